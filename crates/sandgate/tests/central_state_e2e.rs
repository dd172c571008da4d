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
mod sandbox_support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use central::{Pki, node};
use common::control::{api, get_status, within};
use common::{ProxyProcess, read_audit};
use sandgate_testkit::dns::Zone;
use sandgate_testkit::pg::{PgCluster, TestDb, shared_host};

/// A central's policy: a node listener for node-a (project p-1), exceptions for task t-1 on
/// `ports`, an admin listener with a requester and an approver; nothing allowlisted. Both
/// listeners on port 0.
fn central_policy(pki: &Pki, ports: &[u16]) -> std::path::PathBuf {
    let hash = |s: &str| sandgate_policy::auth::secret_hash(s);
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let text = format!(
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: central }}\nspec:\n\
         \x20 listeners:\n    - listen: 127.0.0.1:0\n      role: node\n      tls: {{ cert: central-127.0.0.1.pem, key: central-127.0.0.1.key, client_ca: ca.pem }}\n\
         \x20 nodes:\n    - {{ name: node-a, projects: [ p-1 ], tasks: [ t-1 ] }}\n\
         \x20 exceptions:\n    - {{ scope: {{ task: t-1 }}, ports: [ {ports} ], max_ttl_seconds: 600 }}\n\
         \x20 admin:\n    listen: 127.0.0.1:0\n    tokens:\n\
         \x20     - {{ name: agent-7, role: requester, secret_sha256: {a}, tasks: [ t-1 ] }}\n\
         \x20     - {{ name: alice, role: approver, secret_sha256: {b} }}\n",
        ports = ports.join(", "),
        a = hash("tok-agent"),
        b = hash("tok-alice"),
    );
    let path = pki.path(&format!("central-{}.yaml", central::unique_suffix()));
    std::fs::write(&path, text).unwrap();
    path
}

struct Central {
    p: ProxyProcess,
    node_addr: SocketAddr,
    admin: SocketAddr,
}

fn start_central(pki: &Pki, dns: SocketAddr, db: &str, ports: &[u16]) -> Central {
    start_central_with(central_policy(pki, ports), dns, db)
}

fn start_central_with(policy: std::path::PathBuf, dns: SocketAddr, db: &str) -> Central {
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
    let (node_addr, admin) = (p.listener(&["role=node"]), p.admin());
    Central { p, node_addr, admin }
}

fn request(admin: SocketAddr, host: &str, port: u16) -> String {
    request_as(admin, "tok-agent", "t-1", host, port)
}

fn request_as(admin: SocketAddr, token: &str, task: &str, host: &str, port: u16) -> String {
    let (status, ex) = try_request(admin, token, task, host, port);
    assert_eq!(status, 201, "{ex}");
    ex["id"].as_str().unwrap().to_owned()
}

fn try_request(
    admin: SocketAddr,
    token: &str,
    task: &str,
    host: &str,
    port: u16,
) -> (u16, serde_json::Value) {
    let body = format!(
        r#"{{"task_id":"{task}","requested_hosts":["{host}"],"requested_ports":[{port}],"ttl_seconds":300,"reason":"build"}}"#
    );
    api(admin, "POST", "/v1/exceptions", Some(token), Some(&body))
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

/// The first audit event at `path` that `pred` holds for, waiting for it (bounded).
fn recorded(
    path: &std::path::Path,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let found = central::events_where(path, 1, pred);
    found
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("{what}: {:#?}", read_audit(path)))
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
    let d = recorded(&a.p.audit_path, "a deny at A", |e| e["decision"] == "deny");
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
    let e = recorded(&b.p.audit_path, "an allow at B", |e| e["decision"] == "allow");
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
    // Not web.test: its active exception would answer the request (200), filing nothing.
    let body = format!(
        r#"{{"task_id":"t-1","requested_hosts":["more.test"],"requested_ports":[{}],"ttl_seconds":60,"reason":"r"}}"#,
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

/// A central's policy for a node's sandboxed runs: node-a vouches for its own runs
/// (`node-a:*`), exceptions are enabled for them on `port`, one requester may ask for
/// node-a's runs and another for node-b's only.
fn runs_policy(pki: &Pki, port: u16) -> std::path::PathBuf {
    let hash = |s: &str| sandgate_policy::auth::secret_hash(s);
    let text = format!(
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: central }}\nspec:\n\
         \x20 listeners:\n    - listen: 127.0.0.1:0\n      role: node\n      tls: {{ cert: central-127.0.0.1.pem, key: central-127.0.0.1.key, client_ca: ca.pem }}\n\
         \x20 nodes:\n    - {{ name: node-a, tasks: [ \"node-a:*\" ] }}\n    - {{ name: node-b, projects: [ team-b ], tasks: [ \"node-b:*\" ] }}\n\
         \x20 exceptions:\n    - {{ scope: {{ task: \"node-a:*\" }}, ports: [ {port} ], max_ttl_seconds: 600 }}\n\
         \x20 admin:\n    listen: 127.0.0.1:0\n    tokens:\n\
         \x20     - {{ name: platform-a, role: requester, secret_sha256: {a}, tasks: [ \"node-a:*\" ] }}\n\
         \x20     - {{ name: platform-b, role: requester, secret_sha256: {o}, tasks: [ \"node-b:*\" ] }}\n\
         \x20     - {{ name: alice, role: approver, secret_sha256: {b} }}\n",
        a = hash("tok-platform-a"),
        o = hash("tok-platform-b"),
        b = hash("tok-alice"),
    );
    let path = pki.path(&format!("central-runs-{}.yaml", central::unique_suffix()));
    std::fs::write(&path, text).unwrap();
    path
}

/// `sandgate run` in `proxy` mode as a node of two centrals sharing PostgreSQL: the run's
/// fresh task (`node-a:run-...`) is refused at central B, an exception for exactly that task
/// is asked for and approved through central A, and the same run's next request passes
/// through B under that exception. As the attacker: the requester of another node's runs
/// can neither ask for this run nor see its exception, another node claiming this run's
/// task with a project of its own is refused (it got the exception's 200 before the fix),
/// and the exception does not reach past this run's task.
#[test]
fn an_exception_for_a_sandboxed_runs_task_approved_on_one_central_lets_it_through_the_other() {
    let w = common::world::World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(Zone::new().with("web.test", &["127.0.0.1"]));
    let db = TestDb::create(&shared_host());
    let pki = Pki::new();
    let a = start_central_with(runs_policy(&pki, port), dns.addr(), &db.url());
    let b = start_central_with(runs_policy(&pki, port), dns.addr(), &db.url());
    let cert = pki.node("node-a", &[]);

    // The run asks B first; it waits (at most 20 s) for the test's go before asking again.
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    std::fs::create_dir(&gate).unwrap();
    let allow = format!("web.test:{port}");
    let policy = sandbox_support::write_policy(
        dir.path(),
        &central::run_net(&[&allow], &[b.node_addr, a.node_addr], &cert),
    );
    let policy_text = std::fs::read_to_string(&policy).unwrap();
    let gate_path = gate.display().to_string();
    let with_gate = policy_text.replace(
        "read_paths: [ /usr,",
        &format!("read_paths: [ {gate_path}, /usr,"),
    );
    assert_ne!(
        with_gate, policy_text,
        "the gate directory is not bound into the sandbox"
    );
    std::fs::write(&policy, with_gate).unwrap();
    let web = format!("http://web.test:{port}/");
    let script = format!(
        "curl -sS -o /dev/null -w '%{{http_code}} ' {web}; i=0; \
         while [ ! -e {gate_path}/go ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done; \
         j=0; while [ $j -lt 25 ]; do c=$(curl -sS -o /dev/null -w '%{{http_code}}' {web}); \
         [ \"$c\" = 200 ] && break; sleep 0.2; j=$((j+1)); done; echo $c"
    );
    let run = std::process::Command::new(common::sandgate_bin())
        .args(["run", "--policy"])
        .arg(&policy)
        .args(["--", "sh", "-c", &script])
        .env("XDG_STATE_HOME", sandbox_support::state_home())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    // The run's first request, refused at B under the run's own task.
    let mut task = String::new();
    assert!(
        within(20, || {
            let denied = read_audit(&b.p.audit_path);
            let found = denied.iter().find(|e| {
                e["decision"] == "deny"
                    && e["task_id"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("node-a:run-"))
            });
            if let Some(e) = found {
                task = e["task_id"].as_str().unwrap().to_owned();
            }
            found.is_some()
        }),
        "no deny for the run at B: {:#?}",
        read_audit(&b.p.audit_path)
    );

    // Another node's requester may not ask for this run; this run's may, through A.
    let (status, body) = try_request(a.admin, "tok-platform-b", &task, "web.test", port);
    assert_eq!(status, 403, "{body}");
    let id = request_as(a.admin, "tok-platform-a", &task, "web.test", port);
    assert_eq!(decide(a.admin, &id, "approve"), 200);
    std::fs::write(gate.join("go"), b"").unwrap();

    let out = run.wait_with_output().unwrap();
    let (stdout, stderr) = sandbox_support::text(&out);
    assert_eq!(stdout.trim(), "403 200", "{stderr}");
    let e = recorded(&b.p.audit_path, "an allow at B", |e| e["decision"] == "allow");
    assert_eq!(
        (e["task_id"].as_str(), e["node"].as_str(), e["rule"].as_str()),
        (
            Some(task.as_str()),
            Some("node-a"),
            Some(format!("exception:{id}").as_str())
        ),
        "{e}"
    );

    // Another node's requester does not see it.
    let (status, listed) = api(a.admin, "GET", "/v1/exceptions", Some("tok-platform-b"), None);
    assert_eq!(status, 200);
    assert!(!listed.to_string().contains(&id), "{listed}");

    // Another node, trusted with a project of its own, claims this run's task with that
    // project: refused, on record (a project once let a node name any task, and with it
    // this exception).
    let cert_b = pki.node("node-b", &[]);
    let forger = node(
        &cert_b,
        &[b.node_addr],
        &[allow.as_str()],
        Some((task.as_str(), "team-b")),
    );
    assert_eq!(get_status(forger.addr, &web), "403");
    assert!(within(3, || read_audit(&b.p.audit_path).iter().any(
        |e| e["node"] == "node-b" && e["decision"] == "deny" && e["reason_code"] == "node_not_vouched"
    )));

    // The exception is this run's: a run started now is another task, refused.
    let again = sandbox_support::run(
        &policy,
        &[],
        &["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", &web],
    );
    assert_eq!(sandbox_support::text(&again).0, "403");
    let other = recorded(&b.p.audit_path, "the new run's request at B", |e| {
        e["event"] == "decision" && e["node"] == "node-a" && e["task_id"].as_str() != Some(task.as_str())
    });
    assert_eq!(other["decision"], "deny", "{other}");
}
