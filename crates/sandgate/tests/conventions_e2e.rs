//! What users of other command-line tools and Prometheus exporters expect by habit (issue 34):
//! shell completions that load and name every command, a man page per command that renders,
//! `--version` with the commit and build date, `sandgate_build_info` and the standard
//! `process_*` metrics read by a real Prometheus parser, colour only for a terminal without
//! `NO_COLOR`, routine start-up facts at debug, and the admin listener logged as what it
//! serves.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and the shared harness connects to its own loopback fixtures"
)]

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use common::{ProxyProcess, outcome, sandgate_bin};

/// The commands `sandgate --help` lists (the visible ones; `help` aside).
fn commands() -> Vec<String> {
    let (code, out, err) = outcome(Command::new(sandgate_bin()).arg("--help"));
    assert_eq!(code, 0, "{err}");
    let names: Vec<String> = out
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 10, "{out}");
    names
}

fn completions(shell: &str) -> String {
    let (code, out, err) = outcome(Command::new(sandgate_bin()).args(["completions", shell]));
    assert_eq!(code, 0, "{shell}: {err}");
    out
}

#[test]
fn each_shells_completions_name_every_command_and_no_internal_one() {
    let commands = commands();
    for shell in ["bash", "zsh", "fish"] {
        let script = completions(shell);
        assert!(script.len() > 1000, "{shell}: {script}");
        for c in &commands {
            assert!(script.contains(c.as_str()), "{shell} completions lack {c}");
        }
        // Nested commands and flags too.
        for word in ["tail", "suggest", "--allow", "--policy"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
        // What --help hides (the sandbox's internal steps) is not offered. (Not
        // `sandbox-exec`: `run --print-profile`'s help names macOS's.)
        for hidden in ["sandbox-init", "sandbox-enter", "mcp-session"] {
            assert!(!script.contains(hidden), "{shell} completions offer {hidden}");
        }
    }
    let (code, _, err) = outcome(Command::new(sandgate_bin()).args(["completions", "tcsh"]));
    assert_eq!(code, 64, "an unknown shell is a usage error: {err}");
}

#[test]
fn bash_loads_the_completions_and_completes_a_command() {
    let bin = sandgate_bin();
    let script = format!(
        "source <('{bin}' completions bash) || exit 9\n\
         complete -p sandgate\n\
         COMP_WORDS=(sandgate check-c); COMP_CWORD=1; COMP_LINE='sandgate check-c'; COMP_POINT=16\n\
         _sandgate sandgate check-c sandgate\n\
         echo \"reply: ${{COMPREPLY[*]}}\"\n\
         COMP_WORDS=(sandgate audit ta); COMP_CWORD=2; COMP_LINE='sandgate audit ta'; COMP_POINT=17\n\
         _sandgate sandgate ta audit\n\
         echo \"reply: ${{COMPREPLY[*]}}\"\n"
    );
    let (code, out, err) = outcome(Command::new("bash").args(["--norc", "-c", &script]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.is_empty(), "bash complained: {err}");
    assert!(out.contains("-F _sandgate sandgate"), "{out}");
    assert!(out.contains("reply: check-config\n"), "{out}");
    assert!(out.contains("reply: tail\n"), "{out}");
}

#[test]
fn zsh_and_fish_load_the_completions_where_installed() {
    let bin = sandgate_bin();
    if Command::new("zsh")
        .arg("-fc")
        .arg("true")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let script = format!(
            "autoload -Uz compinit && compinit -u && source <('{bin}' completions zsh) && echo ${{_comps[sandgate]}}"
        );
        let (code, out, err) = outcome(Command::new("zsh").args(["-fc", &script]));
        assert_eq!((code, out.trim()), (0, "_sandgate"), "{err}");
    } else {
        println!("zsh not installed: only its script's content is checked");
    }
    if Command::new("fish")
        .args(["-c", "true"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let script = format!("'{bin}' completions fish | source; complete -C 'sandgate check-c'");
        let (code, out, err) = outcome(Command::new("fish").args(["--no-config", "-c", &script]));
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("check-config"), "{out}");
    } else {
        println!("fish not installed: only its script's content is checked");
    }
}

/// `man -l PAGE` as text, when man-db is installed.
fn man_render(page: &Path) -> Option<String> {
    let probe = Command::new("man").arg("--version").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return None;
    }
    let out = Command::new("man")
        .arg("-l")
        .arg(page)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .env("LC_ALL", "C.UTF-8")
        .output()
        .unwrap();
    assert!(out.status.success(), "man -l {}: {out:?}", page.display());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.trim().is_empty(), "man -l {} warned: {err}", page.display());
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn one_man_page_per_command_and_each_renders() {
    let dir = tempfile::tempdir().unwrap();
    let man1 = dir.path().join("share/man/man1");
    let (code, out, err) = outcome(Command::new(sandgate_bin()).arg("man").arg(&man1));
    assert_eq!(code, 0, "{err}");
    let mut written: Vec<String> = std::fs::read_dir(&man1)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(
        out.lines().count(),
        written.len(),
        "it lists what it wrote: {out}"
    );
    let mut expected = vec!["sandgate.1".to_owned()];
    expected.extend(commands().iter().map(|c| format!("sandgate-{c}.1")));
    expected.extend(
        [
            "sandgate-audit-tail.1",
            "sandgate-policy-suggest.1",
            "sandgate-pki-issue.1",
        ]
        .map(String::from),
    );
    for page in &expected {
        assert!(written.contains(page), "no {page} in {written:?}");
    }
    for internal in [
        "sandgate-sandbox-init.1",
        "sandgate-completions.1",
        "sandgate-help.1",
    ] {
        assert!(
            !written.contains(&internal.to_owned()),
            "{internal} in {written:?}"
        );
    }
    let mut rendered = 0;
    for page in &written {
        let path = man1.join(page);
        let roff = std::fs::read_to_string(&path).unwrap();
        let title = page.trim_end_matches(".1");
        // The roff header: `.TH title section date source manual`.
        let th = roff
            .lines()
            .find(|l| l.starts_with(".TH "))
            .unwrap_or_else(|| panic!("{page}: no .TH"));
        assert!(th.starts_with(&format!(".TH {title} 1 ")), "{page}: {th}");
        assert!(th.contains("\"sandgate 0.1.0 ("), "{page}: {th}");
        assert!(
            roff.contains(".SH NAME") && roff.contains(".SH SYNOPSIS"),
            "{page}"
        );
        if let Some(text) = man_render(&path) {
            assert!(
                text.contains("NAME") && text.contains("SYNOPSIS"),
                "{page}:\n{text}"
            );
            assert!(text.contains(title), "{page}:\n{text}");
            rendered += 1;
        }
    }
    if rendered == 0 {
        println!("man-db not installed: the pages' roff was checked, not rendered");
    }
    // The proxy's page carries its flags' help.
    let proxy = std::fs::read_to_string(man1.join("sandgate-proxy.1")).unwrap();
    assert!(
        proxy.contains("\\-\\-allow") && proxy.contains("Allowlist pattern"),
        "{proxy}"
    );
}

/// `git ARGS` in the repository, when git can read it.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[test]
fn version_names_the_commit_and_the_build_date() {
    let (code, out, err) = outcome(Command::new(sandgate_bin()).arg("--version"));
    assert_eq!(code, 0, "{err}");
    let line = out.trim_end();
    let inner = line
        .strip_prefix(concat!("sandgate ", env!("CARGO_PKG_VERSION"), " ("))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{line:?}"));
    let (commit, date) = inner.split_once(' ').unwrap_or_else(|| panic!("{line:?}"));
    let (_, short, _) = outcome(Command::new(sandgate_bin()).arg("-V"));
    assert_eq!(short, out, "-V and --version say the same");
    let date_ok = date.len() == 10
        && date.bytes().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    assert!(date_ok, "{line:?}");
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) => {
            assert_eq!(commit, head, "{line:?}");
            // The commit's date (UTC), unless the build was given SOURCE_DATE_EPOCH.
            if std::env::var_os("SOURCE_DATE_EPOCH").is_none() {
                let day = Command::new("git")
                    .env("TZ", "UTC")
                    .arg("-C")
                    .arg(env!("CARGO_MANIFEST_DIR"))
                    .args([
                        "log",
                        "-1",
                        "--date=format-local:%Y-%m-%d",
                        "--format=%cd",
                        "HEAD",
                    ])
                    .output()
                    .unwrap();
                assert_eq!(date, String::from_utf8_lossy(&day.stdout).trim(), "{line:?}");
            }
        }
        None => println!("no git here: the commit ({commit}) is not compared"),
    }
}

/// Every sample of `/metrics` on `admin`, parsed by the Python Prometheus client's
/// OpenMetrics parser: `name{k=v,...}` (labels sorted) to value.
fn scrape(admin: std::net::SocketAddr) -> HashMap<String, f64> {
    let script = r#"
import sys, json, urllib.request
from prometheus_client.openmetrics.parser import text_string_to_metric_families
text = urllib.request.urlopen("http://" + sys.argv[1] + "/metrics", timeout=10).read().decode()
out = {}
for family in text_string_to_metric_families(text):
    for s in family.samples:
        key = s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
        out[key] = s.value
print(json.dumps(out))
"#;
    let out = Command::new(common::python())
        .args(["-c", script, &admin.to_string()])
        .env_remove("http_proxy")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn build_info_and_process_metrics_parse_and_are_plausible() {
    let p = ProxyProcess::start(&["--allow", "x.test", "--admin-listen", "127.0.0.1:0"]);
    let m = scrape(p.admin());
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("no {k} in {m:?}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();

    let (_, version, _) = outcome(Command::new(sandgate_bin()).arg("--version"));
    let commit = version
        .split_once('(')
        .and_then(|(_, r)| r.split_whitespace().next())
        .unwrap();
    let build = format!(
        "sandgate_build_info{{commit={commit},version={}}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(get(&build), 1.0, "{m:?}");
    assert_eq!(
        m.keys().filter(|k| k.starts_with("sandgate_build_info{")).count(),
        1
    );

    let rss = get("process_resident_memory_bytes{}");
    assert!(rss > 1e6 && rss < 1e10, "rss {rss}");
    assert!(get("process_virtual_memory_bytes{}") >= rss);
    let (fds, limit) = (get("process_open_fds{}"), get("process_max_fds{}"));
    // Three standard descriptors, the listeners, the runtime's: more than a handful.
    assert!(fds > 3.0 && fds <= limit, "{fds} open, limit {limit}");
    let cpu = get("process_cpu_seconds_total{}");
    assert!((0.0..60.0).contains(&cpu), "cpu {cpu}");
    let start = get("process_start_time_seconds{}");
    assert!(
        start <= now + 1.0 && start > now - 60.0,
        "started at {start}, now {now}"
    );
    // The limit is the process's own: what /proc says for the child.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", p.child.id())).unwrap();
    let soft: f64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert_eq!(limit, soft, "{limits}");
    let fd_dir = std::fs::read_dir(format!("/proc/{}/fd", p.child.id()))
        .unwrap()
        .count() as f64;
    assert!((fds - fd_dir).abs() <= 4.0, "{fds} vs {fd_dir} in /proc");
}

#[test]
fn the_admin_listener_is_logged_as_what_it_serves() {
    let p = ProxyProcess::start(&["--allow", "x.test", "--admin-listen", "127.0.0.1:0"]);
    let line = p.log_line("admin listening").expect("an admin line");
    assert!(line.trim_end().ends_with(" serves=metrics"), "{line}");
    assert!(!p.log_text().contains("metrics listening"), "{}", p.log_text());
    assert_eq!(common::status_of(&common::metrics_text(p.admin())), 200);

    // With admin tokens the control plane's API and page are there too.
    let dir = tempfile::tempdir().unwrap();
    let policy = common::control::write_policy(dir.path(), &[443]);
    let state = dir.path().join("state");
    let p = ProxyProcess::start(&[
        "--policy",
        policy.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    let line = p.log_line("admin listening").expect("an admin line");
    assert!(
        line.trim_end()
            .ends_with(" serves=\"metrics, api, approvals page\""),
        "{line}"
    );
    let admin = p.admin();
    assert_eq!(common::control::admin_get(admin, "/metrics").0, 200);
    assert_eq!(common::control::admin_get(admin, "/v1/exceptions").0, 401);
}

#[test]
fn json_logs_name_the_admin_listener_too() {
    let out = Command::new("timeout")
        .args(["-s", "INT", "1"])
        .arg(sandgate_bin())
        .args([
            "--log-format",
            "json",
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--allow",
            "x.test",
        ])
        .args([
            "--admin-listen",
            "127.0.0.1:0",
            "--audit-log",
            "/dev/null",
            "--shutdown-grace",
            "0",
        ])
        .env("SANDGATE_LOG", "info")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("admin listening"))
        .unwrap_or_else(|| panic!("{err}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["fields"]["message"], "admin listening", "{line}");
    assert_eq!(v["fields"]["serves"], "metrics", "{line}");
    let addr: std::net::SocketAddr = v["fields"]["addr"].as_str().unwrap().parse().unwrap();
    assert_ne!(addr.port(), 0, "{line}");
}

/// The proxy's first seconds of stderr under a pseudo-terminal (util-linux `script`), with
/// `NO_COLOR` as given (None: unset).
fn log_at_a_terminal(no_color: Option<&str>) -> String {
    let command = format!(
        "timeout -s INT 1 '{}' proxy --listen 127.0.0.1:0 --allow x.test --audit-log /dev/null --shutdown-grace 0",
        sandgate_bin()
    );
    let mut cmd = Command::new("script");
    cmd.args(["-q", "-f", "-e", "-c", &command, "/dev/null"])
        .env("SANDGATE_LOG", "info")
        .env_remove("NO_COLOR");
    if let Some(v) = no_color {
        cmd.env("NO_COLOR", v);
    }
    let (_, out, err) = outcome(&mut cmd);
    assert!(out.contains("listening"), "{out}\n{err}");
    out
}

#[test]
fn colour_only_at_a_terminal_without_no_color() {
    const ESC: char = '\x1b';
    assert!(log_at_a_terminal(None).contains(ESC), "a terminal gets colour");
    assert!(
        log_at_a_terminal(Some("")).contains(ESC),
        "an empty NO_COLOR is unset"
    );
    let plain = log_at_a_terminal(Some("1"));
    assert!(!plain.contains(ESC), "NO_COLOR=1: {plain:?}");
    // Not a terminal (a pipe): no colour, NO_COLOR or not.
    let p = ProxyProcess::start(&["--allow", "x.test"]);
    assert!(!p.log_text().contains(ESC), "{:?}", p.log_text());
}

#[test]
fn routine_start_up_facts_are_debug() {
    // An open-file limit the proxy cannot raise, under the default cap's needs: the cap is
    // lowered, a routine fact that the default level does not show.
    let start = |level: &str| {
        let mut cmd = Command::new("prlimit");
        // env(1): the harness sets SANDGATE_LOG=info on the command it is given.
        cmd.args([
            "--nofile=2048:2048",
            "--",
            "env",
            &format!("SANDGATE_LOG={level}"),
        ])
        .arg(sandgate_bin());
        let p = ProxyProcess::start_with(cmd, &["--allow", "x.test", "--admin-listen", "127.0.0.1:0"]);
        p.admin();
        p.log_text()
    };
    let info = start("info");
    assert!(!info.contains("connection cap lowered"), "{info}");
    // At info: the listeners and nothing routine besides.
    assert!(info.lines().all(|l| l.contains(" listening ")), "{info}");
    let debug = start("debug");
    let lowered = debug
        .lines()
        .find(|l| l.contains("connection cap lowered"))
        .unwrap_or_else(|| panic!("{debug}"));
    assert!(
        lowered.contains("DEBUG") && lowered.contains("max_connections=896"),
        "{lowered}"
    );
}
