//! Exceptions below the host name (issue 33: "an exception can grant GET on a path for 15
//! minutes"), end to end with the real binary: a requester asks over the admin API for
//! `GET` on `/docs/**` of two hosts for 900 s, the approver approves with the CLI, and the
//! proxy (intercepting with its own CA, a test CA as the system's roots) lets exactly that
//! through, over plain HTTP and inside an HTTPS tunnel, each refusal recorded with the
//! exception as its rule. What an agent or an approver would try to widen is refused: a
//! path that spells its way out, a method in lowercase, an approval that adds a method or a
//! path, a read-only approval of a request that named POST. Asking again for what the
//! exception covers returns it; asking for more files a new request.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;
/// Tests of their own files, on this file's fixture.
mod exceptions_l7 {
    mod expiry;
    mod revocation;
}

/// The fixtures of `l7/` (its `mod.rs` would bring the plain-HTTP tests along).
#[allow(dead_code, reason = "these tests use part of the fixtures")]
mod l7 {
    pub mod decisions;
    pub mod entries;
    pub mod wire;
}

/// The fixtures of `l7_tls/` (its `mod.rs` would bring the interception tests along).
#[allow(dead_code, reason = "these tests use part of the fixtures")]
mod l7_tls {
    pub mod interception;

    pub use interception::*;
}

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use common::control::{api, cli};
use common::world::World;
use common::{curl, sandgate_bin};
use l7::decisions::{decision, events_once};
use l7_tls::{Intercepting, intercepting_with, pem_file};
use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;
use serde_json::{Value, json};

/// Task t-1 on its own listener; exceptions for t-1 on `ports` for up to 15 minutes; a
/// requester (agent-7) and an approver (alice).
fn policy(dir: &Path, ports: &[u16]) -> std::path::PathBuf {
    let hash = |s: &str| sandgate_policy::auth::secret_hash(s);
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let text = format!(
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: ex-l7 }}\nspec:\n\
         \x20 listeners:\n    - {{ listen: \"127.0.0.1:0\", task: t-1, project: p-1 }}\n\
         \x20 exceptions:\n    - {{ scope: {{ task: t-1 }}, ports: [ {ports} ], max_ttl_seconds: 900 }}\n\
         \x20 admin:\n    listen: \"127.0.0.1:0\"\n    tokens:\n\
         \x20     - {{ name: agent-7, role: requester, secret_sha256: {a}, tasks: [ t-1 ] }}\n\
         \x20     - {{ name: alice, role: approver, secret_sha256: {b} }}\n",
        ports = ports.join(", "),
        a = hash("tok-agent"),
        b = hash("tok-alice"),
    );
    let path = dir.join("policy.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The two origins (plain and TLS), and an intercepting proxy with its exceptions in a
/// state directory.
struct Fixture {
    i: Intercepting,
    /// The proxy's t-1 listener and its admin listener.
    task: SocketAddr,
    admin: SocketAddr,
    web: u16,
    tls: u16,
    _origins: (sandgate_testkit::origin::Origin, sandgate_testkit::origin::Origin),
    _dns: sandgate_testkit::dns::DnsServer,
    _world: World,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let world = World::new();
    let ca = TestCa::new(&["tls.test"]);
    let web = world.origin();
    let tls = world.tls_origin(&ca);
    let dns = world.dns(
        Zone::new()
            .with("web.test", &["127.0.0.1"])
            .with("tls.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), &[web.port(), tls.port()]);
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let state = dir.path().join("state");
    let i = intercepting_with(
        Command::new(sandgate_bin()),
        &dns,
        &policy,
        &roots,
        &["--state-dir", state.to_str().unwrap()],
    );
    let task = i.proxy.listener(&["task=t-1"]);
    let admin = i.proxy.admin();
    Fixture {
        web: web.port(),
        tls: tls.port(),
        i,
        task,
        admin,
        _origins: (web, tls),
        _dns: dns,
        _world: world,
        _dir: dir,
    }
}

impl Fixture {
    /// The status of `method URL` through the t-1 listener, trusting only the proxy's CA.
    fn status(&self, method: &str, url: &str) -> String {
        let ca = self.i.ca_file.to_str().unwrap();
        // curl's HEAD is `-I`: with `-X HEAD` it would wait for a body.
        let how = if method == "HEAD" {
            vec!["-I"]
        } else {
            vec!["-X", method]
        };
        let mut args = vec!["--cacert", ca, "-o", "/dev/null", "-w", "%{http_code}"];
        args.extend(how);
        args.push(url);
        let (_, out, _) = curl(&format!("http://{}", self.task), &args);
        out
    }

    /// Files `body` (a request's JSON) as agent-7: the status and the exception.
    fn ask(&self, body: &Value) -> (u16, Value) {
        let (status, v) = api(
            self.admin,
            "POST",
            "/v1/exceptions",
            Some("tok-agent"),
            Some(&body.to_string()),
        );
        (status, v)
    }

    /// Asks for GET on `paths` of tls.test for `reason`, and has alice approve it with
    /// `approval` (the approval's JSON body): the exception's id.
    fn approved_get(&self, reason: &str, paths: &[&str], approval: &str) -> String {
        let (status, asked) = self.ask(&json!({
            "task_id": "t-1",
            "requested_hosts": ["tls.test"],
            "requested_ports": [self.tls],
            "ttl_seconds": 900,
            "reason": reason,
            "methods": ["GET"],
            "paths": paths,
        }));
        assert_eq!(status, 201, "{asked}");
        let id = asked["id"].as_str().unwrap().to_owned();
        let (status, approved) = api(
            self.admin,
            "POST",
            &format!("/v1/exceptions/{id}/approve"),
            Some("tok-alice"),
            Some(approval),
        );
        assert_eq!(status, 200, "{approved}");
        id
    }

    fn web(&self, path: &str) -> String {
        format!("http://web.test:{}{path}", self.web)
    }

    fn tls(&self, path: &str) -> String {
        format!("https://tls.test:{}{path}", self.tls)
    }
}

fn get_on_docs(f: &Fixture) -> Value {
    json!({
        "task_id": "t-1",
        "requested_hosts": ["web.test", "tls.test"],
        "requested_ports": [f.web, f.tls],
        "ttl_seconds": 900,
        "reason": "read the docs",
        "methods": ["GET"],
        "paths": ["/docs/**", "/api/v1/*"],
    })
}

#[test]
fn an_exception_grants_get_on_paths_for_fifteen_minutes_over_http_and_inside_https() {
    let f = fixture();
    assert_eq!(
        f.status("GET", &f.web("/docs/a")),
        "403",
        "denied before any exception"
    );
    assert_eq!(
        f.status("GET", &f.tls("/docs/a")),
        "000",
        "the CONNECT itself refused"
    );

    let (status, asked) = f.ask(&get_on_docs(&f));
    assert_eq!(status, 201, "{asked}");
    let id = asked["id"].as_str().unwrap().to_owned();
    assert_eq!(asked["methods"], json!(["GET"]));
    assert_eq!(asked["paths"], json!(["/api/v1/*", "/docs/**"]), "kept sorted");
    // The same ask in another order is the pending one, not a second row.
    let mut again = get_on_docs(&f);
    again["paths"] = json!(["/api/v1/*", "/docs/**", "/docs/**"]);
    let (status, same) = f.ask(&again);
    assert_eq!((status, &same["id"]), (200, &json!(id)), "{same}");

    let (code, out, err) = cli(f.admin, "tok-alice", &["approve", &id]);
    assert_eq!(code, 0, "{out}{err}");
    let (_, shown, _) = cli(f.admin, "tok-alice", &["show", &id]);
    assert!(
        shown.contains("methods: GET") && shown.contains("paths: /api/v1/*, /docs/**"),
        "{shown}"
    );
    let (_, listed, _) = cli(f.admin, "tok-alice", &["list"]);
    assert!(listed.contains("[GET /api/v1/*,/docs/**]"), "{listed}");

    // Plain HTTP, decided per request.
    assert_eq!(f.status("GET", &f.web("/docs/a/b")), "200");
    assert_eq!(f.status("GET", &f.web("/api/v1/users")), "200");
    assert_eq!(f.status("POST", &f.web("/docs/a")), "403");
    assert_eq!(f.status("GET", &f.web("/admin")), "403");
    assert_eq!(f.status("GET", &f.web("/docs/%2e%2e/admin")), "403");
    // Inside HTTPS: intercepted because the exception names methods and paths.
    assert_eq!(f.status("GET", &f.tls("/docs/a")), "200");
    assert_eq!(f.status("HEAD", &f.tls("/docs/a")), "403", "HEAD was not granted");
    assert_eq!(f.status("DELETE", &f.tls("/docs/a")), "403");
    assert_eq!(
        f.status("GET", &f.tls("/api/v1/users/7")),
        "403",
        "`*` is one segment"
    );

    let audit = &f.i.proxy.audit_path;
    let rule = json!(format!("exception:{id}"));
    let allowed = decision(audit, "web.test", "GET", "/docs/a/b");
    assert_eq!((&allowed["decision"], &allowed["rule"]), (&json!("allow"), &rule));
    let refused = decision(audit, "web.test", "POST", "/docs/a");
    assert_eq!(refused["decision"], "deny", "{refused}");
    assert_eq!(refused["reason_code"], "request_not_allowed", "{refused}");
    assert_eq!(refused["rule"], rule, "the refusal names the exception");
    let inside = decision(audit, "tls.test", "DELETE", "/docs/a");
    assert_eq!(
        (&inside["scheme"], &inside["decision"], &inside["rule"]),
        (&json!("https"), &json!("deny"), &rule),
        "{inside}"
    );
    let inside = decision(audit, "tls.test", "GET", "/docs/a");
    assert_eq!((&inside["decision"], &inside["rule"]), (&json!("allow"), &rule));

    // Asking for what it covers returns it; asking for more files a new request.
    let mut covered = get_on_docs(&f);
    covered["paths"] = json!(["/docs/guide/**"]);
    covered["requested_hosts"] = json!(["tls.test"]);
    let (status, answer) = f.ask(&covered);
    assert_eq!(
        (status, &answer["id"], &answer["state"]),
        (200, &json!(id), &json!("approved"))
    );
    let mut more = get_on_docs(&f);
    more["methods"] = json!(["GET", "POST"]);
    let (status, filed) = f.ask(&more);
    assert_eq!((status, &filed["state"]), (201, &json!("pending")), "{filed}");
    assert_ne!(filed["id"], json!(id));
}

/// As an agent and as an approver would try to get more than the words say.
#[test]
fn what_would_widen_an_exception_below_the_host_is_refused() {
    let f = fixture();
    for (field, value, why) in [
        ("paths", json!(["/docs/%2e%2e/admin"]), "paths"),
        ("paths", json!(["docs/**"]), "starts with"),
        ("paths", json!(["/docs//x"]), "empty segment"),
        ("methods", json!(["get"]), "uppercase"),
        ("methods", json!([]), "empty"),
    ] {
        let mut body = get_on_docs(&f);
        body[field] = value;
        let (status, answer) = f.ask(&body);
        assert_eq!(status, 422, "{field}: {answer}");
        assert!(answer.to_string().contains(why), "{field}: {answer} lacks {why}");
    }
    let mut both = get_on_docs(&f);
    both["read_only"] = json!(true);
    let (status, answer) = f.ask(&both);
    assert_eq!(status, 422, "read_only with methods: {answer}");

    let mut writes = get_on_docs(&f);
    writes["methods"] = json!(["POST"]);
    let (status, asked) = f.ask(&writes);
    assert_eq!(status, 201, "{asked}");
    let id = asked["id"].as_str().unwrap().to_owned();
    // The requester cannot approve it, narrowed or not.
    let (code, _, _) = cli(f.admin, "tok-agent", &["approve", &id, "--method", "POST"]);
    assert_ne!(code, 0);
    // An approval that adds a method, widens a path, or reads read-only into a request for
    // POST (which would grant GET) is refused, and the request stays pending.
    for narrowing in [
        vec!["--method", "POST", "--method", "PUT"],
        vec!["--path", "/**"],
        vec!["--path", "/docs/**", "--path", "/admin"],
        vec!["--read-only"],
    ] {
        let mut args = vec!["approve", id.as_str()];
        args.extend(&narrowing);
        let (code, out, err) = cli(f.admin, "tok-alice", &args);
        assert_ne!(code, 0, "{narrowing:?}: {out}");
        assert!(
            err.contains("not within") || err.contains("narrow"),
            "{narrowing:?}: {err}"
        );
    }
    let (_, shown, _) = cli(f.admin, "tok-alice", &["show", &id]);
    assert!(shown.contains("state: pending"), "{shown}");
    // A narrowing within the request is taken.
    let (code, out, err) = cli(
        f.admin,
        "tok-alice",
        &["approve", &id, "--path", "/docs/drafts/*"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(f.status("POST", &f.web("/docs/drafts/1")), "200");
    assert_eq!(f.status("POST", &f.web("/docs/other/1")), "403");
    assert_eq!(
        f.status("GET", &f.web("/docs/drafts/1")),
        "403",
        "only POST was asked"
    );
    let approval = |e: &Value| e["event"] == "exception_approved" && e["exception_id"] == json!(id);
    let events = events_once(&f.i.proxy.audit_path, approval);
    let approved = events
        .iter()
        .find(|e| approval(e))
        .unwrap_or_else(|| panic!("no approval on record: {events:#?}"));
    assert_eq!(
        (&approved["methods"], &approved["paths"]),
        (&json!(["POST"]), &json!(["/docs/drafts/*"])),
        "what was granted below the hosts is on record: {approved}"
    );
}
