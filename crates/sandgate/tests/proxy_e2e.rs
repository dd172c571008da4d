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

use common::world::{World, events_of, proxy};
use common::{curl, raw, status_of};
use sandgate_testkit::closed::ClosedPort;
use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;
use serde_json::Value;

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
    // A port with nothing listening (held, so nothing else can listen there).
    let closed = ClosedPort::new();
    let closed_port = closed.port();
    // A server that accepts and never answers.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mute_port = mute.local_addr().unwrap().port();
    let dns = w.dns(Zone::new().with("up.test", &["127.0.0.1"]).silent("slow.test"));
    // `*` is the usual ports only (issue 30): the two test ports are named.
    let (closed_allow, mute_allow) = (format!("*:{closed_port}"), format!("*:{mute_port}"));
    let p = proxy(
        &dns,
        &[
            "--allow",
            "*",
            "--allow",
            &closed_allow,
            "--allow",
            &mute_allow,
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
    // (A request's chunk extensions and trailers are refused: l7_secrets/unread.rs.)
    let chunked = format!(
        "POST http://body.test:{port}/c HTTP/1.1\r\nHost: body.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
         5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
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

/// An origin whose keep-alive timer ends as the client's next request arrives: it reads
/// the request and closes without an answer, as a server whose idle timeout (Apache httpd
/// and Node.js: 5 s) fires while the request crosses its FIN does. The proxy must not
/// reuse a connection idle that long: the second request goes on a new connection and is
/// answered. On the code before the idle limit, the proxy reused the connection and the
/// client got a 502 for a request the origin would have served.
#[test]
fn a_connection_idle_past_common_keep_alive_timeouts_is_not_reused() {
    use std::io::BufRead;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // The origin: at most three connections, each served until a request comes after
    // 4.5 s of idleness (then closed unanswered) or the client goes.
    let origin = std::thread::spawn(move || {
        let mut connections = 0;
        listener.set_nonblocking(false).unwrap();
        for stream in listener.incoming().take(3) {
            let Ok(stream) = stream else { break };
            connections += 1;
            stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut writer = stream.try_clone().unwrap();
            let mut reader = std::io::BufReader::new(stream);
            let mut idle_since = None::<std::time::Instant>;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                // The rest of the head.
                loop {
                    let mut field = String::new();
                    if reader.read_line(&mut field).unwrap_or(0) == 0 || field == "\r\n" {
                        break;
                    }
                }
                if idle_since.is_some_and(|t| t.elapsed() > Duration::from_millis(4500)) {
                    break;
                }
                writer
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .unwrap();
                idle_since = Some(std::time::Instant::now());
            }
            if connections == 2 {
                break;
            }
        }
        connections
    });
    let w = World::new();
    let dns = w.dns(Zone::new().with("idle.test", &["127.0.0.1"]));
    let allow = format!("idle.test:{port}");
    let p = proxy(&dns, &["--allow", &allow]);
    let mut s = TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!("GET http://idle.test:{port}/ HTTP/1.1\r\nHost: idle.test\r\n\r\n");
    let answer = |s: &mut TcpStream| {
        s.write_all(request.as_bytes()).unwrap();
        let mut buf = [0u8; 512];
        let mut got = Vec::new();
        while !got.ends_with(b"ok") && !got.windows(4).any(|w| w == b"502 ") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    };
    assert!(answer(&mut s).starts_with("HTTP/1.1 200"));
    std::thread::sleep(Duration::from_millis(4700));
    let second = answer(&mut s);
    assert!(
        second.starts_with("HTTP/1.1 200"),
        "the request after the idle time got: {second}"
    );
    drop(s);
    assert_eq!(
        origin.join().unwrap(),
        2,
        "the second request came on a new connection"
    );
}
