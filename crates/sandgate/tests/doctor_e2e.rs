//! `sandgate doctor` on this machine (exit 0, bwrap's version reported), and a refused user
//! namespace: simulated in a user namespace of the test's own whose
//! `user.max_user_namespaces` is 0 (a namespace may lower its own limit; the machine's
//! setting is never touched), where `sandgate run` must name the cause and the fix after
//! bwrap's own message, and `sandgate doctor` must report user namespaces unavailable and
//! exit 1.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and the shared harness connects to its own loopback fixtures"
)]

mod common;
mod sandbox_support;

use std::process::Command;

use serde_json::Value;

/// `bwrap --version`'s number, e.g. `0.8.0`.
fn bwrap_version() -> String {
    let out = Command::new("bwrap")
        .arg("--version")
        .output()
        .expect("bwrap --version");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .last()
        .expect("a version")
        .to_owned()
}

#[test]
fn doctor_on_this_machine_says_run_can_work_and_names_bwraps_version() {
    let version = bwrap_version();
    let (code, out, err) = common::outcome(Command::new(common::sandgate_bin()).arg("doctor"));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(&format!("bubblewrap {version}")), "{out}");
    assert!(out.contains("sandgate run can work here."), "{out}");
    for name in [
        "bwrap",
        "user namespaces",
        "seccomp",
        "cgroup",
        "landlock",
        "kernel tls",
        "open files",
    ] {
        assert!(out.lines().any(|l| l.contains(name)), "{name} missing:\n{out}");
    }
    assert!(out.contains("sandgate does not use Landlock yet"), "{out}");

    let (code, out, err) = common::outcome(Command::new(common::sandgate_bin()).args(["doctor", "--json"]));
    assert_eq!(code, 0, "{out}\n{err}");
    let report: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(report["run_can_work"], true, "{report}");
    assert_eq!(report["bwrap_version"], version.as_str(), "{report}");
    let checks = report["checks"].as_array().expect("checks");
    assert_eq!(checks.len(), 7, "{report}");
    for check in checks {
        assert_ne!(check["status"], "fail", "{check}");
        assert!(check["found"].as_str().is_some_and(|f| !f.is_empty()), "{check}");
    }
}

/// Runs `sandgate ARGS...` in a user namespace of its own whose `user.max_user_namespaces`
/// is 0; `None` when this host cannot make that namespace (then nothing can be simulated).
fn in_namespace_without_userns(args: &[&str]) -> Option<(i32, String, String)> {
    let usable = Command::new("unshare")
        .args(["--user", "--map-root-user", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !usable {
        eprintln!("skipped: unshare --user --map-root-user does not work here");
        return None;
    }
    let script = r#"echo 0 > /proc/sys/user/max_user_namespaces || exit 99; exec "$@""#;
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "sh", "-c", script, "sh"])
        .arg(common::sandgate_bin())
        .args(args)
        .env("XDG_STATE_HOME", sandbox_support::state_home());
    let outcome = common::outcome(&mut cmd);
    assert_ne!(
        outcome.0, 99,
        "a user namespace could not lower its own user.max_user_namespaces: {}",
        outcome.2
    );
    Some(outcome)
}

#[test]
fn a_refused_user_namespace_is_named_with_its_cause_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    let policy = sandbox_support::write_policy(dir.path(), "");
    let policy = policy.to_str().unwrap();
    let Some((code, out, err)) = in_namespace_without_userns(&["run", "--policy", policy, "--", "true"])
    else {
        return;
    };
    assert_eq!(code, 69, "stdout: {out}\nstderr: {err}");
    // bwrap's own message, passed through unread, then sandgate's.
    assert!(err.contains("bwrap: Creating new namespace failed"), "{err}");
    let ours = err
        .lines()
        .find(|l| l.starts_with("sandgate: bwrap could not make a user namespace"))
        .unwrap_or_else(|| panic!("no cause named:\n{err}"));
    assert!(ours.contains("user.max_user_namespaces is 0"), "{ours}");
    assert!(
        ours.contains("Fix: sysctl -w user.max_user_namespaces="),
        "{ours}"
    );

    let Some((code, out, err)) = in_namespace_without_userns(&["doctor"]) else {
        return;
    };
    assert_eq!(code, 1, "stdout: {out}\nstderr: {err}");
    let line = out
        .lines()
        .find(|l| l.contains("user namespaces"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.starts_with("FAIL") && line.contains("unavailable"), "{out}");
    assert!(out.contains("user.max_user_namespaces=0"), "{out}");
    assert!(out.contains("sandgate run cannot work here"), "{out}");

    let Some((code, out, _)) = in_namespace_without_userns(&["doctor", "--json"]) else {
        return;
    };
    assert_eq!(code, 1);
    let report: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(report["run_can_work"], false, "{report}");
    let userns = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "user namespaces")
        .unwrap();
    assert_eq!(userns["status"], "fail", "{report}");
}
