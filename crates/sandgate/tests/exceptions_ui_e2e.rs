//! The approvals page and the live event stream: in headless Chromium driven by Selenium
//! (Debian's chromium and chromium-driver, Python's selenium in target/venv), against forged
//! forms and requester logins with curl, and `/v1/events` read as a client would.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::control::{api, get_status, start, task_and_admin, write_policy};
use common::runtime;
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;
use serde_json::Value;

/// The approvals page in headless Chromium (Selenium): log in, see a pending request appear
/// without reloading, approve it with a TTL choice, watch the countdown, revoke.
#[test]
fn the_approvals_page_in_a_real_browser() {
    let python = common::python();
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), &[origin.port()]);
    let p = start(&dns, &policy, &dir.path().join("state"));
    let (listener, admin) = task_and_admin(&p);
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
    let policy = write_policy(dir.path(), &[443]);
    let p = start(&dns, &policy, &dir.path().join("state"));
    let admin = p.admin();
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
    let policy = write_policy(dir.path(), &[origin.port()]);
    let p = start(&dns, &policy, &dir.path().join("state"));
    let (listener, admin) = task_and_admin(&p);
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
