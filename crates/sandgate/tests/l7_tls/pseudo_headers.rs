//! HTTP/2 pseudo-headers that disagree, end to end with a real HTTP/2 client inside an
//! intercepted tunnel: the Python `h2` package (`through.py`), whose own header checks are
//! turned off so it sends what an attacker would. Against an entry for `sp.test` with
//! `paths: ["/myorg/**"]`, and `other.test` allowed on the same port without rules: an
//! `:authority` naming another host, a `host` field that disagrees with `:authority`, a
//! `:scheme` of `http` and a `host` field without `:authority` naming another host are each
//! refused 400 `host_mismatch` inside the tunnel and recorded; an absolute-form `:path` and a
//! `:path` without its leading slash, malformed HTTP/2, have their streams reset. None
//! reaches the origin, which logs every request.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;
use serde_json::{Value, json};

use super::{inside, intercepting, pem_file};
use crate::common::world::World;
use crate::l7::decisions::events_once;
use crate::l7::{egress_policy, entry};

/// Runs `through.py` with the venv's Python (where `h2` is installed) for `cases`: one
/// answer per case, in order (see the script).
pub fn through(proxy: SocketAddr, ca_file: &Path, cases: &[Value]) -> Vec<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/l7_tls/through.py");
    let out = Command::new("timeout")
        .args(["-k", "5", "120"])
        .arg(crate::common::python())
        .arg(script)
        .arg(proxy.ip().to_string())
        .arg(proxy.port().to_string())
        .arg(ca_file)
        .arg(Value::from(cases.to_vec()).to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "through.py failed (is h2 in the venv? ./scripts/test installs it):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().map(str::to_owned).collect()
}

/// An HTTP/2 request inside a tunnel to `connect`, the TLS naming `sni`, with `headers`.
pub fn h2_case(connect: &str, sni: &str, headers: &[(&str, &str)]) -> Value {
    json!({"connect": connect, "sni": sni, "alpn": "h2", "headers": headers})
}

#[test]
fn http2_pseudo_headers_that_disagree_are_refused_before_the_origin() {
    let w = World::new();
    let ca = TestCa::new(&["sp.test", "other.test"]);
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
    let absolute = format!("https://{other}/myorg/abs");

    let req = |scheme: &str, authority: &str, path: &str, extra: &[(&str, &str)]| {
        let mut h = vec![(":method", "GET"), (":scheme", scheme)];
        h.push((":authority", authority));
        h.push((":path", path));
        h.extend_from_slice(extra);
        h.iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect::<Vec<_>>()
    };
    // (what, headers); each in a tunnel of its own to sp.test.
    let cases: Vec<(&str, Vec<(String, String)>)> = vec![
        (
            "another :authority",
            req("https", &other, "/myorg/authority", &[]),
        ),
        (
            "a host field that disagrees",
            req("https", &host, "/myorg/host", &[("host", &other)]),
        ),
        ("an http :scheme", req("http", &host, "/myorg/scheme", &[])),
        ("an absolute-form :path", req("https", &host, &absolute, &[])),
        (
            "a :path without its slash",
            req("https", &host, "myorg/noslash", &[]),
        ),
        (
            "no :authority, a host field naming another host",
            vec![
                (":method".into(), "GET".into()),
                (":scheme".into(), "https".into()),
                (":path".into(), "/myorg/hostonly".into()),
                ("host".into(), other.clone()),
            ],
        ),
    ];
    let values: Vec<Value> = cases
        .iter()
        .map(|(_, h)| json!({"connect": host, "sni": "sp.test", "alpn": "h2", "headers": h}))
        .collect();
    let answers = through(i.proxy.addr, &i.ca_file, &values);
    assert_eq!(answers.len(), cases.len(), "{answers:?}");
    for ((what, headers), answer) in cases.iter().zip(&answers) {
        // The proxy answers 400 `host_mismatch` for another host or scheme; a `:path` that is
        // not origin-form is malformed HTTP/2 (RFC 9113 section 8.3.1), and the h2 crate
        // under hyper resets its stream (PROTOCOL_ERROR, 1) before any request is made of
        // it. Never the origin's 200.
        let malformed = what.contains(":path");
        assert!(
            answer == "400" || (malformed && answer == "reset:1"),
            "{what}: {answer} for {headers:?}"
        );
    }
    // The control: the same client, the headers agreeing, gets through.
    let control = through(
        i.proxy.addr,
        &i.ca_file,
        &[h2_case(
            &host,
            "sp.test",
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":authority", &host),
                (":path", "/myorg/control"),
            ],
        )],
    );
    assert_eq!(control, ["200"], "the control request");
    assert_eq!(
        origin.requests(),
        ["GET /myorg/control"],
        "a refused request reached the origin"
    );

    // Each one the proxy answered is on record inside the tunnel to sp.test, refused; none
    // as a request to other.test.
    let events = events_once(&i.proxy.audit_path, |e| e["path"] == "/myorg/control");
    let decided = inside(&events, "sp.test");
    let refused: Vec<&Value> = decided.iter().filter(|d| d["decision"] == "deny").collect();
    let answered = answers.iter().filter(|a| a.starts_with('4')).count();
    assert_eq!(
        refused.len(),
        answered,
        "answers {answers:?}, on record {decided:#?}"
    );
    for d in &refused {
        assert_eq!(
            (&d["reason_code"], &d["status"]),
            (&"host_mismatch".into(), &400.into()),
            "{d:#}"
        );
    }
    assert!(inside(&events, "other.test").is_empty(), "{events:#?}");
}
