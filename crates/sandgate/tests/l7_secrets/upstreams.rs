//! An intercepted tunnel's parallel upstream connections count against the connection
//! limits: an HTTP/2 client holding many unread streams in one tunnel gets upstream
//! connections only as far as its client address's share goes, every other stream is
//! refused 503 once the response timeout passed waiting for a slot, and a client arriving
//! from another address still gets in. And a connection stays its exchange's while the
//! request body still goes up after the origin answered early: uploads that drip on hold
//! their connections, and a ninth stream is refused rather than given a ninth.

use std::process::Command;

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;
use serde_json::Value;

use super::{PLACEHOLDER, SECRET_VAR, ScriptOrigin, credential, holding, secret, secrets_policy};
use crate::common::world::World;
use crate::common::{python, sandgate_bin};
use crate::l7::decisions::decision;
use crate::l7::{egress_policy, entry};
use crate::l7_tls::{Intercepting, close_of, https_conn, inside, intercepting_with, pem_file};

/// An HTTP/2 client (Python's h2) through a CONNECT from 127.0.0.1: one GET stream for each
/// of `PATHS`, none read past its first window, until each has its status (or 20 s); then,
/// with that tunnel still open, a second client from 127.0.0.2: a CONNECT, TLS (HTTP/1.1)
/// and `GET /second`. Prints JSON: each stream's status, and the second client's.
const CLIENT: &str = r#"
import json, ssl, sys, time
import h2.events
from h2_through import connect, pump, session
proxy, host, port, cafile = sys.argv[1:5]
paths = sys.argv[5:]
s, head = connect(proxy, host, port)
assert s is not None and head.startswith(b"HTTP/1.1 200"), head
t, c = session(s, host, cafile)
streams = []
for path in paths:
    sid = c.get_next_available_stream_id()
    c.send_headers(sid, [(":method", "GET"), (":scheme", "https"), (":authority", "%s:%s" % (host, port)), (":path", path)], end_stream=True)
    streams.append(sid)
t.sendall(c.data_to_send())
status = {}
def event(ev):
    if isinstance(ev, h2.events.ResponseReceived):
        status[ev.stream_id] = int(dict(ev.headers)[":status"])
    elif isinstance(ev, h2.events.DataReceived):
        # The connection's window only: each stream's stays full, unread.
        c.increment_flow_control_window(ev.flow_controlled_length)
pump(t, c, lambda: len(status) >= len(streams), time.monotonic() + 20, event)
second = None
s2, head = connect(proxy, host, port, source="127.0.0.2")
if s2 is not None and head.startswith(b"HTTP/1.1 200"):
    t2 = ssl.create_default_context(cafile=cafile).wrap_socket(s2, server_hostname=host)
    t2.sendall(("GET /second HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n" % (host, port)).encode())
    reply = b""
    while b"\r\n" not in reply:
        b = t2.recv(4096)
        if not b:
            break
        reply += b
    second = int(reply.split(b" ")[1]) if reply else None
else:
    second = head.decode(errors="replace")
print(json.dumps({"streams": [status.get(x) for x in streams], "second": second}), flush=True)
t.close()
"#;

/// With `--max-connections 8`, a lone client's share reaches four slots (a quarter of the
/// cap stays free for others): its tunnel's CONNECT holds one, with its own upstream socket,
/// and three more upstream connections are admitted for its streams. Of eight unread
/// streams, four go upstream and four are refused 503 `connection_limit:client` after the
/// 2 s response timeout; the origin saw four handshakes; a client from 127.0.0.2 gets in.
#[test]
fn a_tunnels_extra_upstream_connections_count_against_the_connection_limits() {
    let w = World::new();
    let ca = TestCa::new(&["par.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("par.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = egress_policy(dir.path(), &entry("par.test", port, &["read_only: true"]));
    let limits = ["--max-connections", "8", "--response-timeout", "2"];
    let i = intercepting_with(Command::new(sandgate_bin()), &dns, &policy, &roots, &limits);
    let paths: Vec<String> = (0..8).map(|n| format!("/bytes/800000{n}")).collect();
    let out = Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(python())
        .envs(super::H2_THROUGH)
        .args(["-c", CLIENT, &i.proxy.addr.port().to_string(), "par.test"])
        .arg(port.to_string())
        .arg(&i.ca_file)
        .args(&paths)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let result: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text}{}", String::from_utf8_lossy(&out.stderr)));

    let mut statuses: Vec<u64> = result["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap_or(0))
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 200, 200, 503, 503, 503, 503], "{result}");
    assert_eq!(
        origin.handshakes(),
        5,
        "four for the tunnel, one for the second client: {result}"
    );
    assert_eq!(
        result["second"], 200,
        "the second client did not get in: {result}"
    );

    // Each refused stream: one deny, naming the limit, and nothing allowed for it.
    let audit = &i.proxy.audit_path;
    let refused = |e: &Value| e["event"] == "decision" && e["reason_code"] == "connection_limit:client";
    // The second client's request is the last decided: every other is on record once it is.
    let second = decision(audit, "par.test", "GET", "/second");
    assert_eq!(second["decision"], "allow", "{second:#}");
    let events = crate::common::read_audit(audit);
    let decisions = inside(&events, "par.test");
    let denied: Vec<&Value> = decisions.iter().filter(|d| refused(d)).collect();
    assert_eq!(denied.len(), 4, "{decisions:#?}");
    for d in &denied {
        assert_eq!(
            (&d["decision"], &d["status"]),
            (&"deny".into(), &503.into()),
            "{d:#}"
        );
    }
    assert_eq!(
        decisions.iter().filter(|d| d["decision"] == "allow").count(),
        5,
        "{decisions:#?}"
    );
}

/// An HTTPS origin (Python's ssl) that answers each request `401` as soon as its head is
/// in, then reads its body (`Content-Length`) on, the connection kept for the next request
/// once it is: as an origin that refuses an upload early. Each connection it accepts adds a
/// line to `DIR/connections`.
const EARLY_ORIGIN: &str = r#"
import os, socket, ssl, sys, threading
cert, key, out = sys.argv[1:4]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(64)
print(srv.getsockname()[1], flush=True)
def serve(conn):
    try:
        tls = ctx.wrap_socket(conn, server_side=True)
        tls.settimeout(60)
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                got = tls.recv(65536)
                if not got:
                    return
                buf += got
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = 0
            for line in head.lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            tls.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
            while len(buf) < length:
                got = tls.recv(65536)
                if not got:
                    return
                buf += got
            buf = buf[length:]
    except Exception:
        pass
while True:
    conn, _ = srv.accept()
    with open(os.path.join(out, "connections"), "a") as f:
        f.write("1\n")
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"#;

/// An HTTP/2 client (Python's h2) through a CONNECT: `N` POST streams to `/upload/I`, each
/// announcing 100 bytes and sending one, the rest never; waits until each has its status
/// (or 20 s) and prints them, in order, as JSON; then holds the connection open for the
/// seconds of its sixth argument, if given.
const DRIPPING: &str = r#"
import json, sys, time
import h2.events
from h2_through import connect, pump, session
proxy, host, port, cafile, n = sys.argv[1:6]
s, head = connect(proxy, host, port)
if s is None:
    sys.exit("CONNECT closed: %r" % head)
assert head.startswith(b"HTTP/1.1 200"), head
t, c = session(s, host, cafile)
streams = []
for i in range(int(n)):
    sid = c.get_next_available_stream_id()
    c.send_headers(sid, [(":method", "POST"), (":scheme", "https"), (":authority", "%s:%s" % (host, port)), (":path", "/upload/%d" % i), ("content-length", "100")])
    c.send_data(sid, b"x")
    streams.append(sid)
t.sendall(c.data_to_send())
status = {}
def event(ev):
    if isinstance(ev, h2.events.ResponseReceived):
        status[ev.stream_id] = int(dict(ev.headers)[":status"])
pump(t, c, lambda: len(status) >= len(streams), time.monotonic() + 20, event)
print(json.dumps([status.get(x) for x in streams]), flush=True)
time.sleep(float(sys.argv[6]) if len(sys.argv) > 6 else 0)
t.close()
"#;

/// The early-answering origin (`drip.test`, POSTs to `/upload/*` allowed) behind a proxy
/// that intercepts its tunnels, started with `limits`; every part kept alive.
struct Drip {
    dir: tempfile::TempDir,
    origin: ScriptOrigin,
    i: Intercepting,
    _dns: sandgate_testkit::dns::DnsServer,
    _world: World,
}

fn drip(limits: &[&str]) -> Drip {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(&["drip.test"]);
    let origin = ScriptOrigin::tls(EARLY_ORIGIN, &ca, dir.path());
    let w = World::new();
    let dns = w.dns(Zone::new().with("drip.test", &["127.0.0.1"]));
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let rule = ["methods: [POST]", "paths: [\"/upload/*\"]"];
    let (policy, _) = egress_policy(dir.path(), &entry("drip.test", origin.port, &rule));
    let i = intercepting_with(Command::new(sandgate_bin()), &dns, &policy, &roots, limits);
    Drip {
        dir,
        origin,
        i,
        _dns: dns,
        _world: w,
    }
}

/// Nine uploads that drip, to an origin that answers each at once and reads on: eight hold
/// the tunnel's eight upstream connections while their bodies are still going up (their
/// 401s came back at once), and the ninth, finding every one busy for the 2 s response
/// timeout, is refused 503 `connection_limit:tunnel`, where before it was given a ninth
/// connection. The origin saw eight.
#[test]
fn an_upload_still_going_up_after_an_early_answer_keeps_its_connection() {
    let Drip {
        dir,
        origin,
        i,
        _dns,
        _world,
    } = drip(&["--response-timeout", "2"]);
    let out = Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(python())
        .envs(super::H2_THROUGH)
        .args(["-c", DRIPPING, &i.proxy.addr.port().to_string(), "drip.test"])
        .arg(origin.port.to_string())
        .arg(&i.ca_file)
        .arg("9")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let result: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text}{}", String::from_utf8_lossy(&out.stderr)));
    let mut statuses: Vec<u64> = result
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap_or(0))
        .collect();
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [401, 401, 401, 401, 401, 401, 401, 401, 503],
        "{result}"
    );
    let connections = std::fs::read_to_string(dir.path().join("connections")).unwrap_or_default();
    assert_eq!(connections.lines().count(), 8, "upstream connections: {result}");
    let refused = (0..9)
        .map(|n| decision(&i.proxy.audit_path, "drip.test", "POST", &format!("/upload/{n}")))
        .filter(|d| d["decision"] == "deny")
        .collect::<Vec<_>>();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(
        refused[0]["reason_code"], "connection_limit:tunnel",
        "{:#}",
        refused[0]
    );
}

/// A placeholder of a credential that asks for `inspect_body`, in an upload to another host
/// after that host already answered (401, at once): the body is cut there, and the
/// request's close, recorded only once the upload ended, says `credential_leak`, where it
/// said `ok` when it was sent with the response's end.
#[test]
fn a_placeholder_found_after_an_early_answer_is_on_record() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(&["drip.test", "cred.test"]);
    let origin = ScriptOrigin::tls(EARLY_ORIGIN, &ca, dir.path());
    let w = World::new();
    let zone = Zone::new()
        .with("drip.test", &["127.0.0.1"])
        .with("cred.test", &["127.0.0.1"]);
    let dns = w.dns(zone);
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let entries = entry("drip.test", origin.port, &["methods: [POST]"]);
    let credentials = credential("cred.test", SECRET_VAR, PLACEHOLDER) + "        inspect_body: true\n";
    let (policy, _) = secrets_policy(dir.path(), &entries, &credentials);
    let one = secret();
    let i = holding(
        &[(SECRET_VAR, one.as_str())],
        &dns,
        &policy,
        &roots,
        &dir.path().join("stdout.log"),
        &[],
    );
    let host = format!("drip.test:{}", origin.port);
    let mut conn = https_conn(i.proxy.addr, "drip.test", origin.port, &i.ca_pem);
    let rest = format!("{PLACEHOLDER} and more");
    conn.send(&format!(
        "POST /upload/late HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n\r\nfirst ",
        6 + rest.len()
    ));
    let answered = conn.read_reply();
    assert_eq!(answered.status, 401, "{answered:?}");
    conn.send(&rest);

    let audit = &i.proxy.audit_path;
    let decided = decision(audit, "drip.test", "POST", "/upload/late");
    assert_eq!(decided["decision"], "allow", "{decided:#}");
    let closed = close_of(audit, &decided);
    assert_eq!(
        (&closed["outcome"], &closed["status"]),
        (&"credential_leak".into(), &401.into()),
        "{closed:#}"
    );
}

/// An upload that stalls after its early answer, from a client that stays connected: its
/// request body is never going to end, and its upstream connection's task holds it. The
/// exchange must still end within the body idle timeout (1 s here): its close written
/// (`client_reset`, the 401 it got), its connection closed. Before, nothing ended it until
/// the client went away: no close, the connection, its turn and its slot held.
#[test]
fn an_upload_stalled_after_an_early_answer_ends_within_the_body_idle_timeout() {
    use std::io::BufRead as _;
    let Drip {
        dir: _dir,
        origin,
        i,
        _dns,
        _world,
    } = drip(&["--body-idle-timeout", "1"]);
    // Python itself (no `timeout` in front), so that killing it ends it: it exits by
    // itself 30 s after its answer at the latest.
    let mut client = Command::new(python())
        .envs(super::H2_THROUGH)
        .args(["-c", DRIPPING, &i.proxy.addr.port().to_string(), "drip.test"])
        .arg(origin.port.to_string())
        .arg(&i.ca_file)
        .args(["1", "30"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(client.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "[401]", "the upload's early answer");
    let audit = &i.proxy.audit_path;
    let decided = decision(audit, "drip.test", "POST", "/upload/0");
    let id = decided["request_id"].clone();
    // Bounded: the close is due 1 s after the answer; the client holds on for 30.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let closed = loop {
        let found = crate::common::read_audit(audit)
            .into_iter()
            .find(|e| e["event"] == "close" && e["request_id"] == id);
        if let Some(found) = found {
            break found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no close 10 s after the answer while the client holds its stalled upload"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let _ = client.kill();
    let _ = client.wait();
    assert_eq!(
        (&closed["outcome"], &closed["status"]),
        (&"client_reset".into(), &401.into()),
        "{closed:#}"
    );
}
