//! A placeholder where it does not belong: in another header to its own host, in the path
//! or query, in the bound header to another host (one intercepted for its rules, and one
//! with a credential of its own), and in plain HTTP to any host (its own included: the
//! secret would travel in the clear). Each is refused 403 `credential_leak`, recorded with
//! the credential's `file:line`, and never reaches an origin. Bodies are inspected only for
//! a credential that asks (`inspect_body`, the last test): otherwise a placeholder in one
//! goes through unchanged, and is only a placeholder.

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;
use serde_json::Value;

use super::{PLACEHOLDER, SECRET_VAR, credential, credential_lines, holding, secret, secrets_policy};
use crate::common::world::World;
use crate::l7::decisions::events_once;
use crate::l7::entry;
use crate::l7::wire::{Conn, Reply, request_with};
use crate::l7_tls::{https_conn, pem_file};

/// How a request is sent: inside an intercepted tunnel, or as plain HTTP.
#[derive(Debug, Clone, Copy)]
enum Via {
    Https,
    Http,
}

/// A request: how it is sent, its host, its target and its header fields.
type Case<'a> = (Via, &'a str, &'a str, &'a [(&'a str, &'a str)]);

/// The second credential's variable and placeholder.
const OTHER_VAR: &str = "L7_OTHER_KEY";
const OTHER: &str = "SANDGATE_L7_OTHER";

#[test]
fn a_placeholder_anywhere_but_its_header_to_its_host_is_refused_as_a_leak() {
    let w = World::new();
    let ca = TestCa::new(&["cred.test", "cred2.test", "ro.test"]);
    let tls = w.tls_origin(&ca);
    let plain = w.origin();
    let (tp, pp) = (tls.port(), plain.port());
    let mut zone = Zone::new();
    for name in ["cred.test", "cred2.test", "ro.test", "open.test"] {
        zone = zone.with(name, &["127.0.0.1"]);
    }
    let dns = w.dns(zone);
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let entries = [
        entry("cred.test", tp, &[]),
        entry("cred2.test", tp, &[]),
        entry("ro.test", tp, &["read_only: true"]),
        entry("open.test", pp, &[]),
        entry("cred.test", pp, &[]),
    ]
    .concat();
    let credentials =
        credential("cred.test", SECRET_VAR, PLACEHOLDER) + &credential("cred2.test", OTHER_VAR, OTHER);
    let (policy, text) = secrets_policy(dir.path(), &entries, &credentials);
    let lines = credential_lines(&text);
    let (one, two) = (secret(), secret());
    let out = tempfile::tempdir().unwrap();
    let vars = [(SECRET_VAR, one.as_str()), (OTHER_VAR, two.as_str())];
    let i = holding(&vars, &dns, &policy, &roots, &out.path().join("stdout.log"), &[]);
    let (ca_pem, proxy) = (i.ca_pem.clone(), i.proxy.addr);
    // Inside a tunnel (intercepted), or as plain HTTP in absolute form.
    let send =
        |via: Via, host: &str, method: &str, target: &str, fields: &[(&str, &str)], body: &str| match via {
            Via::Https => {
                let mut conn = https_conn(proxy, host, tp, &ca_pem);
                conn.send(&request_with(
                    method,
                    target,
                    &format!("{host}:{tp}"),
                    fields,
                    body,
                ));
                conn.read_reply()
            }
            Via::Http => {
                let authority = format!("{host}:{pp}");
                let absolute = format!("http://{authority}{target}");
                let mut conn = Conn::open(proxy);
                conn.send(&request_with(method, &absolute, &authority, fields, body));
                conn.read_reply()
            }
        };
    let bearer = format!("Bearer {PLACEHOLDER}");
    let authorized = ("Authorization", bearer.as_str());
    let other_bearer = format!("Bearer {OTHER}");
    let other = ("Authorization", other_bearer.as_str());
    let cookie = format!("session={PLACEHOLDER}");
    let (query, in_path) = (
        format!("/v1/models?key={PLACEHOLDER}"),
        format!("/v1/{PLACEHOLDER}/models"),
    );
    let plain_query = format!("/d-query?k={PLACEHOLDER}");

    let leaks: [Case<'_>; 10] = [
        // (a) another header to the bound host.
        (
            Via::Https,
            "cred.test",
            "/a-header",
            &[("X-Api-Key", PLACEHOLDER)],
        ),
        (
            Via::Https,
            "cred.test",
            "/a-cookie",
            &[("Cookie", cookie.as_str())],
        ),
        // (b) the query, and the path (beside the header where it belongs).
        (Via::Https, "cred.test", &query, &[]),
        (Via::Https, "cred.test", &in_path, &[authorized]),
        // (c) the bound header to another host: intercepted for its rules, or for a
        // credential of its own (each credential's placeholder, to the other's host).
        (Via::Https, "ro.test", "/c-rules", &[authorized]),
        (Via::Https, "cred2.test", "/c-other", &[authorized]),
        (Via::Https, "cred.test", "/c-swapped", &[other]),
        // (d) plain HTTP: to its own host, to another, in the query.
        (Via::Http, "cred.test", "/d-own", &[authorized]),
        (Via::Http, "open.test", "/d-other", &[authorized]),
        (Via::Http, "open.test", &plain_query, &[]),
    ];
    let replies: Vec<Reply> = leaks
        .iter()
        .map(|(via, host, target, fields)| send(*via, host, "GET", target, fields, ""))
        .collect();
    // Each names the credential whose placeholder it carried: the sixth sends the first
    // credential's placeholder to the second's host, the seventh the second's to the first's.
    let first = format!("policy.yaml:{}", lines[0]);
    let second = format!("policy.yaml:{}", lines[1]);
    let named = |n: usize| if n == 6 { &second } else { &first };
    for (n, ((_, host, target, _), reply)) in leaks.iter().zip(&replies).enumerate() {
        assert_eq!(reply.status, 403, "{host} {target}: {reply:?}");
        assert!(
            reply.body.contains(named(n).as_str()),
            "{host} {target}: {reply:?}"
        );
    }

    // What passes: each placeholder in its own header to its own host (answered with
    // bytes: the echo would show the secret), and bodies, which are not read.
    let body = format!("{{\"key\":\"{PLACEHOLDER}\"}}");
    let json = ("Content-Type", "application/json");
    let passed = [
        send(Via::Https, "cred2.test", "GET", "/bytes/4", &[other], ""),
        send(Via::Https, "cred.test", "POST", "/body", &[json], &body),
        send(Via::Https, "ro.test", "GET", "/read", &[], ""),
        send(Via::Http, "open.test", "POST", "/plain-body", &[json], &body),
    ];
    for reply in &passed {
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    for reply in replies.iter().chain(&passed) {
        assert!(
            !reply.body.contains(&one) && !reply.body.contains(&two),
            "a client was shown a secret: {reply:?}"
        );
    }

    let seen = tls.received();
    let targets: Vec<&str> = seen.iter().map(|r| r.target.as_str()).collect();
    assert_eq!(
        targets,
        ["/bytes/4", "/body", "/read"],
        "only what passed reached the origin"
    );
    assert_eq!(seen[0].header("authorization"), [format!("Bearer {two}")]);
    assert_eq!(
        String::from_utf8_lossy(&seen[1].body),
        body,
        "a body goes through as it was sent"
    );
    assert!(seen[1].header("authorization").is_empty() && seen[2].header("authorization").is_empty());
    let seen = plain.received();
    assert_eq!(
        seen.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(),
        ["/plain-body"]
    );
    assert_eq!(String::from_utf8_lossy(&seen[0].body), body);

    // Each refusal recorded as a leak, where it was sent.
    let is_leak = |e: &Value| e["event"] == "decision" && e["reason_code"] == "credential_leak";
    let events = events_once(&i.proxy.audit_path, |e| is_leak(e) && e["path"] == "/d-query");
    let recorded: Vec<&Value> = events.iter().filter(|e| is_leak(e)).collect();
    let where_: Vec<(&str, &str)> = recorded
        .iter()
        .map(|e| {
            (
                e["destination_host"].as_str().unwrap_or("-"),
                e["path"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    // The path is recorded without its query.
    let sent: Vec<(&str, &str)> = leaks
        .iter()
        .map(|(_, host, target, _)| (*host, target.split('?').next().unwrap_or("")))
        .collect();
    assert_eq!(where_, sent, "{events:#?}");
    for e in &recorded {
        assert_eq!(
            (&e["decision"], &e["status"]),
            (&"deny".into(), &403.into()),
            "{e:#}"
        );
    }
    let text = std::fs::read_to_string(&i.proxy.audit_path).unwrap();
    assert!(
        !text.contains(&one) && !text.contains(&two),
        "the audit holds a secret"
    );
    // The record names the credential too (docs/policy.md: "the audit, the logs and
    // `explain` name the credential by its file and line").
    for (n, e) in recorded.iter().enumerate() {
        assert!(
            e.to_string().contains(named(n).as_str()),
            "should name {}: {e:#}",
            named(n)
        );
    }
}

/// A credential that asks for `inspect_body`: its placeholder in a request body to another
/// host is cut where it ends (here across the read buffers' seams, 16 KiB in), answered 403
/// `credential_leak`, and the close records it; the origin never gets the whole
/// placeholder. Over plain HTTP and inside an intercepted tunnel alike. A body to its own
/// host, and one without it, go through whole.
#[test]
fn a_placeholder_in_a_body_to_another_host_is_cut_where_its_credential_asks() {
    let w = World::new();
    let ca = TestCa::new(&["cred.test", "api.test"]);
    let tls = w.tls_origin(&ca);
    let plain = w.origin();
    let (tp, pp) = (tls.port(), plain.port());
    let mut zone = Zone::new();
    for name in ["cred.test", "api.test", "open.test"] {
        zone = zone.with(name, &["127.0.0.1"]);
    }
    let dns = w.dns(zone);
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let entries = [
        entry("cred.test", tp, &[]),
        entry("api.test", tp, &["methods: [POST]"]),
        entry("open.test", pp, &[]),
    ]
    .concat();
    let credentials = credential("cred.test", SECRET_VAR, PLACEHOLDER) + "        inspect_body: true\n";
    let (policy, _) = secrets_policy(dir.path(), &entries, &credentials);
    let one = secret();
    let out = tempfile::tempdir().unwrap();
    let i = holding(
        &[(SECRET_VAR, one.as_str())],
        &dns,
        &policy,
        &roots,
        &out.path().join("stdout.log"),
        &[],
    );
    let (ca_pem, proxy) = (i.ca_pem.clone(), i.proxy.addr);
    let json = ("Content-Type", "application/json");
    // The placeholder straddles 16 KiB, where a read buffer ends.
    let leaking = format!("{}{PLACEHOLDER}{}", "a".repeat(16_384 - 7), "b".repeat(4096));
    let clean = format!("{}{}", "a".repeat(20_000), &PLACEHOLDER[..PLACEHOLDER.len() - 1]);
    let https = |host: &str, target: &str, body: &str| {
        let mut conn = https_conn(proxy, host, tp, &ca_pem);
        conn.send(&request_with(
            "POST",
            target,
            &format!("{host}:{tp}"),
            &[json],
            body,
        ));
        conn.read_reply()
    };
    let http = |target: &str, body: &str| {
        let authority = format!("open.test:{pp}");
        let mut conn = Conn::open(proxy);
        conn.send(&request_with(
            "POST",
            &format!("http://{authority}{target}"),
            &authority,
            &[json],
            body,
        ));
        conn.read_reply()
    };
    // Chunked, the placeholder split between two chunks: the framing between its halves
    // does not hide it (the origin would read it whole).
    let (half, rest) = PLACEHOLDER.split_at(9);
    let chunked = {
        let authority = format!("open.test:{pp}");
        let mut conn = Conn::open(proxy);
        conn.send(&format!(
            "POST http://{authority}/cut-chunked HTTP/1.1\r\nHost: {authority}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{half}\r\n{:x}\r\n{rest}\r\n0\r\n\r\n",
            half.len(),
            rest.len()
        ));
        conn.read_reply()
    };
    let cut = [
        https("api.test", "/cut-https", &leaking),
        http("/cut-http", &leaking),
        chunked,
    ];
    for reply in &cut {
        assert_eq!(reply.status, 403, "{reply:?}");
        assert!(
            reply.body.contains("credential_leak") || reply.body.contains("placeholder"),
            "{reply:?}"
        );
    }
    let passed = [
        https("cred.test", "/own-host", &leaking),
        https("api.test", "/clean-https", &clean),
        http("/clean-http", &clean),
    ];
    for reply in &passed {
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    // No origin got the placeholder whole, but from its own host.
    for r in tls.received().iter().chain(plain.received().iter()) {
        let whole = super::contains(&r.body, PLACEHOLDER);
        assert_eq!(
            whole,
            r.target == "/own-host",
            "{}: {} bytes",
            r.target,
            r.body.len()
        );
    }
    // Each cut is on record: allowed, then closed as a leak, answered 403.
    for path in ["/cut-https", "/cut-http", "/cut-chunked"] {
        let cut = |e: &Value| e["event"] == "close" && e["outcome"] == "credential_leak" && e["path"] == path;
        let events = events_once(&i.proxy.audit_path, cut);
        let close = events.iter().find(|e| cut(e));
        assert!(close.is_some_and(|c| c["status"] == 403), "{path}: {events:#?}");
    }
}
