//! The proxy in-process (`Proxy::bind` on port 0, the test DNS server, an audit file in a
//! temporary directory): the egress core's one-decision rule across every way a request can
//! end, the direct and chained connectors, the audit writer's line schema, and timeouts
//! under paused time. Fast: no binary is spawned and no real timer is waited on.

#![allow(
    clippy::unwrap_used,
    clippy::disallowed_methods,
    clippy::indexing_slicing,
    reason = "tests on loopback"
)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sandgate_policy::{AddressGuard, Pattern, Ruleset};
use sandgate_proxy::{AuditDestination, AuditOptions, Limits, Listener, Nameservers, Proxy, ProxyConfig};
use sandgate_testkit::closed::ClosedPort;
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use sandgate_testkit::origin::Origin;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A proxy running in this process; `stop` shuts it down and returns its audit events.
struct Running {
    addr: SocketAddr,
    audit: PathBuf,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<u64>>,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn stop(self) -> Vec<Value> {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
        std::fs::read_to_string(&self.audit)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn config(dns: &DnsServer, allow: &[&str], limits: Limits) -> ProxyConfig {
    let mut rules = Ruleset::new();
    for a in allow {
        rules.allow(Pattern::parse(a).unwrap());
    }
    ProxyConfig {
        listen: vec![Listener::system("127.0.0.1:0".parse().unwrap())],
        rules,
        guard: AddressGuard::new(vec!["127.0.0.0/8".parse().unwrap()]),
        nameservers: Nameservers::Explicit(vec![dns.addr()]),
        audit: AuditDestination::Stdout,
        limits,
        audit_options: AuditOptions::default(),
        metrics_listen: None,
        remedies: Default::default(),
        connector: Default::default(),
    }
}

async fn start(mut config: ProxyConfig) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    config.audit = AuditDestination::File(audit.clone());
    let proxy = Proxy::bind(config).await.unwrap();
    let addr = proxy.local_addrs()[0];
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(proxy.run(async move {
        let _ = stopped.await;
    }));
    Running {
        addr,
        audit,
        stop,
        task,
        _dir: dir,
    }
}

/// Sends `request` and reads until the proxy closes (or 60 s).
async fn exchange(proxy: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn by_request(events: &[Value]) -> HashMap<String, Vec<&Value>> {
    let mut map: HashMap<String, Vec<&Value>> = HashMap::new();
    for e in events {
        map.entry(e["request_id"].as_str().unwrap().to_owned())
            .or_default()
            .push(e);
    }
    map
}

/// Every way a request can end leaves exactly one decision event, and a close exactly when
/// it was allowed; each line carries the whole schema.
#[tokio::test]
async fn every_request_has_exactly_one_decision_and_allowed_ones_one_close() {
    let origin = Origin::http().await;
    let dns = DnsServer::start(
        Zone::new()
            .with("ok.test", &["127.0.0.1"])
            .with("private.test", &["10.1.2.3"])
            .with("refused.test", &["127.0.0.1"]),
    )
    .await;
    // Nothing listens there, and nothing can while the test holds it.
    let closed = ClosedPort::new();
    let closed_port = closed.port();
    let port = origin.port();
    let ok = format!("ok.test:{port}");
    let refused = format!("refused.test:{closed_port}");
    let p = start(config(
        &dns,
        &[&ok, "private.test", &refused, "nxdomain.test"],
        Limits::default(),
    ))
    .await;
    let cases = [
        (
            format!("GET http://{ok}/ HTTP/1.1\r\nHost: {ok}\r\nConnection: close\r\n\r\n"),
            "200",
        ),
        (
            "GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n".to_owned(),
            "403",
        ),
        (
            "GET http://private.test/ HTTP/1.1\r\nHost: private.test\r\n\r\n".to_owned(),
            "403",
        ),
        (
            "GET http://nxdomain.test/ HTTP/1.1\r\nHost: nxdomain.test\r\n\r\n".to_owned(),
            "502",
        ),
        (
            format!("CONNECT {refused} HTTP/1.1\r\nHost: {refused}\r\n\r\n"),
            "502",
        ),
        ("GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_owned(), "400"),
        ("BREW coffee\r\n\r\n".to_owned(), "400"),
    ];
    for (request, status) in &cases {
        let reply = exchange(p.addr, request).await;
        assert!(
            reply.starts_with(&format!("HTTP/1.1 {status}")),
            "{request:?}: {reply}"
        );
    }
    let events = p.stop().await;
    let requests = by_request(&events);
    assert_eq!(requests.len(), cases.len(), "{events:#?}");
    for (id, evs) in &requests {
        let decisions: Vec<_> = evs.iter().filter(|e| e["event"] == "decision").collect();
        let closes: Vec<_> = evs.iter().filter(|e| e["event"] == "close").collect();
        assert_eq!(decisions.len(), 1, "{id}: {evs:#?}");
        let allowed = decisions[0]["decision"] == "allow";
        assert_eq!(closes.len(), usize::from(allowed), "{id}: {evs:#?}");
    }
    for e in &events {
        assert_eq!(e.as_object().unwrap().len(), 41, "every field on every line: {e}");
    }
    let failures: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "close")
        .filter_map(|e| e["outcome"].as_str())
        .collect();
    assert!(failures.contains(&"upstream_failure:dns"), "{failures:?}");
    assert!(
        failures.contains(&"upstream_failure:connection_refused"),
        "{failures:?}"
    );
}

/// Exactly once by construction (issue 29): work still open after the hard stop and its
/// 5 s wait (a lookup that never ends, an exchange whose origin never answers, neither
/// watching a stop token) is dropped, and each request records what it owed from its
/// state's `Drop`, in the audit log: a deny `abandoned` for the undecided lookup, a close
/// `shutdown` for the allowed exchange. Before, both tasks outlived the writer and their
/// records were lost.
#[tokio::test]
async fn requests_still_open_after_the_hard_stop_record_what_they_owed() {
    let dns = DnsServer::start(Zone::new().silent("stuck.test").with("mute.test", &["127.0.0.1"])).await;
    // An origin that accepts and never answers.
    let mute = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mute_port = mute.local_addr().unwrap().port();
    let (accepted, mut connected) = tokio::sync::mpsc::unbounded_channel();
    let held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((s, _)) = mute.accept().await {
            kept.push(s);
            let _ = accepted.send(());
        }
    });
    let limits = Limits {
        dns_timeout: Duration::from_secs(120),
        response_timeout: Duration::from_secs(120),
        shutdown_grace: Duration::ZERO,
        ..Limits::default()
    };
    let mute_target = format!("mute.test:{mute_port}");
    let p = start(config(&dns, &["stuck.test", &mute_target], limits)).await;
    let mut clients = Vec::new();
    for request in [
        "GET http://stuck.test/ HTTP/1.1\r\nHost: stuck.test\r\n\r\n".to_owned(),
        format!("GET http://{mute_target}/ HTTP/1.1\r\nHost: {mute_target}\r\n\r\n"),
    ] {
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        clients.push(s);
    }
    // Both requests are in flight: the lookup asked, the origin connected to.
    let origin_reached = tokio::time::timeout(Duration::from_secs(60), connected.recv()).await;
    assert!(
        matches!(origin_reached, Ok(Some(()))),
        "the origin was never reached"
    );
    for _ in 0..6000 {
        if dns.questions_about("stuck.test") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(dns.questions_about("stuck.test") > 0, "the lookup never started");
    let events = p.stop().await;
    held.abort();
    let requests = by_request(&events);
    assert_eq!(requests.len(), 2, "{events:#?}");
    let abandoned: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "decision" && e["reason_code"] == "abandoned")
        .collect();
    assert_eq!(abandoned.len(), 1, "{events:#?}");
    assert_eq!(abandoned[0]["decision"], "deny");
    assert_eq!(abandoned[0]["destination_host"], "stuck.test");
    let closes: Vec<_> = events.iter().filter(|e| e["event"] == "close").collect();
    assert_eq!(closes.len(), 1, "{events:#?}");
    assert_eq!(closes[0]["destination_host"], "mute.test");
    assert_eq!(closes[0]["outcome"], "shutdown");
    for (id, evs) in &requests {
        let decisions = evs.iter().filter(|e| e["event"] == "decision").count();
        assert_eq!(decisions, 1, "{id}: {evs:#?}");
    }
    drop(clients);
}

/// The chained connector: a node-local proxy asks a central one for the tunnel and never
/// resolves the name itself.
#[tokio::test]
async fn the_chained_connector_asks_the_upstream_proxy_and_resolves_nothing() {
    let echo = EchoServer::start().await;
    let central_dns = DnsServer::start(Zone::new().with("echo.test", &["127.0.0.1"])).await;
    let node_dns = DnsServer::start(Zone::new()).await;
    let target = format!("echo.test:{}", echo.addr().port());
    let central = start(config(&central_dns, &[&target], Limits::default())).await;
    let mut node_config = config(&node_dns, &[&target], Limits::default());
    node_config.connector = sandgate_proxy::Connector::UpstreamProxy(central.addr);
    let node = start(node_config).await;
    let mut s = TcpStream::connect(node.addr).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).await.unwrap();
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s.write_all(b"through two proxies").await.unwrap();
    let mut back = [0u8; 19];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"through two proxies");
    drop(s);
    assert_eq!(
        node_dns.questions(),
        Vec::<String>::new(),
        "the node resolved a name"
    );
    assert!(
        central_dns.questions_about("echo.test") > 0,
        "the central proxy resolves"
    );
    let node_events = node.stop().await;
    let central_events = central.stop().await;
    for events in [&node_events, &central_events] {
        assert!(
            events
                .iter()
                .any(|e| e["event"] == "close" && e["bytes_sent"] == 19 && e["bytes_received"] == 19),
            "{events:#?}"
        );
    }
}

/// Paused time: a head that never completes is answered 408 after the head timeout, with no
/// real waiting.
#[tokio::test(start_paused = true)]
async fn a_trickling_head_gets_408_at_the_head_timeout() {
    let dns = DnsServer::start(Zone::new()).await;
    let limits = Limits {
        head_timeout: Duration::from_secs(30),
        ..Limits::default()
    };
    let p = start(config(&dns, &["a.test"], limits)).await;
    let started = tokio::time::Instant::now();
    let reply = exchange(p.addr, "GET http://a.test/ HTTP/1.1\r\nHost: a").await;
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(started.elapsed() >= Duration::from_secs(30));
    let events = p.stop().await;
    assert_eq!(events[0]["reason_code"], "head_timeout");
}
