//! A listener with a peer filter (the sandbox runner's) serves only registered source
//! addresses; any other local process is closed on before a byte is read or written.

#![allow(
    clippy::unwrap_used,
    clippy::disallowed_methods,
    clippy::indexing_slicing,
    reason = "test on loopback"
)]

use std::net::SocketAddr;

use sandgate_policy::{AddressGuard, Ruleset};
use sandgate_proxy::{
    AuditDestination, AuditOptions, Identity, Limits, Listener, Nameservers, PeerFilter, Proxy, ProxyConfig,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

#[tokio::test]
async fn only_registered_peers_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let peers = PeerFilter::new();
    let config = ProxyConfig {
        listen: vec![Listener {
            addr: "127.0.0.1:0".parse().unwrap(),
            identity: Identity::default(),
            peers: Some(peers.clone()),
            front_end: sandgate_proxy::FrontEnd::Http1 { require_auth: false },
        }],
        rules: Ruleset::new(),
        guard: AddressGuard::default(),
        nameservers: Nameservers::Explicit(vec!["127.0.0.1:9".parse().unwrap()]),
        audit: AuditDestination::File(dir.path().join("audit.jsonl")),
        limits: Limits::default(),
        audit_options: AuditOptions::default(),
        metrics_listen: None,
        remedies: Default::default(),
        connector: Default::default(),
    };
    let proxy = Proxy::bind(config).await.unwrap();
    let addr = proxy.local_addrs()[0];
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(proxy.run(async move {
        let _ = stop_rx.await;
    }));
    let ask = |register: bool| {
        let peers = peers.clone();
        async move {
            let socket = TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.1:0".parse::<SocketAddr>().unwrap()).unwrap();
            if register {
                peers.allow(socket.local_addr().unwrap());
            }
            let mut s = socket.connect(addr).await.unwrap();
            let _ = s
                .write_all(b"CONNECT nope.test:443 HTTP/1.1\r\nHost: nope.test:443\r\n\r\n")
                .await;
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out).into_owned()
        }
    };
    assert!(
        ask(true).await.starts_with("HTTP/1.1 403"),
        "a registered peer is served"
    );
    assert_eq!(ask(false).await, "", "an unregistered peer gets nothing");
    let _ = stop_tx.send(());
    let written = run.await.unwrap().unwrap();
    assert_eq!(written, 1, "only the served request was decided");
}
