//! Tunnels and what the proxy can read of them. In report-only mode a CONNECT to a host
//! only entries with rules allow is still intercepted, so learning sees each request's
//! method and path (and a credential still holds). A tunnel the proxy cannot read, SOCKS5
//! or a central's node stream, is refused to a host with a credential or with rules even
//! when the proxy could intercept a CONNECT: it would carry the placeholder past the swap,
//! and the requests past the rules.

use std::time::Duration;

use sandgate_testkit::dns::Zone;
use sandgate_testkit::node::{NodeTls, stream};
use sandgate_testkit::tls::{TestCa, client_hello};
use serde_json::Value;

use super::{PLACEHOLDER, SECRET_VAR, credential, holding, secret, secrets_policy};
use crate::central::{Pki, central_with, events_where};
use crate::common::sandgate_bin;
use crate::common::world::World;
use crate::l7::decisions::{decision, events_once};
use crate::l7::entry;
use crate::l7::wire::request_with;
use crate::l7_tls::{connect_decision, https_conn, pem_file};

#[test]
fn report_only_still_intercepts_so_learning_sees_methods_and_paths() {
    let w = World::new();
    let ca = TestCa::new(&["l7.test", "cred.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("l7.test", &["127.0.0.1"])
            .with("cred.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let entries = entry("l7.test", port, &["read_only: true"]) + &entry("cred.test", port, &[]);
    let (policy, _) = secrets_policy(
        dir.path(),
        &entries,
        &credential("cred.test", SECRET_VAR, PLACEHOLDER),
    );
    let secret = secret();
    let out = tempfile::tempdir().unwrap();
    let stdout = out.path().join("stdout.log");
    let i = holding(
        &[(SECRET_VAR, &secret)],
        &dns,
        &policy,
        &roots,
        &stdout,
        &["--report-only"],
    );
    let audit = &i.proxy.audit_path;
    // Each through a tunnel whose client trusts only the proxy's CA: a tunnel let through
    // blind would show the origin's certificate, which that CA does not vouch for.
    let send = |host: &str, method: &str, target: &str, fields: &[(&str, &str)]| {
        let mut conn = https_conn(i.proxy.addr, host, port, &i.ca_pem);
        conn.send(&request_with(
            method,
            target,
            &format!("{host}:{port}"),
            fields,
            "",
        ));
        conn.read_reply()
    };

    let bearer = format!("Bearer {PLACEHOLDER}");
    let replies = [
        send("l7.test", "POST", "/learn/write", &[]),
        send("l7.test", "GET", "/learn/read", &[]),
        send("cred.test", "GET", "/swapped", &[("Authorization", &bearer)]),
        send("cred.test", "GET", &format!("/leak?key={PLACEHOLDER}"), &[]),
    ];
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 403], "{replies:#?}");
    let seen = origin.received();
    let targets: Vec<&str> = seen.iter().map(|r| r.target.as_str()).collect();
    assert_eq!(targets, ["/learn/write", "/learn/read", "/swapped"]);
    assert_eq!(seen[2].header("authorization"), [format!("Bearer {secret}")]);

    let tunnel = connect_decision(audit, "l7.test");
    assert_eq!(
        (
            &tunnel["decision"],
            &tunnel["reason_code"],
            &tunnel["tls_server_name"]
        ),
        (&"allow".into(), &"inspected".into(), &"l7.test".into()),
        "{tunnel:#}"
    );
    let write = decision(audit, "l7.test", "POST", "/learn/write");
    assert_eq!(
        (
            &write["decision"],
            &write["reason_code"],
            &write["would_deny"],
            &write["scheme"]
        ),
        (
            &"allow".into(),
            &"report_only".into(),
            &"request_not_allowed".into(),
            &"https".into()
        ),
        "{write:#}"
    );
    let read = decision(audit, "l7.test", "GET", "/learn/read");
    assert_eq!(
        (&read["reason_code"], &read["would_deny"], &read["scheme"]),
        (&"allowlisted".into(), &Value::Null, &"https".into()),
        "{read:#}"
    );
    let leak = decision(audit, "cred.test", "GET", "/leak");
    assert_eq!(
        (&leak["decision"], &leak["reason_code"]),
        (&"deny".into(), &"credential_leak".into()),
        "report-only does not let a placeholder out: {leak:#}"
    );
}

#[test]
fn a_socks5_tunnel_to_a_host_with_a_credential_is_refused_though_a_connect_is_intercepted() {
    let w = World::new();
    let ca = TestCa::new(&["cred.test", "open.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("cred.test", &["127.0.0.1"])
            .with("open.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let entries = entry("cred.test", port, &[]) + &entry("open.test", port, &[]);
    let (policy, _) = secrets_policy(
        dir.path(),
        &entries,
        &credential("cred.test", SECRET_VAR, PLACEHOLDER),
    );
    let out = tempfile::tempdir().unwrap();
    let stdout = out.path().join("stdout.log");
    let i = holding(
        &[(SECRET_VAR, &secret())],
        &dns,
        &policy,
        &roots,
        &stdout,
        &["--socks-listen", "127.0.0.1:0"],
    );
    let socks = i.proxy.listener(&["role=socks5"]);
    let via_socks = |host: &str| {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg("--cacert")
            .arg(&roots)
            .arg("--socks5-hostname")
            .arg(socks.to_string())
            .arg(format!("https://{host}:{port}/via-socks"))
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };

    assert_eq!(via_socks("open.test"), (0, "200".to_owned()), "the control");
    let (code, _) = via_socks("cred.test");
    assert_ne!(code, 0, "a SOCKS5 tunnel to the credential's host opened");
    // The same host by CONNECT is intercepted, not refused.
    let mut conn = https_conn(i.proxy.addr, "cred.test", port, &i.ca_pem);
    conn.send(&request_with(
        "GET",
        "/via-connect",
        &format!("cred.test:{port}"),
        &[],
        "",
    ));
    assert_eq!(conn.read_reply().status, 200);

    let audit = &i.proxy.audit_path;
    let is_socks = |e: &Value| e["event"] == "decision" && e["scheme"] == "socks5";
    let events = events_once(audit, |e| is_socks(e) && e["destination_host"] == "cred.test");
    let socks5: Vec<(&Value, &Value, &Value)> = events
        .iter()
        .filter(|e| is_socks(e))
        .map(|e| (&e["destination_host"], &e["decision"], &e["reason_code"]))
        .collect();
    assert_eq!(
        socks5,
        [
            (&"open.test".into(), &"allow".into(), &"allowlisted".into()),
            (&"cred.test".into(), &"deny".into(), &"inspection_required".into()),
        ],
        "{events:#?}"
    );
    assert_eq!(connect_decision(audit, "cred.test")["reason_code"], "inspected");
    assert_eq!(origin.requests(), ["GET /via-socks", "GET /via-connect"]);
}

/// A central that could intercept a CONNECT of its own clients: a node's CONNECT stream to
/// a host with a credential, or with rules, is relayed as it is (never decrypted), so it
/// must be refused; a node's stream of plain HTTP requests carrying the placeholder is
/// refused as a leak. A host without either is the control.
#[test]
fn a_node_stream_to_a_host_with_a_credential_or_rules_is_refused_at_a_central_that_intercepts() {
    let w = World::new();
    let ca = TestCa::new(&["cred.test", "l7.test", "open.test"]);
    let origin = w.tls_origin(&ca);
    let plain = w.origin();
    let (port, pp) = (origin.port(), plain.port());
    let mut zone = Zone::new();
    for name in ["cred.test", "l7.test", "open.test"] {
        zone = zone.with(name, &["127.0.0.1"]);
    }
    let dns = w.dns(zone);
    let pki = Pki::new();
    let roots = pem_file(pki.dir.path(), "roots.pem", &ca.ca_pem);
    let ca_file = pki.path("intercept-ca.pem");
    let entries = [
        entry("cred.test", port, &[]),
        entry("cred.test", pp, &[]),
        entry("l7.test", port, &["read_only: true"]),
        entry("open.test", port, &[]),
    ]
    .concat();
    let spec = format!(
        "  network:\n    allowlist:\n{entries}    credentials:\n{}    tunnels: {{ tls_only: false }}\n  nodes:\n    - name: node-a\n      projects: [p1]\n      tasks: [t1]\n",
        credential("cred.test", SECRET_VAR, PLACEHOLDER)
    );
    let mut command = std::process::Command::new(sandgate_bin());
    command
        .env(SECRET_VAR, secret())
        .env("SSL_CERT_FILE", &roots)
        .env_remove("SSL_CERT_DIR");
    let extra = ["--intercept-ca-cert", ca_file.to_str().unwrap()];
    let c = central_with(command, &pki, dns.addr(), &spec, &extra);
    assert!(
        c.proxy.log_line("intercepting TLS").is_some(),
        "{}",
        c.proxy.log_text()
    );
    let cert = pki.node("node-a", &[]);
    let tls = NodeTls {
        cert: &cert.cert,
        key: &cert.key,
        ca: &cert.ca,
        central_name: "127.0.0.1",
    };
    let on_stream = |authority: String, access: Option<&str>, send: Vec<u8>| {
        let mut fields = vec![("sandgate-task", "t1"), ("sandgate-project", "p1")];
        fields.extend(access.map(|a| ("sandgate-access", a)));
        w.rt.block_on(stream(
            c.node_addr,
            tls,
            &authority,
            &fields,
            &send,
            Duration::from_secs(5),
        ))
    };

    // A stream of plain HTTP requests: the placeholder would travel in the clear.
    let authority = format!("cred.test:{pp}");
    let leak = format!(
        "GET http://{authority}/node-plain HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {PLACEHOLDER}\r\nConnection: close\r\n\r\n"
    );
    let plain_answer = on_stream(authority.clone(), Some("http"), leak.into_bytes());
    let head = String::from_utf8_lossy(&plain_answer.body);
    assert!(head.starts_with("HTTP/1.1 403"), "{plain_answer:?}");
    assert!(plain.requests().is_empty(), "{:?}", plain.requests());

    // Tunnels: the control opens; the others would pass blind.
    let open = on_stream(format!("open.test:{port}"), None, client_hello("open.test"));
    assert_eq!(open.status, 200, "the control: {open:?}");
    let cred = on_stream(format!("cred.test:{port}"), None, client_hello("cred.test"));
    let l7 = on_stream(format!("l7.test:{port}"), None, client_hello("l7.test"));
    let decided: Vec<String> = crate::common::read_audit(&c.proxy.audit_path)
        .iter()
        .filter(|e| e["event"] == "decision")
        .map(|e| format!("{} {} {}", e["destination_host"], e["decision"], e["reason_code"]))
        .collect();
    assert_eq!(
        (cred.status, l7.status),
        (403, 403),
        "a node's tunnel passed blind to a host the central reads requests of: {decided:?}; \
         the origin took {} connections",
        origin.connections()
    );

    let refused = events_where(&c.proxy.audit_path, 3, |e| {
        e["event"] == "decision" && e["decision"] == "deny"
    });
    let why: Vec<(&Value, &Value)> = refused
        .iter()
        .map(|e| (&e["destination_host"], &e["reason_code"]))
        .collect();
    assert_eq!(
        why,
        [
            (&"cred.test".into(), &"credential_leak".into()),
            (&"cred.test".into(), &"inspection_required".into()),
            (&"l7.test".into(), &"inspection_required".into()),
        ],
        "{refused:#?}"
    );
    assert!(refused.iter().all(|e| e["node"] == "node-a"), "{refused:#?}");
}
