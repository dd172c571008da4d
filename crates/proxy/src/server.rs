//! The accept loop, the per-connection request loop, and graceful shutdown.
//!
//! Shape after mini-redis, with one change: a connection is admitted against the proxy's,
//! its listener's and its client address's limits after `accept` ([`crate::admission`]),
//! and one over a limit is answered 503 at once instead of waiting unanswered in the
//! backlog. Every connection task is tracked, and shutdown is three steps: stop accepting and let idle
//! keep-alive connections go; give in-flight requests and tunnels the grace period; then cut
//! what remains (each cut tunnel still writes its close event). The audit writer is drained
//! last, so nothing decided is lost.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use sandgate_policy::{AddressGuard, Context, Ruleset};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::{Admission, ListenerSlots};
use crate::audit::{Audit, AuditEvent, AuditWriter, EventKind, WeakAudit};
use crate::config::{Identity, Limits, ProxyConfig};
use crate::dial::{DialConfig, Dialer};
use crate::forward::{self, Upstream};
use crate::head::{RequestHead, parse_request_head};
use crate::metrics::{KindLabels, Metrics, OutcomeLabels};
use crate::respond::{LimitKind, Refusal};
use crate::tunnel;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot open the audit log: {0}")]
    Audit(std::io::Error),
    #[error("cannot set up DNS resolution: {0}")]
    Resolver(String),
    #[error("no listen address given")]
    NoListener,
    #[error("the upstream proxy {0} is this proxy")]
    UpstreamIsSelf(SocketAddr),
}

/// State shared by every connection.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Swapped whole on reload; a request decides against the set it started with.
    rules: Arc<RwLock<Arc<Ruleset>>>,
    pub dialer: Dialer,
    pub audit: Audit,
    pub limits: Limits,
    pub ids: RequestIds,
    /// Cancelled when in-flight work must end (grace period over).
    pub hard_stop: CancellationToken,
    pub metrics: Arc<Metrics>,
}

impl Shared {
    /// The rules in force now.
    pub fn rules(&self) -> Arc<Ruleset> {
        match self.rules.read() {
            Ok(r) => r.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// Unix seconds now, for decisions (entries expire at exact seconds).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The decision context for a connection's identity, now.
pub(crate) fn context(identity: &Identity) -> Context<'_> {
    Context {
        task: identity.task.as_deref(),
        project: identity.project.as_deref(),
        now: unix_now(),
    }
}

/// Replaces the policy of a running proxy. Holds no strong reference to the audit writer, so
/// it never delays shutdown.
#[derive(Debug, Clone)]
pub struct PolicyHandle {
    rules: Arc<RwLock<Arc<Ruleset>>>,
    audit: WeakAudit,
    metrics: Arc<Metrics>,
}

impl PolicyHandle {
    /// Swaps in a new rule set atomically and records the reload.
    pub async fn replace(&self, rules: Ruleset, generation: u64, detail: String) {
        match self.rules.write() {
            Ok(mut r) => *r = Arc::new(rules),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(rules),
        }
        self.record(true, generation, detail).await;
    }

    /// Records a rejected reload (the old rules stay in force).
    pub async fn rejected(&self, generation: u64, detail: String) {
        self.record(false, generation, detail).await;
    }

    async fn record(&self, applied: bool, generation: u64, detail: String) {
        let outcome = if applied { "applied" } else { "rejected" };
        self.metrics
            .policy_reloads
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
        if applied {
            self.metrics.policy_generation.set(generation as i64);
        }
        let mut e = AuditEvent::new(EventKind::PolicyReload, format!("reload-{generation}"));
        e.outcome = Some(if applied {
            "applied".into()
        } else {
            "rejected".into()
        });
        e.detail = Some(detail);
        self.audit.record(e).await;
    }
}

/// Request ids: a per-process prefix and a counter, unique within a run and unlikely to
/// repeat across restarts.
#[derive(Debug)]
pub(crate) struct RequestIds {
    prefix: u32,
    next: AtomicU64,
}

impl RequestIds {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        RequestIds {
            prefix: nanos ^ std::process::id().rotate_left(16),
            next: AtomicU64::new(1),
        }
    }

    pub fn next(&self) -> String {
        format!(
            "{:08x}{:08x}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// A bound, ready-to-run proxy.
#[derive(Debug)]
pub struct Proxy {
    listeners: Vec<(TcpListener, ListenerMeta)>,
    shared: Arc<Shared>,
    writer: AuditWriter,
    admin: Option<TcpListener>,
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
                    require_auth: spec.require_auth,
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
            upstream_proxy: config.upstream_proxy,
        };
        if let Some(up) = config.upstream_proxy
            && own.contains(&up)
        {
            return Err(StartError::UpstreamIsSelf(up));
        }
        let mut dialer = Dialer::new(&dial_config, own).map_err(|e| StartError::Resolver(e.to_string()))?;
        let metrics = Arc::new(Metrics::new());
        dialer.set_metrics(metrics.clone());
        let (audit, writer) = AuditWriter::start(&config.audit, &config.audit_options, metrics.clone())
            .map_err(StartError::Audit)?;
        let shared = Arc::new(Shared {
            rules: Arc::new(RwLock::new(Arc::new(config.rules))),
            dialer,
            audit,
            limits: config.limits,
            ids: RequestIds::new(),
            hard_stop: CancellationToken::new(),
            metrics,
        });
        Ok(Proxy {
            listeners,
            shared,
            writer,
            admin,
        })
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

    /// A handle to replace the policy while the proxy runs.
    pub fn policy_handle(&self) -> PolicyHandle {
        PolicyHandle {
            rules: self.shared.rules.clone(),
            audit: self.shared.audit.downgrade(),
            metrics: self.shared.metrics.clone(),
        }
    }

    /// The address guard in force (for start-up logging).
    pub fn guard(&self) -> &AddressGuard {
        self.shared.dialer.guard()
    }

    /// Serves until `shutdown` completes, then shuts down gracefully. Returns the number of
    /// audit events written.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> std::io::Result<u64> {
        let Proxy {
            listeners,
            shared,
            writer,
            admin,
        } = self;
        let stop_accepting = CancellationToken::new();
        let tracker = TaskTracker::new();
        let admission = Arc::new(Admission::new(&shared.limits));
        let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
        let count = listeners.len();
        for (listener, meta) in listeners {
            tracker.spawn(accept_loop(
                listener,
                meta,
                Gate {
                    admission: admission.clone(),
                    slots: Admission::listener(&shared.limits, count),
                    refusals: refusals.clone(),
                },
                shared.clone(),
                tracker.clone(),
                stop_accepting.clone(),
            ));
        }
        if let Some(admin) = admin {
            tracker.spawn(crate::admin::serve(
                admin,
                shared.metrics.clone(),
                stop_accepting.clone(),
            ));
        }
        shutdown.await;
        tracing::info!(
            grace_secs = shared.limits.shutdown_grace.as_secs_f64(),
            "shutting down"
        );
        stop_accepting.cancel();
        tracker.close();
        if tokio::time::timeout(shared.limits.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(open = tracker.len(), "grace period over; closing what remains");
            shared.hard_stop.cancel();
            // Cut work ends promptly (it only writes its close event); bound it anyway.
            let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
        }
        drop(shared);
        let written = writer.finish().await?;
        tracing::info!(audit_events = written, "stopped");
        Ok(written)
    }
}

/// What a listener knows about the connections it accepts.
#[derive(Debug)]
pub(crate) struct ListenerMeta {
    identity: Arc<Identity>,
    require_auth: bool,
    peers: Option<crate::config::PeerFilter>,
    /// Refused peers since the last warning, and when that was (one warning per interval).
    refused_peers: AtomicU64,
    last_peer_warning: std::sync::Mutex<Option<std::time::Instant>>,
}

/// Connections answered 503 at once (each for at most [`REFUSAL_TIME`]); beyond this many,
/// further ones are closed without an answer rather than tie up descriptors in a flood.
const MAX_REFUSALS_IN_FLIGHT: usize = 256;
/// How long a refused connection may take to receive its 503.
const REFUSAL_TIME: Duration = Duration::from_secs(1);
/// At most one "unexpected local peer" warning per interval.
const PEER_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Everything a listener checks before it serves a connection.
#[derive(Debug)]
struct Gate {
    admission: Arc<Admission>,
    slots: ListenerSlots,
    refusals: Arc<Semaphore>,
}

impl ListenerMeta {
    /// Logs a refused peer, at most once per interval, with the number refused meanwhile.
    fn warn_refused_peer(&self, peer: SocketAddr) {
        let refused = self.refused_peers.fetch_add(1, Ordering::Relaxed) + 1;
        let Ok(mut last) = self.last_peer_warning.lock() else {
            return;
        };
        if last.is_some_and(|at| at.elapsed() < PEER_WARNING_INTERVAL) {
            return;
        }
        *last = Some(std::time::Instant::now());
        self.refused_peers.store(0, Ordering::Relaxed);
        tracing::warn!(%peer, refused, "connections from unexpected local peers refused");
    }
}

async fn accept_loop(
    listener: TcpListener,
    meta: ListenerMeta,
    gate: Gate,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if meta.peers.as_ref().is_some_and(|f| !f.permits(peer)) {
            // Not this listener's bridge: closed before a byte is read or written.
            meta.warn_refused_peer(peer);
            continue;
        }
        let permit = match gate.admission.admit(&gate.slots, peer.ip()) {
            Ok(p) => p,
            Err(kind) => {
                shared
                    .metrics
                    .connections_refused
                    .get_or_create(&KindLabels {
                        kind: kind.as_str().into(),
                    })
                    .inc();
                // Answered 503 at once, never left waiting; in a flood beyond the refusal
                // budget the connection is simply closed.
                if let Ok(slot) = gate.refusals.clone().try_acquire_owned() {
                    let shared = shared.clone();
                    let identity = meta.identity.clone();
                    tracker.spawn(async move {
                        refuse_at_limit(&shared, stream, peer, identity, kind).await;
                        drop(slot);
                    });
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let stop = stop.clone();
        let identity = meta.identity.clone();
        let require_auth = meta.require_auth;
        shared.metrics.connections.inc();
        shared.metrics.connections_active.inc();
        tracker.spawn(async move {
            // The request loop is boxed and gone before a tunnel starts, so a
            // long-lived tunnel's task holds only the tunnel's own small state.
            let handoff = Box::pin(serve_connection(
                stream,
                peer,
                identity,
                require_auth,
                &shared,
                &stop,
            ))
            .await;
            if let Some((client, head)) = handoff {
                tunnel::handle_connect(&shared, client, head).await;
            }
            shared.metrics.connections_active.dec();
            drop(permit);
        });
    }
}

/// Answers a connection over a limit with 503 and records it, then closes it after reading
/// (and discarding) what the client sent, so the answer is not lost to a reset.
async fn refuse_at_limit(
    shared: &Shared,
    stream: TcpStream,
    peer: SocketAddr,
    identity: Arc<Identity>,
    kind: LimitKind,
) {
    let mut client = ClientConn {
        stream,
        buf: BytesMut::new(),
        peer,
        identity,
    };
    let answered = tokio::time::timeout(
        REFUSAL_TIME,
        forward::refuse(
            shared,
            &mut client,
            None,
            Refusal::ConnectionLimit(kind),
            "-",
            None,
        ),
    );
    let _ = answered.await;
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        let _ = client.stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let mut budget = 64 * 1024usize;
        while budget > 0 {
            match client.stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => budget = budget.saturating_sub(n),
            }
        }
    })
    .await;
}

/// A client connection with its read buffer (bytes received but not yet consumed).
#[derive(Debug)]
pub(crate) struct ClientConn {
    pub stream: TcpStream,
    pub buf: BytesMut,
    pub peer: SocketAddr,
    pub identity: Arc<Identity>,
}

/// What to do after one exchange.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    KeepAlive,
    Close,
}

/// Serves requests until the connection ends, or returns it with a CONNECT head to become
/// a tunnel.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    identity: Arc<Identity>,
    require_auth: bool,
    shared: &Shared,
    stop: &CancellationToken,
) -> Option<(ClientConn, RequestHead)> {
    let listener_identity = identity.clone();
    let mut client = ClientConn {
        stream,
        buf: BytesMut::new(),
        peer,
        identity,
    };
    let mut upstream: Option<Upstream> = None;
    loop {
        let head = match read_request_head(&mut client, &shared.limits, stop).await {
            Ok(Some(head)) => head,
            Ok(None) => return None,
            Err(refusal) => {
                forward::refuse(shared, &mut client, None, refusal, "-", None).await;
                return None;
            }
        };
        // Fail closed: while the audit trail cannot be written, nothing new passes.
        if let Err(cause) = shared.audit.available() {
            forward::refuse(
                shared,
                &mut client,
                None,
                Refusal::AuditUnavailable(cause),
                &head.method,
                None,
            )
            .await;
            return None;
        }
        if require_auth {
            match authenticate(shared, &head, &listener_identity) {
                Ok(identity) => client.identity = identity,
                Err(e) => {
                    // A refused request carries no identity an earlier request proved.
                    client.identity = listener_identity.clone();
                    forward::refuse(
                        shared,
                        &mut client,
                        None,
                        Refusal::ProxyAuth(e),
                        &head.method,
                        None,
                    )
                    .await;
                    return None;
                }
            }
        }
        if head.is_connect() {
            return Some((client, head));
        }
        // Boxed: the HTTP exchange state would otherwise enlarge every connection's future,
        // tunnels included.
        if Box::pin(forward::handle_http(shared, &mut client, head, &mut upstream)).await == Next::Close {
            return None;
        }
    }
}

/// Checks a request's task credentials; the credential's task and project replace the
/// listener's (empty) identity for this request only.
fn authenticate(
    shared: &Shared,
    head: &RequestHead,
    listener: &Identity,
) -> Result<Arc<Identity>, sandgate_policy::AuthError> {
    let header = head
        .fields
        .iter()
        .find(|f| f.is("proxy-authorization"))
        .map(|f| f.value.as_slice());
    let rules = shared.rules();
    let cred = rules.credentials().verify(header)?;
    // The task and project come from the credential record alone (the policy file refuses
    // a project on an auth listener); the listener adds only its job label.
    Ok(Arc::new(Identity {
        task: Some(cred.task.clone()),
        project: cred.project.clone(),
        job: listener.job.clone(),
    }))
}

/// Reads one request head. `Ok(None)`: the connection ended (or idled out, or the proxy is
/// stopping) between requests, which needs no answer.
async fn read_request_head(
    client: &mut ClientConn,
    limits: &Limits,
    stop: &CancellationToken,
) -> Result<Option<RequestHead>, Refusal> {
    let deadline = tokio::time::Instant::now() + limits.head_timeout;
    loop {
        if !client.buf.is_empty() {
            match parse_request_head(&client.buf) {
                Ok(Some((head, len))) => {
                    client.buf.advance(len);
                    return Ok(Some(head));
                }
                Ok(None) if client.buf.len() >= limits.max_head_bytes => return Err(Refusal::HeadTooLarge),
                Ok(None) => {}
                Err(crate::head::HeadError::TooManyFields) => return Err(Refusal::HeadTooLarge),
                Err(e) => return Err(Refusal::Head(e)),
            }
        }
        let idle = client.buf.is_empty();
        // Bounded in bytes: never hold more than the head limit plus one read.
        client.buf.reserve(4096);
        let read = tokio::select! {
            _ = stop.cancelled(), if idle => return Ok(None),
            read = tokio::time::timeout_at(deadline, client.stream.read_buf(&mut client.buf)) => read,
        };
        match read {
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
            Ok(Ok(_)) => {}
            Err(_) if idle => return Ok(None),
            Err(_) => return Err(Refusal::HeadTimeout),
        }
    }
}

/// Builds the decision or close event common fields.
pub(crate) fn event(kind: EventKind, request_id: &str, peer: SocketAddr, identity: &Identity) -> AuditEvent {
    let mut e = AuditEvent::new(kind, request_id.to_owned());
    e.client_addr = Some(peer);
    e.task_id = identity.task.clone();
    e.project_id = identity.project.clone();
    e.job_id = identity.job.clone();
    e
}
