//! The run's own proxy: started on host loopback (port 0) before bwrap, serving only this
//! run's bridges under the run's task identity, with the policy's rules (its patterns and
//! entries, and a named EgressPolicy's), ranges and resolver; `--ask`, `--learn` (the
//! proxy's report-only mode) and the live refusal lines are set up here.

use std::net::SocketAddr;

use sandgate_policy::{AddressGuard, Ruleset};
use sandgate_proxy::{
    AuditDestination, AuditOptions, Connector, FrontEnd, Identity, Limits, Listener, Nameservers, PeerFilter,
    Proxy, ProxyConfig, Remedies, Setting,
};
use tokio::net::UnixListener;

use super::RunError;
use crate::argv::{PROXY_SOCKET, SOCKS_SOCKET};
use crate::bridge;
use crate::policy::SandboxPolicy;
use crate::state::RunState;

/// How the run's proxy serves this run.
pub(super) struct ProxyRun {
    /// The run's task, project, job and subject: on every audit event, decided under, and
    /// forwarded to central proxies.
    pub(super) identity: super::RunIdentity,
    pub(super) ask: Option<std::time::Duration>,
    pub(super) learn: bool,
    /// `--audit-query`: paths recorded with their query strings.
    pub(super) audit_query: bool,
    /// Print each deny on stderr as it happens.
    pub(super) live: bool,
    /// bwrap's pid once it runs: `--ask` holds the sandbox still while it asks.
    pub(super) sandbox: std::sync::Arc<std::sync::OnceLock<i32>>,
    /// What starts the follower of `net.exceptions` (the binary's).
    pub(super) follow: Option<Follow>,
    /// Where the run's audit log is kept after the run, if anywhere: a refusal names it
    /// beside its request id.
    pub(super) kept_log: Option<std::path::PathBuf>,
    /// The bridges are checked once through bwrap's bind descriptors, and nothing else of
    /// this process connects to them (see [`bridge::serve`]); false under Seatbelt, whose
    /// front ports in this process relay to them.
    pub(super) probed: bool,
}

/// What starts a follower of `net.exceptions` for the run's proxy. The binary gives it: it
/// has the control plane's client, which this crate does not depend on. Called once the
/// proxy is bound and before the command starts (so what is approved already applies to the
/// first request); what it returns keeps the follower running, and is dropped when the
/// run's proxy stops. An error is the configuration's (a usage error).
#[derive(Clone)]
pub struct Follow(pub std::sync::Arc<StartFollower>);

/// The function behind [`Follow`]: what it returns keeps the follower running.
pub type StartFollower = dyn Fn(FollowRequest) -> Result<Following, String> + Send + Sync;

/// A running follower, held until the run's proxy stops.
pub type Following = Box<dyn std::any::Any + Send>;

impl std::fmt::Debug for Follow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Follow")
    }
}

/// What a follower is started with: the feed, the run's task and project (its bounds apply
/// to that task only), and the run's proxy.
#[derive(Debug)]
pub struct FollowRequest {
    pub feed: crate::policy::ExceptionsFeed,
    pub task: String,
    pub project: Option<String>,
    pub proxy: sandgate_proxy::PolicyHandle,
}

/// The run's proxy while it serves, with its live deny printer.
pub(super) struct RunningProxy {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<u64>>,
    /// The proxy's audit counters: events that went to stderr make the log not whole.
    audit: std::sync::Arc<sandgate_proxy::audit::AuditMetrics>,
    live: Option<crate::live::Printer>,
    /// The follower of `net.exceptions`, while the proxy serves.
    follower: Option<Following>,
    /// The interception CA's files for the sandbox (name, text), when the run intercepts:
    /// handed to bwrap as data, never written on the host (under Seatbelt, which has no
    /// such data, written into the state directory: `seatbelt/run.rs`).
    pub(super) ca_files: Vec<(&'static str, String)>,
}

impl RunningProxy {
    /// Stops the proxy (its audit log drained), then the live printer (what it was sent
    /// printed). `Err`: why the audit log is not whole (it could not be written, and what
    /// the proxy could not write went to stderr; or the proxy failed): the run must say so.
    pub(super) async fn stop(self) -> Result<(), String> {
        drop(self.follower);
        let _ = self.stop.send(());
        let served = match self.task.await {
            // The log failed for a while and recovered: what could not wait for it went to
            // stderr, and the file lacks it.
            Ok(Ok(_)) => match self.audit.events_not_queued.get() {
                0 => Ok(()),
                n => Err(format!(
                    "it could not be written for a while, and {n} events went to stderr instead"
                )),
            },
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("the run's proxy failed: {e}")),
        };
        if let Some(live) = self.live {
            live.finish().await;
        }
        served
    }
}

/// Starts the run's proxy on host loopback (port 0: an HTTP listener, and a SOCKS5 one when
/// the policy has a SOCKS5 port), serving only this run's bridges, and a bridge socket in
/// front of each listener.
pub(super) async fn start_proxy(
    policy: &SandboxPolicy,
    audit_path: &std::path::Path,
    state: &RunState,
    how: ProxyRun,
) -> Result<RunningProxy, RunError> {
    // Only this run's bridges may talk to its proxy: the listeners share one filter, and
    // one task identity, so HTTP and SOCKS5 requests are the same run's in the audit log.
    let peers = PeerFilter::new();
    let mut config = proxy_config(policy, audit_path, &peers, &how.identity)?;
    config.remedies.audit_log = how.kept_log.clone();
    let listeners = config.listen.len();
    let proxy = Proxy::bind(config)
        .await
        .map_err(|e| RunError::Unavailable(format!("cannot start the proxy: {e}")))?;
    if let Some(timeout) = how.ask {
        proxy.set_asker(std::sync::Arc::new(crate::ask::TerminalAsker::new(
            timeout,
            how.sandbox.clone(),
        )));
    }
    proxy.set_report_only(how.learn);
    proxy.set_record_query(how.audit_query);
    let ca_files = if policy.intercepts() {
        intercept(&proxy, &how.identity)?
    } else {
        Vec::new()
    };
    let follower = follow(policy, &how, &proxy).await?;
    let live = how
        .live
        .then(|| crate::live::Printer::start(proxy.policy_handle().subscribe()));
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
        open_bridge(
            state,
            socket,
            addr,
            what.to_owned(),
            Some(peers.clone()),
            how.probed,
        )?;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let audit = proxy.audit_metrics();
    let task = tokio::spawn(proxy.run(async move {
        let _ = stop_rx.await;
    }));
    Ok(RunningProxy {
        stop: stop_tx,
        task,
        audit,
        live,
        follower,
        ca_files,
    })
}

/// Starts the follower `net.exceptions` asks for, for the run's task, before the command
/// runs (its first read of the control plane included).
async fn follow(
    policy: &SandboxPolicy,
    how: &ProxyRun,
    proxy: &Proxy,
) -> Result<Option<Following>, RunError> {
    let Some(feed) = policy.exceptions.clone() else {
        return Ok(None);
    };
    let Some(Follow(start)) = how.follow.clone() else {
        return Err(RunError::Unavailable(
            "net.exceptions: this runner cannot follow a control plane".into(),
        ));
    };
    let request = FollowRequest {
        feed,
        task: how.identity.task.clone(),
        project: how.identity.project.clone(),
        proxy: proxy.policy_handle(),
    };
    let started = tokio::task::spawn_blocking(move || start(request))
        .await
        .map_err(|e| RunError::Unavailable(format!("net.exceptions: the follower did not start: {e}")))?;
    started
        .map(Some)
        .map_err(|e| RunError::Usage(format!("net.exceptions: {e}")))
}

/// The run's proxy: the policy's rules, ranges and resolver, and its listeners on host
/// loopback port 0 under the run's task, served only to `peers`.
fn proxy_config(
    policy: &SandboxPolicy,
    audit_path: &std::path::Path,
    peers: &PeerFilter,
    run: &super::RunIdentity,
) -> Result<ProxyConfig, RunError> {
    let egress = policy.egress.as_deref();
    let mut rules = Ruleset::from_parts(&policy.allow, &[], egress);
    policy
        .allow_entries
        .iter()
        .cloned()
        .for_each(|e| rules.allow_entry(e));
    policy
        .deny_entries
        .iter()
        .cloned()
        .for_each(|e| rules.deny_entry(e));
    // The bound secrets, read from this process's environment (never the command's).
    let specs: Vec<_> = policy.all_credentials().cloned().collect();
    let secrets = sandgate_policy::document::credentials::resolve(&specs, |name| std::env::var(name).ok())
        .map_err(|e| RunError::Usage(format!("net.credentials: {e}")))?;
    rules.set_secrets(secrets);
    let mut ranges = policy
        .allow_ranges
        .iter()
        .map(|r| {
            r.parse()
                .map_err(|_| RunError::Usage(format!("net.allow_ranges: {r:?} is not a CIDR")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    ranges.extend(egress.iter().flat_map(|f| f.allow_ranges.iter().copied()));
    let mut servers = policy
        .resolver_servers
        .iter()
        .map(|s| {
            s.parse::<SocketAddr>()
                .map_err(|_| RunError::Usage(format!("net.resolver.servers: {s:?} is not IP:PORT")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        servers.extend(
            egress
                .and_then(|f| f.resolver.as_ref())
                .iter()
                .flat_map(|r| r.servers.iter().copied()),
        );
    }
    let listener = |front_end| Listener {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        identity: Identity {
            task: Some(run.task.clone()),
            project: run.project.clone(),
            job: run.job.clone(),
            subject: Some(run.subject.clone()),
            agent: run.agent.clone(),
        },
        peers: Some(peers.clone()),
        front_end,
    };
    let socks = policy
        .socks_port
        .map(|_| listener(FrontEnd::Socks5 { require_auth: false }));
    Ok(ProxyConfig {
        listen: std::iter::once(listener(FrontEnd::Http1 { require_auth: false }))
            .chain(socks)
            .collect(),
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
        connector: match (&policy.central, policy.upstream_proxy) {
            (Some(spec), _) => Connector::Central(centrals(spec)?),
            (None, Some(addr)) => Connector::UpstreamProxy(addr),
            (None, None) => Connector::Direct,
        },
        remedies: run_remedies(),
    })
}

/// A refusal inside a run says the fix in the run's terms: the SandboxPolicy's fields and
/// `sandgate run`'s flag, not the EgressPolicy's and `sandgate proxy`'s. The audit log is
/// set by [`start_proxy`], which knows whether the log outlives the run.
fn run_remedies() -> Remedies {
    Remedies {
        allow_hint: Setting {
            field: "net.allow_domains".into(),
            flag: Some("--allow-domain".into()),
        },
        range_hint: Setting {
            field: "net.allow_ranges".into(),
            flag: None,
        },
        audit_log: None,
    }
}

/// The run's proxy as a node-local proxy of central ones: the upstreams parsed and the TLS
/// files read now, so a bad one stops the run before the command starts.
fn centrals(
    spec: &crate::policy::CentralSpec,
) -> Result<std::sync::Arc<sandgate_proxy::dial::Centrals>, RunError> {
    let files = sandgate_proxy::transport::ClientFiles {
        ca: spec.ca.clone(),
        cert: spec.cert.clone(),
        key: spec.key.clone(),
        http1: false,
    };
    use sandgate_proxy::dial::{Centrals, CentralsError};
    match Centrals::from_urls(&spec.upstreams, files) {
        Ok(c) => Ok(std::sync::Arc::new(c)),
        Err(e @ CentralsError::Url(..)) => Err(RunError::Usage(format!("net.proxy.upstream: {e}"))),
        Err(CentralsError::Tls(e)) => Err(RunError::Usage(format!("net.proxy.tls: {e}"))),
    }
}

/// Makes the run's interception CA and has the proxy use it; returns its certificate, and a
/// bundle of it with the system's roots, for the sandbox (read-only inside, at
/// `/run/sandgate`). Its key stays in this process.
fn intercept(proxy: &Proxy, identity: &super::RunIdentity) -> Result<Vec<(&'static str, String)>, RunError> {
    let name = format!("sandgate run {} interception CA", identity.run);
    let interceptor = sandgate_proxy::inspect::Interceptor::new(&name).map_err(|e| {
        RunError::Unavailable(format!(
            "cannot intercept TLS for the entries with methods or paths: {e}"
        ))
    })?;
    let files = vec![
        (crate::argv::CA_CERT, interceptor.ca().cert_pem().to_owned()),
        (crate::argv::CA_BUNDLE, interceptor.bundle_pem()),
    ];
    proxy.set_interceptor(std::sync::Arc::new(interceptor));
    Ok(files)
}

/// Binds `name` in the run's bridge directory and relays its connections to `target`
/// (see [`bridge::serve`]).
pub(super) fn open_bridge(
    state: &RunState,
    name: &str,
    target: SocketAddr,
    what: String,
    peers: Option<PeerFilter>,
    probed: bool,
) -> Result<(), RunError> {
    let socket = state.bridge_dir().join(name);
    let unix = UnixListener::bind(&socket)
        .map_err(|e| RunError::Unavailable(format!("cannot create the bridge {}: {e}", socket.display())))?;
    tokio::spawn(bridge::serve(unix, target, what, peers, probed));
    Ok(())
}
