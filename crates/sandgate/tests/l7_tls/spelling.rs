//! What a client writes inside an intercepted tunnel, with the raw HTTP/1.1 client of
//! `l7/wire.rs` over TLS (the interception CA trusted): against `paths: ["/myorg/**"]`,
//! paths spelt to leave `/myorg/` are refused 403, and a `Host` or an absolute URI naming
//! another host, port or scheme than the tunnel's is refused 400, each recorded with
//! `scheme: https`; and a ClientHello naming another host than the CONNECT's is refused,
//! with openssl completing its handshake first. Nothing refused reaches the origin, which
//! logs every request it handles.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;
use serde_json::Value;

use super::{connect_decision, https_conn, inside, intercepting, pem_file};
use crate::common::read_audit;
use crate::common::world::World;
use crate::l7::decisions::events_once;
use crate::l7::{egress_policy, entry};

const NOT_CANONICAL: &str = "path_not_canonical";
const NOT_ALLOWED: &str = "request_not_allowed";
const HOST_MISMATCH: &str = "host_mismatch";

#[test]
fn spellings_inside_an_intercepted_tunnel_are_refused_before_the_origin() {
    let w = World::new();
    let ca = TestCa::new(&["sp.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("sp.test", &["127.0.0.1"])
            .with("other.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let entries = entry("sp.test", port, &["paths: [\"/myorg/**\"]"]) + &entry("other.test", port, &[]);
    let (policy, _) = egress_policy(dir.path(), &entries);
    let i = intercepting(&dns, &policy, &roots);
    let host = format!("sp.test:{port}");
    let other = format!("other.test:{port}");

    // (request-target, Host, status, reason), each in a tunnel of its own.
    let cases: Vec<(String, String, u16, &str)> = [
        ("/myorg/%2e%2e/other", &*host, 403, NOT_CANONICAL),
        ("/myorg/..%2fother", &host, 403, NOT_CANONICAL),
        ("/myorg%2Fx", &host, 403, NOT_CANONICAL),
        ("/myorg//x", &host, 403, NOT_CANONICAL),
        ("/myorg/./x", &host, 403, NOT_CANONICAL),
        ("/MYORG/x", &host, 403, NOT_ALLOWED),
        ("/other/x", &host, 403, NOT_ALLOWED),
        // The tunnel's host and port are the request's: a Host naming another host (one
        // allowed without rules, at that), or the same host on the default port, is no
        // way out; nor is an absolute URI naming another host or scheme.
        ("/myorg/x", &other, 400, HOST_MISMATCH),
        ("/myorg/x", "sp.test", 400, HOST_MISMATCH),
        (&format!("https://{other}/myorg/x"), &host, 400, HOST_MISMATCH),
        (&format!("http://{host}/myorg/x"), &host, 400, HOST_MISMATCH),
    ]
    .into_iter()
    .map(|(target, h, status, reason)| (target.to_owned(), h.to_owned(), status, reason))
    .collect();
    for (target, h, status, _) in &cases {
        let mut conn = https_conn(i.proxy.addr, "sp.test", port, &i.ca_pem);
        let reply = conn.exchange("GET", target, h, true);
        assert_eq!(reply.status, *status, "GET {target} Host {h}: {reply:?}");
    }
    assert_eq!(
        origin.requests(),
        Vec::<String>::new(),
        "a refused request reached the origin"
    );

    // Kept alive: an allowed request, a refused one, and an allowed one again on the same
    // tunnel (the refusal leaves the tunnel's upstream connection as it was).
    let mut conn = https_conn(i.proxy.addr, "sp.test", port, &i.ca_pem);
    for (target, status) in [
        ("/myorg/first", 200),
        ("/myorg/%2e%2e/second", 403),
        ("/myorg/third", 200),
    ] {
        let reply = conn.exchange("GET", target, &host, target.ends_with("third"));
        assert_eq!(reply.status, status, "{target}: {reply:?}");
    }
    assert_eq!(origin.requests(), ["GET /myorg/first", "GET /myorg/third"]);

    let events = events_once(&i.proxy.audit_path, |e| e["path"] == "/myorg/third");
    let decided: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "decision" && e["method"] != "CONNECT")
        .collect();
    assert_eq!(decided.len(), cases.len() + 3, "{events:#?}");
    for ((target, h, status, reason), d) in cases.iter().zip(&decided) {
        assert_eq!(
            (&d["decision"], &d["reason_code"], &d["method"], &d["status"]),
            (
                &"deny".into(),
                &(*reason).into(),
                &"GET".into(),
                &(*status).into()
            ),
            "GET {target} Host {h}: {d:#}"
        );
        if *reason != HOST_MISMATCH {
            assert_eq!(
                (&d["path"], &d["destination_host"], &d["scheme"]),
                (&target.as_str().into(), &"sp.test".into(), &"https".into()),
                "{d:#}"
            );
        }
    }
    assert!(inside(&events, "other.test").is_empty(), "{events:#?}");
    // A request refused for naming another host is still one inside the tunnel to sp.test:
    // recorded as such (docs/policy.md: each request inside is recorded with `scheme:
    // https`), so the log ties it to the tunnel it came through.
    let mismatched: Vec<_> = decided
        .iter()
        .filter(|d| d["reason_code"] == HOST_MISMATCH)
        .map(|d| (&d["scheme"], &d["destination_host"], &d["destination_port"]))
        .collect();
    let tunnel = (&"https".into(), &"sp.test".into(), &port.into());
    assert_eq!(
        mismatched, [tunnel; 4],
        "host_mismatch decisions lack the tunnel's scheme and destination"
    );
}

/// openssl names another host in its ClientHello than the CONNECT's, and completes its
/// handshake (it does not stop at the certificate, as an attacker's client would not): the
/// proxy refuses the tunnel then, before any request and before the upstream's handshake.
/// The same client naming the CONNECT's host gets its answer.
#[test]
fn a_client_hello_naming_another_host_is_refused_and_nothing_reaches_the_origin() {
    let w = World::new();
    let ca = TestCa::new(&["sni.test", "other.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("sni.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = egress_policy(dir.path(), &entry("sni.test", port, &["paths: [\"/myorg/**\"]"]));
    let i = intercepting(&dns, &policy, &roots);
    let target = format!("sni.test:{port}");
    let request = format!("GET /myorg/x HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");

    let out = s_client(i.proxy.addr, &target, "other.test", &i.ca_file, &request);
    assert!(
        out.contains("CONNECTION ESTABLISHED") && !out.contains("HTTP/1.1"),
        "{out}"
    );
    let refused = connect_decision(&i.proxy.audit_path, "sni.test");
    assert_eq!(
        (
            &refused["decision"],
            &refused["reason_code"],
            &refused["tls_server_name"]
        ),
        (&"deny".into(), &"sni_mismatch".into(), &"other.test".into()),
        "{refused:#}"
    );
    assert_eq!(
        (origin.handshakes(), origin.requests()),
        (0, Vec::new()),
        "the refused tunnel reached the origin"
    );

    let out = s_client(i.proxy.addr, &target, "sni.test", &i.ca_file, &request);
    assert!(out.contains("HTTP/1.1 200"), "{out}");
    let events = read_audit(&i.proxy.audit_path);
    let tunnels: Vec<(&Value, &Value)> = events
        .iter()
        .filter(|e| e["event"] == "decision" && e["scheme"] == "connect")
        .map(|e| (&e["reason_code"], &e["tls_server_name"]))
        .collect();
    assert_eq!(
        tunnels,
        [
            (&"sni_mismatch".into(), &"other.test".into()),
            (&"inspected".into(), &"sni.test".into())
        ],
        "{events:#?}"
    );
    assert_eq!(inside(&events, "sni.test").len(), 1, "{events:#?}");
    assert_eq!(origin.requests(), ["GET /myorg/x"]);
}

/// `openssl s_client` through the proxy's CONNECT to `connect`, naming `servername`,
/// trusting `ca` but going on when it does not verify; sends `input` once connected and
/// reads until the server closes (at most 20 s). Its output, stdout and stderr.
fn s_client(proxy: SocketAddr, connect: &str, servername: &str, ca: &Path, input: &str) -> String {
    let mut child = Command::new("timeout")
        .args(["-k", "5", "20", "openssl", "s_client", "-brief", "-ign_eof"])
        .args(["-proxy", &proxy.to_string(), "-connect", connect])
        .args(["-servername", servername, "-CAfile"])
        .arg(ca)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
