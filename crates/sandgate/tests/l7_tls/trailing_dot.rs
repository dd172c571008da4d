//! A trailing dot on the host inside TLS: `sp.test.` is the name `sp.test` (DNS's absolute
//! form), so a CONNECT to `sp.test.:PORT`, a ClientHello naming `sp.test.`, a `Host` or an
//! `:authority` carrying the dot are decided as `sp.test`, whose entry has path rules: the
//! tunnel is intercepted, a path outside `/myorg/**` is refused inside it, one inside goes
//! through. Never a blind tunnel, never a request that no rule judged.

use serde_json::{Value, json};

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;

use super::pseudo_headers::{h2_case, through};
use super::{intercepting, pem_file};
use crate::common::read_audit;
use crate::common::world::World;
use crate::l7::decisions::events_once;
use crate::l7::{egress_policy, entry};

/// An HTTP/1.1 request for `path` with `host` as Host, in a tunnel to `connect` whose TLS
/// names `sni`.
fn h1_case(connect: &str, sni: &str, host: &str, path: &str) -> Value {
    let raw = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    json!({"connect": connect, "sni": sni, "alpn": "http/1.1", "raw": raw})
}

#[test]
fn a_trailing_dot_on_the_host_is_the_same_host_and_its_rules_hold() {
    let w = World::new();
    let ca = TestCa::new(&["sp.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("sp.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = egress_policy(dir.path(), &entry("sp.test", port, &["paths: [\"/myorg/**\"]"]));
    let i = intercepting(&dns, &policy, &roots);
    let (dotted, plain) = (format!("sp.test.:{port}"), format!("sp.test:{port}"));

    // (what, case, whether it is inside /myorg/); every mix of the dot in the CONNECT, the
    // ClientHello and the Host or :authority.
    let mut cases = Vec::new();
    for (connect, sni, host) in [
        (&dotted, "sp.test.", &dotted),
        (&dotted, "sp.test", &plain),
        (&plain, "sp.test.", &dotted),
        (&dotted, "sp.test.", &plain),
    ] {
        for (n, path) in ["/other/x", "/myorg/x"].into_iter().enumerate() {
            let tag = format!("{path}/{}", cases.len());
            let what = format!("CONNECT {connect}, SNI {sni}, Host {host}, GET {tag}");
            cases.push((what, h1_case(connect, sni, host, &tag), n == 1));
            let tag = format!("{path}/{}", cases.len());
            let headers = [
                (":method", "GET"),
                (":scheme", "https"),
                (":authority", host.as_str()),
                (":path", tag.as_str()),
            ];
            let what = format!("HTTP/2: CONNECT {connect}, SNI {sni}, :authority {host}, GET {tag}");
            cases.push((what, h2_case(connect, sni, &headers), n == 1));
        }
    }
    let values: Vec<Value> = cases.iter().map(|(_, v, _)| v.clone()).collect();
    let answers = through(i.proxy.addr, &i.ca_file, &values);
    assert_eq!(answers.len(), cases.len(), "{answers:?}");
    for ((what, _, allowed), answer) in cases.iter().zip(&answers) {
        let want = if *allowed { "200" } else { "403" };
        assert_eq!(answer, want, "{what}");
    }
    let reached = origin.requests();
    assert!(
        reached.iter().all(|r| r.starts_with("GET /myorg/")),
        "a path the rules refuse reached the origin: {reached:?}"
    );
    assert_eq!(reached.len(), cases.iter().filter(|c| c.2).count(), "{reached:?}");

    // Every tunnel was intercepted as sp.test's, none relayed blind; each refusal inside is
    // on record as a request to sp.test.
    let last = format!("/myorg/x/{}", cases.len() - 1);
    let events = events_once(&i.proxy.audit_path, |e| e["path"] == last.as_str());
    let tunnels: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "decision" && e["scheme"] == "connect")
        .collect();
    assert_eq!(tunnels.len(), cases.len(), "{events:#?}");
    for t in &tunnels {
        assert_eq!(t["reason_code"], "inspected", "{t:#}");
    }
    let refused: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "decision" && e["scheme"] == "https" && e["decision"] == "deny")
        .collect();
    assert_eq!(
        refused.len(),
        cases.len() / 2,
        "{:#?}",
        read_audit(&i.proxy.audit_path)
    );
    for d in refused {
        assert_eq!(d["reason_code"], "request_not_allowed", "{d:#}");
        assert!(
            d["destination_host"]
                .as_str()
                .is_some_and(|h| h.trim_end_matches('.') == "sp.test"),
            "{d:#}"
        );
    }
}
