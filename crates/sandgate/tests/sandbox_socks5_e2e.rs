//! SOCKS5 inside `sandgate run`: the proxied modes give the command a SOCKS5 port (named in
//! `ALL_PROXY=socks5h://127.0.0.1:1080` with `net.proxy.all_proxy: socks5`, as here; the
//! HTTP proxy otherwise) over a bridge of its own, decided by the run's
//! policy under the run's task and audited as `scheme: socks5`. From inside, the SOCKS5 port
//! reaches only what the policy allows (guarded addresses, unlisted ports and host loopback
//! stay out of reach); from the host, no other process can use the run's listeners. Chained
//! (`net.mode: proxy`) there is no SOCKS5 port yet. The whole file runs again as `nobody`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;
mod sandbox_support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;
use serde_json::Value;

use common::runtime;
use sandbox_support::{eventually, run, text, wait_bounded, write_policy};

/// A SOCKS5 client in plain Python (Debian's python3 inside has no PySocks): it takes the
/// proxy from `ALL_PROXY`, as a program configured by the environment would, and prints one
/// line per request: `NAME reply=CODE` and, when the tunnel opened, the origin's status line.
const SOCKS_CLIENT: &str = r#"
import os, socket, struct, sys, urllib.parse

proxy = urllib.parse.urlsplit(os.environ["ALL_PROXY"])
print("scheme", proxy.scheme, proxy.hostname, proxy.port)

def exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise EOFError("closed after %d bytes" % len(data))
        data += chunk
    return data

def socks(command, address, port):
    s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
    s.sendall(b"\x05\x01\x00")
    assert exact(s, 2) == b"\x05\x00"
    if isinstance(address, bytes):
        dest = b"\x01" + address
    else:
        dest = b"\x03" + bytes([len(address)]) + address.encode()
    s.sendall(b"\x05" + bytes([command]) + b"\x00" + dest + struct.pack(">H", port))
    head = exact(s, 4)
    rest = {1: 4, 4: 16}.get(head[3])
    exact(s, (rest if rest is not None else exact(s, 1)[0]) + 2)
    return s, head[1]

def get(name, host, port, path="/"):
    s, code = socks(1, host, port)
    line = "%s reply=%d" % (name, code)
    if code == 0:
        s.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n" % (path, host, port)).encode())
        line += " " + s.makefile("rb").readline().decode().strip()
    print(line)

def direct(name, host, port):
    try:
        socket.create_connection((host, port), timeout=3)
        print(name, "connected")
    except OSError as e:
        print(name, "failed", type(e).__name__)

for spec in sys.argv[1:]:
    kind, name, host, port = spec.split(",")
    if kind == "get":
        get(name, host, int(port), "/" + name)
    elif kind == "ip":
        get(name, socket.inet_aton(host), int(port))
    elif kind in ("bind", "udp"):
        _, code = socks(2 if kind == "bind" else 3, host, int(port))
        print("%s reply=%d" % (name, code))
    else:
        direct(name, host, int(port))
"#;

fn allowlist(dns: &DnsServer, allow: &[String]) -> String {
    let quoted: Vec<String> = allow.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "net:\n  mode: allowlist\n  allow_domains: [ {} ]\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\n  proxy: {{ all_proxy: socks5 }}\n",
        quoted.join(", "),
        dns.addr()
    )
}

fn audited(events: &[Value], scheme: &str) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["event"] == "decision" && e["scheme"] == scheme)
        .map(|e| {
            (
                e["destination_host"].as_str().unwrap_or_default().to_owned(),
                e["reason_code"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn curl_and_python_reach_an_allowed_origin_through_the_socks5_port() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("denied.test", &["127.0.0.1"]),
    ));
    let port = origin.port();
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), &allowlist(&dns, &[format!("allowed.test:{port}")]));
    let audit = dir.path().join("audit.jsonl");
    let script = format!(
        r#"
echo "env ALL_PROXY=$ALL_PROXY all_proxy=$all_proxy http_proxy=$http_proxy HTTPS_PROXY=$HTTPS_PROXY"
curl -sS -m 10 -o /dev/null -w "curl-socks=%{{http_code}}\n" --socks5-hostname 127.0.0.1:1080 http://allowed.test:{port}/curl-socks
curl -sS -m 10 -o /dev/null --socks5-hostname 127.0.0.1:1080 http://denied.test:{port}/ || echo "curl-socks-denied exit=$?"
curl -sS -m 10 -o /dev/null -w "curl-env=%{{http_code}}\n" http://allowed.test:{port}/curl-env
python3 -c '{SOCKS_CLIENT}' get,python,allowed.test,{port} get,python-denied,denied.test,{port}
"#
    );
    let out = run(
        &policy,
        &["--audit-log", audit.to_str().unwrap()],
        &["sh", "-c", &script],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for want in [
        "env ALL_PROXY=socks5h://127.0.0.1:1080 all_proxy=socks5h://127.0.0.1:1080 http_proxy=http://127.0.0.1:3128 HTTPS_PROXY=http://127.0.0.1:3128",
        "curl-socks=200",
        // curl exits 97 when the SOCKS5 proxy refuses the CONNECT.
        "curl-socks-denied exit=97",
        "curl-env=200",
        "scheme socks5h 127.0.0.1 1080",
        "python reply=0 HTTP/1.1 200 OK",
        "python-denied reply=2",
    ] {
        assert!(stdout.contains(want), "missing {want:?}:\n{stdout}\n{stderr}");
    }
    assert!(
        stderr.contains(&format!("blocked: denied.test:{port} (not allowlisted), 2 times")),
        "{stderr}"
    );
    assert_eq!(origin.connections(), 3, "the three allowed requests only");
    let events = common::read_audit(&audit);
    let allowed = ("allowed.test".to_owned(), "allowlisted".to_owned());
    let denied = ("denied.test".to_owned(), "not_allowlisted".to_owned());
    assert_eq!(
        audited(&events, "socks5"),
        [allowed.clone(), denied.clone(), allowed.clone(), denied],
        "{events:#?}"
    );
    assert_eq!(
        audited(&events, "http"),
        [allowed],
        "curl keeps http_proxy for http: {events:#?}"
    );
    let tasks: std::collections::BTreeSet<&str> =
        events.iter().filter_map(|e| e["task_id"].as_str()).collect();
    assert_eq!(tasks.len(), 1, "one run, one task: {tasks:?}");
    assert!(tasks.iter().all(|t| t.starts_with("run-")), "{tasks:?}");
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "close" && e["scheme"] == "socks5" && e["outcome"] == "ok"),
        "{events:#?}"
    );
}

#[test]
fn from_inside_the_socks5_port_reaches_only_what_the_policy_allows() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let other = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("inside.test", &["10.1.2.3"])
            .with("meta.test", &["169.254.169.254"])
            .with("mapped.test", &["::ffff:10.1.2.3"]),
    ));
    let (port, other_port) = (origin.port(), other.port());
    let dir = tempfile::tempdir().unwrap();
    // Guarded names are listed, so only the address guard can refuse them.
    let policy = write_policy(
        dir.path(),
        &allowlist(
            &dns,
            &[
                format!("allowed.test:{port}"),
                "inside.test:80".to_owned(),
                "meta.test:80".to_owned(),
                "mapped.test:80".to_owned(),
            ],
        ),
    );
    let audit = dir.path().join("audit.jsonl");
    let requests = [
        "get,allowed,allowed.test,".to_owned() + &port.to_string(),
        "get,private,inside.test,80".to_owned(),
        "get,metadata,meta.test,80".to_owned(),
        "get,mapped,mapped.test,80".to_owned(),
        format!("get,unlisted-port,allowed.test,{other_port}"),
        format!("ip,loopback-literal,127.0.0.1,{port}"),
        format!("ip,other-loopback,127.0.0.1,{other_port}"),
        "get,localhost,localhost,3128".to_owned(),
        "bind,bind,allowed.test,80".to_owned(),
        "udp,udp,allowed.test,80".to_owned(),
        format!("direct,direct-origin,127.0.0.1,{port}"),
        format!("direct,direct-other,127.0.0.1,{other_port}"),
        "direct,direct-private,10.1.2.3,80".to_owned(),
    ];
    let mut command = vec!["python3", "-c", SOCKS_CLIENT];
    command.extend(requests.iter().map(String::as_str));
    let out = run(&policy, &["--audit-log", audit.to_str().unwrap()], &command);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for want in [
        "allowed reply=0 HTTP/1.1 200 OK",
        // 0x02: not allowed by the ruleset (RFC 1928 section 6), for every refusal.
        "private reply=2",
        "metadata reply=2",
        "mapped reply=2",
        "unlisted-port reply=2",
        "loopback-literal reply=2",
        "other-loopback reply=2",
        "localhost reply=2",
        // 0x07: command not supported.
        "bind reply=7",
        "udp reply=7",
        // The sandbox's loopback is its own: nothing of the host's listens there.
        "direct-origin failed ConnectionRefusedError",
        "direct-other failed ConnectionRefusedError",
        "direct-private failed",
    ] {
        assert!(
            stdout.lines().any(|l| l.starts_with(want)),
            "missing {want:?}:\n{stdout}\n{stderr}"
        );
    }
    assert!(!stdout.contains("connected"), "{stdout}");
    assert_eq!(origin.connections(), 1, "only the allowed request");
    assert_eq!(other.connections(), 0, "an unlisted host port was reached");
    let events = common::read_audit(&audit);
    let reasons: Vec<String> = audited(&events, "socks5").into_iter().map(|(_, r)| r).collect();
    assert_eq!(
        reasons,
        [
            "allowlisted",
            "destination_ip_prohibited",
            "destination_ip_prohibited",
            "destination_ip_prohibited",
            "not_allowlisted",
            "not_allowlisted",
            "not_allowlisted",
            "not_allowlisted",
        ],
        "{events:#?}"
    );
}

/// The TCP ports `pid` listens on (its sockets, found in /proc/net/tcp by inode).
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|t| {
                    let t = t.to_string_lossy().into_owned();
                    Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is ADDR:PORT in hex; state 0A is LISTEN; field 9 the inode.
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            (*state == "0A" && inodes.iter().any(|i| i == inode))
                .then(|| u16::from_str_radix(local.rsplit(':').next()?, 16).ok())?
        })
        .collect()
}

#[test]
fn no_other_host_process_can_use_the_runs_socks5_listener() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        "net:\n  mode: allowlist\n  allow_domains: [ \"*\" ]\n",
    );
    let mut child = Command::new(common::sandgate_bin())
        .args(["run", "--quiet", "--policy", policy.to_str().unwrap(), "--"])
        // The command lasts until the test closes its stdin, however slow the machine.
        .args(["sh", "-c", "read -r line; true"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let told = child.stdin.take();
    let mut ports = Vec::new();
    // Returns as soon as both listen; the bound only ends a run that never gets there.
    if !eventually(Duration::from_secs(60), || {
        ports = listening_ports(pid);
        ports.len() >= 2
    }) {
        drop(told);
        let _ = child.kill();
        let _ = child.wait();
        let mut stderr = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
        panic!("the run's proxy listeners: {ports:?}\n{stderr}");
    }
    assert_eq!(ports.len(), 2, "an HTTP and a SOCKS5 listener: {ports:?}");
    for port in &ports {
        // A SOCKS5 greeting and an HTTP CONNECT: the proxy closes the connection of any
        // peer its bridges did not register, before reading a byte, so neither is answered.
        for hello in [&b"\x05\x01\x00"[..], b"CONNECT a.example:443 HTTP/1.1\r\n\r\n"] {
            let mut s = match TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], *port))) {
                Ok(s) => s,
                Err(e) => {
                    drop(told);
                    let _ = wait_bounded(&mut child);
                    let mut stderr = String::new();
                    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
                    panic!("port {port} of a live run refused a connection ({e}): {stderr}");
                }
            };
            // A peer the proxy served would have its answer in milliseconds; the bound only
            // keeps a proxy that holds the connection open from hanging the test.
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let _ = s.write_all(hello);
            let mut reply = Vec::new();
            // Closed (or reset) with nothing said, not held open until the read timeout.
            let closed = match s.read_to_end(&mut reply) {
                Ok(_) => true,
                Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            };
            assert!(
                closed && reply.is_empty(),
                "port {port} answered a host peer: {reply:?}"
            );
        }
    }
    drop(told);
    let status = wait_bounded(&mut child);
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    assert!(status.success(), "{stderr}");
}

/// Chained (`net.mode: proxy`), the SOCKS5 port works too: each SOCKS5 tunnel is asked of
/// the upstream proxy as a CONNECT, after the run's own allowlist. A tunnel to a host the
/// run allows but the upstream refuses fails; one the run refuses never reaches upstream.
#[test]
fn proxy_mode_chains_socks5_through_the_upstream() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("central-only.test", &["127.0.0.1"]),
    ));
    let port = origin.port();
    let dns_addr = dns.addr().to_string();
    let allow = format!("allowed.test:{port}");
    let central_only = format!("central-only.test:{port}");
    let central = common::ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &allow,
        "--allow",
        &central_only,
    ]);
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        &format!(
            "net:\n  mode: proxy\n  allow_domains: [ \"{allow}\" ]\n  proxy: {{ upstream: \"{}\", all_proxy: socks5 }}\n",
            central.addr
        ),
    );
    let script = format!(
        "echo \"ALL_PROXY=$ALL_PROXY\"; \
         curl -sS -m 10 -o /dev/null -w 'socks=%{{http_code}}\\n' --socks5-hostname 127.0.0.1:1080 http://{allow}/chained; \
         curl -sS -m 10 -o /dev/null --socks5-hostname 127.0.0.1:1080 http://{central_only}/ 2>/dev/null || echo local_refusal=$?"
    );
    let out = run(&policy, &[], &["sh", "-c", &script]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // curl exit 97: the SOCKS5 proxy refused (the run's allowlist does not list it).
    for want in [
        "ALL_PROXY=socks5h://127.0.0.1:1080",
        "socks=200",
        "local_refusal=97",
    ] {
        assert!(stdout.contains(want), "missing {want:?}:\n{stdout}\n{stderr}");
    }
    assert_eq!(origin.connections(), 1);
    let central_events = central.audit_events(2);
    assert!(
        !central_events
            .iter()
            .any(|e| e["destination_host"] == "central-only.test"),
        "{central_events:#?}"
    );
}

/// Fail closed: the init checks every forward before it starts the command, the SOCKS5
/// port's included. Here the HTTP proxy's bridge answers ready and the SOCKS5 one is
/// missing, or answers that nothing is behind it.
#[test]
fn the_command_does_not_start_without_the_socks5_bridge() {
    let dir = tempfile::tempdir().unwrap();
    let http = dir.path().join("proxy.sock");
    let broken = dir.path().join("socks.sock");
    let marker = dir.path().join("ran");
    // The host side of a bridge, reduced to its status byte: READY (0) for the HTTP proxy,
    // UNREACHABLE (1) and a reason for the SOCKS5 listener.
    let serve = |path: &std::path::Path, reply: &'static [u8]| {
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let _ = stream.write_all(reply);
            }
        });
    };
    serve(&http, b"\x00");
    // Run here rather than in a sandbox's network namespace, the init listens on the host's
    // loopback: on ports the system picks (the command never connects to them).
    let init = |socks: &std::path::Path| {
        Command::new(common::sandgate_bin())
            .arg("sandbox-init")
            .args(["--build", sandgate_sandbox::steps::BUILD])
            .arg(format!("--forward=127.0.0.1:0={}", http.display()))
            .arg(format!("--forward=127.0.0.1:0={}", socks.display()))
            .args(["--", "touch"])
            .arg(&marker)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = init(&broken);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(70), "{stderr}");
    assert!(
        stderr.contains("bridge not ready") && stderr.contains("socks.sock"),
        "{stderr}"
    );
    serve(
        &broken,
        b"\x01nothing answers on the run's SOCKS5 proxy: Connection refused",
    );
    let out = init(&broken);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(70), "{stderr}");
    assert!(
        stderr.contains("nothing answers on the run's SOCKS5 proxy"),
        "{stderr}"
    );
    assert!(!marker.exists(), "the command ran without its SOCKS5 bridge");
}

/// The whole file again as `nobody`.
#[test]
fn the_sandbox_socks5_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody(
        "sandbox_socks5_e2e",
        "the_sandbox_socks5_suite_passes_as_an_ordinary_user",
        5,
    );
}
