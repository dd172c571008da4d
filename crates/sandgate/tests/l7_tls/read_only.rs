//! A read-only entry over HTTPS: inside the tunnel the proxy intercepts, curl's GET, HEAD
//! and OPTIONS reach the origin, and its POST, PUT, PATCH and DELETE are refused 403
//! `request_not_allowed` before it, over HTTP/1.1 and HTTP/2 alike; each refusal is on
//! record with its method, its path, `scheme: https` and the entry (file and line) as its
//! rule.

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;

use super::{intercepting, pem_file};
use crate::common::curl;
use crate::common::world::World;
use crate::l7::decisions::{assert_refused_by, decision, entry_lines};
use crate::l7::{egress_policy, entry};

const READS: [&str; 3] = ["GET", "HEAD", "OPTIONS"];
const WRITES: [&str; 4] = ["POST", "PUT", "PATCH", "DELETE"];

#[test]
fn a_read_only_entry_refuses_every_write_inside_an_intercepted_tunnel() {
    let w = World::new();
    let ca = TestCa::new(&["ro.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("ro.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, text) = egress_policy(dir.path(), &entry("ro.test", port, &["read_only: true"]));
    let line = entry_lines(&text);
    let i = intercepting(&dns, &policy, &roots);
    let ca_file = i.ca_file.to_str().unwrap();

    let mut reached = Vec::new();
    for version in ["--http1.1", "--http2"] {
        for method in READS.iter().chain(&WRITES) {
            let path = format!("/{}/{method}", &version[2..]);
            let url = format!("https://ro.test:{port}{path}");
            // curl's HEAD is `-I`: with `-X HEAD` it would wait for a body. A write carries one.
            let how = match *method {
                "HEAD" => vec!["-I"],
                "GET" | "OPTIONS" => vec!["-X", method],
                _ => vec!["-X", method, "--data", "x=1"],
            };
            let mut args = vec![version, "--cacert", ca_file, "-o", "/dev/null"];
            args.extend(["-w", "%{http_code}"]);
            args.extend(how);
            args.push(&url);
            let (_, status, err) = curl(&i.proxy.url(), &args);
            let want = if READS.contains(method) { "200" } else { "403" };
            assert_eq!(status, want, "{version} {method}: {err}");
            if READS.contains(method) {
                reached.push(format!("{method} {path}"));
            }
        }
    }
    assert_eq!(origin.requests(), reached, "only the reads reach the origin");

    let audit = &i.proxy.audit_path;
    for version in ["http1.1", "http2"] {
        for method in WRITES {
            let d = decision(audit, "ro.test", method, &format!("/{version}/{method}"));
            assert_refused_by(&d, "request_not_allowed", "policy.yaml", &line);
            assert_eq!(
                (&d["scheme"], &d["status"]),
                (&"https".into(), &403.into()),
                "{d:#}"
            );
        }
        for method in READS {
            let d = decision(audit, "ro.test", method, &format!("/{version}/{method}"));
            assert_eq!(d["decision"], "allow", "{d:#}");
        }
    }
}
