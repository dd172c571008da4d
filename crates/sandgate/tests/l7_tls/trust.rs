//! Which certificates each side of a tunnel sees, and how interception fails closed: a
//! tunnel to a host whose entry has no rules (or that also has an entry without rules) is
//! relayed, its client seeing the origin's own certificate, while one to a host only entries
//! with rules allow sees a leaf of the proxy's CA (HTTP/1.1 by ALPN); a client that trusts
//! only the origin's CA (pinning) fails its handshake, recorded as the client's failure with
//! no request inside; an upstream whose certificate the proxy's roots do not vouch for, or
//! that names another host, answers 502 inside the tunnel; a proxy with no roots at all does
//! not start, and one without a CA refuses the tunnel.

use std::process::{Command, Stdio};
use std::time::Duration;

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::{TestCa, cert_der};

use super::{close_of, connect_decision, inside, intercepting, pem_file, tls_through};
use crate::common::world::{World, proxy};
use crate::common::{curl, exit_of, read_audit, sandgate_bin};
use crate::l7::decisions::decision;
use crate::l7::wire::Conn;
use crate::l7::{egress_policy, entry};

#[test]
fn a_tunnel_without_rules_shows_the_origins_certificate_and_one_with_rules_the_proxys() {
    let w = World::new();
    let ca = TestCa::new(&["open.test", "both.test", "l7.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("open.test", &["127.0.0.1"])
            .with("both.test", &["127.0.0.1"])
            .with("l7.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let entries = [
        entry("open.test", port, &[]),
        entry("both.test", port, &["read_only: true"]),
        entry("both.test", port, &[]),
        entry("l7.test", port, &["read_only: true"]),
    ]
    .concat();
    let (policy, _) = egress_policy(dir.path(), &entries);
    let i = intercepting(&dns, &policy, &roots);
    let (addr, audit) = (i.proxy.addr, &i.proxy.audit_path);
    let origin_leaf = cert_der(&ca.leaf_pem);

    // No rules, or an entry without them beside one with them (entries add up): the
    // client, trusting only the origin's CA, gets the origin's own leaf, and may write.
    for host in ["open.test", "both.test"] {
        let blind = tls_through(addr, &format!("{host}:{port}"), host, &ca.ca_pem)
            .unwrap_or_else(|e| panic!("the blind tunnel to {host}: {e}"));
        assert_eq!(blind.peer_certificate(), Some(origin_leaf.clone()));
        let reply = Conn::over(blind).exchange("POST", "/blind", &format!("{host}:{port}"), true);
        assert_eq!(reply.status, 200, "{host}: {reply:?}");
    }

    // Rules: the origin's CA does not vouch for what the client gets...
    let refused = tls_through(addr, &format!("l7.test:{port}"), "l7.test", &ca.ca_pem)
        .expect_err("the intercepted tunnel showed a certificate of the origin's CA");
    assert!(refused.contains("UnknownIssuer"), "{refused}");
    // ...the proxy's CA alone does: another certificate than the origin's, HTTP/1.1.
    let seen = tls_through(addr, &format!("l7.test:{port}"), "l7.test", &i.ca_pem)
        .unwrap_or_else(|e| panic!("the proxy's CA does not verify its leaf: {e}"));
    assert!(seen.peer_certificate().is_some_and(|c| c != origin_leaf));
    assert_eq!(seen.alpn().as_deref(), Some(&b"http/1.1"[..]));
    let reply = Conn::over(seen).exchange("GET", "/seen", &format!("l7.test:{port}"), true);
    assert!(reply.status == 200 && reply.body.contains("/seen"), "{reply:?}");

    for host in ["open.test", "both.test"] {
        let open = connect_decision(audit, host);
        assert_eq!(
            (&open["reason_code"], &open["tls_server_name"]),
            (&"allowlisted".into(), &host.into()),
            "{open:#}"
        );
    }
    assert_eq!(connect_decision(audit, "l7.test")["reason_code"], "inspected");
    let seen = decision(audit, "l7.test", "GET", "/seen");
    assert_eq!(
        (&seen["decision"], &seen["scheme"]),
        (&"allow".into(), &"https".into())
    );
    let events = read_audit(audit);
    assert!(inside(&events, "open.test").is_empty(), "{events:#?}");
    assert!(inside(&events, "both.test").is_empty(), "{events:#?}");
    assert_eq!(inside(&events, "l7.test").len(), 1, "{events:#?}");
    assert_eq!(origin.requests(), ["POST /blind", "POST /blind", "GET /seen"]);
}

/// A client that trusts only the origin's CA, as one that pins it does: curl with
/// `--cacert`. Its words are the ones docs/policy.md quotes.
#[test]
fn a_client_pinning_the_origins_ca_fails_the_handshake_and_nothing_is_asked_inside() {
    let w = World::new();
    let ca = TestCa::new(&["pin.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("pin.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = egress_policy(dir.path(), &entry("pin.test", port, &["read_only: true"]));
    let i = intercepting(&dns, &policy, &roots);
    let audit = &i.proxy.audit_path;

    let url = format!("https://pin.test:{port}/pinned");
    let (code, _, err) = curl(&i.proxy.url(), &["--cacert", roots.to_str().unwrap(), &url]);
    assert_eq!(code, 60, "{err}");
    assert!(err.contains("unable to get local issuer certificate"), "{err}");

    let tunnel = connect_decision(audit, "pin.test");
    assert_eq!(
        (&tunnel["decision"], &tunnel["reason_code"]),
        (&"allow".into(), &"inspected".into()),
        "{tunnel:#}"
    );
    let closed = close_of(audit, &tunnel);
    assert_eq!(closed["outcome"], "client_failure", "{closed:#}");
    let events = read_audit(audit);
    assert!(inside(&events, "pin.test").is_empty(), "{events:#?}");
    assert_eq!(
        (origin.handshakes(), origin.requests()),
        (0, Vec::new()),
        "the pinned client's tunnel reached the origin"
    );
}

/// `bad.test`'s certificate comes from a CA the proxy's roots lack; `named.test`'s from one
/// they hold, but for another name.
#[test]
fn an_upstream_the_proxys_roots_do_not_vouch_for_answers_502_inside_the_tunnel() {
    let w = World::new();
    let trusted = TestCa::new(&["bad.test"]);
    let rogue = TestCa::new(&["bad.test"]);
    let misnamed = TestCa::new(&["elsewhere.test"]);
    let origin = w.tls_origin(&rogue);
    let port = origin.port();
    let elsewhere = w.tls_origin(&misnamed);
    let dns = w.dns(
        Zone::new()
            .with("bad.test", &["127.0.0.1"])
            .with("named.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(
        dir.path(),
        "roots.pem",
        &(trusted.ca_pem.clone() + &misnamed.ca_pem),
    );
    let entries = entry("bad.test", port, &["read_only: true"])
        + &entry("named.test", elsewhere.port(), &["read_only: true"]);
    let (policy, _) = egress_policy(dir.path(), &entries);
    let i = intercepting(&dns, &policy, &roots);
    let audit = &i.proxy.audit_path;

    let url = format!("https://named.test:{}/named", elsewhere.port());
    let (code, status, err) = i.statuses(&[url]);
    assert_eq!((code, status.as_str()), (0, "502 "), "{err}");
    let d = decision(audit, "named.test", "GET", "/named");
    assert_eq!(close_of(audit, &d)["outcome"], "upstream_failure:tls", "{d:#}");
    assert_eq!((elsewhere.handshakes(), elsewhere.requests()), (0, Vec::new()));

    // Two requests on one kept-alive tunnel: each is answered 502.
    let (code, statuses, err) = i.statuses(&[
        format!("https://bad.test:{port}/first"),
        format!("https://bad.test:{port}/second"),
    ]);
    assert_eq!((code, statuses.as_str()), (0, "502 502 "), "{err}");

    for path in ["/first", "/second"] {
        let d = decision(audit, "bad.test", "GET", path);
        assert_eq!(
            (&d["decision"], &d["scheme"]),
            (&"allow".into(), &"https".into()),
            "{d:#}"
        );
        let closed = close_of(audit, &d);
        assert_eq!(
            (&closed["status"], &closed["outcome"]),
            (&502.into(), &"upstream_failure:tls".into()),
            "{closed:#}"
        );
    }
    assert_eq!(connect_decision(audit, "bad.test")["reason_code"], "inspected");
    assert_eq!((origin.handshakes(), origin.requests()), (0, Vec::new()));
}

/// Without roots, an intercepted request's upstream could not be verified: the proxy does
/// not start (and writes no CA). Without a CA, a tunnel to a host only entries with rules
/// allow is refused rather than relayed blind.
#[test]
fn interception_fails_closed_without_roots_and_without_a_ca() {
    let w = World::new();
    let ca = TestCa::new(&["l7.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("l7.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let (policy, _) = egress_policy(dir.path(), &entry("l7.test", port, &["read_only: true"]));
    let empty_file = pem_file(dir.path(), "empty.pem", "");
    let empty_dir = dir.path().join("certs");
    std::fs::create_dir(&empty_dir).unwrap();
    let ca_file = dir.path().join("intercept-ca.pem");

    let child = Command::new(sandgate_bin())
        .args(["proxy", "--listen", "127.0.0.1:0", "--policy"])
        .arg(&policy)
        .arg("--intercept-ca-cert")
        .arg(&ca_file)
        .arg("--audit-log")
        .arg(dir.path().join("audit.jsonl"))
        .env("SSL_CERT_FILE", &empty_file)
        .env("SSL_CERT_DIR", &empty_dir)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stderr) = exit_of(child, Duration::from_secs(20), "the proxy ran without roots");
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("--intercept-ca-cert") && stderr.contains("no trusted root certificates"),
        "{stderr}"
    );
    assert!(
        !ca_file.exists(),
        "a CA was written for a proxy that did not start"
    );

    let p = proxy(&dns, &["--policy", policy.to_str().unwrap()]);
    let url = format!("https://l7.test:{port}/blind");
    let origin_ca = pem_file(dir.path(), "origin-ca.pem", &ca.ca_pem);
    let (code, _, err) = curl(&p.url(), &["--cacert", origin_ca.to_str().unwrap(), &url]);
    assert_ne!(code, 0, "a tunnel to an L7-only host opened without a CA");
    assert!(err.contains("403"), "{err}");
    let refused = connect_decision(&p.audit_path, "l7.test");
    assert_eq!(
        (&refused["decision"], &refused["reason_code"]),
        (&"deny".into(), &"inspection_required".into()),
        "{refused:#}"
    );
    assert_eq!(origin.connections(), 0);
}

/// An intercepted tunnel that moves no byte for the tunnel idle timeout ends, as a blind
/// one does, and is closed `idle_timeout`; one that keeps talking stays. (Before, hyper's
/// header timer bounded only a request's head, and an HTTP/2 connection's silence nothing.)
#[test]
fn an_intercepted_tunnel_left_silent_ends_at_the_idle_timeout() {
    let w = World::new();
    let ca = TestCa::new(&["quiet.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("quiet.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = egress_policy(dir.path(), &entry("quiet.test", port, &["read_only: true"]));
    let i = super::intercepting_with(
        Command::new(sandgate_bin()),
        &dns,
        &policy,
        &roots,
        &["--tunnel-idle-timeout", "1"],
    );
    let audit = &i.proxy.audit_path;
    let mut conn = super::https_conn(i.proxy.addr, "quiet.test", port, &i.ca_pem);
    // Talking every half second for two seconds keeps it open.
    for n in 0..4 {
        conn.send(&format!(
            "GET /talk/{n} HTTP/1.1\r\nHost: quiet.test:{port}\r\n\r\n"
        ));
        assert_eq!(conn.read_reply().status, 200, "request {n}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let tunnel = connect_decision(audit, "quiet.test");
    let started = std::time::Instant::now();
    let closed = close_of(audit, &tunnel);
    assert_eq!(closed["outcome"], "idle_timeout", "{closed:#}");
    assert!(started.elapsed() < Duration::from_secs(5), "closed late");
    // The client sees the end: nothing more comes back.
    conn.send(&format!("GET /after HTTP/1.1\r\nHost: quiet.test:{port}\r\n\r\n"));
    assert_eq!(conn.read_reply().status, 0);
}
