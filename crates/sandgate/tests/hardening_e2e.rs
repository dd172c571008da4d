//! Regression tests for the proxy half of the hostile review (issue 16), resources and
//! loops, each written as the attacker or the failing environment would act: a disk that
//! fills under the audit log, a client that tunnels back into the proxy through one of the
//! host's own addresses, a tenant holding idle connections. Every test here failed on the
//! code before the fix (see the session note); the whole file also runs as `nobody`.

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
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::world::{base_args, connect_from, status_from, strs};
use common::{ProxyProcess, curl, runtime};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;
use serde_json::Value;

/// Writes to `path` until the filesystem is full (bounded: the tmpfs is 1 MiB).
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![b'x'; 4096];
    for _ in 0..10_000 {
        if f.write_all(&block).is_err() {
            return;
        }
    }
    panic!("{} never filled", path.display());
}

/// Sends `curl` requests until one answers `want` (at most `tries`, 100 ms apart).
fn until_status(proxy: &str, url: &str, want: &str, tries: usize) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..tries {
        let (_, out, _) = curl(proxy, &["-o", "/dev/null", "-w", "%{http_code}", url]);
        seen.push(out.clone());
        if out == want {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    seen
}

/// The audit log in a 1 MiB tmpfs of the proxy's own mount namespace (a user namespace
/// makes the mount): the running proxy, the directory, and the log's directory as the test
/// reaches it (through `/proc/PID/root`). A shell holds the namespace, passes SIGTERM on,
/// and copies the log out (to `audit.copy` in the directory) once the proxy has exited. The
/// proxy allows `allow` and syncs at no interval.
fn proxy_over_a_small_tmpfs(
    dns: &DnsServer,
    allow: &str,
) -> (ProxyProcess, tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("audit");
    std::fs::create_dir(&mnt).unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "--mount", "--", "sh", "-c"])
        .arg(
            "mount -t tmpfs -o size=1m tmpfs \"$0\" || exit 1; \"$@\" & pid=$!; \
             trap 'kill -TERM $pid' TERM; wait $pid; wait $pid; cp \"$0/audit.jsonl\" \"$0.copy\"",
        )
        .arg(&mnt)
        .arg(common::sandgate_bin());
    let mut args = base_args(dns);
    args.extend([
        "--allow".into(),
        allow.to_owned(),
        "--audit-fsync-interval".into(),
        "0".into(),
    ]);
    let p = ProxyProcess::start_with_audit(cmd, Some(mnt.join("audit.jsonl")), &strs(&args));
    let inside = Path::new("/proc")
        .join(p.child.id().to_string())
        .join("root")
        .join(mnt.strip_prefix("/").unwrap());
    (p, dir, inside)
}

/// Frees the full tmpfs of [`proxy_over_a_small_tmpfs`] (its `filler` in `inside`), waits
/// until a GET of `url` passes again (the writer recovered), stops the proxy, and returns
/// every event of the log it copied out to `dir`, failing on a torn or bad line.
fn recover_and_stop(p: &mut ProxyProcess, dir: &Path, inside: &Path, url: &str) -> Vec<Value> {
    std::fs::remove_file(inside.join("filler")).unwrap();
    let seen = until_status(&p.url(), url, "200", 50);
    assert_eq!(
        seen.last().map(String::as_str),
        Some("200"),
        "never recovered: {seen:?}"
    );
    assert!(p.terminate().success());
    std::fs::read_to_string(dir.join("audit.copy"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("torn or bad line {l:?}: {e}")))
        .collect()
}

/// Item 9: an audit log that cannot be written stops traffic (503 naming the cause), the
/// writer recovers by itself when space returns, and no event is lost or torn.
#[test]
fn a_full_disk_under_the_audit_log_stops_traffic_and_loses_no_event() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("allowed.test", &["127.0.0.1"])));
    let allow = format!("allowed.test:{}", origin.port());
    let (mut p, dir, inside) = proxy_over_a_small_tmpfs(&dns, &allow);
    let url = |n: usize| format!("http://allowed.test:{}/req-{n}", origin.port());
    let (_, code, _) = curl(&p.url(), &["-o", "/dev/null", "-w", "%{http_code}", &url(1)]);
    assert_eq!(code, "200");

    fill(&inside.join("filler"));
    // The first request after the disk filled may pass (it was decided before the writer
    // saw the failure); from then on every new request gets 503 until space returns.
    let seen = until_status(&p.url(), &url(2), "503", 50);
    assert_eq!(
        seen.last().map(String::as_str),
        Some("503"),
        "never refused: {seen:?}"
    );
    let (_, headers, _) = curl(&p.url(), &["-s", "-D", "-", "-o", "/dev/null", &url(3)]);
    assert!(
        headers.contains("Proxy-Status: sandgate; error=proxy_internal_error")
            && headers.contains("audit log cannot be written"),
        "{headers}"
    );

    let events = recover_and_stop(&mut p, dir.path(), &inside, &url(4));
    let served: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "close" && e["outcome"] == "ok")
        .filter_map(|e| e["request_id"].as_str())
        .collect();
    let allowed = events
        .iter()
        .filter(|e| e["event"] == "decision" && e["decision"] == "allow")
        .count();
    // Every request that reached the origin has its decision and its close on record.
    assert_eq!(allowed, origin.connections(), "{events:#?}");
    assert_eq!(served.len(), origin.connections(), "{events:#?}");
    assert!(
        events
            .iter()
            .any(|e| e["reason_code"] == "audit_unavailable" && e["status"] == 503),
        "{events:#?}"
    );
}

/// Hostile review (2026-11-28), as the client: a request decided while the audit log could
/// be written and let through only after a wait must not pass once the log has failed. A
/// tunnel's allow is recorded when its first bytes come; the disk fills during the wait;
/// those bytes go nowhere, and the tunnel's one decision is the 503's deny. Before, the
/// core checked the log only when it decided, and the bytes reached the origin.
#[test]
fn a_tunnel_whose_first_bytes_come_after_the_log_failed_carries_nothing() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("allowed.test", &["127.0.0.1"])));
    let port = origin.port();
    let (mut p, dir, inside) = proxy_over_a_small_tmpfs(&dns, &format!("allowed.test:{port}"));

    // Answered 200; the proxy waits for the tunnel's first bytes (10 s by default).
    let mut tunnel = TcpStream::connect(p.addr).unwrap();
    tunnel.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    tunnel
        .write_all(
            format!("CONNECT allowed.test:{port} HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n").as_bytes(),
        )
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
        assert_eq!(tunnel.read(&mut byte).unwrap(), 1, "the proxy closed: {head:?}");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );

    fill(&inside.join("filler"));
    let url = format!("http://allowed.test:{port}/after-the-fill");
    let seen = until_status(&p.url(), &url, "503", 50);
    assert_eq!(
        seen.last().map(String::as_str),
        Some("503"),
        "never refused: {seen:?}"
    );

    tunnel
        .write_all(b"GET /through-the-tunnel HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = tunnel.read_to_end(&mut answer);
    assert!(
        answer.is_empty(),
        "the tunnel carried an answer while the log could not be written: {}",
        String::from_utf8_lossy(&answer)
    );
    assert!(
        !origin
            .requests()
            .iter()
            .any(|r| r.contains("/through-the-tunnel")),
        "the tunnel's bytes reached the origin: {:?}",
        origin.requests()
    );

    // Space again: the log has the tunnel's one decision, the 503's deny, and no allow.
    let events = recover_and_stop(&mut p, dir.path(), &inside, &url);
    let tunnel_decisions: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "decision" && e["method"] == "CONNECT")
        .collect();
    assert_eq!(tunnel_decisions.len(), 1, "{tunnel_decisions:#?}");
    assert_eq!(tunnel_decisions[0]["decision"], "deny", "{tunnel_decisions:#?}");
    assert_eq!(tunnel_decisions[0]["reason_code"], "audit_unavailable");
}

/// Issue 29: with an audit log that cannot be written (`/dev/full`), every front end refuses
/// every new request the same way, the egress core's 503, each in its own terms: HTTP/1
/// CONNECT and absolute-form with 503 and `Proxy-Status`, SOCKS5 with a general failure
/// (0x01); not a connection reaches the origins. (A central's node streams: central_e2e.)
/// Unlike the others here, this one passed before issue 29's fix, when HTTP/1 and SOCKS5
/// each had a check of their own; it pins the core's one check and fails without it.
#[test]
fn an_unwritable_audit_log_refuses_http1_and_socks5_alike() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let echo = rt.block_on(sandgate_testkit::echo::EchoServer::start());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("allowed.test", &["127.0.0.1"])));
    let (web, tunnel) = (
        format!("allowed.test:{}", origin.port()),
        format!("allowed.test:{}", echo.addr().port()),
    );
    let mut args = base_args(&dns);
    args.extend(
        [
            "--allow",
            &web,
            "--allow",
            &tunnel,
            "--socks-listen",
            "127.0.0.1:0",
        ]
        .map(String::from),
    );
    let full = Some(Path::new("/dev/full").to_path_buf());
    let mut p = ProxyProcess::start_with_audit(Command::new(common::sandgate_bin()), full, &strs(&args));
    let socks = p.listener(&["role=socks5"]);
    let get = format!("GET http://{web}/ HTTP/1.1\r\nHost: {web}\r\nConnection: close\r\n\r\n");
    // The first request may pass (decided before the writer first failed); its events are
    // the first the proxy cannot write.
    let _ = common::raw(p.addr, get.as_bytes());
    assert!(
        p.log_line("cannot write the audit log").is_some(),
        "the proxy never noticed: {}",
        p.log_text()
    );
    let served = origin.connections();

    let connect = format!("CONNECT {tunnel} HTTP/1.1\r\nHost: {tunnel}\r\n\r\nping");
    let mut ids = Vec::new();
    for i in 0..3 {
        for (what, request) in [("CONNECT", &connect), ("absolute-form", &get)] {
            let reply = common::raw(p.addr, request.as_bytes());
            assert!(reply.starts_with("HTTP/1.1 503"), "{what} {i}: {reply}");
            ids.extend(
                reply
                    .split("request id: ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .map(str::to_owned),
            );
            assert!(
                reply.contains("Proxy-Status: sandgate; error=proxy_internal_error")
                    && reply.contains("audit log cannot be written"),
                "{what} {i}: {reply}"
            );
        }
        assert_eq!(
            socks5_connect(socks, "allowed.test", echo.addr().port()),
            0x01,
            "SOCKS5 {i}"
        );
    }
    assert_eq!(
        origin.connections(),
        served,
        "a refused request reached the origin"
    );
    assert_eq!(echo.connections(), 0, "a refused tunnel reached the origin");

    // Nothing decided is lost: at shutdown every decision the log could not take is on
    // stderr, each refusal's request id among them.
    assert_eq!(ids.len(), 6, "every HTTP/1 refusal names its request id");
    p.terminate();
    for id in &ids {
        // The drain thread may still be reading the last lines: waits up to 5 s for each.
        assert!(p.log_line(id).is_some(), "{id} not on stderr: {}", p.log_text());
    }
}

/// A SOCKS5 CONNECT (no login) to `host:port` with the tunnel's first bytes behind it: the
/// reply code (RFC 1928 section 6), after which nothing may come back (at most 10 s).
fn socks5_connect(socks: std::net::SocketAddr, host: &str, port: u16) -> u8 {
    let mut s = TcpStream::connect(socks).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut method = [0u8; 2];
    s.read_exact(&mut method).unwrap();
    assert_eq!(method, [5, 0]);
    let mut request = vec![5, 1, 0, 3, host.len() as u8];
    request.extend_from_slice(host.as_bytes());
    request.extend_from_slice(&port.to_be_bytes());
    request.extend_from_slice(b"ping");
    s.write_all(&request).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "bytes came back after reply {}: {rest:?}",
        reply[1]
    );
    reply[1]
}

/// Item 9: a proxy whose audit log cannot be opened serves nothing: it does not start.
#[test]
fn a_proxy_with_an_unwritable_audit_log_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir").join("audit.jsonl");
    let out = Command::new(common::sandgate_bin())
        .args([
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--allow",
            "a.test",
            "--audit-log",
        ])
        .arg(&missing)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("cannot open the audit log"), "{stderr}");
}

/// Item 10: through a wildcard listener, a name resolving to one of the host's own
/// addresses must not lead back into the proxy (any of its listeners or its metrics port)
/// or to any other local service. Runs in a private network namespace whose loopback
/// carries 8.8.8.8, a public address, as a cloud VM's NIC would.
#[test]
fn the_hosts_own_addresses_do_not_lead_back_into_the_proxy() {
    if common::rerun_in_private_netns_with(
        "the_hosts_own_addresses_do_not_lead_back_into_the_proxy",
        "ip addr add 8.8.8.8/32 dev lo",
    ) {
        return;
    }
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new().with("self.test", &["8.8.8.8"])));
    // A local service on every address, as sshd or a database often is.
    let service = TcpListener::bind("0.0.0.0:0").unwrap();
    let service_port = service.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in service.incoming().take(8) {
            drop(s);
        }
    });
    let dns_addr = dns.addr().to_string();
    // `*` is the usual ports only (issue 30), so each port is named in a policy file: the
    // proxy's own once it has bound them, by a reload.
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    let allow = |ports: &[u16]| {
        let entries: Vec<String> = ports.iter().map(|p| format!("\"self.test:{p}\"")).collect();
        let staged = dir.path().join("policy.yaml.new");
        std::fs::write(
            &staged,
            format!(
                "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: self }}\nspec:\n  network:\n    allowlist: [ {} ]\n",
                entries.join(", ")
            ),
        )
        .unwrap();
        std::fs::rename(&staged, &policy).unwrap();
    };
    let reload = |p: &ProxyProcess, ports: &[u16]| {
        allow(ports);
        let pid = p.child.id().to_string();
        Command::new("kill").args(["-HUP", &pid]).status().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !common::read_audit(&p.audit_path)
            .iter()
            .any(|e| e["event"] == "policy_reload" && e["outcome"] == "applied")
        {
            assert!(
                std::time::Instant::now() < deadline,
                "no reload:\n{}",
                p.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    allow(&[service_port]);
    let start = |extra: &[&str]| {
        let mut args = vec![
            "--dns-server",
            &dns_addr,
            "--policy",
            policy.to_str().unwrap(),
            "--listen",
            "0.0.0.0:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        ProxyProcess::start(&args)
    };
    let p = start(&[]);
    let addrs = p.listening(3);
    assert_eq!(addrs.len(), 3, "{:?}", p.log.lock().unwrap());
    let wildcard = addrs.iter().find(|a| a.ip().is_unspecified()).unwrap().port();
    let metrics = addrs
        .iter()
        .find(|a| *a != &p.addr && !a.ip().is_unspecified())
        .unwrap()
        .port();
    reload(&p, &[wildcard, metrics, p.addr.port(), service_port]);
    for (port, what) in [
        (wildcard, "this proxy"),
        (metrics, "this proxy"),
        (p.addr.port(), "this proxy"),
        (service_port, "host_address"),
    ] {
        let (status, head) = status_from("127.0.0.1", p.addr, &format!("self.test:{port}"));
        assert_eq!(status, 403, "self.test:{port} ({what}) was not refused:\n{head}");
        assert!(head.contains(what), "self.test:{port}: {head}");
    }
    // An operator may open one of the host's addresses for local services, but never the
    // proxy's own ports.
    allow(&[service_port]);
    let p = start(&["--allow-range", "8.8.8.8/32"]);
    let addrs = p.listening(3);
    let wildcard = addrs.iter().find(|a| a.ip().is_unspecified()).unwrap().port();
    reload(&p, &[wildcard, service_port]);
    assert_eq!(
        status_from("127.0.0.1", p.addr, &format!("self.test:{service_port}")).0,
        200
    );
    let (status, head) = status_from("127.0.0.1", p.addr, &format!("self.test:{wildcard}"));
    assert_eq!(status, 403, "{head}");
    assert!(head.contains("this proxy"), "{head}");
}

/// Item 11: one tenant holding idle connections must not starve the others. With two
/// listeners and a cap of 40, a client parking connections on one listener is stopped at
/// that listener's share and answered 503 (never left hanging), while another listener's
/// client is still served; on one listener, one client address alone may go past its share
/// (issue 32) but is stopped where a quarter of the slots stays free, and another address
/// is served.
#[test]
fn one_tenant_holding_idle_connections_does_not_starve_the_others() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("allowed.test", &["127.0.0.1"])));
    let allow = format!("allowed.test:{}", origin.port());
    let mut args = base_args(&dns);
    args.extend([
        "--allow".into(),
        allow.clone(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--max-connections".into(),
        "40".into(),
    ]);
    let p = ProxyProcess::start(&strs(&args));
    let addrs = p.listening(2);
    let other = *addrs.iter().find(|a| **a != p.addr).unwrap();
    // The greedy tenant opens idle connections on the first listener until refused.
    let mut parked = Vec::new();
    let mut refused = None;
    for i in 0..41 {
        // From four addresses, so the per-client share (10) is not what stops it.
        let mut s = connect_from(&format!("127.0.0.{}", 2 + i % 4), p.addr);
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut byte = [0u8; 64];
        match s.read(&mut byte) {
            // Served connections say nothing until asked; a refused one is answered at once.
            Err(_) => parked.push(s),
            Ok(n) => {
                refused = Some(String::from_utf8_lossy(&byte[..n]).into_owned());
                break;
            }
        }
    }
    let refused = refused.unwrap_or_else(|| panic!("{} idle connections and never refused", parked.len()));
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert_eq!(
        parked.len(),
        20,
        "a listener's default share of 40 with two listeners"
    );
    // Another tenant, on the other listener, is served.
    let (status, head) = status_from("127.0.0.3", other, &allow);
    assert_eq!(status, 200, "{head}");
    drop(parked);

    // On one listener, one client address alone may hold all but a quarter of the cap by
    // default: past its share of 10 while 10 slots stay free for others.
    let mut args = base_args(&dns);
    args.extend([
        "--allow".into(),
        allow.clone(),
        "--max-connections".into(),
        "40".into(),
    ]);
    let p = ProxyProcess::start(&strs(&args));
    let parked: Vec<TcpStream> = (0..30).map(|_| connect_from("127.0.0.2", p.addr)).collect();
    let (status, head) = status_from("127.0.0.2", p.addr, &allow);
    assert_eq!(status, 503, "{head}");
    assert!(head.contains("error=connection_limit_reached"), "{head}");
    assert_eq!(status_from("127.0.0.3", p.addr, &allow).0, 200);
    drop(parked);
    let events = p.audit_events(4);
    // Refused once, the 31st: every one of the 30 parked was served.
    let refused = events
        .iter()
        .filter(|e| {
            e["reason_code"] == "connection_limit:client"
                && e["client_addr"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("127.0.0.2:"))
        })
        .count();
    assert_eq!(refused, 1, "{events:#?}");
}

/// Item 11: an explicit cap the open-file limit cannot carry is refused at start, naming
/// the numbers; a default cap shrinks to fit.
#[test]
fn a_connection_cap_beyond_the_open_file_limit_is_refused_at_start() {
    let child = Command::new("prlimit")
        .args(["--nofile=1024:1024", "--"])
        .arg(common::sandgate_bin())
        .args([
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--max-connections",
            "5000",
            "--audit-log",
            "/dev/null",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stderr) = common::exit_of(
        child,
        Duration::from_secs(10),
        "started with 5000 connections allowed and 1024 descriptors",
    );
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("the limit is 1024"), "{stderr}");
}

/// This whole file again as `nobody` when the tests run as root (as in CI): every attack
/// above must fail the same way against an unprivileged proxy.
/// The attacker reaches the admin listener (no token needed) and holds connections to it
/// open and idle: each would hold one of the descriptors the proxy keeps back for its
/// resolver and upstream dials. Beyond the admin cap a connection is closed at once; those
/// within it are served, and their slots come back when they close.
#[test]
fn idle_connections_to_the_admin_listener_are_capped() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dns_addr = dns.addr().to_string();
    let p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow",
        "a.example",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let addrs = p.listening(2);
    let admin = *addrs.iter().find(|a| **a != p.addr).unwrap();
    let get = |s: &mut TcpStream, path: &str| -> String {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    let mut held: Vec<TcpStream> = (0..64).map(|_| TcpStream::connect(admin).unwrap()).collect();
    for n in 0..4 {
        let mut extra = TcpStream::connect(admin).unwrap();
        extra.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let read = extra.read(&mut [0u8; 1]);
        let closed = match &read {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        };
        assert!(closed, "connection {} beyond the cap was held: {read:?}", 65 + n);
    }
    let answer = get(&mut held[0], "/metrics");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let answer = TcpStream::connect(admin)
            .map(|mut s| get(&mut s, "/healthz"))
            .unwrap_or_default();
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no slot came back: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_hardening_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody(
        "hardening_e2e",
        "the_hardening_suite_passes_as_an_ordinary_user",
        7,
    );
}
