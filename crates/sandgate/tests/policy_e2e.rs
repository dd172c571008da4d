//! Policy files end to end: per-listener task identity, hot reload of a valid and an invalid
//! file while a tunnel stays open, `check-config` and `explain`.

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
use std::process::Command;
use std::time::{Duration, Instant};

use common::{ProxyProcess, status_of};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;

use common::runtime;

fn policy(body: &str) -> String {
    format!("apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: test }}\nspec:\n{body}")
}

fn connect(addr: SocketAddr, target: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    (s, String::from_utf8_lossy(&head).into_owned())
}

fn echo_roundtrip(s: &mut TcpStream, data: &[u8]) {
    s.write_all(data).unwrap();
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, data);
}

/// Waits (bounded) until the audit log holds `n` policy_reload events; returns the last.
fn wait_reloads(p: &ProxyProcess, n: usize) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reloads: Vec<_> = common::read_audit(&p.audit_path)
            .into_iter()
            .filter(|e| e["event"] == "policy_reload")
            .collect();
        if reloads.len() >= n {
            return reloads[n - 1].clone();
        }
        assert!(Instant::now() < deadline, "no reload #{n} within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_listener_bound_to_a_task_gets_that_tasks_entries() {
    let rt = runtime();
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("echo.test", &["127.0.0.1"])));
    let target = format!("echo.test:{}", echo.addr().port());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        policy(&format!(
            "  network:\n    allowlist:\n      - host: \"{target}\"\n        scope: {{ task: t-1 }}\n  listeners:\n    - listen: 127.0.0.1:0\n      task: t-1\n      job: j-7\n"
        )),
    )
    .unwrap();
    let dns_addr = dns.addr().to_string();
    let p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--policy",
        file.to_str().unwrap(),
    ]);
    let task_listener = p.listener(&["task=t-1"]);
    // The plain listener has no task: the task's entry does not apply.
    let (_, head) = connect(p.addr, &target);
    assert_eq!(status_of(&head), 403, "{head}");
    // The task's listener gets it.
    let (mut s, head) = connect(task_listener, &target);
    assert_eq!(status_of(&head), 200, "{head}");
    echo_roundtrip(&mut s, b"hello task");
    drop(s);
    let events = p.audit_events(3);
    let allowed = events.iter().find(|e| e["decision"] == "allow").unwrap();
    assert_eq!(allowed["task_id"], "t-1");
    assert_eq!(allowed["job_id"], "j-7");
    assert!(
        allowed["rule"].as_str().unwrap().contains("[task:t-1]"),
        "{allowed}"
    );
    let denied = events.iter().find(|e| e["decision"] == "deny").unwrap();
    assert_eq!(denied["task_id"], serde_json::Value::Null);
}

#[test]
fn reload_valid_and_invalid_files_while_a_tunnel_stays_open() {
    let rt = runtime();
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("one.test", &["127.0.0.1"])
            .with("two.test", &["127.0.0.1"]),
    ));
    let port = echo.addr().port();
    let one = format!("one.test:{port}");
    let two = format!("two.test:{port}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        policy(&format!("  network:\n    allowlist: [ \"{one}\" ]\n")),
    )
    .unwrap();
    let dns_addr = dns.addr().to_string();
    let p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--policy",
        file.to_str().unwrap(),
    ]);
    let (mut tunnel, head) = connect(p.addr, &one);
    assert_eq!(status_of(&head), 200, "{head}");
    echo_roundtrip(&mut tunnel, b"before");

    // A valid change on disk is picked up; the open tunnel is not cut.
    std::fs::write(
        &file,
        policy(&format!("  network:\n    allowlist: [ \"{two}\" ]\n")),
    )
    .unwrap();
    let reload = wait_reloads(&p, 1);
    assert_eq!(reload["outcome"], "applied", "{reload}");
    assert_eq!(status_of(&connect(p.addr, &one).1), 403);
    assert_eq!(status_of(&connect(p.addr, &two).1), 200);
    echo_roundtrip(&mut tunnel, b"during");

    // An invalid file is rejected and the previous policy stays in force.
    std::fs::write(&file, policy("  network:\n    allowlist: [ \"*.com\" ]\n")).unwrap();
    let reload = wait_reloads(&p, 2);
    assert_eq!(reload["outcome"], "rejected", "{reload}");
    assert!(
        reload["detail"].as_str().unwrap().contains("policy.yaml:6"),
        "{reload}"
    );
    assert_eq!(status_of(&connect(p.addr, &two).1), 200);
    echo_roundtrip(&mut tunnel, b"still flowing");

    // SIGHUP reloads too (the file is valid again and allows both).
    std::fs::write(
        &file,
        policy(&format!("  network:\n    allowlist: [ \"{one}\", \"{two}\" ]\n")),
    )
    .unwrap();
    let reload = wait_reloads(&p, 3);
    assert_eq!(reload["outcome"], "applied");
    Command::new("kill")
        .args(["-HUP", &p.child.id().to_string()])
        .status()
        .unwrap();
    let reload = wait_reloads(&p, 4);
    assert_eq!(reload["outcome"], "applied");
    assert_eq!(status_of(&connect(p.addr, &one).1), 200);
    echo_roundtrip(&mut tunnel, b"after");
}

#[test]
fn check_config_and_explain() {
    let bin = env!("CARGO_BIN_EXE_sandgate");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/policy.md");
    let md = std::fs::read_to_string(example).unwrap();
    let start = md.find("```yaml\n").unwrap() + 8;
    let end = md[start..].find("```").unwrap() + start;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("policy.yaml");
    std::fs::write(&good, &md[start..end]).unwrap();
    let out = Command::new(bin).arg("check-config").arg(&good).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok: prod-egress"));

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        policy("  network:\n    allowlist: [ \"*.com\", \"127.1\" ]\n"),
    )
    .unwrap();
    let out = Command::new(bin).arg("check-config").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.yaml:6: spec.network.allowlist.host: \"*.com\""),
        "{stderr}"
    );
    assert!(stderr.contains("\"127.1\""), "every error is listed: {stderr}");

    // The exit status is the proxy's answer: 0 allowed, 1 refused.
    let explain_exits = |code: i32, args: &[&str]| {
        let out = Command::new(bin)
            .arg("explain")
            .args(["--policy", good.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let explain = |args: &[&str]| explain_exits(0, args);
    let text = explain(&["--task", "t-123", "pypi.org"]);
    assert!(text.starts_with("allow connect pypi.org:443"), "{text}");
    assert!(
        text.contains("expires: 2030-12-01T00:00:00Z") || text.contains("preset:python-packages"),
        "{text}"
    );
    let text = explain(&["pypi.org"]);
    assert!(text.contains("from:    preset:python-packages"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&explain_exits(1, &["--json", "https://x.evil.example/"])).unwrap();
    assert_eq!(json["decision"], "deny");
    assert_eq!(json["reason_code"], "denylisted");
    assert!(
        json["origin"].as_str().unwrap().ends_with("policy.yaml:18"),
        "{json}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&explain_exits(1, &["--json", "--allow", "10.0.0.1", "10.0.0.1"])).unwrap();
    assert_eq!(json["decision"], "allow");
    assert_eq!(json["outcome"], "deny", "the guard refuses it: {json}");
    assert!(
        json["address_guard"].as_str().unwrap().contains("private"),
        "{json}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&explain_exits(1, &["--json", "http://nowhere.example/"])).unwrap();
    assert_eq!(
        (json["decision"].as_str(), json["scheme"].as_str()),
        (Some("deny"), Some("http"))
    );
}

#[test]
fn basic_credentials_on_a_shared_listener() {
    let rt = runtime();
    let origin = rt.block_on(sandgate_testkit::origin::Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let target = format!("web.test:{}", origin.port());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t2.sha256"),
        sandgate_policy::auth::secret_hash("tok-2"),
    )
    .unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        policy(&format!(
            "  network:\n    allowlist:\n      - host: \"{target}\"\n        scope: {{ task: t-1 }}\n\
             \x20 listeners:\n    - listen: 127.0.0.1:0\n      auth: basic\n\
             \x20 auth:\n    tasks:\n      - task: t-1\n        project: p-1\n        secret_sha256: {}\n\
             \x20     - task: t-2\n        secret_sha256_file: t2.sha256\n",
            sandgate_policy::auth::secret_hash("tok-1")
        )),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dns_addr = dns.addr().to_string();
    let p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--policy",
        file.to_str().unwrap(),
    ]);
    let shared = p.listener(&["auth=basic"]);
    let proxy = format!("http://{shared}");
    let url = format!("http://{target}/authed");
    let run = |user: Option<&str>| {
        let mut args = vec!["-s", "-o", "-", "-w", "\n%{http_code}"];
        if let Some(u) = user {
            args.extend_from_slice(&["--proxy-user", u]);
        }
        args.push(&url);
        let (_, body, _) = common::curl(&proxy, &args);
        body
    };
    let ok = run(Some("t-1:tok-1"));
    assert!(ok.ends_with("\n200"), "{ok}");
    assert!(
        !ok.to_ascii_lowercase().contains("proxy-authorization"),
        "credentials leaked upstream: {ok}"
    );
    assert!(run(Some("t-1:wrong")).ends_with("\n407"));
    assert!(run(None).ends_with("\n407"));
    // t-2 authenticates (secret from a referenced file) but the entry is t-1's.
    assert!(run(Some("t-2:tok-2")).ends_with("\n403"));
    let reply = common::raw(
        shared,
        format!("GET {url} HTTP/1.1\r\nHost: web.test\r\n\r\n").as_bytes(),
    );
    assert!(
        reply.contains("Proxy-Authenticate: Basic realm=\"sandgate\""),
        "{reply}"
    );
    let events = p.audit_events(6);
    let allowed = events.iter().find(|e| e["decision"] == "allow").unwrap();
    assert_eq!(
        (allowed["task_id"].as_str(), allowed["project_id"].as_str()),
        (Some("t-1"), Some("p-1"))
    );
    let codes: Vec<&str> = events.iter().filter_map(|e| e["reason_code"].as_str()).collect();
    assert!(
        codes.contains(&"proxy_auth_wrong") && codes.contains(&"proxy_auth_missing"),
        "{codes:?}"
    );
}

#[test]
fn explain_resolve_heads_with_the_answer_and_leaves_denied_names_alone() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("rebind.test", &["93.184.216.34", "10.0.0.1"])
            .with("evil.test", &["93.184.216.34"]),
    ));
    let explain = |target: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_sandgate"))
            .args([
                "explain",
                "--allow",
                "rebind.test",
                "--deny",
                "evil.test",
                "--resolve",
                "--dns-server",
                &dns.addr().to_string(),
                target,
            ])
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8(out.stdout).unwrap())
    };
    let (code, out) = explain("rebind.test");
    assert_eq!(code, Some(1), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..2],
        [
            "deny connect rebind.test:443: allowed by the policy, but the name resolves to an address the proxy refuses: 10.0.0.1 (private)",
            "  policy:  allow: allowed",
        ],
        "{out}"
    );
    assert!(!out.contains("result:"), "{out}");
    let (code, out) = explain("evil.test");
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.starts_with("deny connect evil.test:443: matches a deny rule\n"),
        "{out}"
    );
    assert!(
        !out.contains("address guard") && !out.contains("resolved:"),
        "a name the policy denies is neither guarded nor resolved: {out}"
    );
    assert_eq!(dns.questions_about("evil.test"), 0);
}

#[test]
fn explain_resolve_classifies_every_answer() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(
        Zone::new().with("rebind.test", &["93.184.216.34", "10.0.0.1"]),
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args([
            "explain",
            "--allow",
            "rebind.test",
            "--resolve",
            "--json",
            "--dns-server",
            &dns.addr().to_string(),
            "rebind.test",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "one refused address refuses the name: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["decision"], "allow");
    assert_eq!(json["outcome"], "deny");
    let resolved = json["resolved"].as_array().unwrap();
    assert_eq!(resolved.len(), 2, "{json}");
    assert!(
        resolved
            .iter()
            .any(|r| r["ip"] == "10.0.0.1" && r["class"] == "private" && r["allowed"] == false),
        "{json}"
    );
    assert!(
        resolved
            .iter()
            .any(|r| r["ip"] == "93.184.216.34" && r["allowed"] == true),
        "{json}"
    );
    assert_eq!(
        dns.questions_about("rebind.test"),
        2,
        "one A and one AAAA question"
    );
}
