//! Certificates that change while node-local and central proxies run: rotated on disk, as a
//! Kubernetes Secret's update or cert-manager does it (a new file, then a rename over the
//! old name), with no signal (a scratch image has no `kill`, and nobody should have to
//! restart a central to rotate a CA); and reloaded on SIGHUP.

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
use std::path::Path;

use central::{EchoCentral, NodeCert, Pki, events_where};

/// Writes and reads `bytes` through an echo tunnel.
fn echoes(t: &mut std::net::TcpStream, bytes: &[u8]) {
    t.write_all(bytes).unwrap();
    let mut buf = vec![0u8; bytes.len()];
    t.read_exact(&mut buf).unwrap();
    assert_eq!(buf, bytes);
}

/// Replaces `dst` with `src`'s bytes the way a Secret volume does: written beside it, then
/// renamed over it (a new inode; the old file is never half-written).
fn swap_in(src: &Path, dst: &Path) {
    let tmp = dst.with_extension("swap");
    std::fs::copy(src, &tmp).unwrap();
    std::fs::rename(&tmp, dst).unwrap();
}

/// A copy of `cert`'s three files in a directory of their own, so that rotating the
/// originals leaves this node as it was.
fn keep(cert: &NodeCert, dir: &Path) -> NodeCert {
    let copy = |p: &Path, name: &str| {
        let to = dir.join(name);
        std::fs::copy(p, &to).unwrap();
        to
    };
    NodeCert {
        cert: copy(&cert.cert, "node.pem"),
        key: copy(&cert.key, "node.key"),
        ca: copy(&cert.ca, "ca.pem"),
    }
}

/// Turns `dir/name` into what a Secret volume holds: `name -> ..data/name`, `..data ->
/// ..v1` (a directory holding the file).
fn kubelet_layout(dir: &Path, name: &str) {
    let v1 = dir.join("..v1");
    std::fs::create_dir(&v1).unwrap();
    std::fs::rename(dir.join(name), v1.join(name)).unwrap();
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
}

/// The kubelet's update of a Secret volume: the new file in a new directory, then
/// `..data` swapped to it by one rename.
fn kubelet_update(dir: &Path, name: &str, from: &Path) {
    let v2 = dir.join("..v2");
    std::fs::create_dir(&v2).unwrap();
    std::fs::copy(from, v2.join(name)).unwrap();
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
}

/// The operator rotates the central's client CA (the old one leaked, say), as a Secret
/// update does it. Without a signal, the central reloads and sends GOAWAY on its node
/// connections: a node of the old CA that was connected can open no new tunnel (its next
/// stream needs a new handshake, which fails), one that connects afterwards gets nothing,
/// both on record; a node of the new CA is served, and a tunnel already open carries on.
/// Then a broken file (a key that is not the certificate's) leaves the configuration in
/// force. On the code before, the central kept trusting the old CA until a SIGHUP or a
/// restart, and a connected node kept opening streams even after one.
#[test]
fn a_rotated_client_ca_is_in_force_without_a_signal() {
    let pki = Pki::new();
    kubelet_layout(pki.dir.path(), "ca.pem");
    let s = &EchoCentral::with_pki(pki, &[]);
    let EchoCentral { c, pki, target, .. } = s;
    // The old node keeps its files (CA A) where the rotation does not touch them.
    let old_dir = tempfile::tempdir().unwrap();
    let old = keep(&pki.node("node-a", &[]), old_dir.path());
    let before = s.node(&old);
    let mut open = central::tunnel(before.addr, target);

    // CA B: a node certificate of it (still trusting the central's certificate, of CA A).
    let b = Pki::new();
    let new = NodeCert {
        ca: old.ca.clone(),
        ..b.node("node-a", &[])
    };
    kubelet_update(pki.dir.path(), "ca.pem", &b.path("ca.pem"));
    assert!(
        c.proxy.log_line("TLS files changed and reloaded").is_some(),
        "the central notices the new CA file by itself"
    );

    let (head, _) = central::connect(before.addr, target);
    assert!(
        head.starts_with("HTTP/1.1 502"),
        "a connected node of the rotated-out CA opens no new tunnel: {head}"
    );
    let after_old = s.node(&old);
    let (head, _) = central::connect(after_old.addr, target);
    assert!(
        head.starts_with("HTTP/1.1 502"),
        "a node of the rotated-out CA gets no stream: {head}"
    );
    let refused = events_where(&c.proxy.audit_path, 2, |e| e["reason_code"] == "node_tls_refused");
    assert!(refused.len() >= 2, "the refusals are on record: {refused:?}");

    let after_new = s.node(&new);
    echoes(&mut central::tunnel(after_new.addr, target), b"fresh");
    // A tunnel open before the rotation carries on.
    echoes(&mut open, b"still");

    // A key that is not the certificate's: refused, the configuration in force stays.
    swap_in(&b.path("node-node-a.key"), &pki.path("central-127.0.0.1.key"));
    assert!(c.proxy.log_line("TLS files changed but not reloaded").is_some());
    let again = s.node(&new);
    let (head, _t) = central::connect(again.addr, target);
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "new connections are still served with the files in force: {head}"
    );
}

/// A node-local proxy notices a rotated client certificate too: its next stream goes on a
/// new connection, which presents the new certificate, though the one it had is still up.
/// The new certificate names node-b, which the central does not list, so the switch shows
/// as a refusal. On the code before, the node kept opening streams on its old connection,
/// as node-a.
#[test]
fn a_node_presents_a_rotated_certificate_without_a_signal() {
    let s = &EchoCentral::new(&[]);
    let EchoCentral { c, pki, target, .. } = s;
    let dir = tempfile::tempdir().unwrap();
    let mine = keep(&pki.node("node-a", &[]), dir.path());
    let n = s.node(&mine);
    let (head, _first) = central::connect(n.addr, target);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    let other = pki.node("node-b", &[]);
    swap_in(&other.cert, &mine.cert);
    swap_in(&other.key, &mine.key);
    assert!(
        n.proxy.log_line("TLS files changed and reloaded").is_some(),
        "the node notices its new certificate by itself"
    );
    let (head, _) = central::connect(n.addr, target);
    assert!(
        head.starts_with("HTTP/1.1 502"),
        "the next stream presents node-b's certificate: {head}"
    );
    let unknown = events_where(&c.proxy.audit_path, 1, |e| e["reason_code"] == "node_unknown");
    assert!(!unknown.is_empty(), "the central refused node-b, on record");
}

/// A central's reload (its own certificate renewed) sends GOAWAY on its node connections.
/// A connected node's next tunnel goes on a new connection at once and is served: a
/// renewal costs the nodes no 502 and no central counted down, and the tunnel open on the
/// old connection carries on. On the code before, the node counted the central down on its
/// old connection's GOAWAY and answered 502 until its health check (1 s) passed.
#[test]
fn a_centrals_reload_costs_its_connected_nodes_nothing() {
    let s = &EchoCentral::new(&[]);
    let EchoCentral { c, pki, target, .. } = s;
    let n = s.node(&pki.node("node-a", &[]));
    let mut open = central::tunnel(n.addr, target);
    let (code, _, err) = central::pki(&["issue", "--central", "127.0.0.1", "--force"], pki.dir.path());
    assert_eq!(code, 0, "{err}");
    pki.open_up();
    assert!(c.proxy.log_line("TLS files changed and reloaded").is_some());
    for round in 0..3 {
        let (head, _t) = central::connect(n.addr, target);
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "tunnel {round} after the reload: {head}"
        );
    }
    echoes(&mut open, b"still");
    let log = n.proxy.log.lock().unwrap();
    assert!(
        !log.iter().any(|l| l.contains("central proxy unavailable")),
        "the node counted the central down: {log:?}"
    );
}

/// SIGHUP reads the TLS files again: tunnels already open carry on, new connections use
/// the new files; a broken file leaves the old configuration in force.
#[test]
fn sighup_reloads_certificates_without_dropping_tunnels() {
    let s = &EchoCentral::new(&[]);
    let EchoCentral { c, pki, target, .. } = s;
    let n = s.node(&pki.node("node-a", &[]));
    let mut t = central::tunnel(n.addr, target);

    let hup = central::hup;
    // A new central certificate, then SIGHUP to both.
    let (code, _, err) = central::pki(&["issue", "--central", "127.0.0.1", "--force"], pki.dir.path());
    assert_eq!(code, 0, "{err}");
    pki.open_up();
    hup(c.proxy.child.id());
    hup(n.proxy.child.id());
    assert!(c.proxy.log_line("TLS files reloaded").is_some());
    assert!(n.proxy.log_line("TLS files reloaded").is_some());
    echoes(&mut t, b"still");

    // A broken key: the reload is refused and the configuration in force stays.
    std::fs::write(pki.path("central-127.0.0.1.key"), "not a key").unwrap();
    hup(c.proxy.child.id());
    assert!(c.proxy.log_line("TLS files not reloaded").is_some());
    let n2 = s.node(&pki.node("node-a", &[]));
    let (head, _t2) = central::connect(n2.addr, target);
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "new connections still served: {head}"
    );
}

/// The value of `sandgate_tls_certificate_expiry_timestamp_seconds` for the file whose path
/// ends in `file`, from the admin listener `admin` (`None`: no such sample).
fn expiry(admin: std::net::SocketAddr, file: &str) -> Option<i64> {
    common::metrics_text(admin).lines().find_map(|l| {
        let rest = l.strip_prefix("sandgate_tls_certificate_expiry_timestamp_seconds{path=\"")?;
        let (path, value) = rest.split_once("\"} ")?;
        path.ends_with(file).then(|| value.trim().parse().unwrap())
    })
}

/// An operator alerts on certificates that will expire and on rotations that did not take.
/// Each file's expiry in force is published, on the central (its certificate, its client
/// CA) and on the node (its certificate, the central's CA); a rotation whose files do not
/// load shows as `sandgate_tls_reload_failing 1` while the old certificate (and its
/// expiry) stays in force, and a good rotation clears it and publishes the new expiry.
/// On the code before, neither metric existed: a broken rotation showed in the log only,
/// and the expiry of the certificate in force nowhere.
#[test]
fn certificate_expiry_and_a_rotation_that_does_not_load_show_in_the_metrics() {
    let issue = |pki: &Pki, args: &[&str]| {
        let (code, _, err) = central::pki(args, pki.dir.path());
        assert_eq!(code, 0, "pki {args:?}: {err}");
        pki.open_up();
    };
    let pki = Pki::new();
    // 2030-06-01T23:59:59Z, 2031-01-01T23:59:59Z, 2029-03-03T23:59:59Z.
    let (first, renewed, node_end) = (1_906_588_799, 1_925_078_399, 1_867_276_799);
    issue(
        &pki,
        &[
            "issue",
            "--central",
            "127.0.0.1",
            "--force",
            "--not-after",
            "2030-06-01",
        ],
    );
    let s = &EchoCentral::with_pki(pki, &["--metrics-listen", "127.0.0.1:0"]);
    let EchoCentral { c, pki, target, .. } = s;
    let admin = c.proxy.admin();
    let failing = |a| common::metric(a, "sandgate_tls_reload_failing");

    assert_eq!(expiry(admin, "/central-127.0.0.1.pem"), Some(first));
    let ca = expiry(admin, "/ca.pem").expect("the client CA's expiry");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(ca > now + 3000 * 86_400, "the CA made for 3650 days: {ca}");
    assert_eq!(failing(admin), 0.0);

    // A node: its certificate and the CA it trusts the central by.
    let cert = pki.node("node-a", &["--not-after", "2029-03-03"]);
    let mut args = central::upstream_args(&cert, &[c.node_addr]);
    args.extend(
        [
            "--dns-server",
            "127.0.0.1:9",
            "--allow",
            target,
            "--metrics-listen",
            "127.0.0.1:0",
        ]
        .map(str::to_owned),
    );
    let node = common::ProxyProcess::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let node_admin = node.admin();
    echoes(&mut central::tunnel(node.addr, target), b"through");
    assert_eq!(expiry(node_admin, "/node-node-a.pem"), Some(node_end));
    assert_eq!(expiry(node_admin, "/ca.pem"), Some(ca));
    assert_eq!(failing(node_admin), 0.0);

    // A rotation whose new certificate (valid to 2031) is not its key's: failing, and the
    // expiry published stays the one in force, not the one on disk.
    issue(
        pki,
        &[
            "issue",
            "--central",
            "127.0.0.2",
            "--force",
            "--not-after",
            "2031-01-01",
        ],
    );
    swap_in(
        &pki.path("central-127.0.0.2.pem"),
        &pki.path("central-127.0.0.1.pem"),
    );
    assert!(
        common::control::within(5, || failing(admin) == 1.0),
        "a rotation that does not load shows"
    );
    assert_eq!(expiry(admin, "/central-127.0.0.1.pem"), Some(first));
    // The same on the node: a key that is not its certificate's.
    swap_in(&pki.path("central-127.0.0.2.key"), &cert.key);
    assert!(
        common::control::within(5, || failing(node_admin) == 1.0),
        "the node's failed rotation shows"
    );
    assert_eq!(expiry(node_admin, "/node-node-a.pem"), Some(node_end));
    // A good one: cleared, the new certificate's expiry published.
    issue(
        pki,
        &[
            "issue",
            "--central",
            "127.0.0.1",
            "--force",
            "--not-after",
            "2031-01-01",
        ],
    );
    assert!(
        common::control::within(5, || failing(admin) == 0.0
            && expiry(admin, "/central-127.0.0.1.pem") == Some(renewed)),
        "a good rotation clears it: {:?}",
        expiry(admin, "/central-127.0.0.1.pem")
    );
    // The node still presents the certificate in force (its key on disk is not its).
    echoes(&mut central::tunnel(node.addr, target), b"renewed");
}
