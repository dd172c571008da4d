//! `sandgate run`: preflight, the run's state directory, its own proxy and bridges (proxied
//! modes: HTTP and SOCKS5; loopback ports), bubblewrap, exit status, teardown and the
//! summary.
//!
//! The proxy and the bridge sockets exist before bwrap starts; the init inside checks them
//! before it starts the command. bwrap gets the command's environment as its own (never on
//! its command line). On exit the sandbox is gone (PID namespace; without one, what is left
//! is killed, see [`crate::processes`]), the proxy drains its audit log and stops, and the
//! state directory is removed. When sandgate itself is killed, bwrap's `--die-with-parent`
//! ends the sandbox and the next run removes the state directory ([`crate::state`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

use sandgate_policy::{AddressGuard, Ruleset};
use sandgate_proxy::{
    AuditDestination, AuditOptions, Identity, Limits, Listener, Nameservers, PeerFilter, Protocol, Proxy,
    ProxyConfig,
};
use tokio::net::UnixListener;

use crate::argv::{DNS_FILES, PROXY_SOCKET, RunFacts, SOCKS_SOCKET, bwrap_argv, needs_init};
use crate::policy::{self, NetMode, SandboxPolicy};
use crate::state::{RunState, sweep_stale_state};
use crate::{bridge, env, processes, summary};

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
    /// Ask at the terminal before the allowlist refuses (`--ask`), waiting this long.
    pub ask: Option<std::time::Duration>,
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

/// Loads the policy, with the command line's `--net` and `--allow-domain` applied; every
/// path canonicalised by the host filesystem.
pub fn load_policy(opts: &RunOptions) -> Result<SandboxPolicy, RunError> {
    let text = std::fs::read_to_string(&opts.policy_path)
        .map_err(|e| RunError::Usage(format!("cannot read {}: {e}", opts.policy_path.display())))?;
    let mut p = policy::parse(&text, &opts.params, &|path| std::fs::canonicalize(path), opts.net)
        .map_err(|e| RunError::Usage(format!("{}: {e}", opts.policy_path.display())))?;
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

/// `--path-param NAME=PATH`: a parameter whose value is a host path in its canonical form
/// (symlinks, `.` and `..` resolved by `resolve`; it must exist). A policy may then use it in
/// `env.set` values, which are not paths the sandbox resolves: a Jupyter kernelspec passes
/// `{resource_dir}/../..`, and inside the sandbox `..` would cross directories that are not
/// there.
pub fn path_param(spec: &str, resolve: crate::paths::Resolve<'_>) -> Result<(String, String), RunError> {
    let (name, path) = spec
        .split_once('=')
        .filter(|(name, path)| !name.is_empty() && !path.is_empty())
        .ok_or_else(|| RunError::Usage(format!("invalid --path-param {spec:?}: expected NAME=PATH")))?;
    let canonical = resolve(std::path::Path::new(path))
        .map_err(|e| RunError::Usage(format!("--path-param {name}: {path:?}: {e}")))?;
    let value = canonical
        .to_str()
        .ok_or_else(|| RunError::Usage(format!("--path-param {name}: {path:?} is not UTF-8")))?;
    Ok((name.to_owned(), value.to_owned()))
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

/// The host's DNS files that exist, canonical source first (`net.mode: all` binds them).
fn dns_files(policy: &SandboxPolicy) -> Vec<(PathBuf, PathBuf)> {
    if policy.net != NetMode::All {
        return Vec::new();
    }
    DNS_FILES
        .iter()
        .filter_map(|f| Some((std::fs::canonicalize(f).ok()?, PathBuf::from(f))))
        .collect()
}

/// Runs the command; returns its exit status (128+N for a signal).
pub fn run(opts: RunOptions) -> Result<i32, RunError> {
    let policy = load_policy(&opts)?;
    let host_env: Vec<(String, String)> = std::env::vars().collect();
    let (env, withheld) = env::environment(&policy, &host_env);
    for w in &withheld {
        eprintln!(
            "sandgate: not passing {}: {}; list it by its exact name to pass it",
            w.name, w.reason
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
            bridge_dir: Some("/tmp/sandgate-run-XXXXXXXXXX/bridge".into()),
            dns_files: dns_files(&policy),
            command: opts.command,
        };
        let line: Vec<String> = bwrap_argv(&policy, &facts).iter().map(shell_quote).collect();
        println!("{}", line.join(" "));
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        eprintln!(
            "sandgate: bwrap's environment (values not shown): {}",
            names.join(" ")
        );
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
    let tmp = std::env::temp_dir();
    sweep_stale_state(&tmp);
    let state = RunState::create(&tmp).map_err(|e| {
        RunError::Unavailable(format!("cannot create the run's state in {}: {e}", tmp.display()))
    })?;
    let audit_path = opts.audit_log.clone().unwrap_or_else(|| state.audit_path());
    let proxy = if policy.net.proxied() {
        Some(start_proxy(&policy, &audit_path, &state, opts.ask).await?)
    } else {
        None
    };
    // Explicitly bridged host loopback ports: the init listens on the same port inside.
    for port in &policy.loopback_ports {
        open_bridge(
            &state,
            &format!("port-{port}.sock"),
            SocketAddr::from(([127, 0, 0, 1], *port)),
            format!("host loopback port {port} (net.loopback_ports)"),
            None,
        )?;
    }
    let facts = RunFacts {
        sandgate_exe,
        bridge_dir: needs_init(&policy).then(|| state.bridge_dir()),
        dns_files: dns_files(&policy),
        command: opts.command.clone(),
    };
    let argv = bwrap_argv(&policy, &facts);
    if !policy.unshare_pid {
        processes::become_subreaper();
    }
    let mut cmd = tokio::process::Command::new(&bwrap);
    cmd.args(argv.iter().skip(1)).env_clear().envs(env);
    let mut child = cmd
        .spawn()
        .map_err(|e| RunError::Unavailable(format!("cannot start bwrap: {e}")))?;
    let bwrap_pid = child.id();
    let status = {
        let forward = processes::forward_signals(bwrap_pid);
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
    if !policy.unshare_pid {
        let _ = tokio::task::spawn_blocking(processes::kill_leftovers).await;
    }
    if let Some((stop, task)) = proxy {
        let _ = stop.send(());
        let _ = task.await;
        if !opts.quiet {
            summary::print(&audit_path);
        }
    }
    drop(state);
    Ok(code)
}

type ProxyRun = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<u64>>,
);

/// Starts the run's proxy on host loopback (port 0: an HTTP listener, and a SOCKS5 one when
/// the policy has a SOCKS5 port), serving only this run's bridges, and a bridge socket in
/// front of each listener.
async fn start_proxy(
    policy: &SandboxPolicy,
    audit_path: &std::path::Path,
    state: &RunState,
    ask: Option<std::time::Duration>,
) -> Result<ProxyRun, RunError> {
    // Only this run's bridges may talk to its proxy: the listeners share one filter, and
    // one task identity, so HTTP and SOCKS5 requests are the same run's in the audit log.
    let peers = PeerFilter::new();
    let config = proxy_config(policy, audit_path, &peers)?;
    let listeners = config.listen.len();
    let proxy = Proxy::bind(config)
        .await
        .map_err(|e| RunError::Unavailable(format!("cannot start the proxy: {e}")))?;
    if let Some(timeout) = ask {
        proxy.set_asker(std::sync::Arc::new(crate::ask::TerminalAsker::new(timeout)));
    }
    // In the order of the configuration's listeners: HTTP, then SOCKS5 when there is one.
    let addrs = proxy.local_addrs();
    if addrs.len() != listeners {
        return Err(RunError::Unavailable("the proxy lacks a listener".into()));
    }
    let bridges = [
        (PROXY_SOCKET, "the run's proxy"),
        (SOCKS_SOCKET, "the run's SOCKS5 proxy"),
    ];
    for (addr, (socket, what)) in addrs.into_iter().zip(bridges) {
        open_bridge(state, socket, addr, what.to_owned(), Some(peers.clone()))?;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(proxy.run(async move {
        let _ = stop_rx.await;
    }));
    Ok((stop_tx, task))
}

/// The run's proxy: the policy's rules, ranges and resolver, and its listeners on host
/// loopback port 0 under the run's task, served only to `peers`.
fn proxy_config(
    policy: &SandboxPolicy,
    audit_path: &std::path::Path,
    peers: &PeerFilter,
) -> Result<ProxyConfig, RunError> {
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
    let task = run_id();
    let listener = |protocol| Listener {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        identity: Identity {
            task: Some(task.clone()),
            project: None,
            job: None,
        },
        require_auth: false,
        peers: Some(peers.clone()),
        protocol,
        node: None,
    };
    let socks = policy.socks_port.map(|_| listener(Protocol::Socks5));
    Ok(ProxyConfig {
        listen: std::iter::once(listener(Protocol::Http)).chain(socks).collect(),
        rules,
        guard: AddressGuard::new(ranges),
        nameservers: if servers.is_empty() {
            Nameservers::System
        } else {
            Nameservers::Explicit(servers)
        },
        audit: AuditDestination::File(audit_path.to_path_buf()),
        limits: Limits {
            shutdown_grace: std::time::Duration::from_secs(2),
            ..Limits::default()
        },
        audit_options: AuditOptions::default(),
        metrics_listen: None,
        upstream_proxy: policy.upstream_proxy,
        central: match &policy.central {
            Some(spec) => Some(centrals(spec)?),
            None => None,
        },
    })
}

/// The run's proxy as a node-local proxy of central ones: the upstreams parsed and the TLS
/// files read now, so a bad one stops the run before the command starts.
fn centrals(
    spec: &crate::policy::CentralSpec,
) -> Result<std::sync::Arc<sandgate_proxy::dial::Centrals>, RunError> {
    let hops = spec
        .upstreams
        .iter()
        .map(|u| {
            sandgate_proxy::dial::Hop::parse(u)
                .map_err(|e| RunError::Usage(format!("net.proxy.upstream: {u:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let files = sandgate_proxy::node::ClientFiles {
        ca: spec.ca.clone(),
        cert: spec.cert.clone(),
        key: spec.key.clone(),
        http1: false,
    };
    sandgate_proxy::dial::Centrals::new(hops, files)
        .map(std::sync::Arc::new)
        .map_err(|e| RunError::Usage(format!("net.proxy.tls: {e}")))
}

/// Binds `name` in the run's bridge directory and relays its connections to `target`
/// (see [`bridge::serve`]).
fn open_bridge(
    state: &RunState,
    name: &str,
    target: SocketAddr,
    what: String,
    peers: Option<PeerFilter>,
) -> Result<(), RunError> {
    let socket = state.bridge_dir().join(name);
    let unix = UnixListener::bind(&socket)
        .map_err(|e| RunError::Unavailable(format!("cannot create the bridge {}: {e}", socket.display())))?;
    tokio::spawn(bridge::serve(unix, target, what, peers));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn host(path: &Path) -> std::io::Result<PathBuf> {
        match path.to_str() {
            Some("/b/kernels/python3-low/../..") => Ok("/b".into()),
            _ => Err(std::io::ErrorKind::NotFound.into()),
        }
    }

    #[test]
    fn a_path_param_is_canonical_and_must_exist() {
        assert_eq!(
            path_param("BUNDLE=/b/kernels/python3-low/../..", &host).unwrap(),
            ("BUNDLE".to_owned(), "/b".to_owned())
        );
        for bad in ["BUNDLE", "=/b", "BUNDLE=", ""] {
            let Err(RunError::Usage(m)) = path_param(bad, &host) else {
                panic!("{bad:?} accepted");
            };
            assert!(m.contains("expected NAME=PATH"), "{m}");
        }
        let Err(RunError::Usage(m)) = path_param("B=/nope", &host) else {
            panic!("a missing path accepted");
        };
        assert!(m.starts_with("--path-param B: \"/nope\": "), "{m}");
    }
}
