//! Where a placeholder hid from the search (a review of a646182): a plain-HTTP request's
//! chunk extension or trailer section, relayed as it came while only the chunks' data was
//! searched, is refused 400 and never reaches the origin (a raw origin here shows every
//! byte it got); a header named with the placeholder, and a method that is the placeholder,
//! are refused `credential_leak` over plain HTTP and inside an intercepted tunnel.

use std::io::{BufRead, Read};
use std::path::Path;

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;
use serde_json::Value;

use super::{PLACEHOLDER, SECRET_VAR, ScriptOrigin, credential, holding, secret, secrets_policy};
use crate::common::world::World;
use crate::l7::decisions::{events_once, is_decision};
use crate::l7::entry;
use crate::l7::wire::{Conn, request_with};
use crate::l7_tls::{close_of, https_conn, pem_file};

/// A raw plain-HTTP origin (Python's sockets): it keeps every byte each connection sent in
/// `DIR/conn-N.raw` and prints `done N` once that connection is over; it answers a request
/// read to its end (chunked to its last chunk and trailer section) `200 ok`. It reads for
/// at most 10 s a connection, so each is over by then.
const RAW_ORIGIN: &str = r#"
import os, socket, sys, threading
out = sys.argv[1]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(16)
print(srv.getsockname()[1], flush=True)
lock = threading.Lock()
def ended(data):
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    at = body.find(b"\r\n0\r\n")
    return at >= 0 and b"\r\n\r\n" in body[at + 2:]
def serve(n, conn):
    data = b""
    try:
        conn.settimeout(10)
        while not ended(data) and len(data) < 1 << 20:
            got = conn.recv(65536)
            if not got:
                break
            data += got
        if ended(data):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        conn.close()
    except Exception as e:
        data += b"\n[origin: " + repr(e).encode() + b"]"
    with open(os.path.join(out, "conn-%d.raw" % n), "wb") as f:
        f.write(data)
    with lock:
        print("done", n, flush=True)
n = 0
while True:
    conn, _ = srv.accept()
    n += 1
    threading.Thread(target=serve, args=(n, conn), daemon=True).start()
"#;

/// Everything the raw origin received, once `connections` connections are over, each
/// connection's bytes in turn.
fn received(origin: &mut ScriptOrigin, dir: &Path, connections: usize) -> String {
    let mut done = 0;
    let mut line = String::new();
    while done < connections {
        line.clear();
        match origin.lines.read_line(&mut line) {
            Ok(0) | Err(_) => panic!("the raw origin ended after {done} connections"),
            Ok(_) => done += usize::from(line.starts_with("done")),
        }
    }
    let mut all = String::new();
    for n in 1..=connections {
        let mut f = std::fs::File::open(dir.join(format!("conn-{n}.raw"))).unwrap();
        f.read_to_string(&mut all).unwrap();
    }
    all
}

/// A chunked POST over plain HTTP (a raw client) with the placeholder in a chunk extension,
/// and one with it in a trailer field: each answered 400 naming what was refused, recorded
/// once (the allow, and its close with status 400), and the origin gets neither the
/// placeholder nor the body past the head. The same body without them goes through.
#[test]
fn a_requests_chunk_extensions_and_trailers_are_refused_over_plain_http() {
    let w = World::new();
    let dir = tempfile::tempdir().unwrap();
    let mut origin = ScriptOrigin::start(RAW_ORIGIN, &[dir.path().as_os_str()]);
    let port = origin.port;
    let dns = w.dns(Zone::new().with("open.test", &["127.0.0.1"]));
    let ca = TestCa::new(&["cred.test"]);
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = secrets_policy(
        dir.path(),
        &entry("open.test", port, &[]),
        &credential("cred.test", SECRET_VAR, PLACEHOLDER),
    );
    let one = secret();
    let vars = [(SECRET_VAR, one.as_str())];
    let i = holding(&vars, &dns, &policy, &roots, &dir.path().join("stdout.log"), &[]);
    let authority = format!("open.test:{port}");
    let post = |path: &str, body: &str| {
        let mut conn = Conn::open(i.proxy.addr);
        conn.send(&format!(
            "POST http://{authority}{path} HTTP/1.1\r\nHost: {authority}\r\n\
             Transfer-Encoding: chunked\r\n\r\n{body}"
        ));
        conn.read_reply()
    };
    let extension = post(
        "/extension",
        &format!("b;x={PLACEHOLDER}\r\nhello-chunk\r\n0\r\n\r\n"),
    );
    let trailer = post(
        "/trailer",
        &format!("b\r\nhello-chunk\r\n0\r\n{PLACEHOLDER}: 1\r\nX-Leak: {PLACEHOLDER}\r\n\r\n"),
    );
    let plain = post("/plain", "b\r\nhello-chunk\r\n0\r\n\r\n");
    assert_eq!(
        (extension.status, trailer.status, plain.status),
        (400, 400, 200),
        "{extension:?}\n{trailer:?}\n{plain:?}"
    );
    assert!(extension.body.contains("chunk extension"), "{extension:?}");
    assert!(trailer.body.contains("trailer section"), "{trailer:?}");

    let seen = received(&mut origin, dir.path(), 3);
    assert!(
        !seen.contains(PLACEHOLDER),
        "the placeholder reached the origin:\n{seen}"
    );
    assert_eq!(
        seen.matches("hello-chunk").count(),
        1,
        "only the plain body reached the origin:\n{seen}"
    );

    let audit = &i.proxy.audit_path;
    for path in ["/extension", "/trailer"] {
        let events = events_once(audit, |e| e["event"] == "close" && e["path"] == path);
        let decisions: Vec<&Value> = events
            .iter()
            .filter(|e| is_decision(e, "open.test", "POST", path))
            .collect();
        assert_eq!(decisions.len(), 1, "{path}: {events:#?}");
        let closed = close_of(audit, decisions[0]);
        assert_eq!(
            (&decisions[0]["decision"], &closed["status"], &closed["outcome"]),
            (&"allow".into(), &400.into(), &"client_failure".into()),
            "{path}: {closed:#}"
        );
    }
}

/// A header named with the placeholder (in another case too), and a request whose method
/// is the placeholder (the entries list no methods, so any token passes them): refused 403
/// `credential_leak` inside an intercepted tunnel and over plain HTTP, and none reaches an
/// origin.
#[test]
fn a_placeholder_as_a_header_name_or_the_method_is_refused_as_a_leak() {
    let w = World::new();
    let ca = TestCa::new(&["cred.test"]);
    let tls = w.tls_origin(&ca);
    let plain = w.origin();
    let (tp, pp) = (tls.port(), plain.port());
    let zone = Zone::new()
        .with("cred.test", &["127.0.0.1"])
        .with("open.test", &["127.0.0.1"]);
    let dns = w.dns(zone);
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let entries = [entry("cred.test", tp, &[]), entry("open.test", pp, &[])].concat();
    let (policy, _) = secrets_policy(
        dir.path(),
        &entries,
        &credential("cred.test", SECRET_VAR, PLACEHOLDER),
    );
    let one = secret();
    let vars = [(SECRET_VAR, one.as_str())];
    let i = holding(&vars, &dns, &policy, &roots, &dir.path().join("stdout.log"), &[]);
    let lower = PLACEHOLDER.to_ascii_lowercase();
    let https = |method: &str, target: &str, fields: &[(&str, &str)]| {
        let mut conn = https_conn(i.proxy.addr, "cred.test", tp, &i.ca_pem);
        conn.send(&request_with(
            method,
            target,
            &format!("cred.test:{tp}"),
            fields,
            "",
        ));
        conn.read_reply()
    };
    let http = |method: &str, target: &str, fields: &[(&str, &str)]| {
        let authority = format!("open.test:{pp}");
        let mut conn = Conn::open(i.proxy.addr);
        let absolute = format!("http://{authority}{target}");
        conn.send(&request_with(method, &absolute, &authority, fields, ""));
        conn.read_reply()
    };
    let replies = [
        ("/tls-name", https("GET", "/tls-name", &[(PLACEHOLDER, "1")])),
        ("/tls-method", https(PLACEHOLDER, "/tls-method", &[])),
        ("/http-name", http("GET", "/http-name", &[(&lower, "1")])),
        ("/http-method", http(PLACEHOLDER, "/http-method", &[])),
    ];
    let statuses: Vec<(&str, u16)> = replies.iter().map(|(p, r)| (*p, r.status)).collect();
    let refused: Vec<(&str, u16)> = replies.iter().map(|(p, _)| (*p, 403)).collect();
    assert_eq!(statuses, refused, "{replies:#?}");
    for (path, reply) in &replies {
        assert!(reply.body.contains("credential"), "{path}: {reply:?}");
    }
    let reached: Vec<String> = tls
        .received()
        .iter()
        .chain(plain.received().iter())
        .map(|r| r.target.clone())
        .collect();
    assert_eq!(reached, Vec::<String>::new(), "reached an origin");
    let audit = &i.proxy.audit_path;
    let is_leak = |e: &Value| e["event"] == "decision" && e["reason_code"] == "credential_leak";
    let events = events_once(audit, |e| is_leak(e) && e["path"] == "/http-method");
    let leaks: Vec<&str> = events
        .iter()
        .filter(|e| is_leak(e))
        .map(|e| e["path"].as_str().unwrap_or("-"))
        .collect();
    assert_eq!(
        leaks,
        ["/tls-name", "/tls-method", "/http-name", "/http-method"],
        "{events:#?}"
    );
}
