//! The proxy in-process: what an entry with an expiry let through ends at its second (issue
//! 28). A temporary exception's tunnel ends by the proxy's own doing, with no control plane
//! ticking beside it (as under `sandgate run --ask`, whose answers "for N seconds" are
//! exceptions that nothing else expires); a plain HTTP exchange in flight (a dripping
//! download) ends too. Each close says `expired`. Each test waits up to two seconds of real
//! time: expiry is on the wall clock.

#![allow(
    clippy::unwrap_used,
    clippy::disallowed_methods,
    clippy::indexing_slicing,
    reason = "tests on loopback"
)]

use std::sync::Arc;
use std::time::Duration;

use sandgate_policy::{AddressGuard, Entry, Identity, Pattern, Ruleset, Scope};
use sandgate_proxy::{
    AuditDestination, AuditOptions, Limits, Listener, Nameservers, Proxy, ProxyConfig, unix_now,
};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn config(listener: Listener, rules: Ruleset, dns: &DnsServer, audit: &std::path::Path) -> ProxyConfig {
    ProxyConfig {
        listen: vec![listener],
        rules,
        guard: AddressGuard::new(vec!["127.0.0.0/8".parse().unwrap()]),
        nameservers: Nameservers::Explicit(vec![dns.addr()]),
        audit: AuditDestination::File(audit.to_owned()),
        limits: Limits::default(),
        audit_options: AuditOptions::default(),
        metrics_listen: None,
        remedies: Default::default(),
        connector: Default::default(),
    }
}

/// Stops the proxy and returns its audit events.
async fn stop(
    stop: tokio::sync::oneshot::Sender<()>,
    running: tokio::task::JoinHandle<std::io::Result<u64>>,
    audit: &std::path::Path,
) -> Vec<Value> {
    let _ = stop.send(());
    running.await.unwrap().unwrap();
    std::fs::read_to_string(audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn an_exceptions_tunnel_ends_at_its_second_without_a_control_plane() {
    let echo = EchoServer::start().await;
    let dns = DnsServer::start(Zone::new().with("echo.test", &["127.0.0.1"])).await;
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let mut listener = Listener::system("127.0.0.1:0".parse().unwrap());
    listener.identity = Identity {
        task: Some("t-1".into()),
        ..Identity::default()
    };
    let proxy = Proxy::bind(config(listener, Ruleset::new(), &dns, &audit))
        .await
        .unwrap();
    let addr = proxy.local_addrs()[0];
    let expires = unix_now() + 2;
    let port = echo.addr().port();
    proxy.policy_handle().set_exceptions(vec![Entry {
        ports: Some(vec![port]),
        scope: Scope::Task("t-1".into()),
        expires_at: Some(expires),
        origin: Arc::from("exception:ex-1"),
        ..Entry::from_flag(Pattern::parse("echo.test").unwrap())
    }]);
    let (stopper, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(proxy.run(async move {
        let _ = stopped.await;
    }));

    let mut t = TcpStream::connect(addr).await.unwrap();
    let target = format!("echo.test:{port}");
    t.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\nping").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    while !got.ends_with(b"ping") {
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(10), t.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed before the echo: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        unix_now() < expires,
        "the tunnel opened after the exception expired"
    );
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(15), t.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "the tunnel outlived its exception by 13 s");
    assert!(unix_now() >= expires, "cut before the exception expired");

    let events = stop(stopper, running, &audit).await;
    let close = events.iter().find(|e| e["event"] == "close").unwrap();
    assert_eq!(close["outcome"], "expired", "{events:#?}");
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "decision" && e["rule"] == "exception:ex-1"),
        "{events:#?}"
    );
}

/// An origin that answers a long body one byte every 100 ms (for at most 30 s).
async fn dripping_origin() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let origin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = origin.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = origin.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            if s.read(&mut byte).await.unwrap_or(0) == 0 {
                return;
            }
            head.push(byte[0]);
        }
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 300\r\n\r\n")
            .await;
        for _ in 0..300 {
            if s.write_all(b"x").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (addr, task)
}

#[tokio::test]
async fn a_plain_http_exchange_in_flight_ends_at_its_entrys_second() {
    let (origin, dripping) = dripping_origin().await;
    let dns = DnsServer::start(Zone::new().with("drip.test", &["127.0.0.1"])).await;
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let expires = unix_now() + 2;
    let mut rules = Ruleset::new();
    rules.allow_entry(Entry {
        ports: Some(vec![origin.port()]),
        expires_at: Some(expires),
        origin: Arc::from("policy.yaml:7"),
        ..Entry::from_flag(Pattern::parse("drip.test").unwrap())
    });
    let listener = Listener::system("127.0.0.1:0".parse().unwrap());
    let proxy = Proxy::bind(config(listener, rules, &dns, &audit)).await.unwrap();
    let addr = proxy.local_addrs()[0];
    let (stopper, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(proxy.run(async move {
        let _ = stopped.await;
    }));

    let mut c = TcpStream::connect(addr).await.unwrap();
    let url = format!("http://drip.test:{}/", origin.port());
    c.write_all(format!("GET {url} HTTP/1.1\r\nHost: drip.test:{}\r\n\r\n", origin.port()).as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(15), c.read_to_end(&mut got)).await;
    assert!(ended.is_ok(), "the download outlived its entry by 13 s");
    assert!(unix_now() >= expires, "cut before the entry expired");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(!text.ends_with(&"x".repeat(300)), "the whole body came through");
    dripping.abort();

    let events = stop(stopper, running, &audit).await;
    let close = events.iter().find(|e| e["event"] == "close").unwrap();
    assert_eq!(close["outcome"], "expired", "{events:#?}");
}
