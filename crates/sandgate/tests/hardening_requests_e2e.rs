//! Regression tests for the proxy half of the hostile review (issue 16), requests, each
//! written as the attacker would act: a task that borrows another's identity, an origin
//! sending hop-by-hop fields in an interim response, a name resolving to a denied address,
//! Host fields that are not one authority. Every test here failed on the code before the fix
//! (see the session note); the whole file also runs as `nobody`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use common::world::{base_args, policy_doc, status_from, strs};
use common::{ProxyProcess, curl, raw, runtime, status_of};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;

/// Item 12: a task's identity comes only from its own credential. A listener-wide project
/// on an `auth: basic` listener (which a task without a project used to inherit, choosing a
/// project's scope by choosing the listener) is refused.
#[test]
fn an_auth_listener_cannot_lend_its_project_to_a_task() {
    let target = "web.test:80";
    let dir = tempfile::tempdir().unwrap();
    let auth = format!(
        "\x20 auth:\n    tasks:\n      - task: t-1\n        secret_sha256: {}\n",
        sandgate_policy::auth::secret_hash("tok-1")
    );
    let borrowed = dir.path().join("borrowed.yaml");
    std::fs::write(
        &borrowed,
        policy_doc(&format!(
            "  network:\n    allowlist:\n      - host: \"{target}\"\n        scope: {{ project: p-secret }}\n\
             \x20 listeners:\n    - listen: 127.0.0.1:0\n      auth: basic\n      project: p-secret\n{auth}"
        )),
    )
    .unwrap();
    let out = Command::new(common::sandgate_bin())
        .arg("check-config")
        .arg(&borrowed)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(64),
        "accepted a project on an auth listener: {stderr}"
    );
    assert!(stderr.contains("spec.listeners.project"), "{stderr}");
}

/// Item 12, second half: after an authenticated request on a kept-alive connection, a
/// request without credentials is refused and recorded under no task.
#[test]
fn a_refused_request_carries_no_earlier_identity() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let target = format!("web.test:{}", origin.port());
    let dir = tempfile::tempdir().unwrap();
    let auth = format!(
        "\x20 auth:\n    tasks:\n      - task: t-1\n        secret_sha256: {}\n",
        sandgate_policy::auth::secret_hash("tok-1")
    );
    let file = dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        policy_doc(&format!(
            "  network:\n    allowlist:\n      - host: \"{target}\"\n        scope: {{ task: t-1 }}\n\
             \x20 listeners:\n    - listen: 127.0.0.1:0\n      auth: basic\n{auth}"
        )),
    )
    .unwrap();
    let mut args = base_args(&dns);
    args.extend(["--policy".into(), file.to_str().unwrap().to_owned()]);
    let p = ProxyProcess::start(&strs(&args));
    let shared = p.listener(&["auth=basic"]);
    let url = format!("http://{target}/one");
    // Two requests on one connection: the first authenticated, the second without.
    let reply = raw(
        shared,
        format!(
            "GET {url} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic dC0xOnRvay0x\r\n\r\n\
             GET {url} HTTP/1.1\r\nHost: {target}\r\n\r\n"
        )
        .as_bytes(),
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("HTTP/1.1 407"), "{reply}");
    let events = p.audit_events(3);
    let refused = events
        .iter()
        .find(|e| e["reason_code"] == "proxy_auth_missing")
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert!(
        refused["task_id"].is_null() && refused["project_id"].is_null(),
        "the refused request was recorded under an earlier identity: {refused:#}"
    );
}

/// Item 13: an origin's interim response (`100 Continue`) is rebuilt like a final one: CRLF
/// line ends, hop-by-hop fields (and those its Connection field names) dropped.
#[test]
fn interim_responses_are_rebuilt_and_filtered() {
    let rt = runtime();
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = origin.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        s.write_all(
            b"HTTP/1.1 100 Continue\nConnection: x-hop\nX-Hop: secret\nKeep-Alive: timeout=5\nX-Kept: yes\n\n\
              HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
        )
        .unwrap();
    });
    let dns = rt.block_on(DnsServer::start(Zone::new().with("origin.test", &["127.0.0.1"])));
    let mut args = base_args(&dns);
    args.extend(["--allow".into(), format!("origin.test:{port}")]);
    let p = ProxyProcess::start(&strs(&args));
    let reply = raw(
        p.addr,
        format!(
            "GET http://origin.test:{port}/ HTTP/1.1\r\nHost: origin.test:{port}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    );
    server.join().unwrap();
    let interim = reply.split("\r\n\r\n").next().unwrap();
    assert!(interim.starts_with("HTTP/1.1 100 Continue\r\n"), "{reply:?}");
    assert!(
        !interim.contains("X-Hop") && !interim.contains("Keep-Alive"),
        "{reply:?}"
    );
    assert!(interim.contains("X-Kept: yes\r\n"), "{reply:?}");
    assert!(
        !reply.replace("\r\n", "").contains('\n'),
        "a bare LF reached the client: {reply:?}"
    );
    assert!(reply.ends_with("\r\n\r\nok"), "{reply:?}");
}

/// Item 14: a deny entry that is an address stops a name that resolves to it.
#[test]
fn a_denied_address_is_denied_whatever_name_leads_to_it() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("innocent.test", &["127.0.0.1"])
            .with("other.test", &["127.0.0.2"]),
    ));
    let port = origin.port();
    let mut args = base_args(&dns);
    // `*` is the usual ports only (issue 30): the origin's port is named.
    args.extend([
        "--allow".into(),
        format!("*:{port}"),
        "--deny".into(),
        "127.0.0.1".into(),
    ]);
    let p = ProxyProcess::start(&strs(&args));
    let (_, out, _) = curl(&p.url(), &["-s", "-i", &format!("http://innocent.test:{port}/")]);
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(
        out.contains("resolves to 127.0.0.1, which a deny rule names"),
        "{out}"
    );
    let (status, head) = status_from("127.0.0.1", p.addr, &format!("innocent.test:{port}"));
    assert_eq!(status, 403, "{head}");
    assert_eq!(origin.connections(), 0, "the denied address was reached");
    let events = p.audit_events(2);
    assert!(
        events.iter().all(|e| e["decision"] == "deny"
            && e["reason_code"] == "denylisted"
            && e["resolved_ip"] == "127.0.0.1"
            && e["rule"].as_str().is_some_and(|r| r.contains("deny:127.0.0.1"))),
        "{events:#?}"
    );
}

/// Item 15: a Host field that is not exactly one valid authority is 400 before any DNS
/// query, whatever the request-target says; so is an HTTP/1.1 request without one.
#[test]
fn host_fields_that_are_not_one_authority_get_400_before_dns() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new().with("allowed.test", &["127.0.0.1"])));
    let mut args = base_args(&dns);
    args.extend(["--allow".into(), "*".into()]);
    let p = ProxyProcess::start(&strs(&args));
    for host in [
        "a.test, b.test",
        "user@a.test",
        "a.test/path",
        "",
        "evil.test:99999",
    ] {
        let reply = raw(
            p.addr,
            format!("GET http://allowed.test/ HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&reply), 400, "Host: {host:?}\n{reply}");
        let reply = raw(
            p.addr,
            format!("CONNECT allowed.test:443 HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&reply), 400, "CONNECT with Host: {host:?}\n{reply}");
    }
    let reply = raw(p.addr, b"GET http://allowed.test/ HTTP/1.1\r\n\r\n");
    assert_eq!(status_of(&reply), 400, "{reply}");
    assert_eq!(dns.questions(), Vec::<String>::new(), "DNS was asked");
}

/// This whole file again as `nobody` when the tests run as root (as in CI): every attack
/// above must fail the same way against an unprivileged proxy.
#[test]
fn the_request_hardening_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody(
        "hardening_requests_e2e",
        "the_request_hardening_suite_passes_as_an_ordinary_user",
        5,
    );
}

/// The attacker names the framing field in `Connection`, so a proxy that drops what
/// `Connection` names would forward the body without it, and the origin would read the body,
/// itself a request (here for another virtual host), as a second one that nothing decided or
/// recorded. The origin sees one request, with its whole body.
#[test]
fn a_body_cannot_become_a_request_by_naming_its_length_in_connection() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("ok.test", &["127.0.0.1"])));
    let mut args = base_args(&dns);
    args.extend(["--allow".into(), format!("ok.test:{}", origin.port())]);
    let p = ProxyProcess::start(&strs(&args));
    let inner = "GET /smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n";
    let reply = raw(
        p.addr,
        format!(
            "POST http://ok.test:{port}/ HTTP/1.1\r\nHost: ok.test:{port}\r\nConnection: close, content-length\r\nContent-Length: {len}\r\n\r\n{inner}",
            port = origin.port(),
            len = inner.len()
        )
        .as_bytes(),
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    assert!(
        reply.contains(&format!("\"body_len\":{}", inner.len())),
        "the origin did not get the body as a body: {reply:?}"
    );
    assert!(!reply.contains("/smuggled"), "{reply:?}");
}
