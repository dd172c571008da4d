//! What `remedy` says for each kind of recorded request: lines as the audit reader reads them.

use super::*;
use sandgate_proxy::audit::{Record, Recorded};
use serde_json::json;

/// A record read from a line with these fields, as the audit reader reads any log.
fn record(fields: serde_json::Value) -> Record {
    let mut line = json!({"created_at": "2026-11-22T10:00:00Z", "request_id": "0123456789abcdef"});
    if let (Some(line), Some(more)) = (line.as_object_mut(), fields.as_object()) {
        line.extend(more.clone());
    }
    Record::parse(&line.to_string()).unwrap()
}

fn of(decision: Option<&Record>, close: Option<&Record>) -> Remedy {
    let decision = decision.and_then(|r| match &r.event {
        Recorded::Decision(d) => Some(d),
        _ => None,
    });
    let close = close.and_then(|r| match &r.event {
        Recorded::Close(c) => Some(c),
        _ => None,
    });
    remedy(Request { decision, close })
}

#[test]
fn a_default_deny_names_the_entry_the_flags_and_the_exception() {
    let d = record(
        json!({"event": "decision", "decision": "deny", "reason_code": "not_allowlisted",
        "scheme": "connect", "destination_host": "pypi.org", "destination_port": 443, "task_id": "t-1"}),
    );
    let r = of(Some(&d), None);
    assert_eq!((r.summary.as_str(), r.exit), ("not in allowlist", EXIT_REFUSED));
    assert!(
        r.fixes[0].ends_with("\n    - host: pypi.org\n      ports: [443]"),
        "{r:?}"
    );
    assert_eq!(
        r.fixes[1],
        "or a flag: sandgate proxy --allow pypi.org; sandgate run --allow-domain pypi.org"
    );
    assert!(
        r.fixes[2].ends_with(
            "sandgate exceptions request --task t-1 --host pypi.org --port 443 --ttl 3600 --reason \"...\""
        ),
        "{r:?}"
    );
    // An unusual port is named in the flag; no task, no exception.
    let d = record(
        json!({"event": "decision", "decision": "deny", "reason_code": "not_allowlisted",
        "scheme": "http", "destination_host": "a.test", "destination_port": 8080}),
    );
    let r = of(Some(&d), None);
    assert!(r.fixes[1].contains("--allow a.test:8080;"), "{r:?}");
    assert_eq!(r.fixes.len(), 2);
}

#[test]
fn the_address_guard_names_the_class_and_the_range_to_exempt() {
    let d = record(
        json!({"event": "decision", "decision": "deny", "reason_code": "destination_ip_prohibited",
        "scheme": "connect", "destination_host": "db.internal", "destination_port": 5432, "resolved_ip": "10.1.2.3"}),
    );
    let r = of(Some(&d), None);
    assert!(r.meaning.contains("10.1.2.3, a private address"), "{r:?}");
    assert!(r.fixes[0].contains("allow_ranges: [ 10.1.2.3/32 ]"), "{r:?}");
    assert!(r.fixes[0].contains("--allow-range 10.1.2.3/32"), "{r:?}");
}

#[test]
fn tunnel_refusals_say_what_the_first_bytes_were() {
    let d = record(
        json!({"event": "decision", "decision": "deny", "reason_code": "sni_mismatch",
        "scheme": "connect", "destination_host": "a.test", "destination_port": 443, "tls_server_name": "b.test"}),
    );
    let r = of(Some(&d), None);
    assert!(r.meaning.contains("a TLS ClientHello for b.test"), "{r:?}");
    assert!(r.fixes[0].contains("spec.network.tunnels.sni"), "{r:?}");
    let d = record(
        json!({"event": "decision", "decision": "deny", "reason_code": "not_tls",
        "scheme": "connect", "destination_host": "a.test", "destination_port": 443}),
    );
    let r = of(Some(&d), None);
    assert!(
        r.fixes[0].contains("leave 443 out of spec.network.tunnels.tls_only"),
        "{r:?}"
    );
}

#[test]
fn an_upstream_refusal_is_a_refusal_and_a_failure_is_not() {
    let d = record(
        json!({"event": "decision", "decision": "allow", "reason_code": "allowlisted",
        "rule": "allow:a.test", "scheme": "connect", "destination_host": "a.test", "destination_port": 443}),
    );
    let c = record(
        json!({"event": "close", "outcome": "upstream_failure:upstream_denied", "status": 407,
        "scheme": "connect", "destination_host": "a.test", "destination_port": 443}),
    );
    let r = of(Some(&d), Some(&c));
    assert_eq!(
        (r.summary.as_str(), r.exit),
        ("refused by the upstream proxy", EXIT_REFUSED)
    );
    assert!(r.meaning.contains("allowed here by allow:a.test"), "{r:?}");
    assert!(r.fixes[0].contains("asks for credentials (407)"), "{r:?}");
    let c = record(
        json!({"event": "close", "outcome": "upstream_failure:dns", "status": 502,
        "scheme": "connect", "destination_host": "a.test", "destination_port": 443}),
    );
    let r = of(Some(&d), Some(&c));
    assert_eq!(r.exit, EXIT_FAILED);
    assert!(r.meaning.contains("a.test:443 did not resolve"), "{r:?}");
    let c = record(json!({"event": "close", "outcome": "ok", "status": 200}));
    assert_eq!(of(Some(&d), Some(&c)).exit, EXIT_ALLOWED);
}

#[test]
fn a_learned_pass_says_what_would_allow_it_for_real() {
    let d = record(
        json!({"event": "decision", "decision": "allow", "reason_code": "report_only",
        "would_deny": "not_allowlisted", "scheme": "connect", "destination_host": "a.test", "destination_port": 443}),
    );
    let r = of(Some(&d), None);
    assert_eq!(
        (r.summary.as_str(), r.exit),
        ("only in report-only mode", EXIT_ALLOWED)
    );
    assert!(r.meaning.contains("would deny it: not_allowlisted"), "{r:?}");
    assert!(r.fixes[1].contains("--allow a.test;"), "{r:?}");
}

#[test]
fn refusals_below_the_host_say_what_to_widen_and_never_that_nothing_would() {
    let d = record(
        json!({"event": "decision", "decision": "deny", "reason_code": "request_not_allowed",
        "rule": "allow:ro.test:443 (/p/policy.yaml:7)", "scheme": "https", "destination_host": "ro.test",
        "destination_port": 443, "method": "POST", "path": "/a/b", "task_id": "t-1"}),
    );
    let r = of(Some(&d), None);
    assert_eq!(
        (r.summary.as_str(), r.exit),
        ("method or path not allowed", EXIT_REFUSED)
    );
    assert!(
        r.meaning
            .contains("none of the entries for ro.test:443 allows POST /a/b"),
        "{r:?}"
    );
    assert!(
        r.fixes[0].starts_with("widen allow:ro.test:443 (/p/policy.yaml:7)"),
        "{r:?}"
    );
    assert!(
        r.fixes[1].ends_with("methods: [POST]\n      paths: [\"/a/b\"]"),
        "{r:?}"
    );
    assert!(
        r.fixes[2].contains("--task t-1 --host ro.test --port 443 --method POST --path \"/a/b\""),
        "{r:?}"
    );
    let d = record(
        json!({"event": "decision", "decision": "deny", "reason_code": "inspection_required",
        "scheme": "connect", "destination_host": "git.test", "destination_port": 443}),
    );
    let r = of(Some(&d), None);
    assert_eq!(r.summary, "tunnel needs interception");
    assert!(r.fixes[0].contains("--intercept-ca-cert FILE"), "{r:?}");
    let d = record(
        json!({"event": "decision", "decision": "deny", "reason_code": "credential_leak",
        "rule": "credential:/p/policy.yaml:12", "scheme": "https", "destination_host": "evil.test",
        "destination_port": 443, "method": "GET", "path": "/"}),
    );
    let r = of(Some(&d), None);
    assert!(
        r.meaning.contains("placeholder of credential:/p/policy.yaml:12"),
        "{r:?}"
    );
    for code in ["request_not_allowed", "inspection_required", "credential_leak"] {
        let d = record(
            json!({"event": "decision", "decision": "deny", "reason_code": code,
            "scheme": "connect", "destination_host": "a.test", "destination_port": 443}),
        );
        let r = of(Some(&d), None);
        assert!(
            !r.meaning.contains("not one this proxy serves")
                && r.fixes
                    .iter()
                    .all(|f| !f.contains("no policy setting lets it through")),
            "{code}: {r:?}"
        );
    }
}
