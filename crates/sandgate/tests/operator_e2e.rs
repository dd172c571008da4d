//! The operator's day (issue 11), end to end with the real binary and real clients: the audit
//! readers see aggregates, metrics settle when idle, `explain` answers scripts by its exit
//! status, every refusal is on record with its destination, reloads number only what came
//! into force, `check-config` refuses what cannot start and says what to change, refusals
//! put the destination and the reason where curl and pip print them, and configurations
//! that cannot work are warned about at start.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ProxyProcess, metric, read_audit, runtime, sandgate_bin, status_of};
use sandgate_testkit::closed::ClosedPort;
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use sandgate_testkit::origin::Origin;
use serde_json::Value;

fn policy(body: &str) -> String {
    format!("apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: test }}\nspec:\n{body}")
}

/// Runs sandgate with `args`; returns (exit code, stdout, stderr).
fn sandgate(args: &[&str]) -> (i32, String, String) {
    common::outcome(Command::new(sandgate_bin()).args(args))
}

/// CONNECT, send `n` bytes, read them back, close.
fn tunnel(proxy: SocketAddr, target: &str, n: usize) {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).unwrap(),
            1,
            "{}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s.write_all(&vec![7u8; n]).unwrap();
    let mut back = vec![0u8; n];
    s.read_exact(&mut back).unwrap();
}

/// The field names of docs/audit.md's field table, in order.
fn documented_fields() -> Vec<String> {
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/audit.md")).unwrap();
    let table = md.split("\n## Fields\n").nth(1).unwrap();
    let mut fields = Vec::new();
    for row in table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
    {
        let first = row.split('|').nth(1).unwrap();
        fields.extend(
            first
                .split(',')
                .filter_map(|f| f.trim().strip_prefix('`')?.strip_suffix('`'))
                .map(str::to_owned),
        );
    }
    fields
}

#[test]
fn aggregates_are_read_by_tail_summary_and_a_csv_that_python_parses() {
    let rt = runtime();
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("echo.test", &["127.0.0.1"])));
    let target = format!("echo.test:{}", echo.addr().port());
    let dns_addr = dns.addr().to_string();
    let mut p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &target,
        "--audit-aggregate-window",
        "30",
    ]);
    for _ in 0..4 {
        tunnel(p.addr, &target, 100);
    }
    assert_eq!(
        status_of(&common::raw(
            p.addr,
            b"CONNECT nope.test:443 HTTP/1.1\r\nHost: nope.test\r\n\r\n"
        )),
        403
    );
    // Shutdown writes the open window.
    assert!(p.terminate().success());
    let log = p.audit_path.to_str().unwrap();

    let (code, tail, err) = sandgate(&["audit", "tail", "--file", log]);
    assert_eq!(code, 0, "{err}");
    let line = tail
        .lines()
        .find(|l| l.contains(" aggregate "))
        .unwrap_or_else(|| panic!("{tail}"));
    assert!(
        line.contains(&format!(
            "aggregate connect {target} count=4 sent=400 received=400 since="
        )),
        "{line}"
    );

    let (code, summary, err) = sandgate(&["audit", "summary", "--file", log]);
    assert_eq!(code, 0, "{err}");
    assert!(
        summary.contains(&format!("         4  {target}")),
        "allowed requests: {summary}"
    );
    assert!(
        summary.contains(&format!("400 / 400          {target}")),
        "bytes: {summary}"
    );

    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("audit.csv");
    let (code, _, err) = sandgate(&[
        "audit",
        "export",
        "--input",
        log,
        "--format",
        "csv",
        "--output-file",
        csv.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    // Python's csv module reads it: the header is every documented field in the documented
    // order, and the aggregate row carries its count and window.
    let script = r#"
import csv, json, sys
with open(sys.argv[1], newline="") as f:
    reader = csv.DictReader(f)
    rows = list(reader)
    print(json.dumps({"header": reader.fieldnames, "rows": rows}))
"#;
    let out = Command::new(common::python())
        .args(["-c", script, csv.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let parsed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let header: Vec<String> = serde_json::from_value(parsed["header"].clone()).unwrap();
    assert_eq!(header, documented_fields(), "CSV columns against docs/audit.md");
    assert_eq!(header.len(), 41);
    let rows = parsed["rows"].as_array().unwrap();
    let agg = rows.iter().find(|r| r["event"] == "aggregate").unwrap();
    assert_eq!(agg["count"], "4");
    assert_eq!(
        (agg["bytes_sent"].as_str(), agg["bytes_received"].as_str()),
        (Some("400"), Some("400"))
    );
    assert!(
        agg["window_start"]
            .as_str()
            .unwrap()
            .parse::<jiff::Timestamp>()
            .is_ok(),
        "{agg}"
    );
    assert_eq!(agg["destination_host"], "echo.test");
    let deny = rows.iter().find(|r| r["decision"] == "deny").unwrap();
    assert_eq!(
        (deny["status"].as_str(), deny["count"].as_str()),
        (Some("403"), Some(""))
    );
}

#[test]
fn the_audit_queue_depth_is_zero_when_idle() {
    let rt = runtime();
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("echo.test", &["127.0.0.1"])));
    let target = format!("echo.test:{}", echo.addr().port());
    let dns_addr = dns.addr().to_string();
    let p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &target,
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let admin = p.admin();
    for round in 0..8 {
        tunnel(p.addr, &target, 10);
        common::raw(
            p.addr,
            b"CONNECT nope.test:443 HTTP/1.1\r\nHost: nope.test\r\n\r\n",
        );
        p.audit_events(3 * (round + 1));
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            metric(admin, "sandgate_audit_queue_depth"),
            0.0,
            "idle after round {round}"
        );
    }
}

#[test]
fn explain_answers_by_exit_status_reads_any_scheme_case_and_names_expired_rules() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new().with("up.test", &["93.184.216.34"])));
    let dns_addr = dns.addr().to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        policy("  network:\n    allowlist:\n      - pypi.org\n      - host: old.test\n        expires_at: 2020-01-01T00:00:00Z\n"),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let (code, out, err) = sandgate(&["explain", "--policy", file, "HTTPS://PyPI.org/simple/"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("allow connect pypi.org:443"), "{out}");
    let (code, out, _) = sandgate(&["explain", "--policy", file, "Http://pypi.org:8080/"]);
    assert_eq!(code, 1, "a bare entry allows HTTP on port 80 only: {out}");
    assert!(out.starts_with("deny GET http://pypi.org:8080/"), "{out}");

    // A deny is exit 1, and an expired rule that would have matched is named.
    let (code, out, _) = sandgate(&["explain", "--policy", file, "old.test"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("expired: allow:old.test") && out.contains("since 2020-01-01T00:00:00Z"),
        "{out}"
    );
    let (_, json, _) = sandgate(&["explain", "--policy", file, "--json", "old.test"]);
    let json: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["exit_status"], 1);
    assert!(
        json["expired_rules"][0]["rule"]
            .as_str()
            .unwrap()
            .starts_with("allow:old.test")
    );

    // --resolve: a name that does not exist is an answer (exit 2), not a usage error.
    let resolve = |name: &str| {
        sandgate(&[
            "explain",
            "--allow",
            name,
            "--resolve",
            "--dns-server",
            &dns_addr,
            name,
        ])
    };
    let (code, out, err) = resolve("gone.test");
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("resolved: nothing: cannot resolve gone.test"),
        "{out}"
    );
    assert!(out.contains("the proxy would answer 502"), "{out}");
    let (code, out, err) = resolve("up.test");
    assert_eq!(code, 0, "{out}{err}");
    // A bad target is still a usage error.
    assert_eq!(sandgate(&["explain", "ftp://x.test/"]).0, 64);
}

#[test]
fn listen_flags_open_beside_the_policys_listeners_and_help_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        policy("  listeners:\n    - listen: 127.0.0.1:0\n      task: t-file\n"),
    )
    .unwrap();
    // `start` gives --listen 127.0.0.1:0 too: both are opened.
    let p = ProxyProcess::start(&["--policy", file.to_str().unwrap()]);
    let from_file = p.listener(&["task=t-file"]);
    let from_flag = p.addr;
    assert_ne!(from_file, from_flag, "{}", p.log_text());
    for listener in [from_flag, from_file] {
        let reply = common::raw(
            listener,
            b"CONNECT nowhere.test:443 HTTP/1.1\r\nHost: nowhere.test:443\r\n\r\n",
        );
        assert_eq!(status_of(&reply), 403, "{reply}");
    }
    let tasks: Vec<Option<String>> = p
        .audit_events(2)
        .iter()
        .map(|e| e["task_id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(tasks, [None, Some("t-file".to_owned())]);
    let (_, help, _) = sandgate(&["proxy", "--help"]);
    assert!(
        help.contains("opened beside the policy file's spec.listeners"),
        "{help}"
    );
}

#[test]
fn a_407_names_where_the_request_was_going() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        policy(
            "  listeners:\n    - listen: 127.0.0.1:0\n      auth: basic\n  auth:\n    tasks:\n      - { task: t-1, secret_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 }\n"
        ),
    )
    .unwrap();
    let p = ProxyProcess::start(&["--policy", file.to_str().unwrap()]);
    let listener = p.listener(&["auth=basic"]);
    let reply = common::raw(
        listener,
        b"CONNECT where.test:8443 HTTP/1.1\r\nHost: where.test:8443\r\n\r\n",
    );
    assert_eq!(status_of(&reply), 407, "{reply}");
    let reply = common::raw(
        listener,
        b"GET http://plain.test/x HTTP/1.1\r\nHost: plain.test\r\n\r\n",
    );
    assert_eq!(status_of(&reply), 407, "{reply}");
    let events = p.audit_events(2);
    let dest = |e: &Value| {
        (
            e["reason_code"].as_str().unwrap().to_owned(),
            e["scheme"].clone(),
            e["destination_host"].clone(),
            e["destination_port"].clone(),
        )
    };
    assert_eq!(
        dest(&events[0]),
        (
            "proxy_auth_missing".to_owned(),
            "connect".into(),
            "where.test".into(),
            8443.into()
        )
    );
    assert_eq!(
        dest(&events[1]),
        (
            "proxy_auth_missing".to_owned(),
            "http".into(),
            "plain.test".into(),
            80.into()
        )
    );
    let (_, tail, _) = sandgate(&["audit", "tail", "--file", p.audit_path.to_str().unwrap()]);
    assert!(
        tail.contains("deny  CONNECT where.test:8443 proxy_auth_missing"),
        "{tail}"
    );
}

/// Waits (bounded) until the audit log holds `n` policy_reload events.
fn reloads(p: &ProxyProcess, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found: Vec<Value> = read_audit(&p.audit_path)
            .into_iter()
            .filter(|e| e["event"] == "policy_reload")
            .collect();
        if found.len() >= n {
            return found;
        }
        assert!(Instant::now() < deadline, "no reload #{n} within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_rejected_reload_takes_no_generation() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, policy("  network:\n    allowlist: [ one.test ]\n")).unwrap();
    let p = ProxyProcess::start(&[
        "--policy",
        file.to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let admin = p.admin();
    // Two invalid files, then a valid one (each change on disk is picked up within a
    // second; a half-written file may add a rejection, which changes nothing below).
    std::fs::write(&file, policy("  network:\n    allowlist: [ \"*.com\" ]\n")).unwrap();
    reloads(&p, 1);
    std::fs::write(&file, policy("  network:\n    allowlist: [ \"*.org\" ]\n")).unwrap();
    reloads(&p, 2);
    std::fs::write(&file, policy("  network:\n    allowlist: [ two.test ]\n")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let all = loop {
        let all = reloads(&p, 2);
        if all.iter().any(|e| e["outcome"] == "applied") {
            break all;
        }
        assert!(
            Instant::now() < deadline,
            "the valid file was not applied: {all:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let ids: Vec<&str> = all.iter().map(|e| e["request_id"].as_str().unwrap()).collect();
    let applied = all.iter().position(|e| e["outcome"] == "applied").unwrap();
    assert!(applied >= 2, "{ids:?}");
    for (i, id) in ids[..applied].iter().enumerate() {
        assert_eq!(
            *id,
            format!("reload-1-rejected-{}", i + 1),
            "generation 1 stays in force: {ids:?}"
        );
    }
    assert_eq!(
        ids[applied], "reload-2",
        "the first file applied is generation 2: {ids:?}"
    );
    assert_eq!(metric(admin, "sandgate_policy_generation"), 2.0);
}

#[test]
fn listeners_that_cannot_all_be_bound_fail_the_check_and_the_start() {
    let dir = tempfile::tempdir().unwrap();
    // A port this test holds: every refusal below comes before any bind, and were one not
    // to, the proxy could not take the port from another process.
    let held = ClosedPort::new();
    let addr = held.addr();
    let file = dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        policy(&format!(
            "  listeners:\n    - listen: {addr}\n    - listen: {addr}\n      task: t-1\n"
        )),
    )
    .unwrap();
    let (code, out, err) = sandgate(&["check-config", file.to_str().unwrap()]);
    assert_eq!(code, 64, "{out}{err}");
    assert!(
        err.contains(&format!(
            "policy.yaml:7: spec.listeners.listen: {addr} overlaps {addr} (line 6)"
        )),
        "{err}"
    );
    // The proxy refuses the same before binding anything, and so do flags.
    let dir2 = tempfile::tempdir().unwrap();
    let log = dir2.path().join("a.jsonl");
    let log = log.to_str().unwrap();
    let (code, _, err) = sandgate(&["proxy", "--audit-log", log, "--policy", file.to_str().unwrap()]);
    assert_eq!(code, 64, "{err}");
    let a = addr.to_string();
    let (code, _, err) = sandgate(&["proxy", "--audit-log", log, "--listen", &a, "--socks-listen", &a]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("overlaps"), "{err}");
    let (code, _, err) = sandgate(&[
        "proxy",
        "--audit-log",
        log,
        "--listen",
        &format!("0.0.0.0:{}", addr.port()),
        "--metrics-listen",
        &a,
    ]);
    assert_eq!(code, 64, "{err}");
}

#[test]
fn failed_upstreams_close_with_a_duration_and_the_address_tried() {
    let refused = ClosedPort::new();
    let target = refused.addr().to_string();
    let p = ProxyProcess::start(&["--allow-range", "127.0.0.0/8", "--allow", &target]);
    let connect = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    assert_eq!(status_of(&common::raw(p.addr, connect.as_bytes())), 502);
    let get = format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n");
    assert_eq!(status_of(&common::raw(p.addr, get.as_bytes())), 502);
    let events = p.audit_events(4);
    let closes: Vec<&Value> = events.iter().filter(|e| e["event"] == "close").collect();
    assert_eq!(closes.len(), 2, "{events:#?}");
    for c in closes {
        assert_eq!(c["outcome"], "upstream_failure:connection_refused", "{c}");
        assert!(c["duration_ms"].is_u64(), "{c}");
        assert_eq!(c["resolved_ip"], "127.0.0.1", "{c}");
    }
}

#[test]
fn refusals_say_where_and_why_where_curl_and_pip_print_it() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let p = ProxyProcess::start(&["--allow", "allowed.test"]);
    // curl -v shows the status line.
    let (code, _, err) = common::curl(&p.url(), &["-v", "https://denied.test/"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("< HTTP/1.1 403 sandgate: denied.test:443 not in allowlist\r"),
        "{err}"
    );
    // Plain HTTP: curl prints the body, which says what to do next.
    let url = format!("http://denied.test:{}/", origin.port());
    let (_, body, _) = common::curl(&p.url(), &[&url]);
    assert!(
        body.contains(&format!(
            "denied GET denied.test:{}: not in allowlist",
            origin.port()
        )),
        "{body}"
    );
    assert!(body.contains("request id: "), "{body}");
    assert!(
        body.contains(&format!(
            "to allow it, add denied.test:{0} to the allowlist (spec.network.allowlist, or --allow denied.test:{0})",
            origin.port()
        )),
        "{body}"
    );
    let events = p.audit_events(2);
    let id = events[1]["request_id"].as_str().unwrap();
    assert!(body.contains(&format!("request id: {id}")), "{body}");

    // pip (urllib3 through http.client) prints the reason phrase of a refused CONNECT.
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(common::python())
        .args([
            "-m",
            "pip",
            "download",
            "--isolated",
            "--no-deps",
            "--retries",
            "1",
            "--timeout",
            "5",
        ])
        .arg("-d")
        .arg(work.path())
        .args([
            "--proxy",
            &p.url(),
            "--index-url",
            "https://denied.test/simple",
            "anything",
        ])
        .env_remove("PIP_FIND_LINKS")
        .env_remove("PIP_NO_INDEX")
        .env_remove("PIP_INDEX_URL")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .output()
        .unwrap();
    let pip = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        pip.contains("Tunnel connection failed: 403 sandgate: denied.test:443 not in allowlist"),
        "{pip}"
    );
}

#[test]
fn check_config_says_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    let check = |name: &str, spec: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, policy(spec)).unwrap();
        sandgate(&["check-config", file.to_str().unwrap()])
    };
    let (code, _, err) = check(
        "url.yaml",
        "  network:\n    allowlist:\n      - https://example.com\n",
    );
    assert_eq!(code, 64);
    assert_eq!(
        err.trim(),
        format!(
            "{}: spec.network.allowlist.host: \"https://example.com\": a host, not a URL: write 'example.com'",
            dir.path().join("url.yaml:7").display()
        )
    );
    let (code, _, err) = check(
        "dup.yaml",
        "  network:\n    allowlist: [a.example]\n    allowlist: [b.example]\n",
    );
    assert_eq!(code, 64);
    assert!(
        err.contains("dup.yaml:7: spec.network.allowlist: \"allowlist\" appears twice"),
        "{err}"
    );
    assert!(!err.contains("DuplicateKeyPolicy"), "{err}");
    let (code, _, err) = check(
        "tab.yaml",
        "  network:\n    allowlist: [a.example]\n\tdenylist: [b.example]\n",
    );
    assert_eq!(code, 64);
    assert!(
        err.contains("tab.yaml:7: spec.network: a tab in the indentation"),
        "{err}"
    );
    let (code, _, err) = check(
        "unknown.yaml",
        "  network:\n    allowlist: [a.example]\n    allow_list: [b.example]\n",
    );
    assert_eq!(code, 64);
    assert!(
        err.contains(
            "unknown.yaml:7: spec.network.allow_list: unknown field; this map takes allowlist, denylist"
        ),
        "{err}"
    );
    assert!(!err.contains("line 7"), "the line once: {err}");

    // What starts but cannot be meant: warnings, exit 0.
    let (code, out, err) = check(
        "warn.yaml",
        "  network:\n    allowlist:\n      - host: old.example\n        expires_at: 2020-01-01T00:00:00Z\n      - both.example\n      - 10.0.0.7\n    denylist: [ both.example ]\n    allow_ranges: [ 192.168.7.1/16 ]\n",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok: test"), "{out}");
    for want in [
        "warn.yaml:7: warning: spec.network.allowlist.expires_at: 2020-01-01T00:00:00Z has passed",
        "warn.yaml:9: warning: spec.network.allowlist: both.example is also denied",
        "warn.yaml:10: warning: spec.network.allowlist: 10.0.0.7 is a private address, which the address guard refuses",
        "warn.yaml:12: warning: spec.network.allow_ranges: 192.168.7.1/16 has host bits set; it means 192.168.0.0/16",
    ] {
        assert!(err.contains(want), "{want}\nin\n{err}");
    }

    // The same grammar on the command line.
    let (code, _, err) = sandgate(&["proxy", "--allow", "https://example.com/"]);
    assert_eq!(code, 64);
    assert!(
        err.contains(
            "invalid --allow value \"https://example.com/\": a host, not a URL: write 'example.com'"
        ),
        "{err}"
    );
}

#[test]
fn configurations_that_cannot_work_are_warned_about_at_start() {
    let p = ProxyProcess::start(&[
        "--allow",
        "10.1.2.3",
        "--allow",
        "192.168.1.1",
        "--allow-range",
        "192.168.0.0/16",
    ]);
    let line = p
        .log_line("--allow 10.1.2.3")
        .expect("a warning for the guarded literal");
    assert!(
        line.contains("WARN") && line.contains("private address"),
        "{line}"
    );
    let log = p.log.lock().unwrap().join("\n");
    assert!(
        !log.contains("--allow 192.168.1.1"),
        "an allow range covers it: {log}"
    );

    // PROXY_PORT listens on every interface: said at start, before the bind. The port is
    // one this test holds there, so the bind then fails and the test opens nothing on every
    // interface (nor can it take the port from another process).
    let held = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(sandgate_bin())
        .arg("proxy")
        .arg("--audit-log")
        .arg(dir.path().join("a.jsonl"))
        .env("PROXY_PORT", port.to_string())
        .env_remove("SANDGATE_LISTEN")
        .env("SANDGATE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    while !seen.contains("listening") {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() == 0 {
            break;
        }
        seen.push_str(&line);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.contains(&format!(
            "listening on 0.0.0.0:{port} (PROXY_PORT): every interface"
        )),
        "{seen}"
    );
}

#[test]
fn run_with_an_audit_log_that_cannot_be_written_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir/audit.jsonl");
    let (code, _, err) = sandgate(&[
        "run",
        "--policy",
        "/nonexistent.yaml",
        "--audit-log",
        missing.to_str().unwrap(),
        "--",
        "true",
    ]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains(&missing.display().to_string()), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    let (code, _, err) = sandgate(&[
        "run",
        "--policy",
        "/nonexistent.yaml",
        "--audit-log",
        dir.path().to_str().unwrap(),
        "--",
        "true",
    ]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("is a directory"), "{err}");
}

#[test]
fn audit_readers_pass_lines_through_write_to_stdout_and_say_what_to_pass() {
    let p = ProxyProcess::start(&["--allow", "allowed.test"]);
    for host in ["a.test", "b.test", "c.test"] {
        let req = format!("CONNECT {host}:443 HTTP/1.1\r\nHost: {host}\r\n\r\n");
        assert_eq!(status_of(&common::raw(p.addr, req.as_bytes())), 403);
    }
    p.audit_events(3);
    let log = p.audit_path.to_str().unwrap();
    let written = std::fs::read_to_string(&p.audit_path).unwrap();
    // --json: the lines exactly as written, field order included.
    let (code, out, err) = sandgate(&["audit", "tail", "--json", "--file", log]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, written);
    // export to stdout with `-`, as JSON lines (unchanged) and as CSV.
    let (code, out, err) = sandgate(&[
        "audit",
        "export",
        "--input",
        log,
        "--format",
        "jsonl",
        "--output-file",
        "-",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, written);
    assert!(err.contains("exported 3 events to stdout"), "{err}");
    let (code, out, _) = sandgate(&[
        "audit",
        "export",
        "--input",
        log,
        "--format",
        "csv",
        "--output-file",
        "-",
    ]);
    assert_eq!((code, out.lines().count()), (0, 4), "{out}");
    // A reader that stops early is no error.
    let mut child = Command::new(sandgate_bin())
        .args(["audit", "tail", "--file", log])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // No log where --file points: say what to pass.
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = Command::new(sandgate_bin())
        .args(["audit", "summary"])
        .current_dir(dir.path())
        .env_remove("SANDGATE_AUDIT_LOG")
        .output()
        .map(|o| {
            (
                o.status.code(),
                o.stdout,
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .unwrap();
    assert_eq!(code, Some(64));
    assert!(
        err.contains("no audit log at audit.jsonl: pass --file PATH (the proxy's --audit-log) or set SANDGATE_AUDIT_LOG"),
        "{err}"
    );
}

#[test]
fn presets_lists_what_docs_policy_md_documents() {
    let (code, out, err) = sandgate(&["presets", "--json"]);
    assert_eq!(code, 0, "{err}");
    let presets: Value = serde_json::from_str(&out).unwrap();
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/policy.md")).unwrap();
    let table = md.split("\n## Presets\n").nth(1).unwrap();
    let rows: Vec<&str> = table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .collect();
    assert_eq!(rows.len(), presets.as_object().unwrap().len(), "{rows:?}");
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`');
        let documented: Vec<&str> = cells[2].split(", ").map(|h| h.trim_matches('`')).collect();
        assert_eq!(presets[name]["hosts"], serde_json::json!(documented), "{name}");
    }
    let (_, text, _) = sandgate(&["presets"]);
    assert!(
        text.contains("python-packages  pypi.org, files.pythonhosted.org (443)"),
        "{text}"
    );
}

#[test]
fn the_upstream_proxy_may_be_a_name_or_a_url() {
    let rt = runtime();
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("echo.test", &["127.0.0.1"])
            .with("central.test", &["127.0.0.1"]),
    ));
    let dns_addr = dns.addr().to_string();
    let tunnel_target = format!("echo.test:{}", echo.addr().port());
    let central = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &tunnel_target,
    ]);
    for upstream in [
        format!("http://central.test:{}/", central.addr.port()),
        format!("central.test:{}", central.addr.port()),
        format!("HTTP://{}", central.addr),
    ] {
        let node = ProxyProcess::start(&[
            "--dns-server",
            &dns_addr,
            "--upstream-proxy",
            &upstream,
            "--allow",
            &tunnel_target,
        ]);
        tunnel(node.addr, &tunnel_target, 50);
    }
    for (bad, why) in [
        (
            format!("https://central.test:{}", central.addr.port()),
            "TLS to the upstream proxy is not supported",
        ),
        (
            "socks5://central.test:1080".to_owned(),
            "expected IP:PORT, HOST:PORT or http://HOST:PORT",
        ),
        (
            "http://central.test".to_owned(),
            "expected IP:PORT, HOST:PORT or http://HOST:PORT",
        ),
        ("nowhere.test:3128".to_owned(), "cannot resolve nowhere.test"),
    ] {
        let (code, _, err) = sandgate(&["proxy", "--dns-server", &dns_addr, "--upstream-proxy", &bad]);
        assert_eq!(code, 64, "{bad}: {err}");
        assert!(
            err.contains(&format!("invalid --upstream-proxy value {bad:?}: {why}")),
            "{err}"
        );
    }
}

/// A PEP 503 index of one wheel, served by Python's http.server on a loopback port it
/// chose; killed when dropped.
struct WheelIndex {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl WheelIndex {
    fn start() -> WheelIndex {
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("simple/learned-pkg");
        std::fs::create_dir_all(&pkg).unwrap();
        let wheel = pkg.join("learned_pkg-1.0-py3-none-any.whl");
        let make = r#"
import sys, zipfile, hashlib, base64
files = {
    "learned_pkg/__init__.py": b"",
    "learned_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: learned-pkg\nVersion: 1.0\n",
    "learned_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = ""
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record += f"{name},sha256={digest},{len(data)}\n"
record += "learned_pkg-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
    z.writestr("learned_pkg-1.0.dist-info/RECORD", record)
"#;
        let out = Command::new(common::python())
            .args(["-c", make])
            .arg(&wheel)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        // Port 0: the server binds before it prints "Serving HTTP on 127.0.0.1 port N".
        let mut child = Command::new(common::python())
            .args([
                "-u",
                "-m",
                "http.server",
                "0",
                "--bind",
                "127.0.0.1",
                "--directory",
            ])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut serving = String::new();
        let stdout = child.stdout.take().unwrap();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut serving).unwrap();
        let port = serving
            .split(" port ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("the index did not start: {serving:?}"));
        WheelIndex {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for WheelIndex {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn learn_mode_round_trip_report_only_then_suggest_then_no_deny() {
    let rt = runtime();
    let ca = sandgate_testkit::tls::TestCa::new(&["web.test"]);
    let web = rt.block_on(Origin::https(ca.server_config.clone()));
    let api = rt.block_on(Origin::http());
    let index = WheelIndex::start();
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("index.test", &["127.0.0.1"])
            .with("web.test", &["127.0.0.1"])
            .with("api.test", &["127.0.0.1"])
            .with("inside.test", &["10.0.0.1"]),
    ));
    let dns_addr = dns.addr().to_string();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.ca_pem).unwrap();

    // Three real clients against three loopback origins: pip (plain HTTP index), curl
    // (HTTPS through CONNECT) and Python's urllib (plain HTTP).
    let clients = |proxy: &str| {
        let work = tempfile::tempdir().unwrap();
        let pip = Command::new(common::python())
            .args([
                "-m",
                "pip",
                "download",
                "--isolated",
                "--no-deps",
                "--retries",
                "0",
                "--timeout",
                "10",
            ])
            .arg("-d")
            .arg(work.path())
            .args(["--proxy", proxy, "--trusted-host", "index.test"])
            .args([
                "--index-url",
                &format!("http://index.test:{}/simple/", index.port),
                "learned-pkg",
            ])
            .env_remove("PIP_FIND_LINKS")
            .env_remove("PIP_NO_INDEX")
            .env_remove("PIP_INDEX_URL")
            .output()
            .unwrap();
        assert!(
            pip.status.success() && work.path().join("learned_pkg-1.0-py3-none-any.whl").exists(),
            "pip: {}{}",
            String::from_utf8_lossy(&pip.stdout),
            String::from_utf8_lossy(&pip.stderr)
        );
        let url = format!("https://web.test:{}/learned", web.port());
        let (code, body, err) = common::curl(proxy, &["--cacert", ca_file.to_str().unwrap(), &url]);
        assert_eq!(code, 0, "curl: {err}");
        assert!(body.contains("\"path\":\"/learned\""), "{body}");
        let script = "import sys, urllib.request\nopener = urllib.request.build_opener(urllib.request.ProxyHandler({'http': sys.argv[1]}))\nprint(opener.open(sys.argv[2], timeout=10).read().decode())";
        let py = Command::new(common::python())
            .args(["-c", script, proxy, &format!("http://api.test:{}/py", api.port())])
            .output()
            .unwrap();
        assert!(
            py.status.success(),
            "python: {}",
            String::from_utf8_lossy(&py.stderr)
        );
    };

    // 1. Learn: nothing is allowed, everything passes and is recorded as report_only.
    let mut learn = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--report-only",
    ]);
    clients(&learn.url());
    // The address guard still refuses, report-only or not.
    let inside = common::raw(
        learn.addr,
        b"CONNECT inside.test:443 HTTP/1.1\r\nHost: inside.test\r\n\r\n",
    );
    assert_eq!(status_of(&inside), 403, "{inside}");
    assert!(learn.terminate().success());
    let events = read_audit(&learn.audit_path);
    let passed: Vec<&Value> = events
        .iter()
        .filter(|e| e["reason_code"] == "report_only")
        .collect();
    assert!(passed.len() >= 3, "{events:#?}");
    assert!(
        passed
            .iter()
            .all(|e| e["decision"] == "allow" && e["detail"] == "would deny: not_allowlisted")
    );
    assert!(
        events
            .iter()
            .any(|e| e["reason_code"] == "destination_ip_prohibited")
    );

    // 2. Suggest: a policy that check-config passes without a warning.
    let suggested = dir.path().join("learned.yaml");
    let (code, _, err) = sandgate(&[
        "policy",
        "suggest",
        "--from",
        learn.audit_path.to_str().unwrap(),
        "--reason",
        "learn run 1",
        "--output",
        suggested.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("wrote 3 entries"), "{err}");
    let text = std::fs::read_to_string(&suggested).unwrap();
    for host in ["index.test", "web.test", "api.test"] {
        assert!(text.contains(&format!("- host: \"{host}\"")), "{text}");
    }
    assert!(text.contains("reason: \"learn run 1 ("), "{text}");
    assert!(
        !text.contains("inside.test"),
        "the guard's refusal is no suggestion: {text}"
    );
    let (code, out, err) = sandgate(&["check-config", suggested.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok: learned (3 allow"), "{out}");
    assert!(err.is_empty(), "no warning: {err}");

    // 3. The same run under the suggested policy: everything passes, nothing is denied.
    let mut enforce = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--policy",
        suggested.to_str().unwrap(),
    ]);
    clients(&enforce.url());
    assert!(enforce.terminate().success());
    let events = read_audit(&enforce.audit_path);
    assert!(common::allowlisted_without_deny(&events) >= 3);
}
