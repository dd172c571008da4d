//! `sandgate explain --request-id`: "why was I blocked?" from the id a real 403 printed. A
//! real curl through a real proxy is refused (plain HTTP: the id in the body; CONNECT: in the
//! `Sandgate-Request-Id` header curl -v shows), and explain names the reason and the setting
//! that would allow it, from the audit log given, `SANDGATE_AUDIT_LOG`, or `./audit.jsonl`;
//! with a policy, how that policy decides it now. A malformed id, an id the log does not
//! hold, and an id in a rotated file (found) or in one since removed (not found) too.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and the shared harness connects to its own loopback fixtures"
)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sandgate_testkit::dns::{DnsServer, Zone};
use serde_json::Value;

use common::{ProxyProcess, curl, runtime};

/// `sandgate explain ARGS` in `dir`, without `SANDGATE_AUDIT_LOG` unless `env` sets it:
/// (exit code, stdout, stderr).
fn explain(dir: &Path, env: &[(&str, &Path)], args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(common::sandgate_bin());
    cmd.arg("explain")
        .args(args)
        .current_dir(dir)
        .env_remove("SANDGATE_AUDIT_LOG")
        // No kept run logs of this machine's user are searched.
        .env("XDG_STATE_HOME", dir.join("state"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    common::outcome(&mut cmd)
}

/// The id a refusal's body names (`request id: ID (...)`).
fn id_in_body(body: &str) -> String {
    body.lines()
        .find_map(|l| l.strip_prefix("request id: "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no request id in {body:?}"))
        .to_owned()
}

/// Waits (up to 5 s) until the log or one of its rotated files holds `id`.
fn wait_for(audit: &Path, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let files = || {
        std::iter::once(audit.to_path_buf())
            .chain((1..10).map(|n| std::path::PathBuf::from(format!("{}.{n}", audit.display()))))
    };
    while !files().any(|f| std::fs::read_to_string(f).unwrap_or_default().contains(id)) {
        assert!(Instant::now() < deadline, "{id} is not in {}", audit.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_refusal_is_explained_from_the_id_it_printed() {
    let p = ProxyProcess::start(&["--allow", "allowed.test"]);
    let dir = tempfile::tempdir().unwrap();
    let audit = p.audit_path.to_str().unwrap().to_owned();
    // Plain HTTP: curl prints the body, which names the id and this very command.
    let (_, body, _) = curl(&p.url(), &["http://denied.test:8080/x"]);
    let id = id_in_body(&body);
    assert!(
        body.contains(&format!("(sandgate explain --request-id {id})")),
        "{body}"
    );
    wait_for(&p.audit_path, &id);
    let (code, out, err) = explain(dir.path(), &[], &["--request-id", &id, "--audit-log", &audit]);
    assert_eq!(code, 1, "refused: {out}{err}");
    assert!(
        out.starts_with("denied GET denied.test:8080: not in allowlist\n"),
        "{out}"
    );
    for want in [
        &format!("  request: {id} at "),
        &format!("  logged:  {audit}:1"),
        "  reason:  not_allowlisted, answered 403",
        "  why:     no allow rule matched",
        "        - host: denied.test\n          ports: [8080]",
        "or a flag: sandgate proxy --allow denied.test:8080; sandgate run --allow-domain denied.test:8080",
        "(with --policy FILE, --allow or --deny: how that policy decides it now",
    ] {
        assert!(out.contains(want), "missing {want:?}:\n{out}");
    }
    // No task on this listener: no exception to ask for.
    assert!(!out.contains("exceptions request"), "{out}");
    // With the entry added, the same id says how the policy decides it now.
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: p }\nspec:\n  network:\n    allowlist:\n      - host: denied.test\n        ports: [8080]\n",
    )
    .unwrap();
    let (code, out, _) = explain(
        dir.path(),
        &[],
        &[
            "--request-id",
            &id,
            "--audit-log",
            &audit,
            "--policy",
            policy.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 1, "the exit is the recorded answer: {out}");
    assert!(
        out.contains("  now, with the policy given:\n    allow GET http://denied.test:8080/x: allowed\n      rule:    allow:denied.test:8080"),
        "{out}"
    );

    // CONNECT: curl -v shows the refusal's head (not its body), which names the id.
    let (_, _, verbose) = curl(&p.url(), &["-v", "https://denied.test/"]);
    let id = verbose
        .lines()
        .find_map(|l| l.strip_prefix("< Sandgate-Request-Id: "))
        .unwrap_or_else(|| panic!("no Sandgate-Request-Id in {verbose}"))
        .trim()
        .to_owned();
    wait_for(&p.audit_path, &id);
    // SANDGATE_AUDIT_LOG names the log as it does for `sandgate proxy` and `sandgate audit`.
    let (code, out, err) = explain(
        dir.path(),
        &[("SANDGATE_AUDIT_LOG", &p.audit_path)],
        &["--request-id", &id, "--json"],
    );
    assert_eq!(code, 1, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["request_id"], id.as_str());
    assert_eq!(v["summary"], "denied CONNECT denied.test:443: not in allowlist");
    assert_eq!(v["decision"], "deny");
    assert_eq!(v["reason_code"], "not_allowlisted");
    assert_eq!(v["exit_status"], 1);
    assert_eq!(v["decision_line"]["line"], 2);
    assert_eq!(v["decision_line"]["record"]["request_id"], id.as_str());
    let fixes = v["what_to_do"].as_array().unwrap();
    assert!(
        fixes[1].as_str().unwrap().contains("--allow denied.test;"),
        "a bare host covers 443: {fixes:?}"
    );
    // ./audit.jsonl is where explain looks without a flag or the variable.
    std::fs::copy(&p.audit_path, dir.path().join("audit.jsonl")).unwrap();
    let (code, out, _) = explain(dir.path(), &[], &["--request-id", &id.to_uppercase()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("  logged:  audit.jsonl:2"), "{out}");
}

#[test]
fn the_address_guard_names_the_range_that_would_exempt_it() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(
        Zone::new().with("internal.test", &["127.0.0.1"]),
    ));
    let dns_addr = dns.addr().to_string();
    let p = ProxyProcess::start(&["--dns-server", &dns_addr, "--allow", "internal.test:8080"]);
    let (_, body, _) = curl(&p.url(), &["http://internal.test:8080/"]);
    let id = id_in_body(&body);
    wait_for(&p.audit_path, &id);
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = explain(
        dir.path(),
        &[],
        &["--request-id", &id, "--audit-log", p.audit_path.to_str().unwrap()],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with("denied GET internal.test:8080: resolves to a prohibited address\n"),
        "{out}"
    );
    assert!(out.contains("resolved to 127.0.0.1, a loopback address"), "{out}");
    assert!(
        out.contains("allow_ranges: [ 127.0.0.1/32 ]") && out.contains("--allow-range 127.0.0.1/32"),
        "{out}"
    );
}

#[test]
fn malformed_unknown_and_rotated_ids() {
    let dir = tempfile::tempdir().unwrap();
    // Malformed: a usage error, before any log is read.
    for bad in ["nope", "5f3a9c0e0000000", "ex-0123456789ab"] {
        let (code, _, err) = explain(dir.path(), &[], &["--request-id", bad]);
        assert_eq!(code, 64, "{bad}: {err}");
        assert!(err.contains("a request id is 16 hex digits"), "{err}");
    }
    // No log anywhere: says where to point it.
    let (code, _, err) = explain(dir.path(), &[], &["--request-id", "0123456789abcdef"]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("no audit log to search: pass --audit-log FILE"),
        "{err}"
    );
    // --request-id and a target are one question or the other.
    let (code, _, _) = explain(dir.path(), &[], &["--request-id", "0123456789abcdef", "pypi.org"]);
    assert_eq!(code, 64);

    // A log that rotates every ten lines or so and keeps one rotated file.
    let p = ProxyProcess::start(&[
        "--allow",
        "allowed.test",
        "--audit-max-bytes",
        "4096",
        "--audit-keep",
        "1",
    ]);
    let audit = p.audit_path.to_str().unwrap().to_owned();
    let rotated = format!("{audit}.1");
    let refuse = |n: usize| {
        let (_, body, _) = curl(&p.url(), &[&format!("http://denied-{n}.test/")]);
        let id = id_in_body(&body);
        wait_for(&p.audit_path, &id);
        id
    };
    let first = refuse(0);
    let mut n = 1;
    while !Path::new(&rotated).exists() {
        assert!(n < 40, "the log did not rotate");
        refuse(n);
        n += 1;
    }
    let (code, out, err) = explain(dir.path(), &[], &["--request-id", &first, "--audit-log", &audit]);
    assert_eq!(code, 1, "found in a rotated file: {out}{err}");
    assert!(out.contains(&format!("  logged:  {audit}.")), "{out}");
    assert!(
        out.contains("denied GET denied-0.test:80: not in allowlist"),
        "{out}"
    );
    // An id of another log: not here, and the error says where it looked and why it may
    // be missing.
    let (code, _, err) = explain(
        dir.path(),
        &[],
        &["--request-id", "0123456789abcdef", "--audit-log", &audit],
    );
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains(&format!("request id 0123456789abcdef is not in {audit} (and ")),
        "{err}"
    );
    assert!(err.contains("another proxy's log"), "{err}");
    // Rotated out: the file that held it is gone.
    let holds_first = || {
        std::fs::read_to_string(&rotated)
            .unwrap_or_default()
            .contains(&first)
    };
    while holds_first() {
        assert!(n < 80, "the first line was never rotated out");
        refuse(n);
        n += 1;
    }
    let (code, _, err) = explain(dir.path(), &[], &["--request-id", &first, "--audit-log", &audit]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains(&format!("request id {first} is not in")), "{err}");
    assert!(
        err.contains("a rotated file since removed (--audit-keep)"),
        "{err}"
    );
}
