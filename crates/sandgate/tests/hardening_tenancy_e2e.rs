//! Regression tests for a hostile review (issue 28), each written as the attacker acts:
//! one tenant's idle tunnels, from an address it shares with another tenant, must not lock
//! that tenant out of its own listener; a tunnel must not outlive the expiry of the entry
//! that allowed it, over CONNECT, SOCKS5 or a central's node streams. Every test here failed
//! on the code before the fix (see the session note).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod central;
mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::world::{World, base_args, connect_from, policy_doc, socks5_from, status_from, strs};
use common::{ProxyProcess, read_audit, sandgate_bin};
use sandgate_testkit::dns::Zone;

/// Wall-clock seconds, the clock policy entries expire on.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// An RFC 3339 time `secs` whole seconds from now, and that second.
fn expiring_in(secs: i64) -> (String, i64) {
    let at = now() as i64 + secs;
    (jiff::Timestamp::from_second(at).unwrap().to_string(), at)
}

/// Item 1: the per-task listeners of one host are all reached from its loopback address.
/// Tenant A fills its per-client share with idle tunnels on its own listener; tenant B,
/// from the same address, still gets a tunnel on its own listener, and A is still held to
/// its share.
#[test]
fn a_tenant_holding_its_share_does_not_lock_another_out_of_its_own_listener() {
    let w = World::new();
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let target = format!("echo.test:{}", echo.addr().port());
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    let spec = format!(
        "  network:\n    allowlist: [ \"{target}\" ]\n    tunnels: {{ tls_only: false }}\n\
         \x20 listeners:\n    - listen: 127.0.0.1:0\n      task: tenant-a\n    - listen: 127.0.0.1:0\n      task: tenant-b\n"
    );
    std::fs::write(&policy, policy_doc(&spec)).unwrap();
    let mut args = base_args(&dns);
    args.extend(
        [
            "--policy",
            policy.to_str().unwrap(),
            "--max-connections",
            "40",
            "--max-connections-per-client",
            "4",
        ]
        .map(String::from),
    );
    let p = ProxyProcess::start_as_configured(Command::new(sandgate_bin()), &strs(&args));
    let (a, b) = (p.listener(&["task=tenant-a"]), p.listener(&["task=tenant-b"]));

    let held: Vec<TcpStream> = (0..4)
        .map(|i| {
            let (head, t) = central::connect(a, &target);
            assert!(head.starts_with("HTTP/1.1 200"), "tenant A's tunnel {i}: {head}");
            t
        })
        .collect();
    let (status, head) = status_from("127.0.0.1", a, &target);
    assert_eq!(status, 503, "tenant A is held to its share: {head}");
    assert!(head.contains("error=connection_limit_reached"), "{head}");

    let (status, head) = status_from("127.0.0.1", b, &target);
    assert_eq!(
        status, 200,
        "tenant B was locked out of its own listener by A's share: {head}"
    );
    // And B has a whole share of its own there.
    let more_b: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = connect_from("127.0.0.1", b);
            s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
                .unwrap();
            let mut head = [0u8; 12];
            s.read_exact(&mut head).unwrap();
            assert_eq!(&head, b"HTTP/1.1 200");
            s
        })
        .collect();
    drop((held, more_b));
    let refused = central::events_where(&p.audit_path, 1, |e| {
        e["reason_code"] == "connection_limit:client" && e["task_id"] == "tenant-a"
    });
    assert_eq!(refused.len(), 1, "{:#?}", read_audit(&p.audit_path));
}

/// Sends `text` through the echo tunnel and reads it back.
fn echoes(t: &mut TcpStream, text: &str) {
    t.write_all(text.as_bytes()).unwrap();
    let mut back = vec![0u8; text.len()];
    t.read_exact(&mut back).unwrap();
    assert_eq!(back, text.as_bytes());
}

/// Waits, at most until `limit`, for the proxy to end `t` (end of stream or reset) and
/// returns when that was seen (wall clock); `None` if it was still open at `limit`.
fn closed_at(t: &mut TcpStream, limit: Instant) -> Option<f64> {
    let mut buf = [0u8; 64];
    loop {
        let left = limit.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        t.set_read_timeout(Some(left.min(Duration::from_millis(500))))
            .unwrap();
        match t.read(&mut buf) {
            Ok(0) => return Some(now()),
            Ok(n) => panic!("unasked bytes from the echo server: {:?}", &buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(now()),
        }
    }
}

/// The tunnel ended after `expires` and within a bounded time of it, and carries nothing
/// more.
fn assert_cut_at_expiry(what: &str, t: &mut TcpStream, expires: i64) {
    let limit = Instant::now() + Duration::from_secs_f64((expires as f64 - now()).max(0.0) + 15.0);
    let Some(at) = closed_at(t, limit) else {
        panic!("the {what} tunnel outlived the expiry of the entry that allowed it by 15 s");
    };
    assert!(
        at >= expires as f64,
        "the {what} tunnel was cut before its entry expired"
    );
    assert!(
        at < expires as f64 + 10.0,
        "the {what} tunnel was cut {} s after its entry expired",
        at - expires as f64
    );
    // Nothing flows any more: whatever is written is never echoed.
    let _ = t.write_all(b"after");
    t.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut buf = [0u8; 16];
    assert!(
        matches!(t.read(&mut buf), Ok(0) | Err(_)),
        "the {what} tunnel still carries data"
    );
}

/// Item 2: an entry with `expires_at` a few seconds ahead lets a CONNECT tunnel and a SOCKS5
/// tunnel through; both clients keep them open past that second; the proxy cuts both at it
/// (close `outcome: expired`), and a new request is refused.
#[test]
fn tunnels_end_when_the_entry_that_allowed_them_expires() {
    let w = World::new();
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let port = echo.addr().port();
    let target = format!("echo.test:{port}");
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    let (when, expires) = expiring_in(4);
    let spec = format!(
        "  network:\n    allowlist:\n      - host: echo.test\n        ports: [{port}]\n        expires_at: {when}\n\
         \x20   tunnels: {{ tls_only: false }}\n"
    );
    std::fs::write(&policy, policy_doc(&spec)).unwrap();
    let mut args = base_args(&dns);
    args.extend(
        [
            "--policy",
            policy.to_str().unwrap(),
            "--socks-listen",
            "127.0.0.1:0",
        ]
        .map(String::from),
    );
    let p = ProxyProcess::start(&strs(&args));
    let socks = p.listener(&["role=socks5"]);

    let mut connect = central::tunnel(p.addr, &target);
    echoes(&mut connect, "over CONNECT");
    let mut socks5 = socks5_from("127.0.0.1", socks, "echo.test", port).unwrap();
    echoes(&mut socks5, "over SOCKS5");
    assert!(
        now() < expires as f64,
        "the tunnels opened after the entry expired (a slow start?)"
    );

    assert_cut_at_expiry("CONNECT", &mut connect, expires);
    assert_cut_at_expiry("SOCKS5", &mut socks5, expires);
    let (status, head) = status_from("127.0.0.1", p.addr, &target);
    assert_eq!(status, 403, "{head}");

    let closes = central::events_where(&p.audit_path, 2, |e| {
        e["event"] == "close" && e["outcome"] == "expired"
    });
    assert_eq!(closes.len(), 2, "{:#?}", read_audit(&p.audit_path));
    assert!(closes.iter().any(|e| e["scheme"] == "socks5"), "{closes:#?}");
    assert!(
        closes.iter().all(|e| e["bytes_sent"].as_u64() >= Some(11)),
        "{closes:#?}"
    );
}

/// Item 2 on a central: a node's tunnel is a stream of the node's connection, carried by
/// the central's egress core; the central's entry expiring cuts it there (close `expired`,
/// naming the node), and the node's client sees its tunnel end.
#[test]
fn a_nodes_tunnel_ends_when_the_centrals_entry_expires() {
    let w = World::new();
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let port = echo.addr().port();
    let target = format!("echo.test:{port}");
    let pki = central::Pki::new();
    let cert = pki.node("node-a", &[]);
    let (when, expires) = expiring_in(5);
    let spec = format!(
        "  network:\n    allowlist:\n      - host: echo.test\n        ports: [{port}]\n        expires_at: {when}\n\
         \x20   tunnels: {{ tls_only: false }}\n  nodes:\n    - name: node-a\n      projects: [p1]\n      tasks: [t1]\n"
    );
    let c = central::central(&pki, dns.addr(), &spec, &[]);
    let n = central::node(&cert, &[c.node_addr], &[target.as_str()], Some(("t1", "p1")));

    let mut t = central::tunnel(n.addr, &target);
    echoes(&mut t, "through the central");
    assert!(
        now() < expires as f64,
        "the tunnel opened after the entry expired (a slow start?)"
    );
    assert_cut_at_expiry("node's", &mut t, expires);
    let closes = central::events_where(&c.proxy.audit_path, 1, |e| {
        e["event"] == "close" && e["outcome"] == "expired"
    });
    assert_eq!(closes.len(), 1, "{:#?}", read_audit(&c.proxy.audit_path));
    assert_eq!(closes[0]["node"], "node-a");
}

/// This whole binary again as `nobody` when the tests run as root.
#[test]
fn the_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody("hardening_tenancy_e2e", "the_suite_passes_as_an_ordinary_user", 3);
}
