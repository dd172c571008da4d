//! The admin listener's TLS certificate is renewed without a restart: `sandgate proxy
//! --admin-tls-cert/--admin-tls-key` with a certificate from `sandgate pki`, the files then
//! rewritten in place (as cert-manager renews them) with a new certificate from the same CA,
//! and a new TLS connection gets the new one. A broken replacement (a key that does not match,
//! a file that is no PEM) keeps the certificate in force: never a handshake without one.

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
use std::process::Command;
use std::time::{Duration, Instant};

use common::{ProxyProcess, sandgate_bin};
use sandgate_testkit::tls::{TlsClient, cert_der};

/// `sandgate pki ARGS` in `dir`, which must succeed.
fn pki(dir: &Path, args: &[&str]) {
    let out = Command::new(sandgate_bin())
        .arg("pki")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A new certificate for 127.0.0.1 from the CA in `pki`: its PEM and its key's PEM.
fn issue(pki_dir: &Path) -> (String, String) {
    pki(pki_dir, &["issue", "--central", "127.0.0.1", "--force"]);
    let read = |ext: &str| std::fs::read_to_string(pki_dir.join(format!("central-127.0.0.1.{ext}"))).unwrap();
    (read("pem"), read("key"))
}

/// The serial number of a DER certificate (RFC 5280 section 4.1: Certificate ::= SEQUENCE {
/// tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber INTEGER, ...}, ...}).
fn serial(der: &[u8]) -> Vec<u8> {
    /// The tag, and the contents of the DER element at the start of `b`, and what follows.
    fn element(b: &[u8]) -> (u8, &[u8], &[u8]) {
        let (tag, first) = (b[0], b[1]);
        let (len, at) = if first < 0x80 {
            (usize::from(first), 2)
        } else {
            let n = usize::from(first & 0x7f);
            (b[2..2 + n].iter().fold(0, |l, &x| l << 8 | usize::from(x)), 2 + n)
        };
        (tag, &b[at..at + len], &b[at + len..])
    }
    let (_, certificate, _) = element(der);
    let (_, tbs, _) = element(certificate);
    let (tag, contents, rest) = element(tbs);
    let (tag, contents) = if tag == 0xa0 {
        let (tag, contents, _) = element(rest);
        (tag, contents)
    } else {
        (tag, contents)
    };
    assert_eq!(tag, 0x02, "serialNumber is an INTEGER");
    contents.to_vec()
}

/// A new TLS connection to the admin listener, trusting only `ca`: the certificate it was
/// shown (DER), after checking the listener answers `/healthz` on it.
fn presented(admin: SocketAddr, ca: &str) -> Vec<u8> {
    let tcp = TcpStream::connect(admin).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = TlsClient::handshake(tcp, "127.0.0.1", ca).unwrap();
    let cert = tls.peer_certificate().unwrap();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    cert
}

#[test]
fn a_renewed_admin_certificate_is_served_without_a_restart_and_a_broken_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let pki_dir = dir.path().join("pki");
    pki(&pki_dir, &["init"]);
    let ca = std::fs::read_to_string(pki_dir.join("ca.pem")).unwrap();
    let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let install = |(cert, key): &(String, String)| {
        std::fs::write(&cert_file, cert).unwrap();
        std::fs::write(&key_file, key).unwrap();
    };
    let first = issue(&pki_dir);
    install(&first);
    let proxy = ProxyProcess::start(&[
        "--admin-listen",
        "127.0.0.1:0",
        "--admin-tls-cert",
        cert_file.to_str().unwrap(),
        "--admin-tls-key",
        key_file.to_str().unwrap(),
    ]);
    let admin = proxy.admin();
    assert_eq!(presented(admin, &ca), cert_der(&first.0));

    // Renewed in place: a new certificate from the same CA, a new serial.
    let second = issue(&pki_dir);
    let renewed = cert_der(&second.0);
    assert_ne!(serial(&renewed), serial(&cert_der(&first.0)));
    install(&second);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = presented(admin, &ca);
        if serial(&shown) == serial(&renewed) {
            assert_eq!(shown, renewed);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still the first certificate after 10 s:\n{}",
            proxy.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(proxy.log_line("admin TLS certificate reloaded").is_some());

    // Broken replacements: each is tried (and refused, with a warning) once it is seen,
    // and the renewed certificate stays in force.
    let refusals = || {
        proxy
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("the certificate in force stays"))
            .count()
    };
    let third = issue(&pki_dir);
    let broken = [
        (third.0.clone(), first.1.clone()),
        (third.0.clone(), "not a key\n".to_owned()),
    ];
    for (n, pair) in broken.iter().enumerate() {
        let before = refusals();
        install(pair);
        let deadline = Instant::now() + Duration::from_secs(10);
        while refusals() == before {
            assert_eq!(presented(admin, &ca), renewed, "a broken pair was taken");
            assert!(
                Instant::now() < deadline,
                "the broken pair {n} was not tried in 10 s:\n{}",
                proxy.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(presented(admin, &ca), renewed, "a broken pair was taken");
    }
    install(&third);
    let deadline = Instant::now() + Duration::from_secs(10);
    while presented(admin, &ca) != cert_der(&third.0) {
        assert!(
            Instant::now() < deadline,
            "a good pair after broken ones was not taken"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
