//! Regression tests for the proxy half of the hostile review (issue 16), each written as the
//! attacker or the failing environment would act: a disk that fills under the audit log, a
//! client that tunnels back into the proxy through one of the host's own addresses, a
//! tenant holding thousands of idle connections, a task that borrows another's identity,
//! an origin sending hop-by-hop fields in an interim response, a name resolving to a denied
//! address, and Host fields that are not one authority. Every test here failed on the code
//! before the fix (see the session note); the whole file also runs as `nobody`.

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
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{ProxyProcess, curl, raw, runtime, status_of};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;
use serde_json::Value;

/// Arguments for a proxy that treats loopback as public (the origins live there) and asks
/// `dns` only.
fn base_args(dns: &DnsServer) -> Vec<String> {
    vec![
        "--dns-server".into(),
        dns.addr().to_string(),
        "--allow-range".into(),
        "127.0.0.0/8".into(),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

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

/// Item 9: an audit log that cannot be written stops traffic (503 naming the cause), the
/// writer recovers by itself when space returns, and no event is lost or torn.
#[test]
fn a_full_disk_under_the_audit_log_stops_traffic_and_loses_no_event() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("allowed.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("audit");
    std::fs::create_dir(&mnt).unwrap();
    // The proxy runs in a mount namespace of its own with a 1 MiB tmpfs for its audit log;
    // the test reaches that tmpfs through /proc/PID/root. A shell holds the namespace,
    // passes SIGTERM on, and copies the log out once the proxy has exited.
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "--mount", "--", "sh", "-c"])
        .arg(
            "mount -t tmpfs -o size=1m tmpfs \"$0\" || exit 1; \"$@\" & pid=$!; \
             trap 'kill -TERM $pid' TERM; wait $pid; wait $pid; cp \"$0/audit.jsonl\" \"$0.copy\"",
        )
        .arg(&mnt)
        .arg(common::sandgate_bin());
    let allow = format!("allowed.test:{}", origin.port());
    let mut args = base_args(&dns);
    args.extend([
        "--allow".into(),
        allow,
        "--audit-fsync-interval".into(),
        "0".into(),
    ]);
    let mut p = ProxyProcess::start_with_audit(cmd, Some(mnt.join("audit.jsonl")), &strs(&args));
    let inside = Path::new("/proc")
        .join(p.child.id().to_string())
        .join("root")
        .join(mnt.strip_prefix("/").unwrap());
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

    std::fs::remove_file(inside.join("filler")).unwrap();
    let seen = until_status(&p.url(), &url(4), "200", 50);
    assert_eq!(
        seen.last().map(String::as_str),
        Some("200"),
        "never recovered: {seen:?}"
    );
    assert!(p.terminate().success());

    let events: Vec<Value> = std::fs::read_to_string(dir.path().join("audit.copy"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("torn or bad line {l:?}: {e}")))
        .collect();
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

/// Sends a CONNECT for `target` and returns the status line's code and the head (reads only
/// the response head, so an opened tunnel does not hold the test up).
fn connect_status(proxy: SocketAddr, target: &str) -> (u16, String) {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    (status_of(&text), text)
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
    let start = |extra: &[&str]| {
        let mut args = vec![
            "--dns-server",
            &dns_addr,
            "--allow",
            "*",
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
    for (port, what) in [
        (wildcard, "this proxy"),
        (metrics, "this proxy"),
        (p.addr.port(), "this proxy"),
        (service_port, "host_address"),
    ] {
        let (status, head) = connect_status(p.addr, &format!("self.test:{port}"));
        assert_eq!(status, 403, "self.test:{port} ({what}) was not refused:\n{head}");
        assert!(head.contains(what), "self.test:{port}: {head}");
    }
    // An operator may open one of the host's addresses for local services, but never the
    // proxy's own ports.
    let p = start(&["--allow-range", "8.8.8.8/32"]);
    let addrs = p.listening(3);
    let wildcard = addrs.iter().find(|a| a.ip().is_unspecified()).unwrap().port();
    assert_eq!(
        connect_status(p.addr, &format!("self.test:{service_port}")).0,
        200
    );
    let (status, head) = connect_status(p.addr, &format!("self.test:{wildcard}"));
    assert_eq!(status, 403, "{head}");
}
