//! Fixtures of the central-mode tests: certificates made with `sandgate pki`, central
//! proxies with a `role: node` listener, node-local proxies with `--upstream https://`.

#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test fixtures: a failed setup is a failed test"
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{ProxyProcess, sandgate_bin};

/// A CA and certificates in a temporary directory (world-readable, so a proxy run as
/// `nobody` can read them).
pub struct Pki {
    pub dir: tempfile::TempDir,
}

pub fn pki(args: &[&str], dir: &Path) -> (i32, String, String) {
    let out = Command::new(sandgate_bin())
        .arg("pki")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("run sandgate pki");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

impl Pki {
    /// A CA, a central certificate for 127.0.0.1 and a node certificate for `node-a`.
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        for args in [
            &["init"][..],
            &["issue", "--central", "127.0.0.1"],
            &["issue", "--node", "node-a"],
        ] {
            let (code, _, err) = pki(args, d);
            assert_eq!(code, 0, "pki {args:?}: {err}");
        }
        let pki = Pki { dir };
        pki.open_up();
        pki
    }

    /// Makes every file readable by anyone (tests run proxies as nobody too).
    pub fn open_up(&self) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for e in std::fs::read_dir(self.dir.path()).unwrap() {
            let p = e.unwrap().path();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Issues a node certificate (`extra`: more `pki issue` flags).
    pub fn node(&self, name: &str, extra: &[&str]) -> NodeCert {
        let mut args = vec!["issue", "--node", name, "--force"];
        args.extend_from_slice(extra);
        let (code, _, err) = pki(&args, self.dir.path());
        assert_eq!(code, 0, "pki {args:?}: {err}");
        self.open_up();
        NodeCert {
            cert: self.path(&format!("node-{name}.pem")),
            key: self.path(&format!("node-{name}.key")),
            ca: self.path("ca.pem"),
        }
    }
}

/// A node's TLS files.
#[derive(Clone)]
pub struct NodeCert {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA the central's certificate chains to.
    pub ca: PathBuf,
}

/// A central proxy: the process, its node listener, its plain listener.
pub struct Central {
    pub proxy: ProxyProcess,
    pub node_addr: SocketAddr,
    /// Its policy file (rewrite it and send SIGHUP to reload).
    pub policy: PathBuf,
}

/// Starts a central proxy whose policy `spec` body (YAML under `spec:`, two-space indented)
/// is completed with a `role: node` listener on the pki's central certificate.
pub fn central(pki: &Pki, dns: SocketAddr, spec: &str, extra: &[&str]) -> Central {
    central_on(pki, dns, spec, extra, "127.0.0.1:0")
}

/// As [`central`], its node listener on `listen`.
pub fn central_on(pki: &Pki, dns: SocketAddr, spec: &str, extra: &[&str], listen: &str) -> Central {
    central_logging_to(pki, dns, spec, extra, listen, None)
}

/// As [`central`], started by `command` (which must end by running sandgate: a test gives
/// it an environment of its own).
pub fn central_with(command: Command, pki: &Pki, dns: SocketAddr, spec: &str, extra: &[&str]) -> Central {
    central_started(command, pki, dns, spec, extra, "127.0.0.1:0", None)
}

/// As [`central`], writing its audit log at `audit` (`/dev/full`: a log that cannot be
/// written).
pub fn central_with_audit(pki: &Pki, dns: SocketAddr, spec: &str, extra: &[&str], audit: &Path) -> Central {
    central_logging_to(pki, dns, spec, extra, "127.0.0.1:0", Some(audit))
}

fn central_logging_to(
    pki: &Pki,
    dns: SocketAddr,
    spec: &str,
    extra: &[&str],
    listen: &str,
    audit: Option<&Path>,
) -> Central {
    central_started(Command::new(sandgate_bin()), pki, dns, spec, extra, listen, audit)
}

fn central_started(
    command: Command,
    pki: &Pki,
    dns: SocketAddr,
    spec: &str,
    extra: &[&str],
    listen: &str,
    audit: Option<&Path>,
) -> Central {
    let policy = pki.path(&format!("central-{}.yaml", unique_suffix()));
    let text = format!(
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: central }}\nspec:\n{spec}  listeners:\n    - listen: {listen}\n      role: node\n      tls: {{ cert: central-127.0.0.1.pem, key: central-127.0.0.1.key, client_ca: ca.pem }}\n"
    );
    std::fs::write(&policy, text).unwrap();
    let dns = dns.to_string();
    let mut args = vec![
        "--policy",
        policy.to_str().unwrap(),
        "--dns-server",
        &dns,
        "--allow-range",
        "127.0.0.0/8",
    ];
    args.extend_from_slice(extra);
    let proxy = ProxyProcess::start_with_audit(command, audit.map(Path::to_path_buf), &args);
    let node_addr = proxy.listener(&["role=node"]);
    Central {
        proxy,
        node_addr,
        policy,
    }
}

/// A suffix no other call in this test process returns, for file names.
pub fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The `--upstream` flags for `centrals` with `cert`.
pub fn upstream_args(cert: &NodeCert, centrals: &[SocketAddr]) -> Vec<String> {
    let mut args = Vec::new();
    for c in centrals {
        args.push("--upstream".to_owned());
        args.push(format!("https://{c}"));
    }
    for (flag, path) in [
        ("--upstream-ca", &cert.ca),
        ("--client-cert", &cert.cert),
        ("--client-key", &cert.key),
    ] {
        args.push(flag.to_owned());
        args.push(path.to_str().unwrap().to_owned());
    }
    args
}

/// Events of the audit log at `path` matching `pred`, waiting at most 5 s for at least `n`
/// (the audit is written by a thread of its own, so an answer can reach the client before
/// its line).
pub fn events_where(
    path: &Path,
    n: usize,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let mut found = Vec::new();
    crate::common::control::within(5, || {
        found = crate::common::read_audit(path)
            .into_iter()
            .filter(|e| pred(e))
            .collect();
        found.len() >= n
    });
    found
}

/// `net` of a sandbox policy whose run is a node of `centrals` (in that order) with `cert`,
/// its own allowlist `allow`.
pub fn run_net(allow: &[&str], centrals: &[SocketAddr], cert: &NodeCert) -> String {
    let quoted = |v: Vec<String>| {
        v.iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "net:\n  mode: proxy\n  allow_domains: [ {} ]\n  proxy:\n    upstream: [ {} ]\n    tls: {{ ca: {}, cert: {}, key: {} }}\n",
        quoted(allow.iter().map(|a| a.to_string()).collect()),
        quoted(centrals.iter().map(|c| format!("https://{c}")).collect()),
        cert.ca.display(),
        cert.cert.display(),
        cert.key.display()
    )
}

/// A node-local proxy: its own allowlist `allow` (flags), forwarding to `centrals`; its
/// listener's identity from a policy file when `identity` (task, project) is given. It has
/// no nameserver that answers: it must never need one.
pub fn node(
    cert: &NodeCert,
    centrals: &[SocketAddr],
    allow: &[&str],
    identity: Option<(&str, &str)>,
) -> Node {
    let mut args = upstream_args(cert, centrals);
    args.extend(["--dns-server".to_owned(), "127.0.0.1:9".to_owned()]);
    for a in allow {
        args.extend(["--allow".to_owned(), (*a).to_owned()]);
    }
    let policy_dir = tempfile::tempdir().unwrap();
    if let Some((task, project)) = identity {
        let p = policy_dir.path().join("node.yaml");
        std::fs::write(
            &p,
            format!("apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: node }}\nspec:\n  listeners:\n    - listen: 127.0.0.1:0\n      task: {task}\n      project: {project}\n      subject: ci-bot\n"),
        )
        .unwrap();
        args.extend(["--policy".to_owned(), p.to_str().unwrap().to_owned()]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let proxy = ProxyProcess::start(&refs);
    // The policy's listener carries the identity; the other is --listen's.
    let addr = match identity {
        Some((task, _)) => proxy.listener(&[&format!("task={task}")]),
        None => proxy.addr,
    };
    Node {
        proxy,
        addr,
        _dir: policy_dir,
    }
}

/// A running node-local proxy and the address of its attributed listener.
pub struct Node {
    pub proxy: ProxyProcess,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

/// Sends `CONNECT target` to `proxy` and reads the whole response head (at most 4 KiB, 10 s):
/// the head, and the stream (a tunnel when the head says 200).
pub fn connect(proxy: SocketAddr, target: &str) -> (String, std::net::TcpStream) {
    use std::io::{Read, Write};
    #[expect(clippy::disallowed_methods, reason = "a test client of the proxy under test")]
    let mut t = std::net::TcpStream::connect(proxy).unwrap();
    t.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    t.set_write_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    t.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
        match t.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    (String::from_utf8_lossy(&head).into_owned(), t)
}

/// An open tunnel to `target` through `proxy` (the 200 checked).
pub fn tunnel(proxy: SocketAddr, target: &str) -> std::net::TcpStream {
    let (head, t) = connect(proxy, target);
    assert!(head.starts_with("HTTP/1.1 200"), "CONNECT {target}: {head:?}");
    t
}

/// A central's `spec` body: `ok.test` on `port` allowed; node-a vouches for t1 in p1.
pub fn spec_ok(port: u16) -> String {
    format!(
        "  network:\n    allowlist:\n      - host: ok.test\n        ports: [{port}]\n  nodes:\n    - name: node-a\n      projects: [p1]\n      tasks: [t1]\n"
    )
}

/// A central's `spec` body allowing each `(host, port)`, tunnels carrying any protocol, and
/// node-a vouching for project p1.
pub fn spec_allowing(dests: &[(&str, u16)]) -> String {
    let mut body = String::from("  network:\n    allowlist:\n");
    for (host, port) in dests {
        body.push_str(&format!("      - host: {host}\n        ports: [{port}]\n"));
    }
    body.push_str("    tunnels: { tls_only: false }\n  nodes:\n    - name: node-a\n      projects: [p1]\n      tasks: [t1]\n");
    body
}

/// Sends SIGHUP to `pid` (reload the policy and the TLS files).
pub fn hup(pid: u32) {
    let status = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -HUP {pid}");
}

/// A central allowing one loopback echo server, `echo.test:PORT` (`target`), with `extra`
/// flags; node-a vouches for project p1.
pub struct EchoCentral {
    pub c: Central,
    pub pki: Pki,
    pub target: String,
    _dns: sandgate_testkit::dns::DnsServer,
    _echo: sandgate_testkit::echo::EchoServer,
    _w: crate::common::world::World,
}

impl EchoCentral {
    pub fn new(extra: &[&str]) -> EchoCentral {
        EchoCentral::with_pki(Pki::new(), extra)
    }

    /// As [`EchoCentral::new`], with certificates from `pki`.
    pub fn with_pki(pki: Pki, extra: &[&str]) -> EchoCentral {
        let w = crate::common::world::World::new();
        let echo = w.echo();
        let dns = w.dns(sandgate_testkit::dns::Zone::new().with("echo.test", &["127.0.0.1"]));
        let target = format!("echo.test:{}", echo.addr().port());
        let c = central(
            &pki,
            dns.addr(),
            &spec_allowing(&[("echo.test", echo.addr().port())]),
            extra,
        );
        EchoCentral {
            c,
            pki,
            target,
            _dns: dns,
            _echo: echo,
            _w: w,
        }
    }

    /// A node-local proxy (task t1 in p1) with `cert`, allowing the echo server.
    pub fn node(&self, cert: &NodeCert) -> Node {
        node(cert, &[self.c.node_addr], &[&self.target], Some(("t1", "p1")))
    }
}

/// A central allowing ok.test and not no.test (both resolving to loopback, the origin
/// behind both), whose node node-a vouches for t1 in p1; node-a's certificate.
pub struct OkCentral {
    pub c: Central,
    pub cert: NodeCert,
    pub origin: sandgate_testkit::origin::Origin,
    pub pki: Pki,
    _dns: sandgate_testkit::dns::DnsServer,
    _w: crate::common::world::World,
}

impl OkCentral {
    pub fn new() -> OkCentral {
        let w = crate::common::world::World::new();
        let origin = w.origin();
        let dns = w.dns(
            sandgate_testkit::dns::Zone::new()
                .with("ok.test", &["127.0.0.1"])
                .with("no.test", &["127.0.0.1"]),
        );
        let pki = Pki::new();
        let c = central(&pki, dns.addr(), &spec_ok(origin.port()), &[]);
        let cert = pki.node("node-a", &[]);
        OkCentral {
            c,
            cert,
            origin,
            pki,
            _dns: dns,
            _w: w,
        }
    }
}
