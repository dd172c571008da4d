//! What a hostile client writes past the rules that a literal reading would miss, and an
//! HTTP/2 client's parallel streams: an encoded `?` or `#` in a path segment (an origin that
//! decodes before it splits off the query serves another file) is refused
//! `path_not_canonical`, over plain HTTP and inside an intercepted tunnel; a placeholder
//! percent-encoded in the path or the query is refused `credential_leak`; a request's
//! trailer section never reaches the origin (a raw origin here shows every byte it got);
//! and a response the client does not read holds up no other stream of its tunnel.

use std::io::Read;
use std::path::Path;
use std::process::Command;

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;
use serde_json::Value;

use super::{PLACEHOLDER, SECRET_VAR, ScriptOrigin, credential, holding, secret, secrets_policy};
use crate::common::python;
use crate::common::sandgate_bin;
use crate::common::world::World;
use crate::l7::decisions::{decision, events_once};
use crate::l7::wire::{Conn, Reply, request_with};
use crate::l7::{egress_policy, entry};
use crate::l7_tls::{Intercepting, close_of, https_conn, intercepting, intercepting_with, pem_file};

/// `GET target` to `host`: inside an intercepted tunnel to port `https` when given, else as
/// plain HTTP in absolute form to port `http`; one connection each.
fn get(
    proxy: std::net::SocketAddr,
    ca_pem: &str,
    https: Option<u16>,
    http: u16,
    host: &str,
    target: &str,
) -> Reply {
    match https {
        Some(port) => {
            let mut conn = https_conn(proxy, host, port, ca_pem);
            conn.send(&request_with("GET", target, &format!("{host}:{port}"), &[], ""));
            conn.read_reply()
        }
        None => {
            let authority = format!("{host}:{http}");
            let mut conn = Conn::open(proxy);
            conn.send(&request_with(
                "GET",
                &format!("http://{authority}{target}"),
                &authority,
                &[],
                "",
            ));
            conn.read_reply()
        }
    }
}

/// `paths: ["/files/*.tar.gz"]`: `secret.key%3F.tar.gz` is one segment ending `.tar.gz` to
/// a literal reading, and `/files/secret.key` with a query to an origin that decodes first
/// (CVE-2024-38474). Refused, with `%23`, the other case, and the fullwidth `？`.
#[test]
fn an_encoded_query_or_fragment_in_a_path_is_refused_over_http_and_inside_a_tunnel() {
    let w = World::new();
    let ca = TestCa::new(&["files.test"]);
    let tls = w.tls_origin(&ca);
    let plain = w.origin();
    let (tp, pp) = (tls.port(), plain.port());
    let dns = w.dns(Zone::new().with("files.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let rule = ["paths: [\"/files/*.tar.gz\"]"];
    let entries = entry("files.test", tp, &rule) + &entry("files.test", pp, &rule);
    let (policy, _) = egress_policy(dir.path(), &entries);
    let i = intercepting(&dns, &policy, &roots);
    let refused = [
        "/files/secret.key%3F.tar.gz",
        "/files/secret.key%3f.tar.gz",
        "/files/secret.key%23.tar.gz",
        "/files/secret.key%EF%BC%9F.tar.gz",
    ];
    for via in [Some(tp), None] {
        for target in refused {
            let reply = get(i.proxy.addr, &i.ca_pem, via, pp, "files.test", target);
            assert_eq!(reply.status, 403, "{via:?} {target}: {reply:?}");
        }
        let reply = get(i.proxy.addr, &i.ca_pem, via, pp, "files.test", "/files/ok.tar.gz");
        assert_eq!(reply.status, 200, "{via:?}: {reply:?}");
    }
    for origin in [&tls, &plain] {
        assert_eq!(origin.requests(), ["GET /files/ok.tar.gz"]);
    }
    let last_refused = refused[refused.len() - 1];
    let last = |e: &Value| e["event"] == "decision" && e["path"] == last_refused && e["scheme"] != "https";
    let events = events_once(&i.proxy.audit_path, last);
    let denied: Vec<(&Value, &Value, &Value)> = events
        .iter()
        .filter(|e| e["event"] == "decision" && e["decision"] == "deny")
        .map(|e| (&e["scheme"], &e["path"], &e["reason_code"]))
        .collect();
    let expected: Vec<(Value, Value, Value)> = ["https", "http"]
        .iter()
        .flat_map(|s| refused.map(|t| (Value::from(*s), t.into(), "path_not_canonical".into())))
        .collect();
    let expected: Vec<(&Value, &Value, &Value)> = expected.iter().map(|(a, b, c)| (a, b, c)).collect();
    assert_eq!(denied, expected, "{events:#?}");
}

/// The placeholder percent-encoded (either case of the hex digits, or encoded twice) in the
/// query or the path is the placeholder to an origin that decodes it: refused as a leak,
/// to its own host and to another, inside a tunnel and over plain HTTP.
#[test]
fn a_placeholder_percent_encoded_in_the_path_or_query_is_refused_as_a_leak() {
    let w = World::new();
    let ca = TestCa::new(&["cred.test", "ro.test"]);
    let tls = w.tls_origin(&ca);
    let plain = w.origin();
    let (tp, pp) = (tls.port(), plain.port());
    let mut zone = Zone::new();
    for name in ["cred.test", "ro.test", "open.test"] {
        zone = zone.with(name, &["127.0.0.1"]);
    }
    let dns = w.dns(zone);
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let entries = [
        entry("cred.test", tp, &[]),
        entry("ro.test", tp, &["read_only: true"]),
        entry("open.test", pp, &[]),
    ]
    .concat();
    let (policy, _) = secrets_policy(
        dir.path(),
        &entries,
        &credential("cred.test", SECRET_VAR, PLACEHOLDER),
    );
    let one = secret();
    let out = tempfile::tempdir().unwrap();
    let vars = [(SECRET_VAR, one.as_str())];
    let i = holding(&vars, &dns, &policy, &roots, &out.path().join("stdout.log"), &[]);
    let encoded = PLACEHOLDER.replace('_', "%5F");
    let lower = PLACEHOLDER.replace('_', "%5f");
    let twice = PLACEHOLDER.replace('_', "%255F");
    let cases = [
        (Some(tp), "ro.test", format!("/q-upper?k={encoded}")),
        (Some(tp), "ro.test", format!("/q-lower?k={lower}")),
        (Some(tp), "cred.test", format!("/q-twice?k={twice}")),
        (Some(tp), "cred.test", format!("/p-{encoded}/x")),
        (None, "open.test", format!("/q-plain?k={encoded}")),
    ];
    for (via, host, target) in &cases {
        let reply = get(i.proxy.addr, &i.ca_pem, *via, pp, host, target);
        assert_eq!(reply.status, 403, "{host} {target}: {reply:?}");
    }
    assert_eq!(tls.requests(), Vec::<String>::new(), "a leak reached the origin");
    assert_eq!(
        plain.requests(),
        Vec::<String>::new(),
        "a leak reached the origin"
    );
    let is_leak = |e: &Value| e["event"] == "decision" && e["reason_code"] == "credential_leak";
    let events = events_once(&i.proxy.audit_path, |e| is_leak(e) && e["path"] == "/q-plain");
    let leaks: Vec<&Value> = events.iter().filter(|e| is_leak(e)).map(|e| &e["path"]).collect();
    let sent: Vec<Value> = cases
        .iter()
        .map(|(_, _, t)| t.split('?').next().unwrap_or_default().into())
        .collect();
    assert_eq!(leaks, sent.iter().collect::<Vec<_>>(), "{events:#?}");
}

/// A raw HTTPS origin (Python's ssl): it keeps every byte each connection sent in
/// `DIR/conn-N.raw`, and answers each request, once read to its end (chunked to its last
/// chunk and trailer section, or Content-Length), `200 ok`, closing the connection.
const RAW_ORIGIN: &str = r#"
import os, socket, ssl, sys, threading
cert, key, out = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(16)
print(srv.getsockname()[1], flush=True)
def ended(data):
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    fields = head.lower()
    if b"transfer-encoding: chunked" in fields:
        at = body.find(b"\r\n0\r\n")
        return at >= 0 and b"\r\n\r\n" in body[at + 2:]
    for line in fields.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return True
def serve(n, conn):
    data = b""
    try:
        tls = ctx.wrap_socket(conn, server_side=True)
        tls.settimeout(10)
        while not ended(data) and len(data) < 1 << 20:
            got = tls.recv(65536)
            if not got:
                break
            data += got
        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        tls.close()
    except Exception as e:
        data += b"\n[origin: " + repr(e).encode() + b"]"
    with open(os.path.join(out, "conn-%d.raw" % n), "wb") as f:
        f.write(data)
n = 0
while True:
    conn, _ = srv.accept()
    n += 1
    threading.Thread(target=serve, args=(n, conn), daemon=True).start()
"#;

/// Everything the raw origin in `dir` received, each connection's bytes in turn.
fn received(dir: &Path) -> String {
    let mut all = String::new();
    for n in 1..=16 {
        if let Ok(mut f) = std::fs::File::open(dir.join(format!("conn-{n}.raw"))) {
            let _ = f.read_to_string(&mut all);
        }
    }
    all
}

/// An HTTP/2 POST (Python's h2) through a CONNECT with a body and trailing fields
/// `x-leak: PLACEHOLDER`, announced in `trailer`; prints the response's status.
const H2_TRAILERS: &str = r#"
import sys, time
import h2.events
from h2_through import connect, pump, session
proxy, host, port, cafile, placeholder = sys.argv[1:6]
s, head = connect(proxy, host, port)
if s is None:
    sys.exit("CONNECT closed: %r" % head)
t, c = session(s, host, cafile)
sid = c.get_next_available_stream_id()
c.send_headers(sid, [(":method", "POST"), (":scheme", "https"), (":authority", "%s:%s" % (host, port)), (":path", "/h2-upload"), ("trailer", "x-leak")])
c.send_data(sid, b"h2-body-data")
c.send_headers(sid, [("x-leak", placeholder)], end_stream=True)
t.sendall(c.data_to_send())
got = {"status": None, "ended": False}
def event(ev):
    if isinstance(ev, h2.events.ResponseReceived):
        got["status"] = dict(ev.headers)[":status"]
    elif isinstance(ev, h2.events.DataReceived):
        c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
    elif isinstance(ev, h2.events.StreamEnded):
        got["ended"] = True
pump(t, c, lambda: got["ended"], time.monotonic() + 10, event)
print(got["status"], flush=True)
"#;

/// A request with a trailer section carrying the placeholder (and a field the origin would
/// take as a header) inside an intercepted tunnel, as HTTP/1.1 chunked and as HTTP/2
/// trailing fields: the body reaches the origin, the trailers do not.
#[test]
fn a_requests_trailers_never_reach_the_origin() {
    let w = World::new();
    let ca = TestCa::new(&["up.test"]);
    let dir = tempfile::tempdir().unwrap();
    let origin = ScriptOrigin::tls(RAW_ORIGIN, &ca, dir.path());
    let port = origin.port;
    let dns = w.dns(Zone::new().with("up.test", &["127.0.0.1"]));
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = secrets_policy(
        dir.path(),
        &entry("up.test", port, &["methods: [POST]"]),
        &credential("cred.test", SECRET_VAR, PLACEHOLDER),
    );
    let one = secret();
    let vars = [(SECRET_VAR, one.as_str())];
    let i = holding(&vars, &dns, &policy, &roots, &dir.path().join("stdout.log"), &[]);
    let mut conn = https_conn(i.proxy.addr, "up.test", port, &i.ca_pem);
    conn.send(&format!(
        "POST /upload HTTP/1.1\r\nHost: up.test:{port}\r\nTransfer-Encoding: chunked\r\n\
         Trailer: X-Leak, X-Method-Override\r\nConnection: close\r\n\r\n\
         b\r\nhello-chunk\r\n0\r\nX-Leak: {PLACEHOLDER}\r\nX-Method-Override: DELETE\r\n\r\n"
    ));
    let reply = conn.read_reply();
    assert_eq!(reply.status, 200, "{reply:?}");
    let out = Command::new("timeout")
        .args(["-k", "5", "30"])
        .arg(python())
        .envs(super::H2_THROUGH)
        .args(["-c", H2_TRAILERS, &i.proxy.addr.port().to_string(), "up.test"])
        .arg(port.to_string())
        .arg(&i.ca_file)
        .arg(PLACEHOLDER)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.trim(), "200", "HTTP/2: {status}{stderr}");
    let seen = received(dir.path());
    assert!(seen.contains("hello-chunk"), "the body did not arrive: {seen}");
    assert!(
        seen.contains("h2-body-data"),
        "the HTTP/2 body did not arrive: {seen}"
    );
    assert!(
        !seen.contains(PLACEHOLDER) && !seen.to_ascii_lowercase().contains("x-leak"),
        "a trailer reached the origin: {seen}"
    );
}

/// An HTTP/2 client (Python's h2) through a CONNECT, over TLS with ALPN h2: streams A ask
/// for each of `PATHS_A` and are never read past their first window; once every A's
/// response head is in, streams B ask for each of `PATHS_B` (comma-separated) in turn, each
/// once the last ended, all waited for `WAIT` seconds. Prints JSON: each A's and B's status,
/// bytes and whether it ended, and the Bs' time.
const H2_CLIENT: &str = r#"
import json, sys, time
import h2.events
from h2_through import connect, pump, session
proxy, host, port, cafile, wait, path_b = sys.argv[1:7]
paths_a = sys.argv[7:]
s, head = connect(proxy, host, port)
if s is None:
    sys.exit("CONNECT closed: %r" % head)
assert head.startswith(b"HTTP/1.1 200"), head
t, c = session(s, host, cafile)
def get(path):
    sid = c.get_next_available_stream_id()
    c.send_headers(sid, [(":method", "GET"), (":scheme", "https"), (":authority", "%s:%s" % (host, port)), (":path", path)], end_stream=True)
    t.sendall(c.data_to_send())
    return sid
got = {}
def event(ev):
    s = got.setdefault(getattr(ev, "stream_id", 0), {"status": None, "bytes": 0, "ended": False})
    if isinstance(ev, h2.events.ResponseReceived):
        s["status"] = int(dict(ev.headers)[":status"])
    elif isinstance(ev, h2.events.DataReceived):
        s["bytes"] += len(ev.data)
        if ev.stream_id in a:
            # The connection's window only: stream A's stays full, unread.
            c.increment_flow_control_window(ev.flow_controlled_length)
        else:
            c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
    elif isinstance(ev, h2.events.StreamEnded):
        s["ended"] = True
a = [get(p) for p in paths_a]
pump(t, c, lambda: all(got.get(x, {}).get("status") is not None for x in a), time.monotonic() + 10, event)
started = time.monotonic()
b = []
for path in path_b.split(","):
    b.append(get(path))
    pump(t, c, lambda: got.get(b[-1], {}).get("ended"), started + float(wait), event)
print(json.dumps({"a": [got.get(x) for x in a], "b": [got.get(x) for x in b], "b_seconds": round(time.monotonic() - started, 2)}), flush=True)
t.close()
"#;

/// [`H2_CLIENT`] through `i`'s proxy to `par.test:port`: its JSON.
fn h2_streams(i: &Intercepting, port: u16, paths_a: &[&str], path_b: &str, wait: u32) -> Value {
    let out = Command::new("timeout")
        .args(["-k", "5", "40"])
        .arg(python())
        .envs(super::H2_THROUGH)
        .args(["-c", H2_CLIENT, &i.proxy.addr.port().to_string(), "par.test"])
        .arg(port.to_string())
        .arg(&i.ca_file)
        .args([&wait.to_string(), path_b])
        .args(paths_a)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}{stderr}"))
}

/// One long response on an HTTP/2 tunnel (8 MB the client does not read) holds up no
/// other: stream B goes upstream on a connection of its own and ends within 5 s, while A
/// is still open, and C, asked once B ended, reuses B's connection. Each request has one
/// decision and one close.
#[test]
fn a_response_the_client_does_not_read_holds_up_no_other_stream() {
    let w = World::new();
    let ca = TestCa::new(&["par.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("par.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = egress_policy(dir.path(), &entry("par.test", port, &["read_only: true"]));
    let i = intercepting(&dns, &policy, &roots);
    let result = h2_streams(&i, port, &["/bytes/8000000"], "/b,/c", 5);
    assert_eq!(result["a"][0]["status"], 200, "{result}");
    assert_eq!(result["a"][0]["ended"], false, "A was read whole: {result}");
    for b in result["b"].as_array().unwrap() {
        assert_eq!(
            (&b["status"], &b["ended"]),
            (&200.into(), &true.into()),
            "a stream stalled behind A: {result}"
        );
    }
    assert_eq!(
        origin.requests(),
        ["GET /bytes/8000000", "GET /b", "GET /c"],
        "{result}"
    );

    // One decision and one close for each request; A's closes as the client left it.
    let audit = &i.proxy.audit_path;
    for (path, outcome) in [("/bytes/8000000", None), ("/b", Some("ok")), ("/c", Some("ok"))] {
        let decided = decision(audit, "par.test", "GET", path);
        assert_eq!(decided["decision"], "allow", "{decided:#}");
        let closed = close_of(audit, &decided);
        if let Some(outcome) = outcome {
            assert_eq!(
                (&closed["status"], &closed["outcome"]),
                (&200.into(), &outcome.into()),
                "{closed:#}"
            );
        }
        let events = crate::common::read_audit(audit);
        let of = |kind: &str| {
            events
                .iter()
                .filter(|e| e["event"] == kind && e["request_id"] == decided["request_id"])
                .count()
        };
        assert_eq!((of("decision"), of("close")), (1, 1), "{path}: {events:#?}");
    }
    // B went upstream on a connection of its own, beside A's, and C, after B, on B's.
    assert_eq!(origin.handshakes(), 2, "{result}");
}

/// Parallel upstream connections are bounded: 8 streams the client never reads hold 8
/// connections, and a ninth waits for one for the response timeout (2 s here), then is
/// refused 503 `connection_limit:tunnel`, a deny on record and no allow (nothing went
/// upstream for it); the origin saw 8 handshakes and 8 requests.
#[test]
fn a_tunnels_parallel_upstream_connections_are_bounded() {
    let w = World::new();
    let ca = TestCa::new(&["par.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("par.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = egress_policy(dir.path(), &entry("par.test", port, &["read_only: true"]));
    let i = intercepting_with(
        Command::new(sandgate_bin()),
        &dns,
        &policy,
        &roots,
        &["--response-timeout", "2"],
    );
    let long: Vec<String> = (0..8).map(|n| format!("/bytes/800000{n}")).collect();
    let long: Vec<&str> = long.iter().map(String::as_str).collect();
    let result = h2_streams(&i, port, &long, "/ninth", 8);
    for a in result["a"].as_array().unwrap() {
        assert_eq!(
            (&a["status"], &a["ended"]),
            (&200.into(), &false.into()),
            "{result}"
        );
    }
    assert_eq!(
        (&result["b"][0]["status"], &result["b"][0]["ended"]),
        (&503.into(), &true.into()),
        "{result}"
    );
    let waited = result["b_seconds"].as_f64().unwrap();
    assert!((1.9..7.0).contains(&waited), "{result}");
    assert_eq!((origin.handshakes(), origin.requests().len()), (8, 8), "{result}");
    let ninth = decision(&i.proxy.audit_path, "par.test", "GET", "/ninth");
    assert_eq!(
        (&ninth["decision"], &ninth["reason_code"], &ninth["status"]),
        (&"deny".into(), &"connection_limit:tunnel".into(), &503.into()),
        "{ninth:#}"
    );
    let events = crate::common::read_audit(&i.proxy.audit_path);
    let of_ninth = events
        .iter()
        .filter(|e| e["request_id"] == ninth["request_id"])
        .count();
    assert_eq!(of_ninth, 1, "one record, the deny: {events:#?}");
}
