//! Where a command finds its file when none is named (issue 34), with the real binary:
//! `sandgate proxy` reads `./sandgate.yaml`, else `/etc/sandgate/policy.yaml` (made, for the
//! test, in an overlay of `/etc` inside a user and mount namespace: the machine's own `/etc`
//! is never touched), says which, and lets `--policy` and `SANDGATE_POLICY` win; `sandgate
//! run` reads the `./sandbox.yaml` that `sandgate init --for` writes, or says how to give
//! one; `sandgate audit tail --last-run` opens the newest run's log.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;
mod sandbox_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::world::{World, base_args, events_of, policy_doc, strs};
use common::{ProxyProcess, curl, outcome, sandgate_bin};
use sandgate_testkit::dns::Zone;
use serde_json::Value;

const FOUND_HERE: &str = "policy: ./sandgate.yaml (found; --policy names another)";
const FOUND_ETC: &str = "policy: /etc/sandgate/policy.yaml (found; --policy names another)";

/// An EgressPolicy allowing `hosts` (each with `port`).
fn allowing(hosts: &[&str], port: u16) -> String {
    let list: Vec<String> = hosts.iter().map(|h| format!("\"{h}:{port}\"")).collect();
    policy_doc(&format!("  network:\n    allowlist: [ {} ]\n", list.join(", ")))
}

/// The `allow_rules=` of the first `listening` line.
fn allow_rules(proxy: &ProxyProcess) -> String {
    let line = proxy.log_line("listening").unwrap();
    line.split("allow_rules=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn the_proxy_reads_sandgate_yaml_where_it_starts_and_a_named_policy_wins() {
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("found.test", &["127.0.0.1"])
            .with("other.test", &["127.0.0.1"]),
    );
    let here = tempfile::tempdir().unwrap();
    std::fs::write(
        here.path().join("sandgate.yaml"),
        allowing(&["found.test"], origin.port()),
    )
    .unwrap();
    let args = base_args(&dns);
    let mut cmd = Command::new(sandgate_bin());
    cmd.current_dir(here.path());
    let proxy = ProxyProcess::start_with(cmd, &strs(&args));
    let said = proxy.log_line("(found; --policy names another)").unwrap();
    assert!(said.contains(FOUND_HERE), "{said}");
    assert_eq!(allow_rules(&proxy), "1", "{}", proxy.log_text());
    // The file's rules are the ones in force.
    let (code, body, err) = curl(
        &proxy.url(),
        &["-i", &format!("http://found.test:{}/", origin.port())],
    );
    assert_eq!(code, 0, "{err}");
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    let (_, body, _) = curl(
        &proxy.url(),
        &["-i", &format!("http://other.test:{}/", origin.port())],
    );
    assert!(body.starts_with("HTTP/1.1 403"), "{body}");
    let events = proxy.audit_events(3);
    assert!(
        events_of(&events, "decision")
            .iter()
            .any(|e| e["decision"] == "allow" && e["destination_host"] == "found.test"),
        "{events:?}"
    );
    drop(proxy);

    // Named by --policy, or by SANDGATE_POLICY: that file, and nothing is looked for.
    let other = tempfile::tempdir().unwrap();
    let named = other.path().join("named.yaml");
    std::fs::write(&named, allowing(&["other.test", "more.test"], origin.port())).unwrap();
    let named = named.to_str().unwrap();
    let mut with_flag = args.clone();
    with_flag.extend(["--policy".to_owned(), named.to_owned()]);
    let mut cmd = Command::new(sandgate_bin());
    cmd.current_dir(here.path());
    let proxy = ProxyProcess::start_with(cmd, &strs(&with_flag));
    assert_eq!(allow_rules(&proxy), "2", "{}", proxy.log_text());
    assert!(!proxy.log_text().contains("(found;"), "{}", proxy.log_text());
    drop(proxy);
    let mut cmd = Command::new(sandgate_bin());
    cmd.current_dir(here.path()).env("SANDGATE_POLICY", named);
    let proxy = ProxyProcess::start_with(cmd, &strs(&args));
    assert_eq!(allow_rules(&proxy), "2", "{}", proxy.log_text());
    assert!(!proxy.log_text().contains("(found;"), "{}", proxy.log_text());
    drop(proxy);

    // Where there is none: the flags alone, as before, and nothing said.
    let proxy = ProxyProcess::start(&strs(&args));
    assert_eq!(allow_rules(&proxy), "0", "{}", proxy.log_text());
    assert!(!proxy.log_text().contains("(found;"), "{}", proxy.log_text());
}

/// `sandgate` as the last word of a command that first lays an overlay over /etc, in a user
/// and mount namespace of its own, holding `/etc/sandgate/policy.yaml` with `policy`.
fn with_etc_policy(scratch: &Path, policy: &str) -> Command {
    let (upper, work) = (scratch.join("upper"), scratch.join("work"));
    std::fs::create_dir_all(&upper).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let file = scratch.join("policy.yaml");
    std::fs::write(&file, policy).unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "--mount", "--", "sh", "-c"])
        .arg(format!(
            "set -e; mount -t overlay overlay -o lowerdir=/etc,upperdir={},workdir={} /etc; \
             mkdir -p /etc/sandgate; cp {} /etc/sandgate/policy.yaml; exec \"$0\" \"$@\"",
            upper.display(),
            work.display(),
            file.display()
        ))
        .arg(sandgate_bin());
    cmd
}

#[test]
fn the_proxy_reads_etc_sandgate_policy_yaml_unless_its_directory_has_one() {
    assert!(
        !Path::new("/etc/sandgate/policy.yaml").exists(),
        "this machine has /etc/sandgate/policy.yaml: the test makes its own"
    );
    let w = World::new();
    let dns = w.dns(Zone::new());
    let args = base_args(&dns);
    let scratch = tempfile::tempdir().unwrap();
    // The harness starts it in an empty directory of its own: /etc's file is read.
    let proxy = ProxyProcess::start_with(
        with_etc_policy(scratch.path(), &allowing(&["etc.test"], 443)),
        &strs(&args),
    );
    let said = proxy.log_line("(found; --policy names another)").unwrap();
    assert!(said.contains(FOUND_ETC), "{said}");
    assert_eq!(allow_rules(&proxy), "1", "{}", proxy.log_text());
    drop(proxy);

    // A ./sandgate.yaml where it starts wins over /etc's.
    let here = tempfile::tempdir().unwrap();
    std::fs::write(
        here.path().join("sandgate.yaml"),
        allowing(&["a.test", "b.test"], 443),
    )
    .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let mut cmd = with_etc_policy(scratch.path(), &allowing(&["etc.test"], 443));
    cmd.current_dir(here.path());
    let proxy = ProxyProcess::start_with(cmd, &strs(&args));
    let said = proxy.log_line("(found; --policy names another)").unwrap();
    assert!(said.contains(FOUND_HERE), "{said}");
    assert_eq!(allow_rules(&proxy), "2", "{}", proxy.log_text());
}

/// `sandgate ARGS` in `cwd` with its run logs under `state`: (exit code, stdout, stderr).
fn sandgate_in(cwd: &Path, state: &Path, args: &[&str]) -> (i32, String, String) {
    outcome(
        Command::new(sandgate_bin())
            .args(args)
            .current_dir(cwd)
            .env("XDG_STATE_HOME", state)
            .env_remove("SANDGATE_AUDIT_LOG"),
    )
}

#[test]
fn run_reads_the_sandbox_yaml_that_init_for_writes_and_otherwise_says_how() {
    let here = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let (code, _, err) = sandgate_in(here.path(), state.path(), &["init", "--for", "sh -c true"]);
    assert_eq!(code, 0, "{err}");
    assert!(here.path().join("sandbox.yaml").exists(), "{err}");
    let (code, out, err) = sandgate_in(
        here.path(),
        state.path(),
        &["run", "--", "sh", "-c", "echo inside; exit 7"],
    );
    assert_eq!((code, out.as_str()), (7, "inside\n"), "{err}");
    assert!(
        err.lines()
            .any(|l| l == "sandgate: policy: ./sandbox.yaml (found; --policy names another)"),
        "{err}"
    );
    // --quiet: nothing from sandgate itself.
    let (code, _, err) = sandgate_in(
        here.path(),
        state.path(),
        &["run", "--quiet", "--", "sh", "-c", "exit 3"],
    );
    assert_eq!(code, 3, "{err}");
    assert!(!err.contains("(found;"), "{err}");

    // Nowhere to find one: a usage error that says both ways.
    let empty = tempfile::tempdir().unwrap();
    let (code, _, err) = sandgate_in(empty.path(), state.path(), &["run", "--", "true"]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("--policy FILE") && err.contains("./sandbox.yaml") && err.contains("init --for"),
        "{err}"
    );
}

/// The audit log the totals line of a run names.
fn kept_log(stderr: &str) -> PathBuf {
    let line = stderr
        .lines()
        .find(|l| l.contains("; audit log: "))
        .unwrap_or_else(|| panic!("no totals line: {stderr}"));
    PathBuf::from(line.split("; audit log: ").nth(1).unwrap())
}

#[test]
fn audit_tail_last_run_opens_the_newest_run_log() {
    let here = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    // Nothing run yet: a usage error naming where run logs are kept.
    let (code, _, err) = sandgate_in(here.path(), state.path(), &["audit", "tail", "--last-run"]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains(&state.path().join("sandgate/runs").display().to_string()),
        "{err}"
    );

    // Two runs through their proxy, each refused a name of its own.
    std::fs::write(
        here.path().join("sandbox.yaml"),
        format!("{}net:\n  mode: allowlist\n", sandbox_support::base()),
    )
    .unwrap();
    let mut logs = Vec::new();
    for name in ["first.test", "second.test"] {
        let (_, _, err) = sandgate_in(
            here.path(),
            state.path(),
            &[
                "run",
                "--",
                "sh",
                "-c",
                &format!("curl -s -o /dev/null http://{name}/"),
            ],
        );
        logs.push(kept_log(&err));
    }
    assert_ne!(logs[0], logs[1]);
    let (code, out, err) = sandgate_in(
        here.path(),
        state.path(),
        &["audit", "tail", "--last-run", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!("audit log: {} (the newest run's)", logs[1].display())),
        "{err}"
    );
    let events: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let hosts: Vec<&Value> = events_of(&events, "decision")
        .iter()
        .map(|e| &e["destination_host"])
        .collect();
    assert!(hosts.contains(&&Value::from("second.test")), "{out}");
    assert!(!hosts.contains(&&Value::from("first.test")), "{out}");

    // SANDGATE_AUDIT_LOG names the proxy's log; --last-run, given, still means the run's.
    let out = Command::new(sandgate_bin())
        .args(["audit", "tail", "--last-run"])
        .current_dir(here.path())
        .env("XDG_STATE_HOME", state.path())
        .env("SANDGATE_AUDIT_LOG", "/nonexistent/audit.jsonl")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("second.test"));
}
