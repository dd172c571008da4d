//! Temporary exceptions end to end, with the real binary, curl as the requester's and the
//! approver's client, and a real tunnel: denied, requested, approved (effective at once,
//! no reload), revoked (the open tunnel is cut), every lifecycle event on record; the roles
//! and bounds refused as an attacker would try them; and a restart that keeps what it must.

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
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{ProxyProcess, runtime};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use sandgate_testkit::origin::Origin;
use serde_json::Value;

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// The policy: task t-1 on its own listener, exceptions enabled for t-1 on the test ports,
/// three admin tokens.
fn write_policy(dir: &Path, listener: SocketAddr, admin: SocketAddr, ports: &[u16]) -> std::path::PathBuf {
    let hash = |s: &str| sandgate_policy::auth::secret_hash(s);
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let text = format!(
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: ex }}\nspec:\n\
         \x20 listeners:\n    - {{ listen: \"{listener}\", task: t-1, project: p-1 }}\n\
         \x20 exceptions:\n    - {{ scope: {{ task: t-1 }}, ports: [ {ports} ], max_ttl_seconds: 600 }}\n\
         \x20 admin:\n    listen: \"{admin}\"\n    tokens:\n\
         \x20     - {{ name: agent-7, role: requester, secret_sha256: {a}, tasks: [ t-1 ] }}\n\
         \x20     - {{ name: agent-8, role: requester, secret_sha256: {o}, tasks: [ t-2 ] }}\n\
         \x20     - {{ name: alice, role: approver, secret_sha256: {b} }}\n\
         \x20     - {{ name: victor, role: viewer, secret_sha256: {v} }}\n",
        ports = ports.join(", "),
        a = hash("tok-agent"),
        o = hash("tok-other"),
        b = hash("tok-alice"),
        v = hash("tok-viewer"),
    );
    let path = dir.join("policy.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Calls the admin API with curl; returns (status, JSON body).
fn api(admin: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> (u16, Value) {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "10",
        "--noproxy",
        "*",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
    ]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data", b]);
    }
    let out = cmd.arg(format!("http://{admin}{path}")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (
        status.parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// Runs `sandgate exceptions ARGS` against `admin` with `token` in the environment.
fn cli(admin: SocketAddr, token: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(common::sandgate_bin())
        .arg("exceptions")
        .args(args)
        .env("SANDGATE_ADMIN", format!("http://{admin}"))
        .env("SANDGATE_TOKEN", token)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn get_status(proxy: SocketAddr, url: &str) -> String {
    common::curl(
        &format!("http://{proxy}"),
        &["-o", "/dev/null", "-w", "%{http_code}", url],
    )
    .1
}

fn start(dns: &DnsServer, policy: &Path, state: &Path) -> ProxyProcess {
    let dns_addr = dns.addr().to_string();
    ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--policy",
        policy.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ])
}

/// Waits until `cond` holds (at most `secs`).
fn within(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

#[test]
fn request_approve_revoke_with_a_live_tunnel_and_every_event_on_record() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("web.test", &["127.0.0.1"])
            .with("echo.test", &["127.0.0.1"]),
    ));
    let dir = tempfile::tempdir().unwrap();
    let (listener, admin) = (free_addr(), free_addr());
    let policy = write_policy(dir.path(), listener, admin, &[origin.port(), echo.addr().port()]);
    let state = dir.path().join("state");
    let p = start(&dns, &policy, &state);
    let url = format!("http://web.test:{}/", origin.port());
    assert_eq!(get_status(listener, &url), "403", "denied before any exception");
    // The 403 says how to ask, in the reason clients print and in the body.
    let (_, denied, _) = common::curl(&format!("http://{listener}"), &["-s", &url]);
    assert!(
        denied.contains(&format!(
            "sandgate exceptions request --task t-1 --host web.test --port {}",
            origin.port()
        )),
        "{denied}"
    );
    // The admin API is never reachable through the proxy, even for an allowed name.
    let sneak = common::raw(
        listener,
        format!(
            "GET http://127.0.0.1:{}/v1/exceptions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            admin.port()
        )
        .as_bytes(),
    );
    assert!(sneak.starts_with("HTTP/1.1 403"), "{sneak}");

    let ask = format!(
        r#"{{"task_id":"t-1","requested_hosts":["web.test","echo.test"],"requested_ports":[{},{}],"ttl_seconds":300,"reason":"the build needs it"}}"#,
        origin.port(),
        echo.addr().port()
    );
    let (status, ex) = api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(&ask));
    assert_eq!(status, 201, "{ex}");
    assert_eq!(ex["state"], "pending");
    let id = ex["id"].as_str().unwrap().to_owned();
    assert_eq!(get_status(listener, &url), "403", "pending allows nothing");

    // Attackers: no token, a wrong token, the requester approving its own request, a viewer
    // approving, another task's requester reading or asking.
    let approve = format!("/v1/exceptions/{id}/approve");
    assert_eq!(api(admin, "POST", &approve, None, None).0, 401);
    assert_eq!(api(admin, "POST", &approve, Some("tok-guess"), None).0, 401);
    assert_eq!(api(admin, "POST", &approve, Some("tok-agent"), None).0, 403);
    assert_eq!(api(admin, "POST", &approve, Some("tok-viewer"), None).0, 403);
    assert_eq!(
        api(
            admin,
            "GET",
            &format!("/v1/exceptions/{id}"),
            Some("tok-other"),
            None
        )
        .0,
        404
    );
    assert_eq!(
        api(admin, "POST", "/v1/exceptions", Some("tok-other"), Some(&ask)).0,
        403
    );

    let (status, ex) = api(
        admin,
        "POST",
        &approve,
        Some("tok-alice"),
        Some(r#"{"ttl_seconds":120}"#),
    );
    assert_eq!((status, ex["state"].as_str()), (200, Some("approved")), "{ex}");
    assert!(
        within(1, || get_status(listener, &url) == "200"),
        "the approval did not take effect within a second"
    );

    // A tunnel the exception allows, open when it is revoked.
    let target = format!("echo.test:{}", echo.addr().port());
    let mut tunnel = TcpStream::connect(listener).unwrap();
    tunnel.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tunnel
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = [0u8; 39];
    tunnel.read_exact(&mut head).unwrap();
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    tunnel.write_all(b"ping").unwrap();
    let mut pong = [0u8; 4];
    tunnel.read_exact(&mut pong).unwrap();
    let revoked_at = Instant::now();
    let (code, out, err) = cli(admin, "tok-alice", &["--json", "revoke", &id, "--note", "done"]);
    assert_eq!(code, 0, "{out}{err}");
    let ex: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(ex["state"], "revoked", "{ex}");
    // The CLI says why when the API refuses: revoking twice.
    let (code, _, err) = cli(admin, "tok-alice", &["revoke", &id]);
    assert_eq!(code, 1);
    assert!(err.contains("409") && err.contains("not approved"), "{err}");
    let mut rest = Vec::new();
    let _ = tunnel.read_to_end(&mut rest);
    assert!(
        revoked_at.elapsed() < Duration::from_secs(2),
        "the tunnel outlived the revocation"
    );
    assert_eq!(get_status(listener, &url), "403", "revoked");

    let events = p.audit_events(12);
    let lifecycle: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["exception_id"] == id.as_str())
        .map(|e| (e["event"].as_str().unwrap(), e["subject"].as_str().unwrap_or("-")))
        .collect();
    assert_eq!(
        lifecycle,
        [
            ("exception_requested", "agent-7"),
            ("exception_approved", "alice"),
            ("exception_revoked", "alice")
        ]
    );
    let rule = format!("exception:{id}");
    assert!(
        events
            .iter()
            .any(|e| e["decision"] == "allow" && e["rule"] == rule.as_str() && e["task_id"] == "t-1")
    );
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "close" && e["outcome"] == "revoked"),
        "{events:#?}"
    );
    let refused: Vec<u64> = events
        .iter()
        .filter(|e| e["event"] == "admin_refused")
        .filter_map(|e| e["status"].as_u64())
        .collect();
    assert_eq!(refused, [401, 401, 403, 403, 403], "{events:#?}");
}

#[test]
fn bounds_are_refused_with_their_reason_and_default_deny_holds() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let (listener, admin) = (free_addr(), free_addr());
    let policy = write_policy(dir.path(), listener, admin, &[443]);
    let _p = start(&dns, &policy, &dir.path().join("state"));
    let ask = |hosts: &str, ports: &str, ttl: u32, task: &str| {
        format!(
            r#"{{"task_id":"{task}","requested_hosts":[{hosts}],"requested_ports":[{ports}],"ttl_seconds":{ttl},"reason":"r"}}"#
        )
    };
    for (body, status, want) in [
        (ask(r#""*.pypi.org""#, "443", 60, "t-1"), 422, "no wildcard"),
        (ask(r#""10.0.0.1""#, "443", 60, "t-1"), 422, "no IP literal"),
        (ask(r#""https://pypi.org/x""#, "443", 60, "t-1"), 422, "not a URL"),
        (ask(r#""pypi.org""#, "22", 60, "t-1"), 422, "port 22"),
        (
            ask(r#""pypi.org""#, "443", 601, "t-1"),
            422,
            "over the limit of 600",
        ),
        ("{\"task_id\": 5}".to_owned(), 400, ""),
    ] {
        let (got, err) = api(admin, "POST", "/v1/exceptions", Some("tok-alice"), Some(&body));
        assert_eq!(got, status, "{body}: {err}");
        assert!(
            err["error"].as_str().unwrap_or("").contains(want),
            "{body}: {err}"
        );
    }
    let (got, err) = api(
        admin,
        "POST",
        "/v1/exceptions",
        Some("tok-alice"),
        Some(&ask(r#""pypi.org""#, "443", 60, "t-9")),
    );
    assert_eq!(got, 403, "not enabled for t-9: {err}");
    assert!(err["error"].as_str().unwrap().contains("not enabled"), "{err}");
}

#[test]
fn a_restart_keeps_pending_and_active_exceptions_and_not_expired_ones() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let (listener, admin) = (free_addr(), free_addr());
    let policy = write_policy(dir.path(), listener, admin, &[origin.port()]);
    let state = dir.path().join("state");
    let ask = |ttl: u32| {
        format!(
            r#"{{"task_id":"t-1","requested_hosts":["web.test"],"requested_ports":[{}],"ttl_seconds":{ttl},"reason":"r"}}"#,
            origin.port()
        )
    };
    let mut p = start(&dns, &policy, &state);
    let id_of = |v: Value| v["id"].as_str().unwrap().to_owned();
    let active = id_of(
        api(
            admin,
            "POST",
            "/v1/exceptions",
            Some("tok-agent"),
            Some(&ask(300)),
        )
        .1,
    );
    let short = id_of(api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(&ask(1))).1);
    let pending = id_of(api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(&ask(60))).1);
    for id in [&active, &short] {
        assert_eq!(
            api(
                admin,
                "POST",
                &format!("/v1/exceptions/{id}/approve"),
                Some("tok-alice"),
                None
            )
            .0,
            200
        );
    }
    assert!(p.terminate().success());
    std::thread::sleep(Duration::from_millis(1100));
    let _p = start(&dns, &policy, &state);
    let state_of = |id: &str| {
        api(
            admin,
            "GET",
            &format!("/v1/exceptions/{id}"),
            Some("tok-viewer"),
            None,
        )
        .1["state"]
            .clone()
    };
    assert_eq!(state_of(&active), "approved");
    assert_eq!(state_of(&short), "expired");
    assert_eq!(state_of(&pending), "pending");
    let url = format!("http://web.test:{}/", origin.port());
    assert_eq!(
        get_status(listener, &url),
        "200",
        "the active exception came back"
    );
}

/// The approvals page in headless Chromium (Selenium): log in, see a pending request appear
/// without reloading, approve it with a TTL choice, watch the countdown, revoke.
#[test]
fn the_approvals_page_in_a_real_browser() {
    let python = std::env::var("SANDGATE_TEST_PYTHON")
        .expect("run ./scripts/test: it installs selenium into target/venv");
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let (listener, admin) = (free_addr(), free_addr());
    let policy = write_policy(dir.path(), listener, admin, &[origin.port()]);
    let p = start(&dns, &policy, &dir.path().join("state"));
    let shot = dir.path().join("approvals.png");
    let out = Command::new(python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui/approvals.py"))
        .arg(format!("http://{admin}"))
        .args(["tok-alice", "tok-agent"])
        .arg(&shot)
        .arg(origin.port().to_string())
        .arg(listener.to_string())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.starts_with("OK"),
        "{stdout}\n{stderr}"
    );
    assert!(std::fs::metadata(&shot).unwrap().len() > 1000, "no screenshot");
    if let Ok(keep) = std::env::var("SANDGATE_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
    let events = p.audit_events(3);
    let changes: Vec<&str> = events
        .iter()
        .filter(|e| e["exception_id"].is_string())
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        changes,
        ["exception_requested", "exception_approved", "exception_revoked"],
        "{events:#?}"
    );
}

/// The approvals page's forms refuse a forged or stale CSRF token, and a requester token
/// cannot log in.
#[test]
fn the_approvals_page_refuses_forged_forms_and_requesters() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let (listener, admin) = (free_addr(), free_addr());
    let policy = write_policy(dir.path(), listener, admin, &[443]);
    let _p = start(&dns, &policy, &dir.path().join("state"));
    let ask = r#"{"task_id":"t-1","requested_hosts":["pypi.org"],"requested_ports":[443],"ttl_seconds":60,"reason":"r"}"#;
    let (_, ex) = api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(ask));
    let id = ex["id"].as_str().unwrap();
    let jar = dir.path().join("cookies");
    let curl = |args: &[&str]| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "--noproxy",
                "*",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg("-b")
            .arg(&jar)
            .arg("-c")
            .arg(&jar)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let base = format!("http://{admin}");
    assert_eq!(
        curl(&["--data", "token=tok-agent", &format!("{base}/ui/login")]),
        "401"
    );
    assert_eq!(
        curl(&["--data", "token=tok-alice", &format!("{base}/ui/login")]),
        "303"
    );
    let cookie = std::fs::read_to_string(&jar).unwrap();
    assert!(
        cookie.contains("#HttpOnly_") && cookie.contains("sandgate_session"),
        "{cookie}"
    );
    assert_eq!(
        curl(&["--data", "csrf=forged", &format!("{base}/ui/approve/{id}")]),
        "403"
    );
    assert_eq!(curl(&[&format!("{base}/ui/state")]), "200");
    assert_eq!(
        api(
            admin,
            "GET",
            &format!("/v1/exceptions/{id}"),
            Some("tok-viewer"),
            None
        )
        .1["state"],
        "pending"
    );
}

/// `/v1/events` streams audit events live: a deny and an exception change arrive as they
/// happen; a requester's stream carries its own tasks' events only.
#[test]
fn live_events_stream_denies_and_exception_changes() {
    use std::io::BufRead;
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let (listener, admin) = (free_addr(), free_addr());
    let policy = write_policy(dir.path(), listener, admin, &[origin.port()]);
    let _p = start(&dns, &policy, &dir.path().join("state"));
    let subscribe = |token: &str| {
        let mut child = Command::new("curl")
            .args(["-sN", "--max-time", "20", "--noproxy", "*", "-H"])
            .arg(format!("Authorization: Bearer {token}"))
            .arg(format!("http://{admin}/v1/events"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                if let Some(data) = l.strip_prefix("data:")
                    && tx.send(data.trim().to_owned()).is_err()
                {
                    break;
                }
            }
        });
        (child, rx)
    };
    let (mut viewer, seen) = subscribe("tok-viewer");
    let (mut other, others) = subscribe("tok-other");
    std::thread::sleep(Duration::from_millis(300));
    let url = format!("http://web.test:{}/", origin.port());
    assert_eq!(get_status(listener, &url), "403");
    let ask = format!(
        r#"{{"task_id":"t-1","requested_hosts":["web.test"],"requested_ports":[{}],"ttl_seconds":60,"reason":"r"}}"#,
        origin.port()
    );
    assert_eq!(
        api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(&ask)).0,
        201
    );
    let mut kinds = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while kinds.len() < 2 && Instant::now() < deadline {
        if let Ok(line) = seen.recv_timeout(Duration::from_millis(200)) {
            let v: Value = serde_json::from_str(&line).unwrap();
            kinds.push((
                v["event"].as_str().unwrap().to_owned(),
                v["decision"].as_str().unwrap_or("").to_owned(),
            ));
        }
    }
    assert_eq!(
        kinds,
        [
            ("decision".to_owned(), "deny".to_owned()),
            ("exception_requested".to_owned(), String::new())
        ]
    );
    assert!(
        others.recv_timeout(Duration::from_millis(500)).is_err(),
        "another task's requester saw t-1's events"
    );
    let _ = viewer.kill();
    let _ = other.kill();
    let _ = viewer.wait();
    let _ = other.wait();
}
