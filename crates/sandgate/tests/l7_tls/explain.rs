//! `sandgate explain` with rules below the host: a POST to an `http://` URL and an
//! `https://` URL against entries with `read_only` and with methods and paths (`--policy`,
//! `--method`), and `--request-id` of refusals recorded by a real proxy: a write refused
//! inside an intercepted tunnel (`request_not_allowed`), a tunnel refused for want of an
//! interception CA (`inspection_required`), and a placeholder sent to a host it is not bound
//! to (`credential_leak`). Each says what the refusal means and what would let it through,
//! never "no policy setting lets it through".

use std::process::Command;

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;

use super::{intercepting, pem_file};
use crate::common::world::{World, base_args, strs};
use crate::common::{ProxyProcess, curl, outcome, sandgate_bin};
use crate::l7::decisions::{decision, events_once};
use crate::l7::{egress_policy, entry};

/// `sandgate explain ARGS` with no audit log but those the args name: (code, stdout, stderr).
fn explain(args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(sandgate_bin());
    cmd.arg("explain")
        .args(args)
        .current_dir(dir.path())
        .env_remove("SANDGATE_AUDIT_LOG")
        .env("XDG_STATE_HOME", dir.path().join("state"));
    outcome(&mut cmd)
}

/// Checks that `out` holds each of `want`, and none of the generic refusal's words.
fn says(out: &str, want: &[&str]) {
    for w in want {
        assert!(out.contains(w), "missing {w:?}:\n{out}");
    }
    assert!(
        !out.contains("no policy setting lets it through") && !out.contains("not one this proxy serves"),
        "{out}"
    );
}

#[test]
fn explain_decides_a_method_and_a_path_over_http_and_https_from_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let entries = entry("ro.test", 8080, &["read_only: true"])
        + &entry(
            "git.test",
            443,
            &["methods: [GET, HEAD]", "paths: [\"/myorg/**\"]"],
        );
    let (policy, _) = egress_policy(dir.path(), &entries);
    let policy = policy.to_str().unwrap();

    let (code, out, err) = explain(&["--policy", policy, "--method", "POST", "http://ro.test:8080/a/b"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with("deny POST http://ro.test:8080/a/b: method or path not allowed\n"),
        "{out}"
    );
    assert!(
        out.contains("  rule:    allow:ro.test:8080[read-only] ("),
        "{out}"
    );
    let (code, out, _) = explain(&["--policy", policy, "--method", "GET", "http://ro.test:8080/a/b"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("allow GET http://ro.test:8080/a/b: allowed"),
        "{out}"
    );

    let (code, out, err) = explain(&["--policy", policy, "--method", "POST", "https://git.test/myorg/x"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with("deny POST https://git.test:443/myorg/x: method or path not allowed (inside a tunnel the proxy intercepts"),
        "{out}"
    );
    let (code, out, _) = explain(&["--policy", policy, "https://git.test/myorg/x"]);
    assert_eq!(code, 0, "GET is the default method: {out}");
    let (code, out, _) = explain(&["--policy", policy, "--json", "https://git.test/other/x"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&v["decision"], &v["reason_code"], &v["intercepted"], &v["path"]),
        (
            &"deny".into(),
            &"request_not_allowed".into(),
            &true.into(),
            &"/other/x".into()
        ),
        "{v:#}"
    );
    // A path spelt to leave /myorg/ is refused as such, not matched.
    let (code, out, _) = explain(&["--policy", policy, "https://git.test/myorg/%2e%2e/x"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("path_not_canonical") || out.contains("spelt"),
        "{out}"
    );
}

#[test]
fn explain_request_id_says_what_would_let_a_refusal_below_the_host_through() {
    let w = World::new();
    let ca = TestCa::new(&["ro.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("ro.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = egress_policy(dir.path(), &entry("ro.test", port, &["read_only: true"]));

    // A write refused inside the tunnel the proxy intercepts: its 403 body names the id.
    let i = intercepting(&dns, &policy, &roots);
    let url = format!("https://ro.test:{port}/bucket/object");
    let ca_file = i.ca_file.to_str().unwrap();
    let (_, body, err) = curl(&i.proxy.url(), &["--cacert", ca_file, "--data", "x=1", &url]);
    let id = id_in(&body).unwrap_or_else(|| panic!("no request id in {body:?} {err}"));
    let audit = i.proxy.audit_path.to_str().unwrap();
    decision(&i.proxy.audit_path, "ro.test", "POST", "/bucket/object");
    let (code, out, err) = explain(&["--request-id", &id, "--audit-log", audit]);
    assert_eq!(code, 1, "{out}{err}");
    says(
        &out,
        &[
            &format!("denied POST ro.test:{port}: method or path not allowed"),
            &format!("none of the entries for ro.test:{port} allows POST /bucket/object"),
            "add POST to its methods",
            "read_only allows GET, HEAD and OPTIONS only",
            "      methods: [POST]\n",
        ],
    );

    // The same policy on a proxy without an interception CA: the tunnel is refused, and its
    // head names the id.
    let mut args = base_args(&dns);
    args.extend(["--policy".to_owned(), policy.to_str().unwrap().to_owned()]);
    let blind = ProxyProcess::start(&strs(&args));
    let (_, _, verbose) = curl(&blind.url(), &["-v", "--cacert", ca_file, &url]);
    let id = verbose
        .lines()
        .find_map(|l| l.strip_prefix("< Sandgate-Request-Id: "))
        .unwrap_or_else(|| panic!("no Sandgate-Request-Id in {verbose}"))
        .trim()
        .to_owned();
    events_once(&blind.audit_path, |e| e["request_id"] == id.as_str());
    let audit = blind.audit_path.to_str().unwrap();
    let (code, out, err) = explain(&["--request-id", &id, "--audit-log", audit]);
    assert_eq!(code, 1, "{out}{err}");
    says(
        &out,
        &[
            &format!("denied CONNECT ro.test:{port}: tunnel needs interception"),
            "sandgate proxy --intercept-ca-cert FILE",
            "sandgate run makes one for each run by itself",
        ],
    );
}

#[test]
fn explain_request_id_of_a_credential_leak_names_the_credential() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("api.test", &["127.0.0.1"])
            .with("else.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let entries = entry("api.test", port, &[]) + &entry("else.test", port, &[]);
    let creds = "    credentials:\n      - host: api.test\n        header: Authorization\n        value: \"Bearer ${env:EXPLAIN_KEY}\"\n        placeholder: SANDGATE_EXPLAIN\n";
    let (policy, _) = egress_policy(dir.path(), &(entries + creds));
    let mut command = Command::new(sandgate_bin());
    command.env("EXPLAIN_KEY", "real-secret-value");
    let mut args = base_args(&dns);
    args.extend(["--policy".to_owned(), policy.to_str().unwrap().to_owned()]);
    let p = ProxyProcess::start_with(command, &strs(&args));
    let url = format!("http://else.test:{port}/x");
    let (_, body, err) = curl(&p.url(), &["-H", "Authorization: Bearer SANDGATE_EXPLAIN", &url]);
    let id = id_in(&body).unwrap_or_else(|| panic!("no request id in {body:?} {err}"));
    events_once(&p.audit_path, |e| e["request_id"] == id.as_str());
    let audit = p.audit_path.to_str().unwrap();
    let (code, out, err) = explain(&["--request-id", &id, "--audit-log", audit]);
    assert_eq!(code, 1, "{out}{err}");
    says(
        &out,
        &[
            "credential placeholder sent where it is not bound",
            "carried the placeholder of credential:",
            "send the placeholder only in the header its credential names",
        ],
    );
    assert!(!out.contains("real-secret-value"), "{out}");
    assert!(origin.requests().is_empty(), "the leak reached the origin");
}

/// The id a refusal's body names (`request id: ID (...)`).
fn id_in(body: &str) -> Option<String> {
    body.lines()
        .find_map(|l| l.strip_prefix("request id: "))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
}
