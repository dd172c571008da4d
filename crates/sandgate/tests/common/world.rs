//! The fixtures of the proxy end-to-end tests: a runtime for the loopback servers, the
//! proxy started against the test DNS server, and audit event filters.

#![allow(dead_code, reason = "each test file uses a different part of the harness")]

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use sandgate_testkit::origin::Origin;
use sandgate_testkit::tls::TestCa;
use serde_json::Value;

use super::ProxyProcess;

/// Fixtures run on a background runtime while the test thread drives blocking clients.
pub struct World {
    pub rt: tokio::runtime::Runtime,
}

impl World {
    pub fn new() -> World {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        World { rt }
    }

    pub fn dns(&self, zone: Zone) -> DnsServer {
        self.rt.block_on(DnsServer::start(zone))
    }

    pub fn origin(&self) -> Origin {
        self.rt.block_on(Origin::http())
    }

    pub fn tls_origin(&self, ca: &TestCa) -> Origin {
        self.rt.block_on(Origin::https(ca.server_config.clone()))
    }

    pub fn echo(&self) -> EchoServer {
        self.rt.block_on(EchoServer::start())
    }
}

/// A proxy that treats loopback as public (the origins live there) and asks `dns` only.
pub fn proxy(dns: &DnsServer, extra: &[&str]) -> ProxyProcess {
    let dns_addr = dns.addr().to_string();
    let mut args = vec!["--dns-server", &dns_addr, "--allow-range", "127.0.0.0/8"];
    args.extend_from_slice(extra);
    ProxyProcess::start(&args)
}

pub fn events_of<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == kind).collect()
}

/// Arguments for a proxy that treats loopback as public (the origins live there) and asks
/// `dns` only.
pub fn base_args(dns: &DnsServer) -> Vec<String> {
    vec![
        "--dns-server".into(),
        dns.addr().to_string(),
        "--allow-range".into(),
        "127.0.0.0/8".into(),
    ]
}

pub fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// An `EgressPolicy` document with `body` as its spec.
pub fn policy_doc(body: &str) -> String {
    format!("apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: test }}\nspec:\n{body}")
}

/// Sends a CONNECT for `target` from the local address `from` and returns the status and the
/// response head (only the head is read, so an opened tunnel does not hold the test up; 0
/// when nothing came back within the read timeout).
pub fn status_from(from: &str, proxy: std::net::SocketAddr, target: &str) -> (u16, String) {
    let (status, head, _) = tunnel_from(from, proxy, target);
    (status, head)
}

/// As [`status_from`], with the connection: the tunnel, while it lasts.
pub fn tunnel_from(
    from: &str,
    proxy: std::net::SocketAddr,
    target: &str,
) -> (u16, String, std::net::TcpStream) {
    use std::io::{Read, Write};
    let mut s = connect_from(from, proxy);
    let _ = s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    (super::status_of(&text), text, s)
}

/// A SOCKS5 CONNECT (no login) to `host:port` through `socks` from the local address `from`,
/// waiting up to 10 s for each answer: the tunnel once the proxy replied success, else what
/// it did instead (closed, another method, a reply code).
pub fn socks5_from(
    from: &str,
    socks: std::net::SocketAddr,
    host: &str,
    port: u16,
) -> Result<std::net::TcpStream, String> {
    use std::io::{Read, Write};
    let mut s = connect_from(from, socks);
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let closed = |e: std::io::Error| format!("closed: {e}");
    s.write_all(&[5, 1, 0]).map_err(closed)?;
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).map_err(closed)?;
    if choice != [5, 0] {
        return Err(format!("method choice {choice:?}"));
    }
    let mut request = vec![5, 1, 0, 3, u8::try_from(host.len()).expect("a short host")];
    request.extend_from_slice(host.as_bytes());
    request.extend_from_slice(&port.to_be_bytes());
    s.write_all(&request).map_err(closed)?;
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).map_err(closed)?;
    match reply[1] {
        0 => Ok(s),
        _ => Err(format!("SOCKS5 reply {reply:?}")),
    }
}

/// A connection to `proxy` from the local address `from` (any port), with a 5 s read timeout.
pub fn connect_from(from: &str, proxy: std::net::SocketAddr) -> std::net::TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let local: std::net::SocketAddr = format!("{from}:0").parse().expect("address");
    socket.bind(&local.into()).expect("bind");
    #[expect(
        clippy::disallowed_methods,
        reason = "a test client connecting to the proxy under test"
    )]
    socket.connect(&proxy.into()).expect("connect");
    let s: std::net::TcpStream = socket.into();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    s
}
