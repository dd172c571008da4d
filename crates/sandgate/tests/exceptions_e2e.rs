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
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::control::{api, cli, get_status, start, task_and_admin, within, write_policy};
use common::runtime;
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use sandgate_testkit::origin::Origin;
use serde_json::Value;

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
    let policy = write_policy(dir.path(), &[origin.port(), echo.addr().port()]);
    let state = dir.path().join("state");
    let p = start(&dns, &policy, &state);
    let (listener, admin) = task_and_admin(&p);
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

    // A kept-alive connection with a request the exception allowed...
    let mut kept = TcpStream::connect(listener).unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    kept.write_all(format!("GET {url} HTTP/1.1\r\nHost: web.test\r\n\r\n").as_bytes())
        .unwrap();
    let mut first = [0u8; 12];
    kept.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let mut drain = [0u8; 4096];
    let _ = kept.read(&mut drain);
    // ...and a tunnel the exception allows, both open when it is revoked.
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
    let mut after = Vec::new();
    let _ = kept.read_to_end(&mut after);
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
    let policy = write_policy(dir.path(), &[443]);
    let p = start(&dns, &policy, &dir.path().join("state"));
    let admin = p.admin();
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

/// The attacker needs no token: each refused call goes on record, so a call with a 60 KB
/// path, or a 403 that quotes a 100 KB task id back, would write that much per call into
/// the audit log (pushing earlier traffic out of rotation) and hold it in the live event
/// ring. What a refused call records is bounded.
#[test]
fn a_refused_call_records_a_bounded_line_whatever_the_caller_sends() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), &[443]);
    let p = start(&dns, &policy, &dir.path().join("state"));
    let admin = p.admin();
    let long_path = format!("/v1/exceptions/{}", "A".repeat(60_000));
    let (status, _) = api(admin, "GET", &long_path, None, None);
    assert_eq!(status, 401);
    let task = "t".repeat(100_000);
    let body = format!(
        r#"{{"task_id":"{task}","requested_hosts":["pypi.org"],"requested_ports":[443],"ttl_seconds":60,"reason":"r"}}"#
    );
    let body_file = dir.path().join("body.json");
    std::fs::write(&body_file, &body).unwrap();
    let (status, _) = api(
        admin,
        "POST",
        "/v1/exceptions",
        Some("tok-agent"),
        Some(&format!("@{}", body_file.display())),
    );
    assert_eq!(status, 403, "an agent may not ask for another task");
    let events = p.audit_events(2);
    let refused: Vec<&Value> = events.iter().filter(|e| e["event"] == "admin_refused").collect();
    assert_eq!(refused.len(), 2, "{events:#?}");
    for e in refused {
        let line = e.to_string();
        assert!(line.len() < 2048, "a {} byte line: {}", line.len(), &line[..300]);
    }
}

#[test]
fn a_restart_keeps_pending_and_active_exceptions_and_not_expired_ones() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), &[origin.port()]);
    let state = dir.path().join("state");
    // Three hosts: an identical request would return the pending one instead of a second.
    let ask = |host: &str, ttl: u32| {
        format!(
            r#"{{"task_id":"t-1","requested_hosts":["{host}"],"requested_ports":[{}],"ttl_seconds":{ttl},"reason":"r"}}"#,
            origin.port()
        )
    };
    let mut p = start(&dns, &policy, &state);
    let admin = p.admin();
    let id_of = |v: Value| v["id"].as_str().unwrap().to_owned();
    let active = id_of(
        api(
            admin,
            "POST",
            "/v1/exceptions",
            Some("tok-agent"),
            Some(&ask("web.test", 300)),
        )
        .1,
    );
    let short = id_of(
        api(
            admin,
            "POST",
            "/v1/exceptions",
            Some("tok-agent"),
            Some(&ask("short.test", 1)),
        )
        .1,
    );
    let pending = id_of(
        api(
            admin,
            "POST",
            "/v1/exceptions",
            Some("tok-agent"),
            Some(&ask("pending.test", 60)),
        )
        .1,
    );
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
    // A new process, new ports.
    let p = start(&dns, &policy, &state);
    let (listener, admin) = task_and_admin(&p);
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

/// Review findings: an exception's tunnel ends when it expires; a requester cannot claim a
/// project to reach an enabled scope; an approver approving its own request is refused and
/// on record.
#[test]
fn expiry_cuts_tunnels_claims_and_self_approval_are_refused() {
    let rt = runtime();
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("echo.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), &[echo.addr().port()]);
    let p = start(&dns, &policy, &dir.path().join("state"));
    let (listener, admin) = task_and_admin(&p);
    let port = echo.addr().port();
    let ask = |project: &str| {
        format!(
            r#"{{"task_id":"t-1",{project}"requested_hosts":["echo.test"],"requested_ports":[{port}],"ttl_seconds":60,"reason":"r"}}"#
        )
    };
    let (status, err) = api(
        admin,
        "POST",
        "/v1/exceptions",
        Some("tok-agent"),
        Some(&ask(r#""project_id":"p-9","#)),
    );
    assert_eq!(status, 403, "a claimed project: {err}");
    // Another host than the agent's below, which would otherwise be answered with this one.
    let theirs = ask("").replace("echo.test", "mine.test");
    let (_, mine) = api(admin, "POST", "/v1/exceptions", Some("tok-alice"), Some(&theirs));
    let mine = mine["id"].as_str().unwrap();
    assert_eq!(
        api(
            admin,
            "POST",
            &format!("/v1/exceptions/{mine}/approve"),
            Some("tok-alice"),
            None
        )
        .0,
        403
    );
    let (_, ex) = api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(&ask("")));
    let id = ex["id"].as_str().unwrap();
    let (status, ex) = api(
        admin,
        "POST",
        &format!("/v1/exceptions/{id}/approve"),
        Some("tok-alice"),
        Some(r#"{"ttl_seconds":2}"#),
    );
    assert_eq!(status, 200, "{ex}");
    let target = format!("echo.test:{port}");
    let mut tunnel = TcpStream::connect(listener).unwrap();
    tunnel.set_read_timeout(Some(Duration::from_secs(6))).unwrap();
    tunnel
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = [0u8; 39];
    tunnel.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"));
    let opened = Instant::now();
    let mut rest = Vec::new();
    let _ = tunnel.read_to_end(&mut rest);
    assert!(
        opened.elapsed() < Duration::from_secs(4),
        "the tunnel outlived its exception's expiry"
    );
    let events = p.audit_events(8);
    let refused: Vec<u64> = events
        .iter()
        .filter(|e| e["event"] == "admin_refused")
        .filter_map(|e| e["status"].as_u64())
        .collect();
    assert_eq!(
        refused,
        [403, 403],
        "the claim and the self-approval are on record: {events:#?}"
    );
    assert!(
        events.iter().any(|e| e["event"] == "exception_expired"),
        "{events:#?}"
    );
}

/// `sandgate exceptions ARGS` with neither SANDGATE_ADMIN nor SANDGATE_TOKEN set (nor
/// COLUMNS): everything from the flags, wherever they stand.
fn cli_flags(args: &[&str], token: Option<&str>) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(common::sandgate_bin());
    cmd.arg("exceptions")
        .args(args)
        .env_remove("SANDGATE_ADMIN")
        .env_remove("SANDGATE_TOKEN")
        .env_remove("COLUMNS");
    if let Some(t) = token {
        cmd.env("SANDGATE_TOKEN", t);
    }
    common::outcome(&mut cmd)
}

/// An RFC 3339 time within a minute of now, as the audit log writes it.
fn is_now(v: &Value) -> bool {
    let Some(text) = v.as_str() else { return false };
    let Ok(t) = text.parse::<jiff::Timestamp>() else {
        return false;
    };
    text.ends_with('Z') && (jiff::Timestamp::now().as_second() - t.as_second()).abs() < 60
}

/// The approver's day with the CLI, as issue 31 found it wanting: flags after the
/// subcommand, the reason and TTL in the list, every field in `show`, RFC 3339 times that
/// the library's `Exception` reads back, and a missing, unknown or underpowered token that
/// says what to do. And the requester who tries to set a time of its own.
#[test]
fn the_approvers_cli_takes_flags_anywhere_and_says_what_to_fix() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), &[443]);
    let p = start(&dns, &policy, &dir.path().join("state"));
    let admin = p.admin();
    let url = format!("http://{admin}");
    let token_file = |name: &str, token: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{token}\n")).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (agent, alice, viewer) = (
        token_file("agent.token", "tok-agent"),
        token_file("alice.token", "tok-alice"),
        token_file("viewer.token", "tok-viewer"),
    );
    let reason = format!(
        "pip install of the pinned wheel, {}\nsecond line",
        "ünïcödé ".repeat(8)
    );

    // A request, its flags after the subcommand.
    let (code, out, err) = cli_flags(
        &[
            "request",
            "--task",
            "t-1",
            "--host",
            "pypi.org",
            "--port",
            "443",
            "--ttl",
            "600",
            "--reason",
            &reason,
            "--json",
            "--admin",
            &url,
            "--token-file",
            &agent,
        ],
        None,
    );
    assert_eq!(code, 0, "{out}{err}");
    let filed: Value = serde_json::from_str(&out).unwrap();
    let id = filed["id"].as_str().unwrap().to_owned();
    assert!(is_now(&filed["requested_at"]), "{filed}");

    // Both positions, and a mix, give the same list.
    let after = cli_flags(&["list", "--json", "--admin", &url, "--token-file", &alice], None);
    let before = cli_flags(&["--json", "--admin", &url, "--token-file", &alice, "list"], None);
    let mixed = cli_flags(&["--admin", &url, "list", "--json"], Some("tok-alice"));
    assert_eq!(after.0, 0, "{after:?}");
    assert_eq!(after, before);
    assert_eq!(after, mixed);
    // The API's JSON is what the library's type reads (a follower does exactly this).
    let listed: Vec<sandgate_policy::Exception> = serde_json::from_str(&after.1).unwrap();
    assert_eq!((listed.len(), listed[0].id.as_str()), (1, id.as_str()));
    assert_eq!(listed[0].reason, reason);

    // The table: headers, the TTL, the reason cut on a character boundary, one line each.
    let (code, table, err) = cli_flags(&["list", "--admin", &url], Some("tok-viewer"));
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "a line break in the reason adds no line:\n{table}"
    );
    for header in [
        "ID",
        "STATE",
        "TASK",
        "HOSTS",
        "PORTS",
        "TTL",
        "EXPIRES",
        "REQUESTED BY",
        "REASON",
    ] {
        assert!(lines[0].contains(header), "{header}:\n{table}");
    }
    assert!(lines[1].contains(&id) && lines[1].contains(" 10m "), "{table}");
    assert!(
        lines[1].contains("pip install of the pinned wheel") && lines[1].ends_with('…'),
        "{table}"
    );

    // show: every field on a line of its own, the reason whole (its line break shown as \n).
    let (code, shown, err) = cli_flags(&["show", &id, "--admin", &url, "--token-file", &viewer], None);
    assert_eq!(code, 0, "{err}");
    for field in [
        "id",
        "state",
        "task_id",
        "project_id",
        "hosts",
        "ports",
        "ttl_seconds",
        "reason",
        "requested_by",
        "requested_at",
        "decided_by",
        "decided_at",
        "note",
        "expires_at",
    ] {
        assert_eq!(
            shown
                .lines()
                .filter(|l| l.starts_with(&format!("{field}: ")))
                .count(),
            1,
            "{field}:\n{shown}"
        );
    }
    assert!(
        shown.contains(&format!("\nreason: {}\n", reason.replace('\n', "\\n"))),
        "{shown}"
    );
    assert!(
        shown.contains("\nttl_seconds: 600\n") && shown.contains("\nrequested_by: agent-7\n"),
        "{shown}"
    );

    // Approved with the flags after the id: every time RFC 3339, in the CLI's JSON too.
    let (code, out, err) = cli_flags(
        &[
            "approve",
            &id,
            "--ttl",
            "300",
            "--admin",
            &url,
            "--token-file",
            &alice,
            "--json",
        ],
        None,
    );
    assert_eq!(code, 0, "{out}{err}");
    let ex: Value = serde_json::from_str(&out).unwrap();
    for field in ["requested_at", "decided_at"] {
        assert!(is_now(&ex[field]), "{field}: {ex}");
    }
    let (requested, expires) = (
        ex["decided_at"].as_str().unwrap(),
        ex["expires_at"].as_str().unwrap(),
    );
    let span = expires.parse::<jiff::Timestamp>().unwrap().as_second()
        - requested.parse::<jiff::Timestamp>().unwrap().as_second();
    assert_eq!(span, 300, "{ex}");
    let (_, shown, _) = cli_flags(&["show", &id, "--admin", &url], Some("tok-alice"));
    assert!(shown.contains(&format!("\nexpires_at: {expires}\n")), "{shown}");

    // No token: what to set, before anything is sent (exit 64).
    let (code, _, err) = cli_flags(&["list", "--admin", &url], None);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("SANDGATE_TOKEN") && err.contains("--token-file"),
        "{err}"
    );
    let empty = token_file("empty.token", " ");
    let (code, _, err) = cli_flags(&["list", "--admin", &url, "--token-file", &empty], None);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("empty") && err.contains("SANDGATE_TOKEN"), "{err}");
    // A token the API does not know: 401, and which token that was and what to set.
    let (code, _, err) = cli_flags(&["list", "--admin", &url], Some("tok-guess"));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("401") && err.contains("token from SANDGATE_TOKEN") && err.contains("--token-file"),
        "{err}"
    );
    let guess = token_file("guess.token", "tok-guess");
    let (code, _, err) = cli_flags(&["list", "--admin", &url, "--token-file", &guess], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("{guess} (--token-file)")), "{err}");
    // The wrong role: the role the call needs.
    let (code, _, err) = cli_flags(&["revoke", &id, "--admin", &url, "--token-file", &viewer], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("403") && err.contains("approver role"), "{err}");
    let (code, _, err) = cli_flags(
        &[
            "request", "--task", "t-1", "--host", "x.test", "--ttl", "60", "--reason", "r", "--admin", &url,
        ],
        Some("tok-viewer"),
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("403") && err.contains("requester role"), "{err}");
    let refused = || -> Vec<u64> {
        p.audit_events(0)
            .iter()
            .filter(|e| e["event"] == "admin_refused")
            .filter_map(|e| e["status"].as_u64())
            .collect()
    };
    within(5, || refused().len() >= 4);
    assert_eq!(refused(), [401, 401, 403, 403], "the missing tokens sent nothing");

    // A requester cannot set a time: a body naming one is refused, saying which field.
    for (path, body) in [
        (
            "/v1/exceptions".to_owned(),
            r#"{"task_id":"t-1","requested_hosts":["pypi.org"],"ttl_seconds":60,"reason":"r","expires_at":"2099-01-01T00:00:00Z"}"#,
        ),
        (
            "/v1/exceptions".to_owned(),
            r#"{"task_id":"t-1","requested_hosts":["pypi.org"],"ttl_seconds":"2099-01-01T00:00:00Z","reason":"r"}"#,
        ),
        (
            format!("/v1/exceptions/{id}/approve"),
            r#"{"expires_at":4102444800}"#,
        ),
    ] {
        let (status, err) = api(admin, "POST", &path, Some("tok-alice"), Some(body));
        assert_eq!(status, 400, "{body}: {err}");
        let message = err["error"].as_str().unwrap_or_default();
        assert!(
            message.contains("expires_at") || message.contains("ttl_seconds"),
            "{body}: {err}"
        );
    }
}
