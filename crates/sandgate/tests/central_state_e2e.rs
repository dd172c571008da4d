//! Issue 13's scenario end to end: two central proxies sharing their exceptions in real
//! PostgreSQL, a node-local proxy forwarding to both over mutual TLS and HTTP/2, curl as the
//! client. Denied and allowed requests are on record at the central under the node's task
//! and name; an exception approved through central A applies through central B within a
//! second; revoking it through B ends the tunnel A carries; with A killed the node fails
//! over to B; with PostgreSQL stopped B decides on what it knew and answers approvals 503,
//! and resumes when it returns.

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

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use central::{Pki, node};
use common::control::{api, get_status, within};
use common::world::free_addr;
use common::{ProxyProcess, read_audit};
use sandgate_testkit::dns::Zone;
use sandgate_testkit::pg::{PgCluster, TestDb};

/// A central's policy: a node listener for node-a (project p-1), exceptions for task t-1 on
/// `ports`, an admin listener with a requester and an approver; nothing allowlisted.
fn central_policy(pki: &Pki, admin: SocketAddr, ports: &[u16]) -> std::path::PathBuf {
    let hash = |s: &str| sandgate_policy::auth::secret_hash(s);
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let text = format!(
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: central }}\nspec:\n\
         \x20 listeners:\n    - listen: 127.0.0.1:0\n      role: node\n      tls: {{ cert: central-127.0.0.1.pem, key: central-127.0.0.1.key, client_ca: ca.pem }}\n\
         \x20 nodes:\n    - {{ name: node-a, projects: [ p-1 ] }}\n\
         \x20 exceptions:\n    - {{ scope: {{ task: t-1 }}, ports: [ {ports} ], max_ttl_seconds: 600 }}\n\
         \x20 admin:\n    listen: \"{admin}\"\n    tokens:\n\
         \x20     - {{ name: agent-7, role: requester, secret_sha256: {a}, tasks: [ t-1 ] }}\n\
         \x20     - {{ name: alice, role: approver, secret_sha256: {b} }}\n",
        ports = ports.join(", "),
        a = hash("tok-agent"),
        b = hash("tok-alice"),
    );
    let path = pki.path(&format!("central-{}.yaml", admin.port()));
    std::fs::write(&path, text).unwrap();
    path
}

struct Central {
    p: ProxyProcess,
    node_addr: SocketAddr,
    admin: SocketAddr,
}

fn start_central(pki: &Pki, dns: SocketAddr, db: &str, ports: &[u16]) -> Central {
    let admin = free_addr();
    let policy = central_policy(pki, admin, ports);
    let dns = dns.to_string();
    let p = ProxyProcess::start(&[
        "--policy",
        policy.to_str().unwrap(),
        "--dns-server",
        &dns,
        "--allow-range",
        "127.0.0.0/8",
        "--state",
        db,
    ]);
    let node_addr = central::listener_with_role(&p, "node");
    Central { p, node_addr, admin }
}

fn request(admin: SocketAddr, host: &str, port: u16) -> String {
    let body = format!(
        r#"{{"task_id":"t-1","requested_hosts":["{host}"],"requested_ports":[{port}],"ttl_seconds":300,"reason":"build"}}"#
    );
    let (status, ex) = api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(&body));
    assert_eq!(status, 201, "{ex}");
    ex["id"].as_str().unwrap().to_owned()
}

fn decide(admin: SocketAddr, id: &str, action: &str) -> u16 {
    api(
        admin,
        "POST",
        &format!("/v1/exceptions/{id}/{action}"),
        Some("tok-alice"),
        None,
    )
    .0
}

#[test]
fn two_centrals_on_one_database_serve_a_node_as_one() {
    let w = common::world::World::new();
    let origin = w.origin();
    let echo = w.echo();
    let dns = w.dns(
        Zone::new()
            .with("web.test", &["127.0.0.1"])
            .with("echo.test", &["127.0.0.1"]),
    );
    // A cluster of this test's own: it is stopped and started below.
    let cluster = PgCluster::private();
    let db = TestDb::create(&cluster.host());
    let pki = Pki::new();
    let ports = [origin.port(), echo.addr().port()];
    let mut a = start_central(&pki, dns.addr(), &db.url(), &ports);
    let b = start_central(&pki, dns.addr(), &db.url(), &ports);
    let cert = pki.node("node-a", &[]);
    let allow = [
        format!("web.test:{}", origin.port()),
        format!("echo.test:{}", echo.addr().port()),
    ];
    let refs: Vec<&str> = allow.iter().map(String::as_str).collect();
    // The node prefers A; a second node uses only B, to see what B decides.
    let n = node(&cert, &[a.node_addr, b.node_addr], &refs, Some(("t-1", "p-1")));
    let via_b = node(&cert, &[b.node_addr], &refs, Some(("t-1", "p-1")));
    let web = format!("http://web.test:{}/", origin.port());

    // Denied at the central, on record under the node's task and name.
    assert_eq!(get_status(n.addr, &web), "403");
    let denied = read_audit(&a.p.audit_path);
    let d = denied
        .iter()
        .find(|e| e["decision"] == "deny")
        .expect("a deny at A");
    assert_eq!(
        (d["task_id"].as_str(), d["node"].as_str()),
        (Some("t-1"), Some("node-a")),
        "{d}"
    );

    // Approved through A, it applies through B within a second.
    let id = request(a.admin, "web.test", origin.port());
    assert_eq!(get_status(via_b.addr, &web), "403");
    assert_eq!(decide(a.admin, &id, "approve"), 200);
    let approved = Instant::now();
    assert!(within(2, || get_status(via_b.addr, &web) == "200"));
    assert!(
        approved.elapsed() < Duration::from_millis(1500),
        "{:?}",
        approved.elapsed()
    );
    assert_eq!(get_status(n.addr, &web), "200");
    let allowed = read_audit(&b.p.audit_path);
    let e = allowed
        .iter()
        .find(|e| e["decision"] == "allow")
        .expect("an allow at B");
    assert_eq!(
        (e["task_id"].as_str(), e["node"].as_str()),
        (Some("t-1"), Some("node-a"))
    );
    assert!(e["rule"].as_str().unwrap_or("").starts_with("exception:"), "{e}");

    // A tunnel carried by A under another exception; revoked through B, it ends.
    let echo_id = request(a.admin, "echo.test", echo.addr().port());
    assert_eq!(decide(a.admin, &echo_id, "approve"), 200);
    let target = format!("echo.test:{}", echo.addr().port());
    let mut tunnel = None;
    // The approval reaches A's rules within a second; retry the CONNECT until it does.
    assert!(within(2, || {
        let (head, s) = central::connect(n.addr, &target);
        let ok = head.starts_with("HTTP/1.1 200");
        if ok {
            tunnel = Some(s);
        }
        ok
    }));
    let mut t = tunnel.expect("a tunnel");
    t.write_all(b"ping").unwrap();
    let mut pong = [0u8; 4];
    t.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"ping");
    let revoked = Instant::now();
    assert_eq!(decide(b.admin, &echo_id, "revoke"), 200);
    let mut rest = Vec::new();
    if let Err(e) = t.read_to_end(&mut rest) {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the tunnel A carried outlived the revocation through B: {e}"
        );
    }
    assert!(
        revoked.elapsed() < Duration::from_secs(3),
        "{:?}",
        revoked.elapsed()
    );
    assert!(
        within(3, || read_audit(&a.p.audit_path)
            .iter()
            .any(|e| e["event"] == "close"
                && e["outcome"] == "revoked"
                && e["node"] == "node-a")),
        "A records the revoked tunnel: {:#?}",
        read_audit(&a.p.audit_path)
            .iter()
            .filter(|e| e["event"] == "close")
            .collect::<Vec<_>>()
    );

    // A killed: the node fails over to B, where the approved exception holds.
    let _ = a.p.child.kill();
    let _ = a.p.child.wait();
    assert_eq!(get_status(n.addr, &web), "200");

    // PostgreSQL stopped: B decides on what it knew; approvals answer 503, and a metric
    // says so; it resumes.
    let unavailable = || common::metric(b.admin, "sandgate_state_store_unavailable");
    assert_eq!(unavailable(), 0.0);
    cluster.stop();
    assert_eq!(
        get_status(n.addr, &web),
        "200",
        "the exception last known still applies"
    );
    let body = format!(
        r#"{{"task_id":"t-1","requested_hosts":["web.test"],"requested_ports":[{}],"ttl_seconds":60,"reason":"r"}}"#,
        origin.port()
    );
    assert!(within(5, || api(
        b.admin,
        "POST",
        "/v1/exceptions",
        Some("tok-agent"),
        Some(&body)
    )
    .0 == 503));
    assert!(
        within(10, || unavailable() == 1.0),
        "the store's outage is not in /metrics"
    );
    cluster.start();
    assert!(
        within(15, || api(
            b.admin,
            "POST",
            "/v1/exceptions",
            Some("tok-agent"),
            Some(&body)
        )
        .0 == 201),
        "B resumes without a restart"
    );
    assert!(within(10, || unavailable() == 0.0));
    assert_eq!(get_status(n.addr, &web), "200");
}
