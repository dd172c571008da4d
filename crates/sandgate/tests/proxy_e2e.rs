//! End-to-end tests of `sandgate proxy` with real clients (curl, Python) against loopback
//! origins, a fixture DNS server of our own, and a test CA. Tests whose DNS answers are
//! private or reserved run inside a private network namespace.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    clippy::zombie_processes,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::{ProxyProcess, curl, raw, rerun_in_private_netns, rerun_in_private_netns_with, status_of};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use sandgate_testkit::origin::Origin;
use sandgate_testkit::tls::TestCa;
use serde_json::Value;

/// Fixtures run on a background runtime while the test thread drives blocking clients.
struct World {
    rt: tokio::runtime::Runtime,
}

impl World {
    fn new() -> World {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        World { rt }
    }

    fn dns(&self, zone: Zone) -> DnsServer {
        self.rt.block_on(DnsServer::start(zone))
    }

    fn origin(&self) -> Origin {
        self.rt.block_on(Origin::http())
    }

    fn tls_origin(&self, ca: &TestCa) -> Origin {
        self.rt.block_on(Origin::https(ca.server_config.clone()))
    }

    fn echo(&self) -> EchoServer {
        self.rt.block_on(EchoServer::start())
    }
}

/// A proxy that treats loopback as public (the origins live there) and asks `dns` only.
fn proxy(dns: &DnsServer, extra: &[&str]) -> ProxyProcess {
    let dns_addr = dns.addr().to_string();
    let mut args = vec!["--dns-server", &dns_addr, "--allow-range", "127.0.0.0/8"];
    args.extend_from_slice(extra);
    ProxyProcess::start(&args)
}

fn events_of<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == kind).collect()
}

#[test]
fn curl_http_through_the_proxy_reaches_an_allowed_origin() {
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(Zone::new().with("allowed.test", &["127.0.0.1"]));
    let allow = format!("allowed.test:{}", origin.port());
    let p = proxy(&dns, &["--allow", &allow]);
    let url = format!("http://allowed.test:{}/hello?x=1", origin.port());
    let (code, body, err) = curl(
        &p.url(),
        &["-H", "Proxy-Authorization: Basic c2VjcmV0", url.as_str()],
    );
    assert_eq!(code, 0, "{err}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["path"], "/hello?x=1");
    let headers = seen["headers"].as_array().unwrap();
    let header = |name: &str| {
        headers
            .iter()
            .find(|h| h[0] == name)
            .map(|h| h[1].as_str().unwrap().to_owned())
    };
    assert_eq!(header("host"), Some(allow.clone()));
    assert_eq!(header("via").as_deref(), Some("1.1 sandgate"));
    assert_eq!(
        header("proxy-authorization"),
        None,
        "credentials must not reach the upstream"
    );
    assert_eq!(header("proxy-connection"), None);

    let events = p.audit_events(2);
    let decisions = events_of(&events, "decision");
    let closes = events_of(&events, "close");
    assert_eq!((decisions.len(), closes.len()), (1, 1), "{events:#?}");
    let d = decisions[0];
    assert_eq!(d["decision"], "allow");
    assert_eq!(d["destination_host"], "allowed.test");
    assert_eq!(d["resolved_ip"], "127.0.0.1");
    assert_eq!(d["rule"], format!("allow:{allow}"));
    assert_eq!(closes[0]["request_id"], d["request_id"]);
    assert_eq!(closes[0]["status"], 200);
    assert_eq!(closes[0]["outcome"], "ok");
    assert!(closes[0]["bytes_received"].as_u64().unwrap() > body.len() as u64);
}

#[test]
fn curl_https_through_connect_and_deny_names_the_destination() {
    let w = World::new();
    let ca = TestCa::new(&["allowed.test"]);
    let origin = w.tls_origin(&ca);
    let dns = w.dns(
        Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("denied.test", &["127.0.0.1"]),
    );
    let allow = format!("allowed.test:{}", origin.port());
    let p = proxy(&dns, &["--allow", &allow]);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.ca_pem).unwrap();
    let ca_arg = ca_file.to_str().unwrap();

    let url = format!("https://allowed.test:{}/secure", origin.port());
    let (code, body, err) = curl(&p.url(), &["--cacert", ca_arg, &url]);
    assert_eq!(code, 0, "{err}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["path"], "/secure");

    let denied = format!("https://denied.test:{}/", origin.port());
    let (code, _, err) = curl(&p.url(), &["--cacert", ca_arg, "-v", &denied]);
    assert_ne!(code, 0);
    assert!(err.contains("403"), "{err}");
    // The body names the destination; read it with a raw client.
    let reply = raw(
        p.addr,
        format!(
            "CONNECT denied.test:{0} HTTP/1.1\r\nHost: denied.test:{0}\r\n\r\n",
            origin.port()
        )
        .as_bytes(),
    );
    assert_eq!(status_of(&reply), 403);
    assert!(
        reply.contains(&format!(
            "denied CONNECT denied.test:{}: not in allowlist",
            origin.port()
        )),
        "{reply}"
    );
    assert!(
        reply.contains("Proxy-Status: sandgate; error=http_request_denied"),
        "{reply}"
    );
    assert_eq!(
        dns.questions_about("denied.test"),
        0,
        "a denied name must cause no DNS query"
    );

    let events = p.audit_events(4);
    let decisions = events_of(&events, "decision");
    assert_eq!(decisions.len(), 3, "{events:#?}");
    assert_eq!(events_of(&events, "close").len(), 1);
    let close = events_of(&events, "close")[0];
    assert_eq!(close["scheme"], "connect");
    assert!(close["bytes_sent"].as_u64().unwrap() > 0);
    assert!(close["bytes_received"].as_u64().unwrap() > 0);
}

#[test]
fn python_urllib_through_the_proxy() {
    let w = World::new();
    let ca = TestCa::new(&["py.test"]);
    let origin = w.origin();
    let tls = w.tls_origin(&ca);
    let dns = w.dns(Zone::new().with("py.test", &["127.0.0.1"]));
    let a1 = format!("py.test:{}", origin.port());
    let a2 = format!("py.test:{}", tls.port());
    let p = proxy(&dns, &["--allow", &a1, "--allow", &a2]);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.ca_pem).unwrap();
    let script = r#"
import json, ssl, sys, urllib.request, urllib.error
proxy, http_port, https_port, cafile = sys.argv[1:5]
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({"http": proxy, "https": proxy}),
    urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=cafile)))
r = opener.open(f"http://py.test:{http_port}/py", data=b"hello=1", timeout=10)
seen = json.load(r)
assert seen["method"] == "POST" and seen["body_len"] == 7, seen
r = opener.open(f"https://py.test:{https_port}/tls", timeout=10)
assert json.load(r)["path"] == "/tls"
try:
    opener.open("http://blocked.test/", timeout=10)
    raise SystemExit("blocked request succeeded")
except urllib.error.HTTPError as e:
    assert e.code == 403, e.code
    assert "blocked.test:80" in e.read().decode()
print("python ok")
"#;
    let out = Command::new("python3")
        .args([
            "-c",
            script,
            &p.url(),
            &origin.port().to_string(),
            &tls.port().to_string(),
            ca_file.to_str().unwrap(),
        ])
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("python ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn malformed_and_ambiguous_requests_get_400_before_any_dns_query() {
    let w = World::new();
    let dns = w.dns(Zone::new().with("ok.test", &["127.0.0.1"]));
    let p = proxy(&dns, &["--allow", "*"]);
    let cases: &[(&str, u16)] = &[
        ("GET / HTTP/1.1\r\nHost: ok.test\r\n\r\n", 400),
        ("GET https://ok.test/ HTTP/1.1\r\nHost: ok.test\r\n\r\n", 400),
        ("GET ftp://ok.test/ HTTP/1.1\r\nHost: ok.test\r\n\r\n", 400),
        (
            "GET http://user:pw@ok.test/ HTTP/1.1\r\nHost: ok.test\r\n\r\n",
            400,
        ),
        ("GET http://ok%2etest/ HTTP/1.1\r\nHost: ok.test\r\n\r\n", 400),
        ("GET http://0x7f.1/ HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("GET http://127.1/ HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("GET http://2130706433/ HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("GET http://ok.test:99999/ HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("CONNECT ok.test HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("CONNECT [fe80::1%25eth0]:443 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (
            "POST http://ok.test/ HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        (
            "POST http://ok.test/ HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
            400,
        ),
        (
            "POST http://ok.test/ HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 3, 3\r\n\r\nabc",
            400,
        ),
        (
            "POST http://ok.test/ HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: gzip\r\n\r\n",
            400,
        ),
        (
            "GET http://ok.test/ HTTP/1.1\r\nHost: ok.test\r\nX-A: 1\r\n folded\r\n\r\n",
            400,
        ),
        (
            "GET http://ok.test/ HTTP/1.1\r\nHost: ok.test\r\nHost: evil.test\r\n\r\n",
            400,
        ),
    ];
    for (request, want) in cases {
        let reply = raw(p.addr, request.as_bytes());
        assert_eq!(status_of(&reply), *want, "{request:?} -> {reply}");
        assert!(
            reply.contains("Proxy-Status: sandgate; error=http_request_error"),
            "{reply}"
        );
    }
    assert!(
        dns.questions().is_empty(),
        "no DNS for malformed requests: {:?}",
        dns.questions()
    );
    let events = p.audit_events(cases.len());
    assert_eq!(events.len(), cases.len(), "one decision per request: {events:#?}");
    assert!(
        events
            .iter()
            .all(|e| e["event"] == "decision" && e["decision"] == "deny")
    );
}

#[test]
fn oversized_and_slow_heads() {
    let w = World::new();
    let dns = w.dns(Zone::new());
    let p = proxy(&dns, &["--allow", "*", "--head-timeout", "0.5"]);
    let big = format!(
        "GET http://ok.test/ HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let reply = raw(p.addr, big.as_bytes());
    assert_eq!(status_of(&reply), 431, "{reply}");
    // A head that never finishes: 408 once the head timeout passes.
    let reply = raw(p.addr, b"GET http://ok.test/ HTTP/1.1\r\nX-Slow: 1\r\n");
    assert_eq!(status_of(&reply), 408, "{reply}");
    // A connection that sends nothing is closed quietly.
    assert_eq!(raw(p.addr, b""), "");
}

#[test]
fn upstream_failures_map_to_502_and_504() {
    let w = World::new();
    // A port with nothing listening.
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // A server that accepts and never answers.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mute_port = mute.local_addr().unwrap().port();
    let dns = w.dns(Zone::new().with("up.test", &["127.0.0.1"]).silent("slow.test"));
    let p = proxy(
        &dns,
        &[
            "--allow",
            "*",
            "--dns-timeout",
            "0.5",
            "--response-timeout",
            "0.5",
        ],
    );
    let get = |host: &str| {
        raw(
            p.addr,
            format!("GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes(),
        )
    };
    let reply = get("nxdomain.test");
    assert_eq!(status_of(&reply), 502, "{reply}");
    assert!(reply.contains("error=dns_error"), "{reply}");
    let reply = get("slow.test");
    assert_eq!(status_of(&reply), 504, "{reply}");
    assert!(reply.contains("error=dns_timeout"), "{reply}");
    let reply = get(&format!("up.test:{closed_port}"));
    assert_eq!(status_of(&reply), 502, "{reply}");
    assert!(reply.contains("error=connection_refused"), "{reply}");
    let reply = get(&format!("up.test:{mute_port}"));
    assert_eq!(status_of(&reply), 504, "{reply}");
    assert!(reply.contains("error=connection_read_timeout"), "{reply}");
    drop(mute);
    let events = p.audit_events(8);
    assert_eq!(events_of(&events, "decision").len(), 4, "{events:#?}");
    let closes = events_of(&events, "close");
    assert_eq!(closes.len(), 4, "{events:#?}");
    let outcomes: Vec<&str> = closes.iter().map(|e| e["outcome"].as_str().unwrap()).collect();
    assert_eq!(
        outcomes,
        [
            "upstream_failure:dns",
            "upstream_failure:dns_timeout",
            "upstream_failure:connection_refused",
            "upstream_failure:response_timeout"
        ]
    );
}

#[test]
fn keep_alive_decides_each_request_and_reuses_only_the_same_destination() {
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("a.test", &["127.0.0.1"])
            .with("b.test", &["127.0.0.1"]),
    );
    let allow = format!("a.test:{}", origin.port());
    let p = proxy(&dns, &["--allow", &allow]);
    let mut s = TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let port = origin.port();
    // Two allowed requests (one with a lying Host header), then a denied one, pipelined.
    let requests = format!(
        "GET http://a.test:{port}/one HTTP/1.1\r\nHost: a.test:{port}\r\n\r\n\
         GET http://a.test:{port}/two HTTP/1.1\r\nHost: b.test\r\n\r\n\
         GET http://b.test:{port}/three HTTP/1.1\r\nHost: a.test:{port}\r\n\r\n"
    );
    s.write_all(requests.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    // Bodies have no trailing newline, so find status lines anywhere.
    let statuses: Vec<&str> = out
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &out[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["200", "200", "403"], "{out}");
    assert!(
        out.contains(&format!("[\"host\",\"a.test:{port}\"]")),
        "Host is rewritten from the target: {out}"
    );
    assert!(
        !out.contains("\"b.test\""),
        "the lying Host header must not reach the origin: {out}"
    );
    assert!(out.contains("denied GET b.test"), "{out}");
    assert_eq!(
        origin.connections(),
        1,
        "the upstream connection is reused for the same destination"
    );
}

#[test]
fn request_bodies_are_forwarded_verbatim() {
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(Zone::new().with("body.test", &["127.0.0.1"]));
    let allow = format!("body.test:{}", origin.port());
    let p = proxy(&dns, &["--allow", &allow]);
    let port = origin.port();
    let chunked = format!(
        "POST http://body.test:{port}/c HTTP/1.1\r\nHost: body.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
         5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
    );
    let reply = raw(p.addr, chunked.as_bytes());
    assert_eq!(status_of(&reply), 200, "{reply}");
    assert!(reply.contains("\"body_len\":11"), "{reply}");
    // A 2 MiB upload through curl (which sends Expect: 100-continue).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("upload");
    std::fs::write(&file, vec![7u8; 2 * 1024 * 1024]).unwrap();
    let url = format!("http://body.test:{port}/upload");
    let data = format!("@{}", file.display());
    let (code, body, err) = curl(&p.url(), &["--data-binary", &data, &url]);
    assert_eq!(code, 0, "{err}");
    assert!(body.contains("\"body_len\":2097152"), "{body}");
    // A large response body.
    let (code, body, err) = curl(&p.url(), &[&format!("http://body.test:{port}/bytes/3000000")]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(body.len(), 3_000_000);
}

#[test]
fn tunnel_counts_bytes_each_way_exactly() {
    let w = World::new();
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let allow = format!("echo.test:{}", echo.addr().port());
    let p = proxy(&dns, &["--allow", &allow]);
    let mut s = TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The first payload bytes ride along with the CONNECT head, as TLS clients do.
    let head = format!("CONNECT {allow} HTTP/1.1\r\nHost: {allow}\r\n\r\nearly");
    s.write_all(head.as_bytes()).unwrap();
    let payload = vec![42u8; 1_000_000];
    s.write_all(&payload).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let established = b"HTTP/1.1 200 Connection Established\r\n\r\n";
    assert!(out.starts_with(established));
    assert_eq!(out.len() - established.len(), 5 + payload.len());
    let events = p.audit_events(2);
    let close = events_of(&events, "close")[0];
    assert_eq!(close["bytes_sent"], 1_000_005);
    assert_eq!(close["bytes_received"], 1_000_005);
    assert_eq!(close["outcome"], "ok");
}

#[test]
fn the_proxy_refuses_to_connect_to_itself() {
    let w = World::new();
    let dns = w.dns(Zone::new());
    let dns_addr = dns.addr().to_string();
    // The policy must name the proxy's own port, so learn a free loopback port first.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let p = ProxyWithListen::start(
        &free,
        &[
            "--dns-server",
            &dns_addr,
            "--allow-range",
            "127.0.0.0/8",
            "--allow",
            &free,
        ],
    );
    let reply = raw(
        p.addr,
        format!("CONNECT {free} HTTP/1.1\r\nHost: {free}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&reply), 403, "{reply}");
    assert!(reply.contains("that is this proxy"), "{reply}");
}

/// A proxy on a given listen address (for the self-connection test only).
struct ProxyWithListen {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl ProxyWithListen {
    fn start(listen: &str, args: &[&str]) -> ProxyWithListen {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandgate"))
            .args(["proxy", "--listen", listen, "--audit-log", "/dev/null"])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let addr: std::net::SocketAddr = listen.parse().unwrap();
        for _ in 0..200 {
            if TcpStream::connect(addr).is_ok() {
                return ProxyWithListen { child, addr };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        panic!("proxy did not listen on {listen}");
    }
}

impl Drop for ProxyWithListen {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn private_and_reserved_answers_are_refused_in_a_private_netns() {
    if rerun_in_private_netns("private_and_reserved_answers_are_refused_in_a_private_netns") {
        return;
    }
    let w = World::new();
    let dns = w.dns(
        Zone::new()
            .with("rebind.test", &["93.184.216.34", "10.0.0.1"])
            .with("meta.test", &["169.254.169.254"])
            .with("mapped.test", &["::ffff:127.0.0.1"])
            .with("nat64.test", &["64:ff9b::a00:1"])
            .with("ula.test", &["fd00::1"])
            .with("cgnat.test", &["100.64.0.1"]),
    );
    let dns_addr = dns.addr().to_string();
    // No --allow-range here: the guard is in full force.
    let p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow",
        "*",
        "--allow",
        "10.0.0.5",
        "--allow",
        "[::1]",
    ]);
    for (target, class) in [
        ("rebind.test:443", "private"),
        ("meta.test:443", "cloud_metadata"),
        ("mapped.test:443", "loopback"),
        ("nat64.test:443", "private"),
        ("ula.test:443", "unique_local"),
        ("cgnat.test:443", "shared_cgnat"),
        ("10.0.0.5:443", "private"),
        ("[::1]:443", "loopback"),
    ] {
        let reply = raw(
            p.addr,
            format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&reply), 403, "{target}: {reply}");
        assert!(
            reply.contains("error=destination_ip_prohibited"),
            "{target}: {reply}"
        );
        assert!(
            reply.contains(&format!("resolves to a {class} address")),
            "{target}: {reply}"
        );
    }
    let events = p.audit_events(8);
    assert_eq!(events.len(), 8, "{events:#?}");
    assert!(
        events
            .iter()
            .all(|e| e["decision"] == "deny" && e["reason_code"] == "destination_ip_prohibited")
    );
    assert_eq!(events[0]["resolved_ip"], "10.0.0.1");
}

#[test]
fn sigterm_lets_a_tunnel_finish_and_flushes_the_audit_log() {
    let w = World::new();
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let allow = format!("echo.test:{}", echo.addr().port());
    let mut p = proxy(&dns, &["--allow", &allow, "--shutdown-grace", "5"]);
    let mut s = TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT {allow} HTTP/1.1\r\nHost: {allow}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).unwrap();
    let pid = p.child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // New connections are refused or closed, but the open tunnel still works.
    s.write_all(b"still here").unwrap();
    let mut back = [0u8; 10];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"still here");
    drop(s);
    let status = p.terminate();
    assert!(status.success(), "{status:?}");
    let events = common::read_audit(&p.audit_path);
    assert_eq!(events.len(), 2, "{events:#?}");
    assert_eq!(events[1]["event"], "close");
    assert_eq!(events[1]["bytes_sent"], 10);
}

#[test]
fn bad_flags_exit_64_naming_the_value() {
    for (args, needle) in [
        (&["--allow", "*.com"][..], "*.com"),
        (&["--allow", "127.1"][..], "127.1"),
        (&["--deny", "**"][..], "**"),
        (&["--listen", "nowhere"][..], "nowhere"),
        (&["--allow-range", "10.0.0.0/99"][..], "10.0.0.0/99"),
        (&["--no-such-flag"][..], "--no-such-flag"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_sandgate"))
            .arg("proxy")
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn an_ordinary_user_runs_the_proxy() {
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(Zone::new().with("plain.test", &["127.0.0.1"]));
    let dns_addr = dns.addr().to_string();
    let allow = format!("plain.test:{}", origin.port());
    let (p, _bin) = ProxyProcess::start_unprivileged(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &allow,
    ]);
    let pid = p.child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap().to_owned();
    assert!(
        !uid_line.split_whitespace().skip(1).any(|u| u == "0"),
        "proxy runs as root: {uid_line}"
    );
    let (code, body, err) = curl(&p.url(), &[&format!("http://{allow}/as-nobody")]);
    assert_eq!(code, 0, "{err}");
    assert!(body.contains("/as-nobody"), "{body}");
    let reply = raw(
        p.addr,
        b"CONNECT elsewhere.test:443 HTTP/1.1\r\nHost: elsewhere.test:443\r\n\r\n",
    );
    assert_eq!(status_of(&reply), 403, "{reply}");
    assert_eq!(p.audit_events(3).len(), 3);
}

#[test]
fn an_upstream_reset_mid_tunnel_ends_only_that_tunnel() {
    let w = World::new();
    let origin = w.origin();
    // An upstream that reads a little, then resets the connection (SO_LINGER 0).
    let resetter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let reset_port = resetter.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = resetter.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    });
    let dns = w.dns(
        Zone::new()
            .with("reset.test", &["127.0.0.1"])
            .with("fine.test", &["127.0.0.1"]),
    );
    let a1 = format!("reset.test:{reset_port}");
    let a2 = format!("fine.test:{}", origin.port());
    let p = proxy(&dns, &["--allow", &a1, "--allow", &a2]);
    let mut s = TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT {a1} HTTP/1.1\r\nHost: {a1}\r\n\r\nhello").as_bytes())
        .unwrap();
    server.join().unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    // The proxy carries on serving.
    let (code, body, err) = curl(&p.url(), &[&format!("http://{a2}/after-reset")]);
    assert_eq!(code, 0, "{err}");
    assert!(body.contains("/after-reset"));
    let events = p.audit_events(4);
    let close = events_of(&events, "close")
        .into_iter()
        .find(|e| e["destination_host"] == "reset.test")
        .unwrap();
    assert_eq!(close["outcome"], "upstream_reset", "{close}");
    assert_eq!(close["bytes_sent"], 5);
}

#[test]
fn connect_timeout_is_504_in_a_private_netns() {
    // A veth pair whose far end has no address: ARP for 198.18.0.2 is never answered, so the
    // SYN never leaves, inside a namespace that has no route off this machine anyway.
    let setup = "ip link add sink0 type veth peer name sink1; ip addr add 198.18.0.1/24 dev sink0; \
                 ip link set sink0 up; ip link set sink1 up; \
                 for i in 1 2 3 4 5 6 7 8 9 10; do ip link show sink0 | grep -q LOWER_UP && break; sleep 0.1; done";
    if rerun_in_private_netns_with("connect_timeout_is_504_in_a_private_netns", setup) {
        return;
    }
    let p = ProxyProcess::start(&[
        "--dns-server",
        "127.0.0.1:9",
        "--allow-range",
        "198.18.0.0/15",
        "--allow",
        "198.18.0.2:443",
        "--connect-timeout",
        "0.5",
    ]);
    let reply = raw(
        p.addr,
        b"CONNECT 198.18.0.2:443 HTTP/1.1\r\nHost: 198.18.0.2:443\r\n\r\n",
    );
    assert_eq!(status_of(&reply), 504, "{reply}");
    assert!(reply.contains("error=connection_timeout"), "{reply}");
    let events = p.audit_events(2);
    assert_eq!(
        events[1]["outcome"], "upstream_failure:connection_timeout",
        "{events:#?}"
    );
}

#[test]
fn idle_tunnels_are_closed_and_the_connection_cap_holds() {
    let w = World::new();
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let allow = format!("echo.test:{}", echo.addr().port());
    let p = proxy(
        &dns,
        &[
            "--allow",
            &allow,
            "--tunnel-idle-timeout",
            "0.5",
            "--max-connections",
            "1",
        ],
    );
    let connect = format!("CONNECT {allow} HTTP/1.1\r\nHost: {allow}\r\n\r\n");
    let mut first = TcpStream::connect(p.addr).unwrap();
    first.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    first.write_all(connect.as_bytes()).unwrap();
    let mut head = [0u8; 39];
    first.read_exact(&mut head).unwrap();
    // While the first tunnel holds the only slot, a second connection is answered 503 at
    // once (never left waiting unanswered).
    let second = common::raw(p.addr, connect.as_bytes());
    assert!(second.starts_with("HTTP/1.1 503"), "{second}");
    assert!(second.contains("connection_limit_reached"), "{second}");
    // The idle first tunnel is closed after 0.5 s; then a new connection is served.
    let mut rest = Vec::new();
    first.read_to_end(&mut rest).unwrap();
    let mut third = TcpStream::connect(p.addr).unwrap();
    third.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    third.write_all(connect.as_bytes()).unwrap();
    third.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"));
    let events = p.audit_events(4);
    let close = events_of(&events, "close")[0];
    assert_eq!(close["outcome"], "idle_timeout", "{events:#?}");
    assert!(
        events.iter().any(|e| e["reason_code"]
            .as_str()
            .is_some_and(|r| r.starts_with("connection_limit:"))),
        "{events:#?}"
    );
}

#[test]
fn a_node_local_proxy_chains_through_a_central_one() {
    let w = World::new();
    let echo = w.echo();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("echo.test", &["127.0.0.1"])
            .with("web.test", &["127.0.0.1"])
            .with("other.test", &["127.0.0.1"]),
    );
    let tunnel = format!("echo.test:{}", echo.addr().port());
    let web = format!("web.test:{}", origin.port());
    let other = format!("other.test:{}", echo.addr().port());
    let central = proxy(&dns, &["--allow", &tunnel, "--allow", &web]);
    let central_addr = central.addr.to_string();
    // The node-local proxy has no working DNS at all: names are resolved centrally.
    let local = ProxyProcess::start(&[
        "--dns-server",
        "127.0.0.1:9",
        "--upstream-proxy",
        &central_addr,
        "--allow",
        &tunnel,
        "--allow",
        &web,
        "--allow",
        &other,
    ]);
    let mut s = TcpStream::connect(local.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT {tunnel} HTTP/1.1\r\nHost: {tunnel}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"));
    s.write_all(b"through two proxies").unwrap();
    let mut back = [0u8; 19];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"through two proxies");
    drop(s);
    let (code, body, err) = curl(&local.url(), &[&format!("http://{web}/chained")]);
    assert_eq!(code, 0, "{err}");
    assert!(body.contains("\"path\":\"/chained\""), "{body}");
    // Allowed locally, refused centrally: 403, recorded as an allow that failed upstream.
    let reply = raw(
        local.addr,
        format!("CONNECT {other} HTTP/1.1\r\nHost: {other}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&reply), 403, "{reply}");
    assert!(reply.contains("the upstream proxy refused it"), "{reply}");
    // Refused locally: the central proxy never hears of it.
    let reply = raw(
        local.addr,
        b"CONNECT nope.test:443 HTTP/1.1\r\nHost: nope.test:443\r\n\r\n",
    );
    assert_eq!(status_of(&reply), 403);
    let central_events = central.audit_events(5);
    assert!(
        !central_events
            .iter()
            .any(|e| e["destination_host"] == "nope.test")
    );
    assert_eq!(
        central_events
            .iter()
            .filter(|e| e["event"] == "decision" && e["decision"] == "allow")
            .count(),
        2
    );
    let local_events = local.audit_events(7);
    let closes: Vec<&str> = events_of(&local_events, "close")
        .iter()
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert!(closes.contains(&"upstream_failure:upstream_denied"), "{closes:?}");
    assert_eq!(
        local_events.iter().filter(|e| e["event"] == "decision").count(),
        4,
        "{local_events:#?}"
    );
}
