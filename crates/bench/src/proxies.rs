//! Starting the proxies under test, each pinned to core 0 and allowing exactly the harness's
//! servers: sandgate, Squid and tinyproxy (Debian packages), with equivalent allowlists, and
//! the bare relay that is every proxy's floor.
//! sandgate listens on port 0 and its start-up log says where; the other two cannot, and are
//! checked to hold the port they were given.

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
    /// The certificate of the CA an intercepting proxy made (PEM), for its clients to trust.
    pub intercept_ca_pem: Option<String>,
    _dir: tempfile::TempDir,
}

impl RunningProxy {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every process of the target: the proxy, and the central behind a node-local one.
    pub fn pids(&self) -> Vec<u32> {
        std::iter::once(self.child.id())
            .chain(self.companion.as_ref().map(Child::id))
            .collect()
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

/// Starts `cmd`, a `sandgate proxy` whose listeners are on port 0, and returns it with the
/// address of the listener with `role` (`proxy`, `node`) as its start-up log says (at most
/// 15 s). Its stderr is read to the end, so it never blocks on a full pipe.
fn spawn_sandgate(cmd: &mut Command, role: &str, name: &str) -> Result<(Child, SocketAddr), BoxError> {
    use std::io::BufRead;
    let mut child = cmd
        .env("SANDGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let wanted = format!("role={role}");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let tokens: Vec<&str> = line.split_whitespace().collect();
            if !(tokens.contains(&"listening") && tokens.contains(&wanted.as_str())) {
                continue;
            }
            let addr = tokens
                .iter()
                .find_map(|t| t.strip_prefix("addr=")?.parse::<SocketAddr>().ok());
            if let (Some(addr), Some(tx)) = (addr, tx.take()) {
                let _ = tx.send(addr);
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(15)) {
        Ok(addr) => Ok((child, addr)),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!("{name} did not log a {role} listener").into())
        }
    }
}

/// Squid and tinyproxy can be given neither port 0 nor a bound socket: each start gets a
/// port found free, and counts only once the proxy itself holds a listening socket there.
/// A start that lost the port to another process in between is ended and tried again on
/// another port; so the benchmark never measures a stranger on the port.
fn start_third_party(
    name: &str,
    mut start: impl FnMut(u16) -> Result<Child, BoxError>,
) -> Result<(Child, SocketAddr), BoxError> {
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut child = start(port)?;
        if wait_listening(addr, &mut child, name).is_ok() && holds_listener(child.id(), port) {
            return Ok((child, addr));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    Err(format!("{name} did not listen on a port of its own in 5 tries").into())
}

/// Whether process `pid` has a socket listening on 127.0.0.1:`port` among its descriptors
/// (/proc/net/tcp: local address in hex, state 0A is LISTEN, then the socket's inode).
fn holds_listener(pid: u32, port: u16) -> bool {
    let local = format!("0100007F:{port:04X}");
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(1) != Some(&local.as_str()) || f.get(3) != Some(&"0A") {
                return None;
            }
            f.get(9).map(|inode| format!("socket:[{inode}]"))
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .any(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
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

/// `program` under `prlimit --nofile=N:N` (one exec more, the same process), so that its
/// default limits are those of a host with `nofile` descriptors (or the hard limit, when
/// lower: raising it needs privilege); as is without prlimit.
fn with_descriptors(program: &Path, core: Option<usize>, nofile: u64) -> Command {
    let Some(prlimit) = which("prlimit") else {
        return pinned(program, core);
    };
    let nofile = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(nofile, |(_, hard)| nofile.min(hard));
    let mut c = pinned(&prlimit, core);
    c.arg(format!("--nofile={nofile}:{nofile}"))
        .arg("--")
        .arg(program);
    c
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

fn allowed(s: &Servers) -> [SocketAddr; 5] {
    [s.origin, s.echo, s.sink, s.source, s.tls.addr]
}

/// What a sandgate target changes from the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandgateMode {
    /// Every server allowed by `--allow`: tunnels SNI-checked and relayed blind.
    Plain,
    /// The tunnels' first-bytes check off (`spec.network.tunnels: {sni: off, tls_only:
    /// false}`).
    NoPeek,
    /// The TLS origin allowed only by a `read_only: true` entry, so its tunnels are
    /// intercepted: `--intercept-ca-cert`, and the origin's CA as the system's roots
    /// (`SSL_CERT_FILE`) to verify it upstream.
    Intercept,
}

/// sandgate allowing the harness's servers, as `mode` says.
pub fn sandgate(
    binary: &Path,
    s: &Servers,
    core: Option<usize>,
    mode: SandgateMode,
) -> Result<RunningProxy, BoxError> {
    let dir = world_writable_dir()?;
    // 5,000 idle tunnels come from one client address, on the default limits of a host with
    // 20,000 descriptors (issue 32): a cap of 9,872, of which a lone client may hold 7,404.
    let mut cmd = with_descriptors(binary, core, 20_000);
    cmd.args([
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--allow-range",
        "127.0.0.1/32",
    ]);
    cmd.args(["--audit-log"]).arg(dir.path().join("audit.jsonl"));
    cmd.args(["--dns-server", "127.0.0.1:9"]);
    let intercepted = (mode == SandgateMode::Intercept).then_some(s.tls.addr);
    for a in allowed(s).into_iter().filter(|a| Some(*a) != intercepted) {
        cmd.args(["--allow", &a.to_string()]);
    }
    let network = match mode {
        SandgateMode::Plain => None,
        SandgateMode::NoPeek => Some("    tunnels: {sni: \"off\", tls_only: false}\n".to_owned()),
        SandgateMode::Intercept => Some(format!(
            "    allowlist:\n      - {{host: \"{}\", read_only: true}}\n",
            s.tls.addr
        )),
    };
    if let Some(network) = network {
        let policy = dir.path().join("policy.yaml");
        std::fs::write(
            &policy,
            format!(
                "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{name: bench}}\nspec:\n  network:\n{network}"
            ),
        )?;
        cmd.arg("--policy").arg(policy);
    }
    let ca_file = dir.path().join("intercept-ca.pem");
    if mode == SandgateMode::Intercept {
        cmd.arg("--intercept-ca-cert").arg(&ca_file);
        cmd.env("SSL_CERT_FILE", &s.tls.ca_file)
            .env_remove("SSL_CERT_DIR");
    }
    let (child, addr) = spawn_sandgate(&mut cmd, "proxy", "sandgate")?;
    let mut proxy = RunningProxy {
        addr,
        child,
        companion: None,
        intercept_ca_pem: None,
        _dir: dir,
    };
    if mode == SandgateMode::Intercept {
        // Written before the proxy logs its listeners.
        proxy.intercept_ca_pem = Some(std::fs::read_to_string(&ca_file)?);
    }
    Ok(proxy)
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
    let policy = d.join("central.yaml");
    std::fs::write(
        &policy,
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {name: central}\nspec:\n  listeners:\n    - listen: 127.0.0.1:0\n      role: node\n      tls: {cert: pki/central-127.0.0.1.pem, key: pki/central-127.0.0.1.key, client_ca: pki/ca.pem}\n  nodes:\n    - name: bench-node\n      tasks: [\"*\"]\n",
    )?;
    let mut central = pinned(binary, core);
    central.args([
        "proxy",
        "--listen",
        "127.0.0.1:0",
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
    let (mut central, central_addr) = spawn_sandgate(&mut central, "node", "sandgate central")?;
    let mut node = pinned(binary, core);
    node.args(["proxy", "--listen", "127.0.0.1:0"]);
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
    let (child, addr) = match spawn_sandgate(&mut node, "proxy", "sandgate node") {
        Ok(started) => started,
        Err(e) => {
            let _ = central.kill();
            let _ = central.wait();
            return Err(e);
        }
    };
    Ok(RunningProxy {
        addr,
        child,
        companion: Some(central),
        intercept_ca_pem: None,
        _dir: dir,
    })
}

pub fn squid(s: &Servers, core: Option<usize>) -> Result<RunningProxy, BoxError> {
    let dir = world_writable_dir()?;
    let d = dir.path().display();
    let ports: Vec<String> = allowed(s).iter().map(|a| a.port().to_string()).collect();
    let conf_path = dir.path().join("squid.conf");
    let squid = which("squid").ok_or("squid not installed (apt-get install -y squid)")?;
    let (child, addr) = start_third_party("squid", |port| {
        let conf = format!(
            "http_port 127.0.0.1:{port}\npid_filename {d}/squid.pid\ncache deny all\ncache_mem 8 MB\n\
             access_log none\ncache_store_log none\ncache_log {d}/cache.log\ncoredump_dir {d}\n\
             visible_hostname bench\nmax_filedescriptors 65536\nshutdown_lifetime 0 seconds\n\
             acl bench_dst dst 127.0.0.1/32\nacl bench_ports port {}\n\
             http_access allow bench_dst bench_ports\nhttp_access deny all\n",
            ports.join(" ")
        );
        std::fs::write(&conf_path, conf)?;
        Ok(pinned(&squid, core)
            .args(["-N", "-f"])
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?)
    })?;
    Ok(RunningProxy {
        addr,
        child,
        companion: None,
        intercept_ca_pem: None,
        _dir: dir,
    })
}

pub fn tinyproxy(s: &Servers, core: Option<usize>) -> Result<RunningProxy, BoxError> {
    let dir = world_writable_dir()?;
    let filter = dir.path().join("filter");
    std::fs::write(&filter, "^127\\.0\\.0\\.1$\n")?;
    let conf_path = dir.path().join("tinyproxy.conf");
    let tinyproxy = which("tinyproxy").ok_or("tinyproxy not installed (apt-get install -y tinyproxy)")?;
    let (child, addr) = start_third_party("tinyproxy", |port| {
        let mut conf = format!(
            "User nobody\nGroup nogroup\nPort {port}\nListen 127.0.0.1\nTimeout 600\nMaxClients 12000\n\
             Allow 127.0.0.1\nLogLevel Critical\nFilter \"{}\"\nFilterDefaultDeny Yes\nFilterExtended Yes\n",
            filter.display()
        );
        for a in allowed(s) {
            conf.push_str(&format!("ConnectPort {}\n", a.port()));
        }
        std::fs::write(&conf_path, conf)?;
        Ok(pinned(&tinyproxy, core)
            .args(["-d", "-c"])
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?)
    })?;
    Ok(RunningProxy {
        addr,
        child,
        companion: None,
        intercept_ca_pem: None,
        _dir: dir,
    })
}

/// The bare relay (`relay.rs`): this binary again, pinned as the proxies are, printing the
/// address it listens on as its first line (at most 15 s).
pub fn bare_relay(core: Option<usize>) -> Result<RunningProxy, BoxError> {
    use std::io::BufRead;
    let exe = std::env::current_exe()?;
    let mut child = pinned(&exe, core)
        .arg(crate::relay::FLAG)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line.trim().parse::<SocketAddr>());
    });
    match rx.recv_timeout(Duration::from_secs(15)) {
        Ok(Ok(addr)) => Ok(RunningProxy {
            addr,
            child,
            companion: None,
            intercept_ca_pem: None,
            _dir: tempfile::tempdir()?,
        }),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            Err("the bare relay did not say where it listens".into())
        }
    }
}

pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
