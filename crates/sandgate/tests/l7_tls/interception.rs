//! The intercepting proxy of these tests and a client through it: a proxy started with
//! `--intercept-ca-cert` that takes a test CA for the system's roots (`SSL_CERT_FILE`), a
//! TLS client through one of its tunnels (the raw HTTP/1.1 client of `l7/wire.rs` speaks
//! inside it), the audit lines of a tunnel and of its requests, and the files a run or a
//! proxy left behind, to search. Kept apart from the tests in this directory so other test
//! binaries (`l7_secrets_e2e.rs`) can load it without them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use sandgate_testkit::dns::DnsServer;
use sandgate_testkit::tls::TlsClient;
use serde_json::Value;

use crate::common::world::{base_args, strs, tunnel_from};
use crate::common::{ProxyProcess, curl, sandgate_bin};
use crate::l7::decisions::events_once;
use crate::l7::wire::Conn;

/// A proxy that intercepts, and the CA it made.
pub struct Intercepting {
    pub proxy: ProxyProcess,
    /// The interception CA's certificate, PEM, as the proxy wrote it.
    pub ca_pem: String,
    pub ca_file: PathBuf,
    _dir: tempfile::TempDir,
}

/// `sandgate proxy --policy POLICY --intercept-ca-cert FILE`, asking `dns` only, loopback
/// treated as public, with the certificates in `roots` as the system's roots (the test CA
/// that signed the origins); returns once the CA is written.
pub fn intercepting(dns: &DnsServer, policy: &Path, roots: &Path) -> Intercepting {
    intercepting_with(Command::new(sandgate_bin()), dns, policy, roots, &[])
}

/// As [`intercepting`], starting `command` (which must end by running sandgate: a test
/// gives it an environment of its own, or wraps it) with `extra` arguments after the rest.
pub fn intercepting_with(
    mut command: Command,
    dns: &DnsServer,
    policy: &Path,
    roots: &Path,
    extra: &[&str],
) -> Intercepting {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("intercept-ca.pem");
    command.env("SSL_CERT_FILE", roots).env_remove("SSL_CERT_DIR");
    let mut args = base_args(dns);
    args.extend(
        [
            "--policy",
            policy.to_str().unwrap(),
            "--intercept-ca-cert",
            ca_file.to_str().unwrap(),
        ]
        .map(str::to_owned),
    );
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let proxy = ProxyProcess::start_with(command, &strs(&args));
    // Logged once the CA is written; the proxy serves no tunnel before it has the CA.
    assert!(
        proxy.log_line("intercepting TLS").is_some(),
        "no interception CA:\n{}",
        proxy.log_text()
    );
    let ca_pem = std::fs::read_to_string(&ca_file).unwrap();
    Intercepting {
        proxy,
        ca_pem,
        ca_file,
        _dir: dir,
    }
}

impl Intercepting {
    /// curl through the proxy, trusting only its CA, for each of `urls` (one kept-alive
    /// tunnel where curl can): its exit code, the statuses (`200 502 `) and its stderr.
    pub fn statuses(&self, urls: &[String]) -> (i32, String, String) {
        let mut args = vec!["--cacert", self.ca_file.to_str().unwrap(), "-w", "%{http_code} "];
        for url in urls {
            args.extend(["-o", "/dev/null", url]);
        }
        curl(&self.proxy.url(), &args)
    }
}

/// Writes `pem` to `dir/name`; returns its path.
pub fn pem_file(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap();
    path
}

/// A TLS client through a CONNECT to `target` (`host:port`, answered 200), naming `sni` and
/// trusting only `roots_pem`; `Err` when its handshake fails.
pub fn tls_through(proxy: SocketAddr, target: &str, sni: &str, roots_pem: &str) -> Result<TlsClient, String> {
    let (status, head, tcp) = tunnel_from("127.0.0.1", proxy, target);
    assert_eq!(status, 200, "CONNECT {target}: {head}");
    TlsClient::handshake(tcp, sni, roots_pem)
}

/// The raw HTTP/1.1 client inside a tunnel to `host:port` that trusts only `roots_pem`.
pub fn https_conn(proxy: SocketAddr, host: &str, port: u16, roots_pem: &str) -> Conn<TlsClient> {
    let tls = tls_through(proxy, &format!("{host}:{port}"), host, roots_pem)
        .unwrap_or_else(|e| panic!("TLS through the tunnel to {host}: {e}"));
    Conn::over(tls)
}

/// The CONNECT decision for `host`, waited for; fails listing the log.
pub fn connect_decision(audit: &Path, host: &str) -> Value {
    let is =
        |e: &Value| e["event"] == "decision" && e["scheme"] == "connect" && e["destination_host"] == host;
    let events = events_once(audit, is);
    events
        .iter()
        .find(|e| is(e))
        .cloned()
        .unwrap_or_else(|| panic!("no CONNECT decision for {host}:\n{events:#?}"))
}

/// The close of the request `decision` decided, waited for; fails listing the log.
pub fn close_of(audit: &Path, decision: &Value) -> Value {
    let id = &decision["request_id"];
    let is = |e: &Value| e["event"] == "close" && &e["request_id"] == id;
    let events = events_once(audit, is);
    events
        .iter()
        .find(|e| is(e))
        .cloned()
        .unwrap_or_else(|| panic!("no close for {id}:\n{events:#?}"))
}

/// The decisions on requests inside intercepted tunnels (`scheme: https`) to `host`.
pub fn inside(events: &[Value], host: &str) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["event"] == "decision" && e["scheme"] == "https" && e["destination_host"] == host)
        .cloned()
        .collect()
}

/// Every regular file under `dir`, at any depth (sockets and the like left out).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match entry.file_type() {
                Ok(t) if t.is_dir() => todo.push(entry.path()),
                Ok(t) if t.is_file() => found.push(entry.path()),
                _ => {}
            }
        }
    }
    found
}
