//! `sandgate run`: preflight, the run's own proxy and bridge (proxied modes), bubblewrap,
//! signal forwarding, exit status, teardown and the blocked summary.
//!
//! The proxy and the bridge socket exist before bwrap starts; the init inside checks both
//! before it starts the command. On exit (or when sandgate is killed: bwrap runs with
//! `--die-with-parent`) the sandbox dies, the proxy drains its audit log and stops, and the
//! temporary directories are removed.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use sandgate_policy::{AddressGuard, Ruleset};
use sandgate_proxy::{
    AuditDestination, AuditOptions, Identity, Limits, Listener, Nameservers, PeerFilter, Proxy, ProxyConfig,
};
use tokio::net::UnixListener;

use crate::argv::{RunFacts, bwrap_argv};
use crate::policy::{self, NetMode, SandboxPolicy};

/// How `sandgate run` was asked to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub policy_path: PathBuf,
    pub params: BTreeMap<String, String>,
    pub net: Option<NetMode>,
    pub allow_domains: Vec<String>,
    pub audit_log: Option<PathBuf>,
    pub print_argv: bool,
    /// `seatbelt`: print the macOS profile instead of running.
    pub print_profile: Option<String>,
    pub quiet: bool,
    pub command: Vec<OsString>,
}

/// Why a run could not start. The CLI exits 64 for `Usage`, 69 for `Unavailable`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Unavailable(String),
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Loads the policy and applies the command-line overrides.
pub fn load_policy(opts: &RunOptions) -> Result<SandboxPolicy, RunError> {
    let text = std::fs::read_to_string(&opts.policy_path)
        .map_err(|e| RunError::Usage(format!("cannot read {}: {e}", opts.policy_path.display())))?;
    let mut p = policy::parse(&text, &opts.params, &|path: &Path| path.exists())
        .map_err(|e| RunError::Usage(format!("{}: {e}", opts.policy_path.display())))?;
    if let Some(net) = opts.net {
        if net == NetMode::Proxy && p.upstream_proxy.is_none() {
            return Err(RunError::Usage(
                "--net proxy needs net.proxy.upstream in the policy".into(),
            ));
        }
        p.net = net;
    }
    for d in &opts.allow_domains {
        let pattern = sandgate_policy::Pattern::parse(d)
            .map_err(|e| RunError::Usage(format!("invalid --allow-domain {d:?}: {e}")))?;
        p.allow.push(pattern);
    }
    if !p.net.proxied() && !opts.allow_domains.is_empty() {
        return Err(RunError::Usage("--allow-domain needs net mode allowlist".into()));
    }
    Ok(p)
}

/// Checks that the sandbox can be built here, with a message that says what to do.
fn preflight() -> Result<PathBuf, RunError> {
    if !cfg!(target_os = "linux") {
        return Err(RunError::Unavailable(
            "sandgate run needs Linux and bubblewrap; on macOS, `sandgate run --print-profile seatbelt` renders the policy for sandbox-exec".into(),
        ));
    }
    let bwrap = find_in_path("bwrap").ok_or_else(|| {
        RunError::Unavailable("bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap".into())
    })?;
    if std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone").is_ok_and(|v| v.trim() == "0") {
        return Err(RunError::Unavailable(
            "user namespaces are disabled (kernel.unprivileged_userns_clone=0): sysctl -w kernel.unprivileged_userns_clone=1".into(),
        ));
    }
    if std::fs::read_to_string("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
        .is_ok_and(|v| v.trim() == "1")
    {
        return Err(RunError::Unavailable(
            "Ubuntu's AppArmor restricts unprivileged user namespaces: allow bwrap with an AppArmor profile, or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0".into(),
        ));
    }
    Ok(bwrap)
}

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("run-{}-{nanos:08x}", std::process::id())
}

fn shell_quote(s: &OsString) -> String {
    let s = s.to_string_lossy();
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-_.,:=@%+".contains(&b))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Runs the command; returns its exit status (128+N for a signal).
pub fn run(opts: RunOptions) -> Result<i32, RunError> {
    let policy = load_policy(&opts)?;
    let host_env: Vec<(String, String)> = std::env::vars().collect();
    let (env, withheld) = policy::environment(&policy, &host_env);
    for name in &withheld {
        eprintln!(
            "sandgate: not passing {name}: it looks like a secret; list it by its exact name to pass it"
        );
    }
    let sandgate_exe = std::env::current_exe()
        .map_err(|e| RunError::Unavailable(format!("cannot find the sandgate binary: {e}")))?;
    match opts.print_profile.as_deref() {
        None => {}
        Some("seatbelt") => {
            let profile = crate::seatbelt::render(&policy);
            let command: Vec<String> = opts
                .command
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            print!("{}", profile.text);
            println!(
                ";; run with: {}",
                crate::seatbelt::command_line(&profile, "PROFILE.sb", &command)
            );
            return Ok(0);
        }
        Some(other) => {
            return Err(RunError::Usage(format!(
                "--print-profile {other:?}: the only kind is seatbelt"
            )));
        }
    }
    if opts.print_argv {
        let facts = RunFacts {
            sandgate_exe,
            bridge_dir: Some("/tmp/sandgate-bridge.XXXXXX".into()),
            env,
            command: opts.command,
        };
        let line: Vec<String> = bwrap_argv(&policy, &facts).iter().map(shell_quote).collect();
        println!("{}", line.join(" "));
        return Ok(0);
    }
    let bwrap = preflight()?;
    if policy.net == NetMode::All {
        tracing::warn!("net mode all: the sandbox shares the host's network, unfiltered");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| RunError::Unavailable(e.to_string()))?;
    rt.block_on(supervise(policy, opts, env, sandgate_exe, bwrap))
}

async fn supervise(
    policy: SandboxPolicy,
    opts: RunOptions,
    env: Vec<(String, String)>,
    sandgate_exe: PathBuf,
    bwrap: PathBuf,
) -> Result<i32, RunError> {
    let id = run_id();
    sweep_stale_state(&std::env::temp_dir());
    // Holds the bridge socket; visible inside the sandbox. The audit log lives elsewhere.
    // Both names carry our pid so a later run can sweep them if we die without cleaning up.
    let pid = std::process::id();
    let bridge_dir = tempfile::Builder::new()
        .prefix(&format!("sandgate-bridge-{pid}-"))
        .tempdir()
        .map_err(|e| RunError::Unavailable(e.to_string()))?;
    let state_dir = tempfile::Builder::new()
        .prefix(&format!("sandgate-run-{pid}-"))
        .tempdir()
        .map_err(|e| RunError::Unavailable(e.to_string()))?;
    let audit_path = opts
        .audit_log
        .clone()
        .unwrap_or_else(|| state_dir.path().join("audit.jsonl"));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut proxy_task = None;
    if policy.net.proxied() {
        let mut rules = Ruleset::new();
        policy.allow.iter().cloned().for_each(|p| rules.allow(p));
        let ranges = policy
            .allow_ranges
            .iter()
            .map(|r| {
                r.parse()
                    .map_err(|_| RunError::Usage(format!("net.allow_ranges: {r:?} is not a CIDR")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let servers = policy
            .resolver_servers
            .iter()
            .map(|s| {
                s.parse::<SocketAddr>()
                    .map_err(|_| RunError::Usage(format!("net.resolver.servers: {s:?} is not IP:PORT")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Only this run's bridge may talk to its proxy.
        let peers = PeerFilter::new();
        let config = ProxyConfig {
            listen: vec![Listener {
                addr: SocketAddr::from(([127, 0, 0, 1], 0)),
                identity: Identity {
                    task: Some(id.clone()),
                    project: None,
                    job: None,
                },
                require_auth: false,
                peers: Some(peers.clone()),
            }],
            rules,
            guard: AddressGuard::new(ranges),
            nameservers: if servers.is_empty() {
                Nameservers::System
            } else {
                Nameservers::Explicit(servers)
            },
            audit: AuditDestination::File(audit_path.clone()),
            limits: Limits {
                shutdown_grace: std::time::Duration::from_secs(2),
                ..Limits::default()
            },
            audit_options: AuditOptions::default(),
            metrics_listen: None,
            upstream_proxy: policy.upstream_proxy,
        };
        let proxy = Proxy::bind(config)
            .await
            .map_err(|e| RunError::Unavailable(format!("cannot start the proxy: {e}")))?;
        let proxy_addr = *proxy
            .local_addrs()
            .first()
            .ok_or_else(|| RunError::Unavailable("the proxy has no listener".into()))?;
        let socket = bridge_dir.path().join("proxy.sock");
        let unix = UnixListener::bind(&socket).map_err(|e| {
            RunError::Unavailable(format!("cannot create the bridge {}: {e}", socket.display()))
        })?;
        tokio::spawn(bridge(unix, proxy_addr, Some(peers)));
        proxy_task = Some(tokio::spawn(proxy.run(async move {
            let _ = stop_rx.await;
        })));
    }
    // Explicitly bridged host loopback ports: the init listens on the same port inside.
    for port in &policy.loopback_ports {
        let socket = bridge_dir.path().join(format!("port-{port}.sock"));
        let unix = UnixListener::bind(&socket).map_err(|e| {
            RunError::Unavailable(format!("cannot create the bridge {}: {e}", socket.display()))
        })?;
        tokio::spawn(bridge(unix, SocketAddr::from(([127, 0, 0, 1], *port)), None));
    }
    let facts = RunFacts {
        sandgate_exe,
        bridge_dir: (policy.net.proxied() || !policy.loopback_ports.is_empty())
            .then(|| bridge_dir.path().to_path_buf()),

        env,
        command: opts.command.clone(),
    };
    let argv = bwrap_argv(&policy, &facts);
    let mut cmd = tokio::process::Command::new(&bwrap);
    cmd.args(argv.iter().skip(1));
    let mut child = cmd
        .spawn()
        .map_err(|e| RunError::Unavailable(format!("cannot start bwrap: {e}")))?;
    let bwrap_pid = child.id();
    let status = {
        let forward = forward_signals(bwrap_pid);
        tokio::pin!(forward);
        tokio::select! {
            status = child.wait() => status,
            _ = &mut forward => child.wait().await,
        }
    };
    let code = match status {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(e) => return Err(RunError::Unavailable(format!("waiting for bwrap failed: {e}"))),
    };
    let _ = stop_tx.send(());
    if let Some(task) = proxy_task {
        let _ = task.await;
        if !opts.quiet {
            blocked_summary(&audit_path);
        }
    }
    drop(bridge_dir);
    drop(state_dir);
    Ok(code)
}

/// Removes the temporary directories of runs whose sandgate process is gone (killed with
/// `kill -9`, say, so it could not remove them itself). Only our own directories, only when
/// the owning pid no longer exists, only ones this user may remove.
pub fn sweep_stale_state(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name
            .strip_prefix("sandgate-bridge-")
            .or_else(|| name.strip_prefix("sandgate-run-"))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let dead = pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists();
        if dead && std::fs::remove_dir_all(entry.path()).is_ok() {
            tracing::info!(path = %entry.path().display(), "removed a dead run's state");
        }
    }
}

/// Relays each connection on a bridge socket to a host loopback address: the run's proxy,
/// or a port the policy bridges explicitly.
async fn bridge(listener: UnixListener, target: SocketAddr, peers: Option<PeerFilter>) {
    loop {
        let Ok((mut unix, _)) = listener.accept().await else {
            continue;
        };
        let peers = peers.clone();
        tokio::spawn(async move {
            // Bind first, so the proxy knows this source address before the connection arrives.
            let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
                return;
            };
            if socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).is_err() {
                return;
            }
            let Ok(local) = socket.local_addr() else { return };
            if let Some(p) = &peers {
                p.allow(local);
            }
            if let Ok(mut tcp) = socket.connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut unix, &mut tcp).await;
            }
            if let Some(p) = &peers {
                p.forget(local);
            }
        });
    }
}

/// Forwards SIGINT, SIGTERM and SIGHUP to the processes inside the sandbox (never to bwrap
/// itself, whose death would SIGKILL the sandbox). Runs until the caller stops polling it.
async fn forward_signals(bwrap_pid: Option<u32>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    loop {
        let sig = tokio::select! {
            _ = int.recv() => nix::sys::signal::Signal::SIGINT,
            _ = term.recv() => nix::sys::signal::Signal::SIGTERM,
            _ = hup.recv() => nix::sys::signal::Signal::SIGHUP,
        };
        if let Some(pid) = bwrap_pid {
            for target in sandbox_processes(pid) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(target), sig);
            }
        }
    }
}

/// Descendants of `root` that are not bwrap's own processes.
fn sandbox_processes(root: u32) -> Vec<i32> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1))
                .and_then(|p| p.parse().ok());
            if let Some(ppid) = ppid {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut queue = vec![root as i32];
    while let Some(p) = queue.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            queue.push(c);
            let comm = std::fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
            if comm.trim() != "bwrap" {
                out.push(c);
            }
        }
    }
    out
}

/// One stderr line per blocked destination: `blocked: evil.com:443 (not in allowlist), 3 times`.
fn blocked_summary(audit: &Path) {
    let Ok((events, _)) = sandgate_proxy::audit_query::read_events(&[audit.to_path_buf()]) else {
        return;
    };
    let mut blocked: BTreeMap<(String, String), usize> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e["event"] == "decision" && e["decision"] == "deny")
    {
        let dest = match (e["destination_host"].as_str(), e["destination_port"].as_u64()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            _ => "(malformed request)".to_owned(),
        };
        let reason = e["reason_code"].as_str().unwrap_or("denied").replace('_', " ");
        *blocked.entry((dest, reason)).or_default() += 1;
    }
    for ((dest, reason), n) in blocked {
        let times = if n == 1 {
            "once".to_owned()
        } else {
            format!("{n} times")
        };
        eprintln!("blocked: {dest} ({reason}), {times}");
    }
}
