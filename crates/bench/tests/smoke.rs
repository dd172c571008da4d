//! Runs the load benchmark in smoke mode (tiny sizes; direct, sandgate, sandgate
//! intercepting the HTTPS origin, and the bare relay; and three rounds of the sandbox's
//! start-up) so the harness cannot rot. It checks that every scenario
//! ran and produced figures; it asserts no speed.

#![allow(clippy::panic, clippy::expect_used, reason = "test")]

use std::process::Command;

/// The cell in column `column` (counted from 1 after the label) of the row labelled
/// `metric`.
fn figure<'a>(stdout: &'a str, metric: &str, column: usize) -> &'a str {
    let line = stdout
        .lines()
        .find(|l| l.strip_prefix("| ").is_some_and(|rest| rest.starts_with(metric)))
        .unwrap_or_else(|| panic!("no {metric} row:\n{stdout}"));
    line.split('|').nth(column + 1).unwrap_or("").trim()
}

#[test]
fn smoke_run_produces_every_figure() {
    let bench = env!("CARGO_BIN_EXE_sandgate-bench");
    let sandgate = std::path::Path::new(bench).with_file_name("sandgate");
    assert!(
        sandgate.exists(),
        "build the sandgate binary first: {}",
        sandgate.display()
    );
    let out = Command::new(bench)
        .args([
            "--smoke",
            "--no-pin",
            "--targets",
            "direct,sandgate,sandgate-intercept,relay",
            "--sandgate",
        ])
        .arg(&sandgate)
        .output()
        .expect("run sandgate-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Columns: direct, sandgate, sandgate-intercept, relay.
    for metric in [
        "tunnel throughput up",
        "tunnel throughput down",
        "keep-alive GETs",
        "GET p99 ",
        "new tunnels",
        "RSS per idle tunnel past",
        "RSS per tunnel waiting",
    ] {
        for (column, target) in [(2, "sandgate"), (4, "relay")] {
            let cell = figure(&stdout, metric, column);
            assert!(
                cell.parse::<f64>().is_ok(),
                "{metric}: no {target} figure: {cell:?}"
            );
        }
    }
    for metric in [
        "keep-alive HTTPS GETs",
        "HTTPS GET p99 ",
        "proxy CPU per HTTPS GET",
        "load CPU per HTTPS GET",
    ] {
        for (column, target) in [(2, "sandgate"), (3, "sandgate-intercept")] {
            let cell = figure(&stdout, metric, column);
            assert!(
                cell.parse::<f64>().is_ok(),
                "{metric}: no {target} figure: {cell:?}"
            );
        }
    }
    // What each unit of work costs: the limit (direct's load side) and the proxy's.
    let cpu = [
        "CPU per keep-alive GET",
        "CPU per new tunnel",
        "CPU per GiB relayed",
    ];
    for metric in cpu {
        let cells =
            [(1, "direct"), (2, "sandgate"), (4, "relay")].map(|(c, t)| (figure(&stdout, metric, c), t));
        for (cell, target) in cells {
            assert!(
                cell.parse::<f64>().is_ok(),
                "{metric}: no {target} figure: {cell:?}"
            );
        }
    }
    // The sandbox's start-up, paired with bare bwrap (where bwrap is, as in CI).
    let bwrap = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("bwrap").is_file()));
    if bwrap {
        for (column, variant) in [(1, "bare bwrap"), (2, "none"), (3, "allowlist")] {
            let cell = figure(&stdout, "measured", column);
            assert!(
                cell.parse::<f64>().is_ok_and(f64::is_finite),
                "start-up: no {variant} figure: {cell:?}\n{stdout}\n{stderr}"
            );
        }
    }
    // Only the intercepting target's and the relay's failures leave the run's status
    // untouched.
    assert!(!stderr.contains("sandgate-intercept:"), "{stderr}");
    assert!(!stderr.contains("relay:"), "{stderr}");
}
