//! Idle tunnels cut in bulk (issue 32), written as a client that holds many: half of them
//! silent (waiting for their first bytes), half past them (one byte echoed). An idle
//! tunnel holds no token of its own any more: its two long waits end at the grant's stop
//! token. So each tunnel must still end in exactly one decision and one close, with the
//! cut's outcome, whether its entry expires under it or the proxy stops.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::world::{World, base_args, policy_doc, strs};
use common::{ProxyProcess, read_audit};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use serde_json::Value;

/// Tunnels held at once: every other one silent.
const TUNNELS: usize = 500;

/// Opens a tunnel to `target`; past its first bytes (one byte echoed back) unless `silent`.
/// `None` when the proxy did not answer 200.
fn open(proxy: SocketAddr, target: &str, silent: bool) -> Option<TcpStream> {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        return None;
    }
    if !silent {
        s.write_all(b"x").unwrap();
        s.read_exact(&mut byte).unwrap();
        assert_eq!(&byte, b"x", "the echo came back");
    }
    Some(s)
}

/// Opens [`TUNNELS`] tunnels, every other one silent; fails unless all were opened.
fn open_all(proxy: SocketAddr, target: &str) -> Vec<TcpStream> {
    let held: Vec<TcpStream> = (0..TUNNELS)
        .filter_map(|i| open(proxy, target, i % 2 == 0))
        .collect();
    assert_eq!(held.len(), TUNNELS, "every tunnel opened before the cut");
    held
}

/// Waits (bounded by `limit`) until the proxy has ended every one of `held`: each read ends
/// with EOF or an error, never with a byte.
fn until_all_ended(held: Vec<TcpStream>, limit: Duration) {
    let deadline = Instant::now() + limit;
    for mut s in held {
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let mut byte = [0u8; 1];
        match s.read(&mut byte) {
            Ok(0) => {}
            Ok(_) => panic!("a cut tunnel carried a byte"),
            Err(e) => assert!(
                !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "a tunnel was still open {limit:?} after the cut"
            ),
        }
    }
}

/// Every tunnel in `events` ended in exactly one decision, an allow, and exactly one close
/// whose outcome is `outcome`.
fn one_decision_and_one_close_each(events: &[Value], outcome: &str) {
    let mut decisions: HashMap<&str, usize> = HashMap::new();
    let mut closes: HashMap<&str, Vec<&Value>> = HashMap::new();
    for e in events {
        let id = e["request_id"].as_str().unwrap();
        match e["event"].as_str().unwrap() {
            "decision" => {
                assert_eq!(e["decision"], "allow", "{e}");
                *decisions.entry(id).or_default() += 1;
            }
            "close" => closes.entry(id).or_default().push(e),
            other => panic!("unexpected event {other}: {e}"),
        }
    }
    assert_eq!(decisions.len(), TUNNELS, "one decision per tunnel");
    assert!(decisions.values().all(|n| *n == 1), "a tunnel decided twice");
    assert_eq!(closes.len(), TUNNELS, "one close per tunnel");
    for (id, list) in &closes {
        assert!(decisions.contains_key(id), "a close without its decision: {id}");
        assert_eq!(list.len(), 1, "closed twice: {list:?}");
        assert_eq!(list[0]["outcome"], outcome, "{}", list[0]);
    }
}

/// What a proxy's tunnels lead to, kept for as long as the test runs.
type Fixtures = (EchoServer, DnsServer, tempfile::TempDir);

/// A proxy allowing the echo through an entry that lives `ttl` seconds (none: no expiry),
/// with a first-bytes wait longer than any test here; the echo's `host:port`.
fn proxy(w: &World, ttl: Option<u32>, extra: &[&str]) -> (ProxyProcess, String, Fixtures) {
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let target = format!("echo.test:{}", echo.addr().port());
    let entry = match ttl {
        Some(ttl) => format!("{{ host: \"{target}\", ttl_seconds: {ttl} }}"),
        None => format!("\"{target}\""),
    };
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    let spec = format!(
        "  network:\n    allowlist: [ {entry} ]\n    tunnels: {{ tls_only: false, first_bytes_timeout_ms: 60000 }}\n"
    );
    std::fs::write(&policy, policy_doc(&spec)).unwrap();
    let mut args = base_args(&dns);
    args.extend(["--policy".into(), policy.to_str().unwrap().to_owned()]);
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let p = ProxyProcess::start(&strs(&args));
    (p, target, (echo, dns, dir))
}

#[test]
fn idle_tunnels_cut_by_their_entrys_expiry_each_end_in_one_decision_and_one_close() {
    let w = World::new();
    // Long enough to open every tunnel first on a loaded machine.
    let (mut p, target, _keep) = proxy(&w, Some(10), &[]);
    let held = open_all(p.addr, &target);
    until_all_ended(held, Duration::from_secs(20));
    let events = p.audit_events(2 * TUNNELS);
    assert!(p.child.try_wait().unwrap().is_none(), "the proxy runs on");
    one_decision_and_one_close_each(&events, "expired");
    assert!(p.terminate().success());
    assert_eq!(
        read_audit(&p.audit_path).len(),
        2 * TUNNELS,
        "nothing more at the stop"
    );
}

#[test]
fn idle_tunnels_cut_at_shutdown_each_end_in_one_decision_and_one_close() {
    let w = World::new();
    let (mut p, target, _keep) = proxy(&w, None, &["--shutdown-grace", "1"]);
    let held = open_all(p.addr, &target);
    let stopping = Instant::now();
    let status = p.terminate();
    assert!(status.success(), "{status:?}");
    // The grace, then the cut: not the five seconds that would drop unfinished work.
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "stopped after {:?}",
        stopping.elapsed()
    );
    until_all_ended(held, Duration::from_secs(5));
    one_decision_and_one_close_each(&read_audit(&p.audit_path), "shutdown");
}
