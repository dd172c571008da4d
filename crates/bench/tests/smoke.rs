//! Runs the load benchmark in smoke mode (tiny sizes, sandgate and direct only) so the
//! harness cannot rot. It checks that every scenario ran and produced figures; it asserts no
//! speed.

#![allow(clippy::panic, clippy::expect_used, reason = "test")]

use std::process::Command;

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
            "direct,sandgate",
            "--sandgate",
        ])
        .arg(&sandgate)
        .output()
        .expect("run sandgate-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for metric in [
        "tunnel throughput up",
        "tunnel throughput down",
        "keep-alive GETs",
        "GET p99 ",
        "new tunnels",
        "RSS per idle tunnel",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with("| ") && l.contains(metric))
            .unwrap_or_else(|| panic!("no {metric} row:\n{stdout}"));
        let sandgate_cell = line.split('|').nth(3).unwrap_or("").trim();
        assert!(
            sandgate_cell.parse::<f64>().is_ok(),
            "{metric}: no sandgate figure in {line:?}"
        );
    }
}
