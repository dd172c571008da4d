//! Starting the proxies under test, each pinned to core 0 and allowing exactly the harness's
//! servers: sandgate, Squid and tinyproxy (Debian packages), with equivalent allowlists.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::client::BoxError;
use crate::servers::Servers;

/// A running proxy; killed when dropped.
#[derive(Debug)]
pub struct RunningProxy {
    pub addr: SocketAddr,
    child: Child,
    /// A second process the target needs (the central proxy behind a node-local one).
    companion: Option<Child>,
    _dir: tempfile::TempDir,
}

impl RunningProxy {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RunningProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(c) = &mut self.companion {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn pinned(program: &Path, core: Option<usize>) -> Command {
    match core {
        Some(core) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &core.to_string()]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

#[expect(clippy::disallowed_methods, reason = "waits for a loopback proxy to listen")]
fn wait_listening(addr: SocketAddr, child: &mut Child, name: &str) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            return Err(format!("{name} exited: {status}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("{name} did not listen on {addr}").into())
}

fn world_writable_dir() -> Result<tempfile::TempDir, BoxError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))?;
    Ok(dir)
}

fn allowed(s: &Servers) -> [SocketAddr; 4] {
    [s.origin, s.echo, s.sink, s.source]
}

/// sandgate with the same allowlist; `inspect: false` turns the tunnels' first-bytes check
/// off (`spec.network.tunnels: {sni: off, tls_only: false}`).
pub fn sandgate(
    binary: &Path,
    s: &Servers,
    core: Option<usize>,
    inspect: bool,
) -> Result<RunningProxy, BoxError> {
    let dir = world_writable_dir()?;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut cmd = pinned(binary, core);
    cmd.args([
        "proxy",
        "--listen",
        &addr.to_string(),
        "--allow-range",
        "127.0.0.1/32",
    ]);
    cmd.args(["--audit-log"]).arg(dir.path().join("audit.jsonl"));
    // 5,000 idle tunnels come from one client address: that share must hold them all.
    cmd.args(["--dns-server", "127.0.0.1:9", "--max-connections", "8000"]);
    cmd.args(["--max-connections-per-client", "8000"]);
    for a in allowed(s) {
        cmd.args(["--allow", &a.to_string()]);
    }
    if !inspect {
        let policy = dir.path().join("policy.yaml");
        std::fs::write(
            &policy,
            "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {name: bench}\nspec:\n  network:\n    tunnels: {sni: \"off\", tls_only: false}\n",
        )?;
        cmd.arg("--policy").arg(policy);
    }
    let mut child = cmd
        .env("SANDGATE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    wait_listening(addr, &mut child, "sandgate")?;
    Ok(RunningProxy {
        addr,
        child,
        companion: None,
        _dir: dir,
    })
}

/// A node-local sandgate forwarding to a central one over mutual TLS and HTTP/2 (one
/// connection, a stream per request), both on the proxies' core: the central holds the
/// allowlist and dials; the node allows the same and dials nothing itself. Certificates
/// from `sandgate pki`. `http1`: a TLS connection per tunnel with HTTP/1.1 CONNECT instead,
/// to show what multiplexing buys.
pub fn sandgate_central(
    binary: &Path,
    s: &Servers,
    core: Option<usize>,
    http1: bool,
) -> Result<RunningProxy, BoxError> {
    let dir = world_writable_dir()?;
    let d = dir.path();
    for args in [
        &["init"][..],
        &["issue", "--central", "127.0.0.1"],
        &["issue", "--node", "bench-node"],
    ] {
        let status = Command::new(binary)
            .arg("pki")
            .args(args)
            .arg("--dir")
            .arg(d.join("pki"))
            .stdout(Stdio::null())
            .status()?;
        if !status.success() {
            return Err(format!("sandgate pki {args:?} failed").into());
        }
    }
    let central_addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let policy = d.join("central.yaml");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{name: central}}\nspec:\n  listeners:\n    - listen: {central_addr}\n      role: node\n      tls: {{cert: pki/central-127.0.0.1.pem, key: pki/central-127.0.0.1.key, client_ca: pki/ca.pem}}\n  nodes:\n    - name: bench-node\n      tasks: [\"*\"]\n"
        ),
    )?;
    let plain: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut central = pinned(binary, core);
    central.args([
        "proxy",
        "--listen",
        &plain.to_string(),
        "--allow-range",
        "127.0.0.1/32",
    ]);
    central.arg("--policy").arg(&policy);
    central.arg("--audit-log").arg(d.join("central.jsonl"));
    // Every tunnel is a stream from the one node, and a stream takes a slot (as a
    // connection does): room for the idle tunnels and the churn on one listener, from one
    // client.
    central.args(["--dns-server", "127.0.0.1:9", "--max-connections", "9800"]);
    central.args([
        "--max-connections-per-client",
        "9800",
        "--max-connections-per-listener",
        "9800",
    ]);
    for a in allowed(s) {
        central.args(["--allow", &a.to_string()]);
    }
    let mut central = central
        .env("SANDGATE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    wait_listening(central_addr, &mut central, "sandgate central")?;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut node = pinned(binary, core);
    node.args(["proxy", "--listen", &addr.to_string()]);
    node.args(["--upstream", &format!("https://{central_addr}")]);
    node.arg("--upstream-ca").arg(d.join("pki/ca.pem"));
    node.arg("--client-cert").arg(d.join("pki/node-bench-node.pem"));
    node.arg("--client-key").arg(d.join("pki/node-bench-node.key"));
    node.arg("--audit-log").arg(d.join("node.jsonl"));
    if http1 {
        node.args(["--upstream-transport", "http1"]);
    }
    node.args(["--dns-server", "127.0.0.1:9", "--max-connections", "8000"]);
    node.args(["--max-connections-per-client", "8000"]);
    for a in allowed(s) {
        node.args(["--allow", &a.to_string()]);
    }
    let mut child = node
        .env("SANDGATE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    wait_listening(addr, &mut child, "sandgate node")?;
    Ok(RunningProxy {
        addr,
        child,
        companion: Some(central),
        _dir: dir,
    })
}

pub fn squid(s: &Servers, core: Option<usize>) -> Result<RunningProxy, BoxError> {
    let dir = world_writable_dir()?;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let d = dir.path().display();
    let ports: Vec<String> = allowed(s).iter().map(|a| a.port().to_string()).collect();
    let conf = format!(
        "http_port {addr}\npid_filename {d}/squid.pid\ncache deny all\ncache_mem 8 MB\n\
         access_log none\ncache_store_log none\ncache_log {d}/cache.log\ncoredump_dir {d}\n\
         visible_hostname bench\nmax_filedescriptors 65536\nshutdown_lifetime 0 seconds\n\
         acl bench_dst dst 127.0.0.1/32\nacl bench_ports port {}\n\
         http_access allow bench_dst bench_ports\nhttp_access deny all\n",
        ports.join(" ")
    );
    let conf_path = dir.path().join("squid.conf");
    std::fs::write(&conf_path, conf)?;
    let squid = which("squid").ok_or("squid not installed (apt-get install -y squid)")?;
    let mut child = pinned(&squid, core)
        .args(["-N", "-f"])
        .arg(&conf_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    wait_listening(addr, &mut child, "squid")?;
    Ok(RunningProxy {
        addr,
        child,
        companion: None,
        _dir: dir,
    })
}

pub fn tinyproxy(s: &Servers, core: Option<usize>) -> Result<RunningProxy, BoxError> {
    let dir = world_writable_dir()?;
    let port = free_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let filter = dir.path().join("filter");
    std::fs::write(&filter, "^127\\.0\\.0\\.1$\n")?;
    let mut conf = format!(
        "User nobody\nGroup nogroup\nPort {port}\nListen 127.0.0.1\nTimeout 600\nMaxClients 12000\n\
         Allow 127.0.0.1\nLogLevel Critical\nFilter \"{}\"\nFilterDefaultDeny Yes\nFilterExtended Yes\n",
        filter.display()
    );
    for a in allowed(s) {
        conf.push_str(&format!("ConnectPort {}\n", a.port()));
    }
    let conf_path = dir.path().join("tinyproxy.conf");
    std::fs::write(&conf_path, conf)?;
    let tinyproxy = which("tinyproxy").ok_or("tinyproxy not installed (apt-get install -y tinyproxy)")?;
    let mut child = pinned(&tinyproxy, core)
        .args(["-d", "-c"])
        .arg(&conf_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    wait_listening(addr, &mut child, "tinyproxy")?;
    Ok(RunningProxy {
        addr,
        child,
        companion: None,
        _dir: dir,
    })
}

pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
