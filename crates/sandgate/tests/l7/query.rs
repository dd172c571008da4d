//! A request's query string in the audit: left out of `path` by default (a query may carry
//! a token the sandbox holds), recorded whole with `--audit-query`; the rules decide on the
//! path alone either way.

use sandgate_testkit::dns::Zone;

use super::decisions::decision;
use super::{egress_policy, entry};
use crate::common::curl;
use crate::common::world::{World, proxy};

/// Status of a GET of `url` through the proxy at `proxy_url`.
fn get(proxy_url: &str, url: &str) -> String {
    let (code, status, err) = curl(proxy_url, &["-o", "/dev/null", "-w", "%{http_code}", url]);
    assert_eq!(code, 0, "{url}: {err}");
    status
}

#[test]
fn the_query_is_recorded_only_where_the_proxy_is_asked_to() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(Zone::new().with("q.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let (policy, _) = egress_policy(dir.path(), &entry("q.test", port, &["paths: [\"/q/**\"]"]));
    let policy = policy.to_str().unwrap();
    let url = format!("http://q.test:{port}/q/item?token=hunter2&n=1");

    let plain = proxy(&dns, &["--policy", policy]);
    assert_eq!(get(&plain.url(), &url), "200");
    let d = decision(&plain.audit_path, "q.test", "GET", "/q/item");
    assert_eq!(d["decision"], "allow", "{d}");
    let log = std::fs::read_to_string(&plain.audit_path).unwrap();
    assert!(
        !log.contains("hunter2"),
        "the query reached the audit without --audit-query:\n{log}"
    );

    let asked = proxy(&dns, &["--policy", policy, "--audit-query"]);
    assert_eq!(get(&asked.url(), &url), "200");
    let d = decision(&asked.audit_path, "q.test", "GET", "/q/item?token=hunter2&n=1");
    assert_eq!(d["decision"], "allow", "{d}");
    // Still decided on the path alone: the query cannot make a path match.
    let outside = format!("http://q.test:{port}/other?x=/q/item");
    assert_eq!(get(&asked.url(), &outside), "403");
}

/// The same for a run's own proxy: `sandgate run --audit-query` records the query of the
/// command's request; without it the run's audit log has the path alone.
#[test]
fn a_run_records_the_query_only_with_audit_query() {
    use crate::sandbox_support::{base, run, text};
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(Zone::new().with("q.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "{}net:\n  mode: allowlist\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\n  allowlist:\n{}",
        base(),
        dns.addr(),
        super::entry_at(4, "q.test", port, &["paths: [\"/q/**\"]"]),
    );
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, &yaml).unwrap();
    let url = format!("http://q.test:{port}/q/item?token=hunter2");
    for (audit_query, path) in [(false, "/q/item"), (true, "/q/item?token=hunter2")] {
        let audit = dir.path().join(format!("audit-{audit_query}.jsonl"));
        let mut args = vec!["--audit-log", audit.to_str().unwrap()];
        if audit_query {
            args.push("--audit-query");
        }
        let out = run(
            &policy,
            &args,
            &[
                "curl",
                "-sS",
                "-m",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &url,
            ],
        );
        let (stdout, stderr) = text(&out);
        assert_eq!(stdout.trim(), "200", "{stdout}\n{stderr}");
        let d = decision(&audit, "q.test", "GET", path);
        assert_eq!(d["decision"], "allow", "{d}");
        let log = std::fs::read_to_string(&audit).unwrap();
        assert_eq!(log.contains("hunter2"), audit_query, "{log}");
    }
}
