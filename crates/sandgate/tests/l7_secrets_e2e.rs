//! Credentials the sandbox never holds (issue 33; docs/policy.md, "Credentials the sandbox
//! never holds"), end to end with real clients against loopback origins signed by a test CA
//! that the proxy takes for the system's roots: the placeholder a client sends in the bound
//! header reaches the bound host as the secret, while the secret is written nowhere else
//! (here); a placeholder anywhere else is refused as a leak (`l7_secrets/leaks.rs`); inside
//! `sandgate run` the command holds only the placeholder (`l7_secrets/sandboxed.rs`); an
//! unset secret stops a proxy, a reload and a run (`l7_secrets/start.rs`); tunnels that
//! cannot be read are refused, and report-only still reads them (`l7_secrets/tunnels.rs`).
//! The fixtures are those of the interception tests (`l7_tls/interception.rs`) and of the
//! plain-HTTP rule tests (`l7/`), loaded here without their tests.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod central;
mod common;
mod l7_secrets;
mod sandbox_support;

/// The fixtures of `l7/` (its `mod.rs` would bring the plain-HTTP tests along).
#[allow(dead_code, reason = "these tests use part of the fixtures")]
mod l7 {
    pub mod decisions;
    pub mod entries;
    pub mod wire;

    pub use entries::{egress_policy, entry, entry_at};
}

/// The fixtures of `l7_tls/` (its `mod.rs` would bring the interception tests along).
#[allow(dead_code, reason = "these tests use part of the fixtures")]
mod l7_tls {
    pub mod interception;

    pub use interception::*;
}

use common::world::World;
use l7::decisions::decision;
use l7::entry;
use l7::wire::request_with;
use l7_secrets::{PLACEHOLDER, SECRET_VAR, containing, credential, holding, secret, secrets_policy};
use l7_tls::{connect_decision, files_under, https_conn, pem_file};
use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;

/// The bound header as an SDK writes it, the same field in lowercase with another word
/// before the placeholder (the field is replaced whole), and a request without it (nothing
/// is added): over HTTP/1.1 with a raw client, and over HTTP/2 with curl. The origin answers
/// with bytes of its own rather than an echo, so anything of the secret a client got back
/// would have come from the proxy. (An origin that echoes request headers would hand the
/// secret back: responses are not rewritten.)
#[test]
fn the_placeholder_reaches_its_host_as_the_secret_and_the_secret_is_written_nowhere_else() {
    let w = World::new();
    let ca = TestCa::new(&["cred.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("cred.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    // An entry without methods or paths: the credential alone makes the host intercepted.
    let (policy, _) = secrets_policy(
        dir.path(),
        &entry("cred.test", port, &[]),
        &credential("cred.test", SECRET_VAR, PLACEHOLDER),
    );
    let secret = secret();
    let out = tempfile::tempdir().unwrap();
    let stdout = out.path().join("stdout.log");
    let mut i = holding(&[(SECRET_VAR, &secret)], &dns, &policy, &roots, &stdout, &[]);
    let host = format!("cred.test:{port}");
    let bearer = format!("Bearer {PLACEHOLDER}");
    let token = format!("token {PLACEHOLDER}");

    let sends: [(&str, (&str, &str)); 3] = [
        ("/bytes/16", ("Authorization", &bearer)),
        ("/bytes/17", ("authorization", &token)),
        ("/bytes/18", ("Accept", "*/*")),
    ];
    let mut answers = String::new();
    for (target, field) in sends {
        let mut conn = https_conn(i.proxy.addr, "cred.test", port, &i.ca_pem);
        conn.send(&request_with("GET", target, &host, &[field], ""));
        let reply = conn.read_reply();
        assert_eq!(
            (reply.status, reply.body.len().to_string()),
            (200, target.replace("/bytes/", "")),
            "{target}: {reply:?}"
        );
        answers.push_str(&reply.body);
    }
    // curl speaks HTTP/2 inside the tunnel; -i and -v show every header either way.
    let ca_file = i.ca_file.to_str().unwrap().to_owned();
    let url = format!("https://{host}/bytes/8");
    let header = format!("Authorization: {bearer}");
    let (code, curl_out, curl_err) = common::curl(
        &i.proxy.url(),
        &["--cacert", &ca_file, "-i", "-v", "-H", &header, &url],
    );
    assert_eq!(code, 0, "{curl_err}");
    assert!(curl_out.contains("\nHTTP/2 200"), "{curl_out}");
    // A refusal inside the same kind of tunnel: its words name the credential, not the
    // secret.
    let leak_url = format!("https://{host}/bytes/9?key={PLACEHOLDER}");
    let (_, refused_out, refused_err) =
        common::curl(&i.proxy.url(), &["--cacert", &ca_file, "-i", "-v", &leak_url]);
    assert!(refused_out.contains(" 403"), "{refused_out}\n{refused_err}");

    let authorizations: Vec<(String, Vec<String>)> = origin
        .received()
        .iter()
        .map(|r| {
            let values = r
                .header("authorization")
                .iter()
                .map(|v| (*v).to_owned())
                .collect();
            (r.target.clone(), values)
        })
        .collect();
    let real = vec![format!("Bearer {secret}")];
    assert_eq!(
        authorizations,
        [
            ("/bytes/16".to_owned(), real.clone()),
            ("/bytes/17".to_owned(), real.clone()),
            ("/bytes/18".to_owned(), Vec::new()),
            ("/bytes/8".to_owned(), real),
        ],
        "what the origin received"
    );
    for seen in [&answers, &curl_out, &curl_err, &refused_out, &refused_err] {
        assert!(!seen.contains(&secret), "a client was shown the secret:\n{seen}");
    }

    let audit = i.proxy.audit_path.clone();
    let tunnel = connect_decision(&audit, "cred.test");
    assert_eq!(
        (&tunnel["decision"], &tunnel["reason_code"]),
        (&"allow".into(), &"inspected".into()),
        "a host with a credential is always intercepted: {tunnel:#}"
    );
    let d = decision(&audit, "cred.test", "GET", "/bytes/8");
    assert_eq!(
        (&d["decision"], &d["scheme"]),
        (&"allow".into(), &"https".into()),
        "{d:#}"
    );

    // Everything the proxy wrote, once it has stopped: its audit log and working
    // directory, its CA's directory, its stdout, its trace-level log.
    let status = i.proxy.terminate();
    assert!(status.success(), "{status:?}");
    let mut written = files_under(audit.parent().unwrap());
    written.extend(files_under(i.ca_file.parent().unwrap()));
    written.extend(files_under(out.path()));
    assert!(written.contains(&audit) && written.contains(&stdout) && written.contains(&i.ca_file));
    assert_eq!(containing(&written, &secret), Vec::<std::path::PathBuf>::new());
    let log = i.proxy.log_text();
    assert!(
        log.contains("TRACE") || log.contains("DEBUG"),
        "not a trace-level log:\n{log}"
    );
    assert!(!log.contains(&secret), "the log holds the secret:\n{log}");
}
