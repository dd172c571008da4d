//! The accept loop, the hand-off of each connection to its front end, and graceful
//! shutdown.
//!
//! Shape after mini-redis, with one change: a connection is admitted against the proxy's,
//! its listener's and its client address's limits after `accept` ([`crate::admission`]),
//! and one over a limit is refused at once instead of waiting unanswered in the backlog
//! (recorded; an HTTP/1 client is answered 503 first, a SOCKS5 client or a node has no
//! answer before its handshake and is closed). Every connection task is tracked, and
//! shutdown is three steps: stop accepting and let idle keep-alive connections go; give
//! in-flight requests and tunnels the grace period; then cut what remains (each cut tunnel
//! still writes its close event, and a task dropped after that records what it owed from
//! its states' `Drop`). The audit writer is drained last, so nothing decided is lost.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use sandgate_policy::AddressGuard;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::admission::Admission;
use crate::audit::{AuditDestination, AuditWriter};
use crate::config::{FrontEnd, Identity, ProxyConfig};
use crate::dial::{DialConfig, Dialer};
use crate::egress::Egress;
use crate::metrics::Metrics;
use crate::rules::PolicyHandle;
use crate::transport::TlsHandle;

mod accept;
mod pools;

use accept::{Gate, MAX_REFUSALS_IN_FLIGHT, accept_loop};

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot open the audit log {}: {source}", path.display())]
    Audit {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot set up DNS resolution: {0}")]
    Resolver(String),
    #[error("no listen address given")]
    NoListener,
    #[error("the upstream proxy {0} is this proxy")]
    UpstreamIsSelf(SocketAddr),
}

/// One bound listener: its address (with the port the system chose for port 0), its role
/// (`proxy`, `socks5` or `node`), and the identity and credentials it gives its traffic.
#[derive(Debug, Clone)]
pub struct BoundListener {
    pub addr: SocketAddr,
    pub role: &'static str,
    pub identity: Arc<Identity>,
    pub require_auth: bool,
}

/// A bound, ready-to-run proxy.
#[derive(Debug)]
pub struct Proxy {
    listeners: Vec<(TcpListener, ListenerMeta)>,
    egress: Arc<Egress>,
    writer: AuditWriter,
    admin: Option<TcpListener>,
    admin_routes: Option<axum::Router>,
    /// TLS for the admin listener ([`Proxy::serve_admin_tls`]).
    admin_tls: Option<Arc<rustls::ServerConfig>>,
}

impl Proxy {
    /// Binds every listen address, builds the resolver and opens the audit log.
    pub async fn bind(config: ProxyConfig) -> Result<Proxy, StartError> {
        if config.listen.is_empty() {
            return Err(StartError::NoListener);
        }
        let mut listeners = Vec::with_capacity(config.listen.len());
        for spec in &config.listen {
            let listener = TcpListener::bind(spec.addr)
                .await
                .map_err(|source| StartError::Bind {
                    addr: spec.addr,
                    source,
                })?;
            listeners.push((
                listener,
                ListenerMeta {
                    identity: Arc::new(spec.identity.clone()),
                    front_end: spec.front_end.clone(),
                    peers: spec.peers.clone(),
                    refused_peers: AtomicU64::new(0),
                    last_peer_warning: std::sync::Mutex::new(None),
                },
            ));
        }
        let admin = match config.metrics_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| StartError::Bind { addr, source })?,
            ),
            None => None,
        };
        // Every port of ours, the admin port included: the dialer refuses them all.
        let own: Vec<SocketAddr> = listeners
            .iter()
            .map(|(l, _)| l)
            .chain(admin.as_ref())
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let dial_config = DialConfig {
            nameservers: config.nameservers.clone(),
            dns_timeout: config.limits.dns_timeout,
            connect_timeout: config.limits.connect_timeout,
            guard: config.guard.clone(),
            connector: config.connector.clone(),
        };
        if let crate::dial::Connector::UpstreamProxy(up) = config.connector
            && own.contains(&up)
        {
            return Err(StartError::UpstreamIsSelf(up));
        }
        let mut dialer = Dialer::new(&dial_config, own).map_err(|e| StartError::Resolver(e.to_string()))?;
        let metrics = Arc::new(Metrics::new());
        dialer.set_metrics(metrics.clone());
        let (audit, writer) = AuditWriter::start(
            &config.audit,
            &config.audit_options,
            metrics.audit.clone(),
            metrics.clone(),
        )
        .map_err(|source| StartError::Audit {
            path: match &config.audit {
                AuditDestination::File(path) => path.clone(),
                AuditDestination::Stdout => "(stdout)".into(),
            },
            source,
        })?;
        let egress = Arc::new(Egress::new(
            config.rules,
            dialer,
            audit,
            config.limits,
            config.remedies,
            metrics,
        ));
        Ok(Proxy {
            listeners,
            egress,
            writer,
            admin,
            admin_routes: None,
            admin_tls: None,
        })
    }

    /// Has the proxy ask `asker` before the allowlist refuses a task's request
    /// (`sandgate run --ask`). Set once, before `run`.
    pub fn set_asker(&self, asker: Arc<dyn crate::ask::Asker>) {
        let _ = self.egress.asker.set(asker);
    }

    /// Has the proxy intercept the TLS of a CONNECT that only allow entries with methods
    /// or paths allow, deciding each request inside (`http1/intercept/`), instead of
    /// refusing it. Set once, before `run`.
    pub fn set_interceptor(&self, interceptor: Arc<crate::inspect::Interceptor>) {
        let _ = self.egress.interceptor.set(interceptor);
    }

    /// Report-only (learn) mode: requests the policy denies pass, recorded as
    /// `reason_code: report_only` with `detail: would deny: REASON`; the address guard,
    /// address deny entries and tunnel checks still refuse. Set before `run`.
    pub fn set_report_only(&self, on: bool) {
        self.egress
            .report_only
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Records each request's path with its query string (`--audit-query`).
    pub fn set_record_query(&self, on: bool) {
        self.egress
            .record_query
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Adds routes (the control plane's API) to the admin listener. Without an admin
    /// listener they are not served.
    pub fn mount_admin(&mut self, routes: axum::Router) {
        self.admin_routes = Some(match self.admin_routes.take() {
            Some(r) => r.merge(routes),
            None => routes,
        });
    }

    /// Serves the admin listener over TLS with `files` (read now; an error leaves it plain
    /// and is the caller's to report).
    pub fn serve_admin_tls(
        &mut self,
        files: &crate::transport::tls::AdminFiles,
    ) -> Result<(), crate::transport::TlsError> {
        self.admin_tls = Some(files.load()?);
        Ok(())
    }

    /// What `sandgate_build_info` says: the binary's version and commit.
    pub fn set_build_info(&self, version: &str, commit: &str) {
        self.egress.metrics.set_build_info(version, commit);
    }

    /// The admin (metrics) listener's address, when one is configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The addresses actually bound (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|(l, _)| l.local_addr().ok())
            .collect()
    }

    /// Every listener as bound (the port the system chose for port 0), in the order of
    /// [`ProxyConfig::listen`], with what the start-up log says of it.
    pub fn bound_listeners(&self) -> Vec<BoundListener> {
        self.listeners
            .iter()
            .filter_map(|(l, meta)| {
                Some(BoundListener {
                    addr: l.local_addr().ok()?,
                    role: meta.front_end.role(),
                    identity: meta.identity.clone(),
                    require_auth: meta.front_end.require_auth(),
                })
            })
            .collect()
    }

    /// What SIGHUP reloads besides the policy: the TLS files of node listeners and of the
    /// connections to central proxies.
    pub fn tls_handle(&self) -> TlsHandle {
        let listeners = self.listeners.iter().filter_map(|(_, m)| m.node());
        let mut configs: Vec<Arc<dyn crate::transport::reload::TlsConfig>> =
            listeners.map(|n| n.tls.clone() as _).collect();
        configs.extend(self.egress.dialer.centrals().map(|c| c.tls() as _));
        TlsHandle {
            configs,
            metrics: self.egress.metrics.clone(),
        }
    }

    /// The audit trail's counters (events written, events that went to stderr instead), for
    /// a caller that must say whether the log is whole once the proxy has stopped.
    pub fn audit_metrics(&self) -> Arc<crate::audit::AuditMetrics> {
        self.egress.metrics.audit.clone()
    }

    /// A handle to replace the policy while the proxy runs.
    pub fn policy_handle(&self) -> PolicyHandle {
        PolicyHandle {
            rules: self.egress.rules.clone(),
            layers: self.egress.layers.clone(),
            cuts: self.egress.cuts.clone(),
            stopping: self.egress.stopping.clone(),
            audit: self.egress.audit.downgrade(),
            metrics: self.egress.metrics.clone(),
            node_listeners: self
                .listeners
                .iter()
                .filter_map(|(_, m)| m.node().cloned())
                .collect(),
        }
    }

    /// The address guard in force (for start-up logging).
    pub fn guard(&self) -> &AddressGuard {
        self.egress.dialer.guard()
    }

    /// Serves until `shutdown` completes, then shuts down gracefully. Returns the number of
    /// audit events written.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> std::io::Result<u64> {
        let Proxy {
            listeners,
            egress,
            writer,
            admin,
            admin_routes,
            admin_tls,
        } = self;
        let stop_accepting = egress.stopping.clone();
        let tracker = TaskTracker::new();
        let admission = Arc::new(Admission::new(&egress.limits));
        let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
        // An HTTP/1 and a SOCKS5 listener of one tenant share one pool (server/pools.rs).
        let doors: Vec<pools::Door<'_>> = listeners
            .iter()
            .map(|(listener, meta)| {
                let ip = listener.local_addr().ok().map(|a| a.ip());
                pools::Door::new(&meta.identity, &meta.front_end, meta.peers.as_ref(), ip)
            })
            .collect();
        let slots = pools::share(&doors, |count| Admission::listener(&egress.limits, count));
        drop(doors);
        for ((listener, meta), slots) in listeners.into_iter().zip(slots) {
            tracker.spawn(accept_loop(
                listener,
                meta,
                Gate {
                    admission: admission.clone(),
                    slots,
                    refusals: refusals.clone(),
                },
                egress.clone(),
                tracker.clone(),
                stop_accepting.clone(),
            ));
        }
        if let Some(admin) = admin {
            tracker.spawn(crate::admin::serve(
                admin,
                egress.metrics.clone(),
                admin_routes,
                admin_tls,
                stop_accepting.clone(),
            ));
        }
        shutdown.await;
        tracing::info!(
            grace_secs = egress.limits.shutdown_grace.as_secs_f64(),
            "shutting down"
        );
        stop_accepting.cancel();
        tracker.close();
        if tokio::time::timeout(egress.limits.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(open = tracker.len(), "grace period over; closing what remains");
            egress.hard_stop.cancel();
            // Cut work ends promptly (it only writes its close event); bound it anyway.
            if tokio::time::timeout(Duration::from_secs(5), tracker.wait())
                .await
                .is_err()
            {
                // Stuck somewhere no stop token reaches (a lookup, a connect): dropped, and
                // each request it held records what it owed, before the writer drains.
                tracing::warn!(open = tracker.len(), "dropping what is still open");
                egress.dropped.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(1), tracker.wait()).await;
            }
        }
        drop(egress);
        let written = writer.finish().await?;
        tracing::info!(audit_events = written, "stopped");
        Ok(written)
    }
}

/// What a listener knows about the connections it accepts.
#[derive(Debug)]
pub(crate) struct ListenerMeta {
    identity: Arc<Identity>,
    front_end: FrontEnd,
    peers: Option<crate::config::PeerFilter>,
    /// Refused peers since the last warning, and when that was (one warning per interval).
    refused_peers: AtomicU64,
    last_peer_warning: std::sync::Mutex<Option<std::time::Instant>>,
}

impl ListenerMeta {
    /// A node listener's TLS and nodes.
    fn node(&self) -> Option<&Arc<crate::transport::NodeListener>> {
        match &self.front_end {
            FrontEnd::Node(node) => Some(node),
            _ => None,
        }
    }
}
