//! SOCKS5 under the same policy as HTTP, with real clients: curl `--socks5-hostname` to
//! allowed, denied and guarded destinations, Python's PySocks (with an RFC 1929 login as task
//! credentials), and the commands and address types a SOCKS5 proxy must refuse. Every
//! decision comes from the same egress core and lands in the same audit log (`scheme:
//! socks5`).

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
use std::process::Command;
use std::time::Duration;

use common::world::{base_args, policy_doc, strs};
use common::{ProxyProcess, runtime};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;

fn socks_curl(socks: SocketAddr, url: &str) -> (i32, String, String) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--socks5-hostname",
        ])
        .arg(socks.to_string())
        .arg(url)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn curl_through_socks5_is_decided_like_http() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("denied.test", &["127.0.0.1"])
            .with("inside.test", &["10.1.2.3"])
            .with("bare.test", &["127.0.0.1"]),
    ));
    let port = origin.port();
    let mut args = base_args(&dns);
    let allow = format!("allowed.test:{port}");
    args.extend([
        "--allow".into(),
        allow,
        "--allow".into(),
        "inside.test:80".into(),
        "--allow".into(),
        "bare.test".into(),
        "--socks-listen".into(),
        "127.0.0.1:0".into(),
    ]);
    let p = ProxyProcess::start(&strs(&args));
    assert_eq!(p.listening(2).len(), 2);
    let socks = p.listener(&["role=socks5"]);
    let (code, status, err) = socks_curl(socks, &format!("http://allowed.test:{port}/via-socks"));
    assert_eq!((code, status.as_str()), (0, "200"), "{err}");
    // Refused by the policy, the address guard, and the default ports of a bare entry (443
    // only: anything else must be listed): each a SOCKS5 "not allowed" reply. Port 80 is
    // the attacker's: a blind stream there lets its own Host header pick any site behind
    // the allowed name's front end.
    for url in [
        format!("http://denied.test:{port}/"),
        "http://inside.test/".to_owned(),
        "http://bare.test:22/".to_owned(),
        "http://bare.test/".to_owned(),
    ] {
        let (code, _, err) = socks_curl(socks, &url);
        assert_eq!(code, 97, "{url}: {err}");
        assert!(err.contains("(2)"), "{url}: {err}");
    }
    assert_eq!(
        origin.connections(),
        1,
        "only the allowed request reached the origin"
    );
    let events = p.audit_events(6);
    let socks_events: Vec<_> = events.iter().filter(|e| e["scheme"] == "socks5").collect();
    let reasons: Vec<&str> = socks_events
        .iter()
        .filter(|e| e["event"] == "decision")
        .map(|e| e["reason_code"].as_str().unwrap())
        .collect();
    assert_eq!(
        reasons,
        [
            "allowlisted",
            "not_allowlisted",
            "destination_ip_prohibited",
            "not_allowlisted",
            "not_allowlisted"
        ],
        "{events:#?}"
    );
    assert!(
        socks_events
            .iter()
            .any(|e| e["event"] == "close" && e["outcome"] == "ok")
    );
}

/// A SOCKS5 request by hand: greeting, then `command` for `name:port`; returns the reply
/// code.
fn raw_request(socks: SocketAddr, command: u8, atyp_and_addr: &[u8], port: u16) -> u8 {
    let mut s = TcpStream::connect(socks).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).unwrap();
    assert_eq!(choice, [5, 0]);
    let mut req = vec![5, command, 0];
    req.extend_from_slice(atyp_and_addr);
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    reply[1]
}

#[test]
fn bind_udp_and_unknown_address_types_are_refused_with_their_codes() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let mut args = base_args(&dns);
    args.extend([
        "--allow".into(),
        "*".into(),
        "--socks-listen".into(),
        "127.0.0.1:0".into(),
    ]);
    let p = ProxyProcess::start(&strs(&args));
    let socks = p.listener(&["role=socks5"]);
    let name = [&[3u8, 6][..], b"a.test"].concat();
    assert_eq!(raw_request(socks, 2, &name, 443), 0x07, "BIND");
    assert_eq!(raw_request(socks, 3, &name, 443), 0x07, "UDP ASSOCIATE");
    assert_eq!(
        raw_request(socks, 1, &[9, 1, 2, 3, 4], 443),
        0x08,
        "address type 9"
    );
    // An IPv4 literal that no entry lists: the IP-literal rule (`*` never covers one).
    assert_eq!(raw_request(socks, 1, &[1, 127, 0, 0, 1], 80), 0x02);
    // A bad name is a general failure, never a lookup.
    let bad = [&[3u8, 7][..], b"a b.com"].concat();
    assert_eq!(raw_request(socks, 1, &bad, 443), 0x01);
}

const PYSOCKS: &str = r#"
import socks, sys
proxy_host, proxy_port, user, password, host, port = sys.argv[1:7]
s = socks.socksocket()
s.set_proxy(socks.SOCKS5, proxy_host, int(proxy_port), rdns=True, username=user or None, password=password or None)
s.settimeout(10)
try:
    s.connect((host, int(port)))
except socks.ProxyError as e:
    print("refused", e); sys.exit(0)
s.sendall(("GET /pysocks HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host).encode())
print(s.recv(12).decode())
"#;

#[test]
fn python_pysocks_with_an_rfc1929_login_as_task_credentials() {
    // The venv under target/ is not nobody's to run; the proxy side of logins runs as nobody
    // in the other tests of this file.
    if std::env::var_os("SANDGATE_AS_NOBODY").is_some() {
        return;
    }
    let python = common::python();
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        policy_doc(&format!(
            "  network:\n    allowlist:\n      - host: \"web.test:{}\"\n        scope: {{ task: t-1 }}\n\
             \x20 listeners:\n    - {{ listen: \"127.0.0.1:0\", protocol: socks5, auth: basic }}\n\
             \x20 auth:\n    tasks:\n      - {{ task: t-1, secret_sha256: {} }}\n      - {{ task: t-2, secret_sha256: {} }}\n",
            origin.port(),
            sandgate_policy::auth::secret_hash("tok-1"),
            sandgate_policy::auth::secret_hash("tok-2"),
        )),
    )
    .unwrap();
    let mut args = base_args(&dns);
    args.extend(["--policy".into(), file.to_str().unwrap().to_owned()]);
    let p = ProxyProcess::start(&strs(&args));
    let socks = p.listener(&["role=socks5", "auth=basic"]);
    let run = |user: &str, pass: &str| {
        let out = Command::new(&python)
            .args([
                "-c",
                PYSOCKS,
                "127.0.0.1",
                &socks.port().to_string(),
                user,
                pass,
                "web.test",
            ])
            .arg(origin.port().to_string())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    assert_eq!(run("t-1", "tok-1"), "HTTP/1.1 200");
    assert!(run("t-1", "wrong").starts_with("refused"), "a wrong secret");
    assert!(run("", "").starts_with("refused"), "no login on an auth listener");
    // t-2 logs in, but the entry is t-1's.
    assert!(run("t-2", "tok-2").starts_with("refused"));
    let events = p.audit_events(4);
    let allowed = events.iter().find(|e| e["decision"] == "allow").unwrap();
    assert_eq!(
        (allowed["task_id"].as_str(), allowed["scheme"].as_str()),
        (Some("t-1"), Some("socks5"))
    );
    let codes: Vec<&str> = events.iter().filter_map(|e| e["reason_code"].as_str()).collect();
    assert!(
        codes.contains(&"proxy_auth_wrong") && codes.contains(&"proxy_auth_missing"),
        "{codes:?}"
    );
}

/// A node-local proxy chained to a central one: a SOCKS5 tunnel to an allowed destination
/// is a tunnel to that destination, never a raw connection to the central proxy (through
/// which the client could ask for anything the local policy refuses).
#[test]
fn a_chained_socks5_tunnel_cannot_talk_to_the_upstream_proxy() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let echo = rt.block_on(sandgate_testkit::echo::EchoServer::start());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("echo.test", &["127.0.0.1"])
            .with("web.test", &["127.0.0.1"]),
    ));
    let tunnel = format!("echo.test:{}", echo.addr().port());
    let web = format!("web.test:{}", origin.port());
    let mut central_args = base_args(&dns);
    central_args.extend(["--allow".into(), tunnel.clone(), "--allow".into(), web.clone()]);
    let central = ProxyProcess::start(&strs(&central_args));
    let central_addr = central.addr.to_string();
    // Locally only the echo server is allowed; web.test is refused here.
    let local = ProxyProcess::start(&[
        "--dns-server",
        "127.0.0.1:9",
        "--upstream-proxy",
        &central_addr,
        "--allow",
        &tunnel,
        "--socks-listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(local.listening(2).len(), 2);
    let socks = local.listener(&["role=socks5"]);
    let mut s = TcpStream::connect(socks).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).unwrap();
    let mut req = vec![5, 1, 0, 3, 9];
    req.extend_from_slice(b"echo.test");
    req.extend_from_slice(&echo.addr().port().to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[1], 0, "the allowed tunnel opens");
    // Speak proxy to whatever is on the other end: the echo server sends it back; the
    // central proxy would have fetched the refused origin.
    let smuggled = format!("GET http://{web}/secret HTTP/1.1\r\nHost: {web}\r\n\r\n");
    s.write_all(smuggled.as_bytes()).unwrap();
    let mut back = vec![0u8; smuggled.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(String::from_utf8_lossy(&back), smuggled);
    assert_eq!(origin.connections(), 0, "the refused origin was reached");
}

/// The whole file again as `nobody`.
#[test]
fn the_socks5_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody("socks5_e2e", "the_socks5_suite_passes_as_an_ordinary_user", 4);
}
