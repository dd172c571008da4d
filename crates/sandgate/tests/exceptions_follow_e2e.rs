//! A proxy that follows a control plane it does not host (`--exceptions-from`), end to end
//! with two real proxies: the control plane (SQLite, the admin API) and a node that only
//! follows it. An approval there passes here within a second; a revocation there cuts a live
//! tunnel here within a second; while the control plane cannot be reached the node keeps
//! what it knows until it expires, takes nothing new, and `/readyz` says so; it catches up
//! by itself. As attackers: the follower's token cannot request, approve or revoke; an
//! exception outside the node's own bounds changes nothing there; a plain-HTTP feed on
//! another host is refused at start.
//!
//! The node reaches the control plane through a relay the test owns (its port held for the
//! whole test), so "unreachable" is the relay cutting and refusing connections, with the
//! control plane itself still up and approving.

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
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::control::{api, get_status, start_with, within};
use common::{ProxyProcess, runtime};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use sandgate_testkit::origin::Origin;
use tokio::net::TcpListener;

/// The control plane's policy: task t-1 on a listener, exceptions for t-1 on `ports`, and
/// four tokens: a requester, an approver, a follower and a viewer.
fn control_policy(dir: &Path, ports: &[u16]) -> std::path::PathBuf {
    let hash = sandgate_policy::auth::secret_hash;
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let text = format!(
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: control }}\nspec:\n\
         \x20 listeners:\n    - {{ listen: \"127.0.0.1:0\", task: t-1, project: p-1 }}\n\
         \x20 exceptions:\n    - {{ scope: {{ task: t-1 }}, ports: [ {ports} ], max_ttl_seconds: 600 }}\n\
         \x20   - {{ scope: {{ task: t-9 }}, ports: [ {ports} ], max_ttl_seconds: 600 }}\n\
         \x20 admin:\n    listen: \"127.0.0.1:0\"\n    tokens:\n\
         \x20     - {{ name: agent-7, role: requester, secret_sha256: {a}, tasks: [ t-1, t-9 ] }}\n\
         \x20     - {{ name: alice, role: approver, secret_sha256: {b} }}\n\
         \x20     - {{ name: node-1, role: follower, secret_sha256: {f} }}\n",
        ports = ports.join(", "),
        a = hash("tok-agent"),
        b = hash("tok-alice"),
        f = hash("tok-follow"),
    );
    let path = dir.join("control.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The node's policy: the same task on a listener, and its own bounds: exceptions for t-1
/// on `ports` only. No admin tokens: it hosts no control plane.
fn node_policy(dir: &Path, ports: &[u16]) -> std::path::PathBuf {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let text = format!(
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: node }}\nspec:\n\
         \x20 listeners:\n    - {{ listen: \"127.0.0.1:0\", task: t-1, project: p-1 }}\n\
         \x20 exceptions:\n    - {{ scope: {{ task: t-1 }}, ports: [ {ports} ], max_ttl_seconds: 600 }}\n\
         \x20 admin:\n    listen: \"127.0.0.1:0\"\n",
        ports = ports.join(", "),
    );
    let path = dir.join("node.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A TCP relay the test owns: forwards to `to` while up; while down it cuts what it carries
/// and closes every new connection at once.
struct Relay {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    generation: tokio::sync::watch::Sender<u64>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let (accept_up, cuts) = (up.clone(), generation.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if !accept_up.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(to).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Relay { addr, up, generation }
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
        if !up {
            self.generation.send_modify(|g| *g += 1);
        }
    }
}

fn approve(admin: SocketAddr, task: &str, hosts: &[&str], ports: &[u16], ttl: u32) -> String {
    let hosts: Vec<String> = hosts.iter().map(|h| format!("{h:?}")).collect();
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let ask = format!(
        r#"{{"task_id":"{task}","requested_hosts":[{}],"requested_ports":[{}],"ttl_seconds":{ttl},"reason":"follow test"}}"#,
        hosts.join(","),
        ports.join(",")
    );
    let (status, ex) = api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(&ask));
    assert!(status == 201 || status == 200, "{status} {ex}");
    let id = ex["id"].as_str().unwrap().to_owned();
    let (status, ex) = api(
        admin,
        "POST",
        &format!("/v1/exceptions/{id}/approve"),
        Some("tok-alice"),
        None,
    );
    assert_eq!((status, ex["state"].as_str()), (200, Some("approved")), "{ex}");
    id
}

fn ready(admin: SocketAddr) -> u16 {
    common::control::admin_get(admin, "/readyz").0
}

#[test]
fn a_node_follows_a_control_plane_it_does_not_host() {
    let rt = runtime();
    let _guard = rt.enter();
    let origin = rt.block_on(Origin::http());
    let other = rt.block_on(Origin::http());
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("web.test", &["127.0.0.1"])
            .with("late.test", &["127.0.0.1"])
            .with("short.test", &["127.0.0.1"])
            .with("echo.test", &["127.0.0.1"]),
    ));
    let dir = tempfile::tempdir().unwrap();
    let (web, echo_port, wide) = (origin.port(), echo.addr().port(), other.port());
    // The control plane allows one port more than the node's bounds do.
    let control = start_with(
        &dns,
        &control_policy(dir.path(), &[web, echo_port, wide]),
        &["--state-dir", dir.path().join("state").to_str().unwrap()],
    );
    let (control_admin, control_listener) = (control.admin(), control.listener(&["task=t-1"]));
    let relay = rt.block_on(Relay::start(control_admin));
    let token = dir.path().join("follow.token");
    std::fs::write(&token, "tok-follow\n").unwrap();
    let node = start_with(
        &dns,
        &node_policy(dir.path(), &[web, echo_port]),
        &[
            "--exceptions-from",
            &format!("http://{}", relay.addr),
            "--exceptions-token-file",
            token.to_str().unwrap(),
            "--exceptions-resync",
            "2",
        ],
    );
    let (node_admin, node_listener) = (node.admin(), node.listener(&["task=t-1"]));
    let url = format!("http://web.test:{web}/");
    assert_eq!(get_status(node_listener, &url), "403", "nothing approved yet");
    assert_eq!(ready(node_admin), 200, "{}", node.log_text());

    // Approved on the control plane: the node passes within a second.
    let id = approve(
        control_admin,
        "t-1",
        &["web.test", "echo.test"],
        &[web, echo_port],
        300,
    );
    let approved = Instant::now();
    assert!(
        within(1, || get_status(node_listener, &url) == "200"),
        "the node did not apply the approval within a second:\n{}",
        node.log_text()
    );
    assert!(approved.elapsed() < Duration::from_secs(2));

    // A live tunnel through the node; revoked on the control plane, it is cut within a second.
    let target = format!("echo.test:{echo_port}");
    let mut tunnel = TcpStream::connect(node_listener).unwrap();
    tunnel.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tunnel
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = [0u8; 39];
    tunnel.read_exact(&mut head).unwrap();
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    tunnel.write_all(b"ping").unwrap();
    let mut pong = [0u8; 4];
    tunnel.read_exact(&mut pong).unwrap();
    let (status, _) = api(
        control_admin,
        "POST",
        &format!("/v1/exceptions/{id}/revoke"),
        Some("tok-alice"),
        Some(r#"{"note":"done"}"#),
    );
    assert_eq!(status, 200);
    let revoked = Instant::now();
    let mut rest = Vec::new();
    let _ = tunnel.read_to_end(&mut rest);
    assert!(
        revoked.elapsed() < Duration::from_secs(1),
        "the node's tunnel outlived the revocation by {:?}",
        revoked.elapsed()
    );
    assert_eq!(get_status(node_listener, &url), "403", "revoked");
    assert!(
        within(5, || common::read_audit(&node.audit_path).iter().any(
            |e| e["event"] == "close" && e["outcome"] == "revoked" && e["destination_host"] == "echo.test"
        )),
        "no close of the tunnel as revoked on the node: {:#?}",
        common::read_audit(&node.audit_path)
    );

    // Attackers, on the control plane: the follower's token reads and does nothing else.
    let ask = format!(
        r#"{{"task_id":"t-1","requested_hosts":["web.test"],"requested_ports":[{web}],"ttl_seconds":60,"reason":"sneak"}}"#
    );
    assert_eq!(
        api(
            control_admin,
            "POST",
            "/v1/exceptions",
            Some("tok-follow"),
            Some(&ask)
        )
        .0,
        403
    );
    let pending = api(
        control_admin,
        "POST",
        "/v1/exceptions",
        Some("tok-agent"),
        Some(&ask),
    )
    .1;
    let pending = pending["id"].as_str().unwrap().to_owned();
    for action in ["approve", "deny", "revoke"] {
        let path = format!("/v1/exceptions/{pending}/{action}");
        assert_eq!(
            api(control_admin, "POST", &path, Some("tok-follow"), None).0,
            403,
            "{action}"
        );
    }
    assert_eq!(
        api(control_admin, "GET", "/v1/exceptions", Some("tok-follow"), None).0,
        200
    );
    let (status, approved) = api(
        control_admin,
        "GET",
        "/v1/exceptions?state=approved",
        Some("tok-follow"),
        None,
    );
    assert_eq!(status, 200);
    assert!(
        approved
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["state"] == "approved"),
        "{approved}"
    );
    // An exception with methods and paths reaches a follower only when it says it reads
    // them (`below=1`, as this version's do): one from before them would read it as the
    // whole host.
    let limited = format!(
        r#"{{"task_id":"t-1","requested_hosts":["ro.test"],"requested_ports":[{web}],"ttl_seconds":60,"reason":"read","read_only":true}}"#
    );
    let (_, filed) = api(
        control_admin,
        "POST",
        "/v1/exceptions",
        Some("tok-agent"),
        Some(&limited),
    );
    let limited = filed["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/exceptions/{limited}/approve");
    assert_eq!(api(control_admin, "POST", &path, Some("tok-alice"), None).0, 200);
    let listed = |query: &str| {
        let (_, all) = api(
            control_admin,
            "GET",
            &format!("/v1/exceptions{query}"),
            Some("tok-follow"),
            None,
        );
        all.as_array()
            .unwrap()
            .iter()
            .any(|e| e["id"] == limited.as_str())
    };
    assert!(!listed("?state=approved"), "an older follower's query got it");
    assert!(listed("?state=approved&below=1"));
    for bad in ["?state=bogus", "?task=t-1", "?state=approved&x=1", "?below=2"] {
        let path = format!("/v1/exceptions{bad}");
        assert_eq!(
            api(control_admin, "GET", &path, Some("tok-follow"), None).0,
            400,
            "{bad}"
        );
    }

    // An exception outside the node's bounds (a port it does not allow; a task it does not
    // serve) passes on the control plane and changes nothing on the node.
    let wide_url = format!("http://web.test:{wide}/");
    approve(control_admin, "t-1", &["web.test"], &[wide], 300);
    assert!(within(2, || get_status(control_listener, &wide_url) == "200"));
    approve(control_admin, "t-9", &["web.test"], &[web], 300);
    // A later approval in bounds proves the node read everything before it.
    approve(control_admin, "t-1", &["late.test"], &[web], 300);
    assert!(within(1, || get_status(
        node_listener,
        &format!("http://late.test:{web}/")
    ) == "200"));
    assert_eq!(
        get_status(node_listener, &wide_url),
        "403",
        "out of the node's bounds"
    );
    assert_eq!(get_status(node_listener, &url), "403", "another task's exception");

    // The control plane unreachable: what the node knows stays until it expires, and
    // nothing new arrives; /readyz says so. An exception of 3 s shows the expiry.
    let short = approve(control_admin, "t-1", &["short.test"], &[web], 3);
    let short_url = format!("http://short.test:{web}/");
    assert!(within(1, || get_status(node_listener, &short_url) == "200"));
    let short_ends = Instant::now() + Duration::from_secs(3);
    relay.set_up(false);
    assert!(
        within(3, || ready(node_admin) == 503),
        "/readyz did not say the control plane is unreachable:\n{}",
        node.log_text()
    );
    let (_, why) = common::control::admin_get(node_admin, "/readyz");
    assert!(why.contains("control plane"), "{why}");
    assert_eq!(
        common::metric(node_admin, "sandgate_state_store_unavailable"),
        1.0
    );
    assert_eq!(
        get_status(node_listener, &format!("http://late.test:{web}/")),
        "200",
        "a known exception stays while the control plane is away"
    );
    let unseen = approve(control_admin, "t-1", &["web.test"], &[web], 300);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        get_status(node_listener, &url),
        "403",
        "an approval reached a node that cannot read"
    );
    while Instant::now() < short_ends + Duration::from_millis(1100) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        get_status(node_listener, &short_url),
        "403",
        "a known exception outlived its expiry"
    );

    // Back: the node catches up by itself.
    relay.set_up(true);
    assert!(
        within(5, || get_status(node_listener, &url) == "200"),
        "the node did not catch up with {unseen}:\n{}",
        node.log_text()
    );
    assert!(within(2, || ready(node_admin) == 200));
    let _ = short;
    drop(node);
    drop(control);
}

#[test]
fn a_follower_refuses_to_start_on_a_feed_it_cannot_trust_or_read() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let node = node_policy(dir.path(), &[80]);
    let token = dir.path().join("follow.token");
    std::fs::write(&token, "tok-follow\n").unwrap();
    let start = |from: &str, policy: &Path| {
        let out = std::process::Command::new(common::sandgate_bin())
            .args([
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--dns-server",
                &dns.addr().to_string(),
            ])
            .args(["--policy", policy.to_str().unwrap()])
            .args([
                "--exceptions-from",
                from,
                "--exceptions-token-file",
                token.to_str().unwrap(),
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Plain HTTP to another host: refused before anything is sent.
    let (code, err) = start("http://192.0.2.1:9090", &node);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("plain HTTP"), "{err}");
    // https:// with no CA to verify it against: refused.
    let (code, err) = start("https://192.0.2.1:9443", &node);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("CA"), "{err}");
    // A host name would need the system resolver: refused too.
    let (code, err) = start("http://control.example:9090", &node);
    assert_eq!(code, Some(64), "{err}");
    // A policy with no bounds of its own: nothing could ever apply.
    let bare = dir.path().join("bare.yaml");
    std::fs::write(
        &bare,
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: bare }\nspec: {}\n",
    )
    .unwrap();
    let (code, err) = start("http://127.0.0.1:9", &bare);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("spec.exceptions"), "{err}");
    // A token the control plane refuses: said at start, with what to fix.
    let control = start_with(
        &dns,
        &control_policy(dir.path(), &[80]),
        &["--state-dir", dir.path().join("state").to_str().unwrap()],
    );
    std::fs::write(&token, "tok-wrong\n").unwrap();
    let (code, err) = start(&format!("http://{}", control.admin()), &node);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("401") && err.contains("follower"), "{err}");
    let _: Option<ProxyProcess> = None;
}

/// A control plane on another host is followed over TLS: its admin listener serves a
/// certificate, and the follower trusts only the CA it is given. An approval reaches the
/// follower within a second. As an attacker: a follower given another CA (a listener it
/// cannot verify, as a man in the middle would present) applies nothing and says so.
#[test]
fn a_control_plane_is_followed_over_tls_verified_against_its_ca() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let web = origin.port();
    let ca = sandgate_testkit::tls::TestCa::new(&["127.0.0.1"]);
    let other = sandgate_testkit::tls::TestCa::new(&["127.0.0.1"]);
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (cert, key) = (
        write("admin.pem", &ca.leaf_pem),
        write("admin.key", &ca.leaf_key_pem),
    );
    let (ca_file, other_ca) = (write("ca.pem", &ca.ca_pem), write("other.pem", &other.ca_pem));
    let token = write("follow.token", "tok-follow\n");
    let control = start_with(
        &dns,
        &control_policy(dir.path(), &[web]),
        &[
            "--state-dir",
            dir.path().join("state").to_str().unwrap(),
            "--admin-tls-cert",
            &cert,
            "--admin-tls-key",
            &key,
        ],
    );
    let admin = control.admin();
    let from = format!("https://{admin}");
    let follower = |ca: &str| {
        start_with(
            &dns,
            &node_policy(dir.path(), &[web]),
            &[
                "--exceptions-from",
                &from,
                "--exceptions-token-file",
                &token,
                "--exceptions-ca",
                ca,
            ],
        )
    };
    let trusted = follower(&ca_file);
    let fooled = follower(&other_ca);
    let url = format!("http://web.test:{web}/");
    let https_api = |method: &str, path: &str, token: &str| {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert", &ca_file, "-X", method])
            .args(["-H", &format!("Authorization: Bearer {token}"), "-H", "Content-Type: application/json"])
            .args(["-o", "-", "-w", "\n%{http_code}"])
            .args(if method == "POST" && path == "/v1/exceptions" {
                vec!["--data".to_owned(), format!(r#"{{"task_id":"t-1","requested_hosts":["web.test"],"requested_ports":[{web}],"ttl_seconds":300,"reason":"tls"}}"#)]
            } else {
                Vec::new()
            })
            .arg(format!("https://{admin}{path}"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (
            status.to_owned(),
            serde_json::from_str::<serde_json::Value>(body).unwrap_or_default(),
        )
    };
    // The admin listener speaks TLS only.
    assert_eq!(
        common::control::admin_get(admin, "/healthz").0,
        0,
        "plain HTTP answered on a TLS listener"
    );
    let (status, ex) = https_api("POST", "/v1/exceptions", "tok-agent");
    assert_eq!(status, "201", "{ex}");
    let id = ex["id"].as_str().unwrap().to_owned();
    let (status, ex) = https_api("POST", &format!("/v1/exceptions/{id}/approve"), "tok-alice");
    assert_eq!(status, "200", "{ex}");
    let trusted_listener = trusted.listener(&["task=t-1"]);
    assert!(
        within(1, || get_status(trusted_listener, &url) == "200"),
        "the TLS follower did not apply the approval:\n{}",
        trusted.log_text()
    );
    assert_eq!(ready(trusted.admin()), 200);
    // The follower that cannot verify the listener reads nothing, applies nothing, says so.
    let fooled_listener = fooled.listener(&["task=t-1"]);
    assert_eq!(get_status(fooled_listener, &url), "403");
    assert_eq!(ready(fooled.admin()), 503, "{}", fooled.log_text());
    assert!(
        fooled.log_text().contains("cannot read the control plane"),
        "{}",
        fooled.log_text()
    );
}
