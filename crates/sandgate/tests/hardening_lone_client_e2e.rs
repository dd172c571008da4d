//! A lone client past its share (issue 32), each test written as the client acts, with
//! real tunnels on loopback: one address alone may hold far more than the quarter of the
//! cap it was held to before, yet never the reserve kept for the next address, and two
//! addresses together cannot lock a third out. The proxy runs under `prlimit` with 456
//! descriptors, so its default cap is 100 connections ((456 - 256) / 2) and a share 25.
//! Both tests fail on the rule before (a lone client refused at its 26th tunnel).

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

use common::world::{World, base_args, policy_doc, socks5_from, strs, tunnel_from};
use common::{ProxyProcess, read_audit, sandgate_bin, status_of};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use serde_json::Value;

/// The default cap under 456 descriptors, and what a lone client may hold of it: all but
/// a quarter.
const CAP: usize = 100;
const LONE: usize = 75;

/// A proxy under 456 descriptors with default limits, tunnelling to an echo server without
/// the first-bytes check (an idle tunnel stays open); the echo's `host:port`.
struct Fixture {
    p: ProxyProcess,
    target: String,
    _echo: EchoServer,
    _dns: DnsServer,
    _policy: tempfile::TempDir,
    _w: World,
}

fn fixture() -> Fixture {
    fixture_with(&[])
}

/// As [`fixture`], with `extra` flags for the proxy.
fn fixture_with(extra: &[&str]) -> Fixture {
    let w = World::new();
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let target = format!("echo.test:{}", echo.addr().port());
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    let spec = format!(
        "  network:\n    allowlist: [ \"{target}\" ]\n    tunnels: {{ sni: \"off\", tls_only: false }}\n"
    );
    std::fs::write(&policy, policy_doc(&spec)).unwrap();
    let mut cmd = Command::new("prlimit");
    cmd.args(["--nofile=456:456", "--"]).arg(sandgate_bin());
    let mut args = base_args(&dns);
    args.extend(["--policy".into(), policy.to_str().unwrap().to_owned()]);
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let p = ProxyProcess::start_with(cmd, &strs(&args));
    Fixture {
        p,
        target,
        _echo: echo,
        _dns: dns,
        _policy: dir,
        _w: w,
    }
}

/// A CONNECT to `target` from the local address `from`: the status, the response head,
/// and the connection (the tunnel, while it lasts).
fn tunnel(from: &str, proxy: SocketAddr, target: &str) -> (u16, String, TcpStream) {
    tunnel_from(from, proxy, target)
}

/// Opens tunnels from `from` until one is refused (at most `most`): the open tunnels and
/// the refusal's head.
fn fill(from: &str, f: &Fixture, most: usize) -> (Vec<TcpStream>, Option<String>) {
    let mut held = Vec::new();
    for _ in 0..most {
        match tunnel(from, f.p.addr, &f.target) {
            (200, _, t) => held.push(t),
            (_, head, _) => return (held, Some(head)),
        }
    }
    (held, None)
}

/// Sends `text` through the tunnel and reads it back.
fn echoes(t: &mut TcpStream, text: &str) {
    t.write_all(text.as_bytes()).unwrap();
    let mut back = vec![0u8; text.len()];
    t.read_exact(&mut back).unwrap();
    assert_eq!(back, text.as_bytes());
}

/// The `connection_limit:client` records of connections from `from`, once there are
/// `want` (waits up to 5 s for the writer).
fn client_limit_records(f: &Fixture, from: &str, want: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found: Vec<Value> = read_audit(&f.p.audit_path)
            .into_iter()
            .filter(|e| {
                e["reason_code"] == "connection_limit:client"
                    && e["client_addr"]
                        .as_str()
                        .is_some_and(|a| a.starts_with(&format!("{from}:")))
            })
            .collect();
        if found.len() >= want || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The sidecar case: one client, nobody else. It holds three times the 25 tunnels it was
/// held to before, each one live; a second address arriving later still gets a tunnel.
#[test]
fn a_lone_client_holds_three_times_its_old_share_and_a_second_address_still_gets_in() {
    let f = fixture();
    let mut lone: Vec<TcpStream> = (1..=LONE)
        .map(|n| {
            let (status, head, t) = tunnel("127.0.0.2", f.p.addr, &f.target);
            assert_eq!(status, 200, "the lone client's tunnel {n} of {LONE}: {head}");
            t
        })
        .collect();
    echoes(&mut lone[0], "the first is live");
    echoes(&mut lone[LONE - 1], "and the last");
    let (status, head, mut second) = tunnel("127.0.0.3", f.p.addr, &f.target);
    assert_eq!(status, 200, "a second address was locked out: {head}");
    echoes(&mut second, "the second address's tunnel");
}

/// The attacker alone takes every tunnel it can, then goes on asking for the reserve: each
/// ask is answered 503 at once and recorded (`connection_limit:client`), and takes
/// nothing. A second address takes all it can too; a third still gets in.
#[test]
fn a_lone_client_cannot_take_the_reserve_and_two_cannot_lock_out_a_third() {
    let f = fixture();
    let (mut first, refused) = fill("127.0.0.2", &f, CAP + 1);
    assert_eq!(
        first.len(),
        LONE,
        "tunnels the first address took alone: {refused:?}"
    );
    let refused = refused.unwrap();
    assert_eq!(status_of(&refused), 503, "{refused}");
    assert!(refused.contains("error=connection_limit_reached"), "{refused}");
    for _ in 0..3 {
        let (status, head, _) = tunnel("127.0.0.2", f.p.addr, &f.target);
        assert_eq!(status, 503, "the attacker took a slot of the reserve: {head}");
    }
    echoes(&mut first[0], "still held");

    // A second address takes all it can: its share, but the slots kept for newcomers.
    let (second, refused) = fill("127.0.0.3", &f, CAP);
    assert!(
        second.len() >= 20,
        "the second address got {} tunnels",
        second.len()
    );
    assert_eq!(status_of(&refused.unwrap()), 503);
    let (status, head, mut third) = tunnel("127.0.0.4", f.p.addr, &f.target);
    assert_eq!(status, 200, "two addresses locked a third out: {head}");
    echoes(&mut third, "the third address's tunnel");

    assert_eq!(client_limit_records(&f, "127.0.0.2", 4).len(), 4);
    assert_eq!(client_limit_records(&f, "127.0.0.3", 1).len(), 1);
}

/// A SOCKS5 tunnel to `target` (`host:port`) through `socks` from the local address `from`.
fn socks_from(from: &str, socks: SocketAddr, target: &str) -> Result<TcpStream, String> {
    let (host, port) = target.rsplit_once(':').unwrap();
    socks5_from(from, socks, host, port.parse().unwrap())
}

/// One client, nobody else, on a proxy that serves HTTP/1 and SOCKS5 (`--socks-listen`):
/// the two listeners are one tenant's two doors and share one pool, so the client holds as
/// many tunnels over SOCKS5 as over HTTP/1 alone, not three quarters of half the cap (37 here,
/// as when each listener had its own half); past that it is refused and recorded, and a
/// second address still gets in by the other door.
#[test]
fn a_lone_client_holds_as_much_through_either_front_end() {
    let f = fixture_with(&["--socks-listen", "127.0.0.1:0"]);
    let socks = f.p.listener(&["role=socks5"]);
    let mut lone: Vec<TcpStream> = (1..=LONE)
        .map(|n| {
            socks_from("127.0.0.2", socks, &f.target)
                .unwrap_or_else(|e| panic!("the lone client's SOCKS5 tunnel {n} of {LONE} was refused: {e}"))
        })
        .collect();
    echoes(&mut lone[LONE - 1], "the last is live");
    assert!(
        socks_from("127.0.0.2", socks, &f.target).is_err(),
        "the lone client took the reserve"
    );
    // The same address is one client on both doors: HTTP/1 refuses it too.
    let (status, head, _) = tunnel("127.0.0.2", f.p.addr, &f.target);
    assert_eq!(status, 503, "{head}");
    assert_eq!(client_limit_records(&f, "127.0.0.2", 2).len(), 2);
    let (status, head, mut second) = tunnel("127.0.0.3", f.p.addr, &f.target);
    assert_eq!(status, 200, "a second address was locked out: {head}");
    echoes(&mut second, "the second address's tunnel");
}
