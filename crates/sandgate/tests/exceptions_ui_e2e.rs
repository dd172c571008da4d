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

use common::control::{api, get_status, start, task_and_admin, within, write_policy};
use common::runtime;
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;
use serde_json::Value;

/// The approvals page in headless Chromium (Selenium), as an approver uses it: a live deny,
/// a request appearing without a reload, approve with a TTL choice, revoke with a note after
/// a confirmation, deny with a note, allow a live deny for five minutes in one click (and
/// the next request passes), a tweak listed in words, narrowed on the page (a wider
/// workspace refused) and approved, then revoked with a note after a confirmation, then a
/// viewer's page with no action; all in place, the page never reloaded. One screenshot per
/// step under `target/tmp/approvals-screenshots/`.
#[test]
fn the_approvals_page_in_a_real_browser() {
    let python = common::python();
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let zone = Zone::new()
        .with("web.test", &["127.0.0.1"])
        .with("other.test", &["127.0.0.1"]);
    let dns = rt.block_on(DnsServer::start(zone));
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), &[origin.port()]);
    let p = start(&dns, &policy, &dir.path().join("state"));
    let (listener, admin) = task_and_admin(&p);
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("approvals-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    let out = Command::new(python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui/approvals.py"))
        .arg(format!("http://{admin}"))
        .args(["tok-alice", "tok-agent", "tok-viewer"])
        .arg(&shots)
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
    println!("screenshots in {}:\n{stdout}", shots.display());
    let taken: Vec<_> = std::fs::read_dir(&shots).unwrap().map(Result::unwrap).collect();
    assert_eq!(taken.len(), 13, "{taken:?}");
    assert!(
        taken.iter().all(|f| f.metadata().unwrap().len() > 1000),
        "an empty screenshot"
    );
    let events = p.audit_events(7);
    let changes: Vec<(&str, &str, &str)> = events
        .iter()
        .filter(|e| e["exception_id"].is_string())
        .map(|e| {
            (
                e["event"].as_str().unwrap(),
                e["subject"].as_str().unwrap_or(""),
                e["requested_by"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("exception_requested", "agent-7", "agent-7"),
            ("exception_approved", "alice", "agent-7"),
            ("exception_requested", "agent-7", "agent-7"),
            ("exception_revoked", "alice", "agent-7"),
            ("exception_denied", "alice", "agent-7"),
            // The one-click allow: a request and an approval, both alice's.
            ("exception_requested", "alice", "alice"),
            ("exception_approved", "alice", "alice"),
            // The tweak: asked, approved narrowed, revoked.
            ("exception_requested", "agent-7", "agent-7"),
            ("exception_approved", "alice", "agent-7"),
            ("exception_revoked", "alice", "agent-7"),
        ],
        "{events:#?}"
    );
    let tweaks: Vec<(&str, &str)> = events
        .iter()
        .filter_map(|e| Some((e["event"].as_str()?, e["tweak"].as_str()?)))
        .collect();
    let narrowed = "sandbox=web max_seconds=30 max_output_bytes=1048576 workspace=/srv/work/build";
    assert_eq!(
        tweaks,
        [
            (
                "exception_requested",
                "sandbox=web max_seconds=120 max_output_bytes=10485760 network workspace=/srv/work"
            ),
            ("exception_approved", narrowed),
            ("exception_revoked", narrowed),
        ],
        "what is on record as approved is the narrowed tweak: {events:#?}"
    );
    let passed = events.iter().any(|e| {
        e["event"] == "decision"
            && e["decision"] == "allow"
            && e["rule"].as_str().is_some_and(|r| r.starts_with("exception:"))
    });
    assert!(
        passed,
        "the request after the allow passed by the exception: {events:#?}"
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
    // A stream sends nothing, not even its status line, before its first event; so denies
    // go through until the viewer's stream shows one: then it is subscribed (the other,
    // started with it, is given a moment more), and what it saw is set aside.
    let probe = format!("http://web.test:{}/probe", origin.port());
    let subscribed = within(10, || {
        assert_eq!(get_status(listener, &probe), "403");
        seen.recv_timeout(Duration::from_millis(200)).is_ok()
    });
    assert!(subscribed, "the viewer's stream never started");
    std::thread::sleep(Duration::from_millis(300));
    while seen.recv_timeout(Duration::from_millis(200)).is_ok() {}
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

/// A page session as curl keeps it: a cookie jar, logged in with `token`, and the page's
/// CSRF token.
struct PageSession {
    base: String,
    jar: std::path::PathBuf,
    csrf: String,
}

impl PageSession {
    fn login(admin: std::net::SocketAddr, dir: &std::path::Path, token: &str) -> PageSession {
        let base = format!("http://{admin}");
        let jar = dir.join(format!("jar-{token}"));
        let mut s = PageSession {
            base,
            jar,
            csrf: String::new(),
        };
        let (status, _) = s.call(&["--data", &format!("token={token}")], "/ui/login");
        assert_eq!(status, 303, "login as {token}");
        let (status, page) = s.call(&[], "/ui");
        assert_eq!(status, 200);
        let (_, rest) = page
            .split_once("name=sandgate-csrf content=\"")
            .expect("a CSRF token in the page");
        s.csrf = rest.split('"').next().unwrap().to_owned();
        assert_eq!(s.csrf.len(), 32, "{page}");
        s
    }

    /// curl with the jar: (status, body).
    fn call(&self, args: &[&str], path: &str) -> (u16, String) {
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "--noproxy",
                "*",
                "-o",
                "-",
                "-w",
                "\n%{http_code}",
            ])
            .arg("-b")
            .arg(&self.jar)
            .arg("-c")
            .arg(&self.jar)
            .args(args)
            .arg(format!("{}{path}", self.base))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap();
        (status.parse().unwrap(), body.to_owned())
    }

    /// POSTs the one-click allow: (status, JSON answer).
    fn allow(&self, fields: &str) -> (u16, Value) {
        let (status, body) = self.call(&["--data", fields], "/ui/allow");
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }
}

/// As attackers against the one-click allow: no session, no or a forged CSRF token, a
/// viewer's session, and a host, port, TTL or task outside the policy's bounds are each
/// refused, with the rule named, and nothing is stored; the refusals by role and by CSRF
/// token are on record. The approver's own allow, within bounds, passes.
#[test]
fn the_one_click_allow_refuses_what_it_must() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), &[443]);
    let p = start(&dns, &policy, &dir.path().join("state"));
    let admin = p.admin();
    let alice = PageSession::login(admin, dir.path(), "tok-alice");
    let victor = PageSession::login(admin, dir.path(), "tok-viewer");
    let (_, page) = alice.call(&[], "/ui");
    assert!(
        page.contains("<noscript>") && page.contains("This page needs JavaScript"),
        "{page}"
    );
    let good = "task=t-1&host=pypi.org&port=443&ttl=300&request_id=req-1";
    let nobody = PageSession {
        base: alice.base.clone(),
        jar: dir.path().join("empty-jar"),
        csrf: String::new(),
    };
    assert_eq!(
        nobody.allow(&format!("csrf={}&{good}", alice.csrf)).0,
        401,
        "no session"
    );
    assert_eq!(alice.allow(good).0, 403, "no CSRF token");
    assert_eq!(
        alice.allow(&format!("csrf=forged&{good}")).0,
        403,
        "a forged CSRF token"
    );
    assert_eq!(
        alice.allow(&format!("csrf={}&{good}", victor.csrf)).0,
        403,
        "another session's CSRF token"
    );
    let (status, body) = victor.allow(&format!("csrf={}&{good}", victor.csrf));
    assert_eq!(status, 403, "a viewer: {body}");
    assert!(body["error"].as_str().unwrap().contains("viewer role"), "{body}");
    for (fields, want, why) in [
        (
            "task=t-1&host=pypi.org&port=8080&ttl=300",
            422,
            "port 8080 is not allowed",
        ),
        (
            "task=t-1&host=pypi.org&port=443&ttl=3600",
            422,
            "over the limit of 600",
        ),
        ("task=t-1&host=10.0.0.1&port=443&ttl=300", 422, "no IP literal"),
        ("task=t-1&host=%2A.pypi.org&port=443&ttl=300", 422, "no wildcard"),
        (
            "task=t-2&host=pypi.org&port=443&ttl=300",
            403,
            "not enabled for task",
        ),
        (
            "task=t-1&host=pypi.org&port=99999&ttl=300",
            422,
            "port: a whole number",
        ),
    ] {
        let (status, body) = alice.allow(&format!("csrf={}&{fields}", alice.csrf));
        assert_eq!(status, want, "{fields}: {body}");
        assert!(body["error"].as_str().unwrap().contains(why), "{fields}: {body}");
    }
    let (_, all) = api(admin, "GET", "/v1/exceptions", Some("tok-alice"), None);
    assert_eq!(all, Value::Array(vec![]), "nothing was stored");
    let (status, body) = alice.allow(&format!("csrf={}&{good}", alice.csrf));
    assert_eq!(status, 200, "{body}");
    let ex = &body["exception"];
    assert_eq!(
        (
            ex["state"].as_str(),
            ex["requested_by"].as_str(),
            ex["decided_by"].as_str()
        ),
        (Some("approved"), Some("alice"), Some("alice")),
        "{body}"
    );
    assert!(
        ex["reason"]
            .as_str()
            .unwrap()
            .contains("after a deny (request req-1)"),
        "{body}"
    );
    let (_, again) = alice.allow(&format!("csrf={}&{good}", alice.csrf));
    assert_eq!(
        (again["existing"].as_bool(), &again["exception"]["id"]),
        (Some(true), &ex["id"])
    );
    let events = p.audit_events(1);
    let refused: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["event"] == "admin_refused" && e["method"] == "POST /ui/allow")
        .map(|e| {
            (
                e["subject"].as_str().unwrap_or(""),
                e["status"]
                    .as_u64()
                    .map_or("", |s| if s == 403 { "403" } else { "?" }),
            )
        })
        .collect();
    assert_eq!(
        refused,
        [
            ("alice", "403"),
            ("alice", "403"),
            ("alice", "403"),
            ("victor", "403"),
            ("alice", "403")
        ],
        "the CSRF refusals, the viewer's, and the task not enabled: {events:#?}"
    );
}

/// As an agent: 50 identical requests, 40 of them at once, file one pending request. The
/// first is answered 201, every other 200 with the same exception; once it is approved, the
/// same request is answered 200 with the active exception.
#[test]
fn an_agents_duplicate_requests_cannot_pile_up() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), &[443]);
    let p = start(&dns, &policy, &dir.path().join("state"));
    let admin = p.admin();
    let ask = r#"{"task_id":"t-1","requested_hosts":["pypi.org"],"requested_ports":[443],"ttl_seconds":60,"reason":"pip"}"#;
    let at_once: Vec<_> = (0..40)
        .map(|_| {
            std::thread::spawn(move || api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(ask)))
        })
        .collect();
    let mut answers: Vec<(u16, Value)> = at_once.into_iter().map(|t| t.join().unwrap()).collect();
    for _ in 0..10 {
        answers.push(api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(ask)));
    }
    let created = answers.iter().filter(|(s, _)| *s == 201).count();
    assert_eq!(created, 1, "{answers:?}");
    assert!(answers.iter().all(|(s, _)| *s == 201 || *s == 200), "{answers:?}");
    let id = answers[0].1["id"].as_str().unwrap().to_owned();
    assert!(
        answers.iter().all(|(_, ex)| ex["id"] == id.as_str()),
        "{answers:?}"
    );
    let (_, all) = api(admin, "GET", "/v1/exceptions", Some("tok-alice"), None);
    assert_eq!(all.as_array().unwrap().len(), 1, "{all}");
    let approve = format!("/v1/exceptions/{id}/approve");
    assert_eq!(api(admin, "POST", &approve, Some("tok-alice"), None).0, 200);
    let (status, ex) = api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(ask));
    assert_eq!(
        (status, ex["id"].as_str(), ex["state"].as_str()),
        (200, Some(id.as_str()), Some("approved"))
    );
}
