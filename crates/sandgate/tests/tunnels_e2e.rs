//! A tunnel must carry the TLS it claims (`spec.network.tunnels`), checked with real
//! clients: `openssl s_client -proxy` with a server name other than the CONNECT host is
//! refused and audited (`sni_mismatch`, the name seen), the matching name and curl end to
//! end pass, curl's own domain fronting (`--connect-to`) through CONNECT and SOCKS5 is
//! refused, plain bytes and silence in a `tls_only` tunnel are refused (`not_tls`). As an
//! attacker: a ClientHello split over two records, one that is not readable, and one sent
//! before the 200 all get the same check, and no byte of a refused tunnel reaches the
//! upstream (an echo server would send it back).

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
use std::process::{Command, Stdio};
use std::time::Duration;

use common::world::{World, base_args, events_of, policy_doc, strs};
use common::{ProxyProcess, curl};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::tls::{TestCa, client_hello, split_record};
use serde_json::Value;

/// A proxy with a policy file allowing `allow` (host:port entries) and `tunnels` as the
/// body of `spec.network.tunnels` (empty: the defaults); SOCKS5 on a second listener.
fn proxy_with(dns: &DnsServer, dir: &Path, allow: &[String], tunnels: &str) -> (ProxyProcess, SocketAddr) {
    let mut body = "  listeners:\n    - listen: 127.0.0.1:0\n    - listen: 127.0.0.1:0\n      protocol: socks5\n  network:\n    allowlist:\n".to_owned();
    for a in allow {
        body.push_str(&format!("      - \"{a}\"\n"));
    }
    if !tunnels.is_empty() {
        body.push_str(&format!("    tunnels:\n{tunnels}"));
    }
    let file = dir.join("policy.yaml");
    std::fs::write(&file, policy_doc(&body)).unwrap();
    let mut args = base_args(dns);
    args.extend(["--policy".into(), file.to_str().unwrap().to_owned()]);
    let p = ProxyProcess::start(&strs(&args));
    // The test's own listener, and the file's two.
    assert_eq!(p.listening(3).len(), 3);
    let socks = p.listener(&["role=socks5"]);
    (p, socks)
}

/// `openssl s_client` through the HTTP proxy to `connect`, sending `servername` (`None`:
/// no server name at all). Returns whether the handshake completed and its output.
fn s_client(proxy: SocketAddr, connect: &str, servername: Option<&str>, ca: &Path) -> (bool, String) {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-brief", "-verify_return_error", "-CAfile"])
        .arg(ca)
        .args(["-proxy", &proxy.to_string(), "-connect", connect]);
    match servername {
        Some(name) => cmd.args(["-servername", name]),
        None => cmd.arg("-noservername"),
    };
    let out = cmd.stdin(Stdio::null()).output().expect("openssl s_client");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (text.contains("CONNECTION ESTABLISHED"), text)
}

fn decisions(events: &[Value]) -> Vec<(String, Option<String>)> {
    events_of(events, "decision")
        .iter()
        .map(|e| {
            (
                e["reason_code"].as_str().unwrap().to_owned(),
                e["tls_server_name"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

#[test]
fn openssl_with_another_server_name_is_refused_and_the_matching_one_passes() {
    let w = World::new();
    // The origin would serve either name: only the proxy's check stands between them.
    let ca = TestCa::new(&["allowed.test", "other.example"]);
    let origin = w.tls_origin(&ca);
    let dns = w.dns(Zone::new().with("allowed.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.ca_pem).unwrap();
    let target = format!("allowed.test:{}", origin.port());
    let (p, _) = proxy_with(&dns, dir.path(), std::slice::from_ref(&target), "");

    let (ok, out) = s_client(p.addr, &target, Some("other.example"), &ca_file);
    assert!(!ok, "fronted handshake completed:\n{out}");
    let (ok, out) = s_client(p.addr, &target, Some("ALLOWED.test"), &ca_file);
    assert!(ok, "matching name refused:\n{out}");
    let (ok, out) = s_client(p.addr, &target, None, &ca_file);
    assert!(!ok, "a ClientHello without a name passed:\n{out}");
    // curl end to end with the test CA.
    let url = format!("https://{target}/secure");
    let (code, body, err) = curl(&p.url(), &["--cacert", ca_file.to_str().unwrap(), &url]);
    assert_eq!(code, 0, "{err}");
    assert!(body.contains("/secure"), "{body}");

    let events = p.audit_events(6);
    assert_eq!(
        decisions(&events),
        [
            ("sni_mismatch".into(), Some("other.example".into())),
            ("allowlisted".into(), Some("allowed.test".into())),
            ("sni_missing".into(), None),
            ("allowlisted".into(), Some("allowed.test".into())),
        ],
        "{events:#?}"
    );
    let mismatch = &events_of(&events, "decision")[0];
    assert_eq!(mismatch["decision"], "deny");
    assert_eq!(mismatch["destination_host"], "allowed.test");
    assert_eq!(
        events_of(&events, "close").len(),
        2,
        "only the two allowed tunnels have closes: {events:#?}"
    );
}

#[test]
fn curl_domain_fronting_with_connect_to_is_refused_over_connect_and_socks5() {
    let w = World::new();
    let ca = TestCa::new(&["front.test", "hidden.test"]);
    let origin = w.tls_origin(&ca);
    let dns = w.dns(Zone::new().with("front.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.ca_pem).unwrap();
    let port = origin.port();
    let front = format!("front.test:{port}");
    let (p, socks) = proxy_with(&dns, dir.path(), std::slice::from_ref(&front), "");
    // curl connects to the allowed front but speaks TLS (and HTTP) for the hidden name.
    let url = format!("https://hidden.test:{port}/fronted");
    let connect_to = format!("hidden.test:{port}:front.test:{port}");
    let ca_arg = ca_file.to_str().unwrap();
    let (code, _, err) = curl(&p.url(), &["--cacert", ca_arg, "--connect-to", &connect_to, &url]);
    assert_ne!(code, 0, "fronting over CONNECT passed");
    assert!(
        err.contains("alert") || err.contains("reset") || err.contains("SSL"),
        "{err}"
    );
    let socks_url = format!("socks5h://{socks}");
    let (code, _, err) = curl(
        &socks_url,
        &["--cacert", ca_arg, "--connect-to", &connect_to, &url],
    );
    assert_ne!(code, 0, "fronting over SOCKS5 passed: {err}");
    // The honest SOCKS5 request passes, with its name on record.
    let honest = format!("https://front.test:{port}/");
    let (code, _, err) = curl(&socks_url, &["--cacert", ca_arg, &honest]);
    assert_eq!(code, 0, "{err}");
    let events = p.audit_events(4);
    let seen: Vec<_> = events_of(&events, "decision")
        .iter()
        .map(|e| {
            (
                e["scheme"].as_str().unwrap().to_owned(),
                e["reason_code"].as_str().unwrap().to_owned(),
                e["tls_server_name"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("connect".into(), "sni_mismatch".into(), "hidden.test".into()),
            ("socks5".into(), "sni_mismatch".into(), "hidden.test".into()),
            ("socks5".into(), "allowlisted".into(), "front.test".into()),
        ],
        "{events:#?}"
    );
}

/// Opens a CONNECT tunnel by hand and returns the stream after the 200.
fn tunnel(proxy: SocketAddr, target: &str, early: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").into_bytes();
    request.extend_from_slice(early);
    s.write_all(&request).unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).unwrap();
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// Everything the proxy sends back until it closes (or 10 s pass).
fn rest(mut s: TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

#[test]
fn tls_only_tunnels_refuse_plain_bytes_and_silence_and_other_ports_carry_anything() {
    let w = World::new();
    let strict = w.echo();
    let open = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let strict_t = format!("echo.test:{}", strict.addr().port());
    let open_t = format!("echo.test:{}", open.addr().port());
    let tunnels = format!(
        "      tls_only: [{}]\n      first_bytes_timeout_ms: 300\n",
        strict.addr().port()
    );
    let (p, _) = proxy_with(&dns, dir.path(), &[strict_t.clone(), open_t.clone()], &tunnels);

    // Plain bytes where TLS is required: closed, not echoed, never forwarded.
    let mut s = tunnel(p.addr, &strict_t, b"");
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(rest(s), b"");
    // Silence past the limit.
    let s = tunnel(p.addr, &strict_t, b"");
    assert_eq!(rest(s), b"");
    // Anything goes on another port (an SSH banner, say), byte for byte.
    let mut s = tunnel(p.addr, &open_t, b"");
    s.write_all(b"SSH-2.0-test\r\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(rest(s), b"SSH-2.0-test\r\n");

    let events = p.audit_events(4);
    let reasons: Vec<String> = decisions(&events).into_iter().map(|(r, _)| r).collect();
    assert_eq!(reasons, ["not_tls", "not_tls", "allowlisted"], "{events:#?}");
    let close = events_of(&events, "close")[0];
    assert_eq!(close["bytes_sent"], 14, "{close}");
    assert_eq!(close["bytes_received"], 14, "{close}");
}

#[test]
fn split_unreadable_and_pipelined_hellos_get_the_same_check() {
    let w = World::new();
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let target = format!("echo.test:{}", echo.addr().port());
    // Not a tls_only port: only the name check stands.
    let (p, _) = proxy_with(&dns, dir.path(), std::slice::from_ref(&target), "");

    // 1. The name split across two records, the second sent a moment later.
    let hello = split_record(&client_hello("evil.example"), 30);
    let mut s = tunnel(p.addr, &target, b"");
    s.write_all(&hello[..20]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    s.write_all(&hello[20..]).unwrap();
    let back = rest(s);
    assert_eq!(
        back,
        [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49],
        "an access_denied alert, no echo"
    );
    // 2. A TLS record that is no readable ClientHello (its inner length lies): it could
    // carry any name, so it is refused even where plain bytes would pass.
    let mut broken = client_hello("evil.example");
    broken[8] = broken[8].wrapping_sub(3);
    let mut s = tunnel(p.addr, &target, b"");
    s.write_all(&broken).unwrap();
    assert_eq!(rest(s), b"");
    // 3. A ClientHello pipelined behind the CONNECT head, before the 200.
    let s = tunnel(p.addr, &target, &client_hello("evil.example"));
    assert!(
        !rest(s).windows(4).any(|w| w == [0x16, 0x03, 0x01, 0x00]),
        "echoed back"
    );
    // 4. The matching name, split, is echoed back whole (the bytes forwarded unchanged).
    let good = split_record(&client_hello("echo.test"), 50);
    let mut s = tunnel(p.addr, &target, &good[..10]);
    s.write_all(&good[10..]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(rest(s), good);

    let events = p.audit_events(5);
    let seen = decisions(&events);
    assert_eq!(
        seen,
        [
            ("sni_mismatch".into(), Some("evil.example".into())),
            ("not_tls".into(), None),
            ("sni_mismatch".into(), Some("evil.example".into())),
            ("allowlisted".into(), Some("echo.test".into())),
        ],
        "{events:#?}"
    );
    let close = events_of(&events, "close")[0];
    assert_eq!(close["bytes_sent"], good.len(), "{close}");
}

/// The attacker waits out `first_bytes_timeout_ms` on a port that is not `tls_only`, so the
/// tunnel is relayed as a silent one, and only then sends a ClientHello naming another
/// server (a front end that serves many sites on 8443 picks the site by it). It is checked
/// as if it had come first: an access_denied alert, nothing forwarded. An honest late hello
/// is carried.
#[test]
fn a_hello_sent_after_the_first_bytes_timeout_gets_the_same_check() {
    let w = World::new();
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let target = format!("echo.test:{}", echo.addr().port());
    let (p, _) = proxy_with(
        &dns,
        dir.path(),
        std::slice::from_ref(&target),
        "      first_bytes_timeout_ms: 300\n",
    );

    let mut s = tunnel(p.addr, &target, b"");
    std::thread::sleep(Duration::from_millis(700));
    s.write_all(&client_hello("evil.example")).unwrap();
    assert_eq!(
        rest(s),
        [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49],
        "an access_denied alert, no echo"
    );
    let good = client_hello("echo.test");
    let mut s = tunnel(p.addr, &target, b"");
    std::thread::sleep(Duration::from_millis(700));
    s.write_all(&good).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(rest(s), good, "the honest late hello is carried");

    let events = p.audit_events(4);
    let closes: Vec<&str> = events_of(&events, "close")
        .iter()
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(closes, ["late_hello_refused", "ok"], "{events:#?}");
}

/// The whole file again as `nobody`.
#[test]
fn the_tunnel_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody("tunnels_e2e", "the_tunnel_suite_passes_as_an_ordinary_user", 6);
}

/// A TLS 1.3 server that asks for a retry (a HelloRetryRequest): the second ClientHello is
/// checked like the first. A second hello naming another server ends the tunnel before it
/// reaches the server, which only ever sees the allowed name.
#[test]
fn the_second_client_hello_after_a_retry_request_is_checked_too() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .args(["-subj", "/CN=allowed.test", "-days", "1", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(made.success());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tunnels/hrr.py");
    // Standard library only: Debian's Python, which an ordinary user may run too.
    let python = "/usr/bin/python3";
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut server = Killed(
        Command::new(python)
            .args([script, "server"])
            .arg(&cert)
            .arg(&key)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(server.0.stdout.take().unwrap()));
    let port: u16 = lines.next().unwrap().unwrap().trim().parse().unwrap();
    let w = World::new();
    let dns = w.dns(Zone::new().with("allowed.test", &["127.0.0.1"]));
    let target = format!("allowed.test:{port}");
    let (p, _) = proxy_with(&dns, dir.path(), std::slice::from_ref(&target), "");
    let client = |sni2: &str| -> Value {
        let out = Command::new(python)
            .args([
                script,
                "client",
                &p.addr.port().to_string(),
                &target,
                "allowed.test",
                sni2,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // The proxy's own answer: a fatal access_denied alert.
    const PROXY_ALERT: &str = "15030300020231";
    let evil = client("evil.test");
    assert_eq!(evil["retry"], true, "{evil}");
    assert_eq!(evil["after"], PROXY_ALERT, "{evil}");
    // The same name twice: the second hello reaches the server, which answers it (the test's
    // key share is not a real P-384 point, so with an alert of its own).
    let honest = client("allowed.test");
    assert_eq!(honest["retry"], true, "{honest}");
    let after = honest["after"].as_str().unwrap();
    assert!(
        !after.is_empty() && after != PROXY_ALERT,
        "the server answered: {honest}"
    );
    let events = p.audit_events(4);
    let closes: Vec<&str> = events_of(&events, "close")
        .iter()
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert!(closes.contains(&"retry_refused"), "{events:#?}");
    let _ = server.0.kill();
    let seen: Vec<String> = lines
        .map_while(Result::ok)
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("sni "))
        .collect();
    // Only the allowed name ever reached the server.
    assert!(
        seen.len() >= 2 && seen.iter().all(|l| l == "sni allowed.test"),
        "{seen:?}"
    );
}
