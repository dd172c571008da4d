//! The audit trail: one JSON object per line for every decision and every close.
//!
//! Events go through a bounded channel to a dedicated writer thread, so disk latency never
//! stalls a proxy worker; when the writer falls behind, senders wait (back-pressure) rather
//! than drop an event. The writer serialises, writes, and flushes whenever the queue runs
//! empty or at most a few milliseconds after an event arrived; on shutdown every queued
//! event is written and flushed before [`AuditWriter::finish`] returns.
//!
//! Fail closed: when a write fails (a full disk, `EMFILE` while rotating), the writer keeps
//! the unwritten lines ([`crate::audit_sink`]), marks [`AuditHealth`] as failing, and retries
//! until it can write again. While it fails, the request path refuses new requests with 503
//! (`Audit::available`), so no traffic passes unrecorded; requests already allowed finish
//! and their events wait in memory. Field names follow the seed spec (`docs/audit.md`).

use std::borrow::Cow;
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandgate_policy::Verdict;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::audit_sink::Sink;
use crate::metrics::Metrics;

/// Version of the event schema below; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;
/// Events queued before senders wait.
const QUEUE_DEPTH: usize = 8192;
/// Longest an event waits in the writer before it is handed to the OS.
const FLUSH_DELAY: Duration = Duration::from_millis(4);

/// Where audit lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditDestination {
    Stdout,
    File(PathBuf),
}

/// What an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A request was decided (exactly one per request).
    Decision,
    /// An allowed request or tunnel ended (exactly one per allowed request).
    Close,
    /// A policy file was reloaded, or a reload was rejected.
    PolicyReload,
    /// Allowed traffic to one destination over one window, when aggregation is on.
    Aggregate,
}

/// One audit record. Absent values serialise as `null` so every line has every field.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEvent {
    pub schema_version: u32,
    pub event: EventKind,
    pub created_at: String,
    pub request_id: String,
    pub client_addr: Option<SocketAddr>,
    pub task_id: Option<String>,
    pub project_id: Option<String>,
    pub job_id: Option<String>,
    pub decision: Option<Verdict>,
    pub reason_code: Option<Cow<'static, str>>,
    pub scheme: Option<&'static str>,
    pub method: Option<String>,
    pub destination_host: Option<String>,
    pub destination_port: Option<u16>,
    pub resolved_ip: Option<IpAddr>,
    pub rule: Option<Arc<str>>,
    pub status: Option<u16>,
    pub bytes_sent: Option<u64>,
    pub bytes_received: Option<u64>,
    pub duration_ms: Option<u64>,
    pub outcome: Option<Cow<'static, str>>,
    /// Free text for events that need it (a rejected reload's errors).
    pub detail: Option<String>,
    /// Aggregate events: allowed requests folded into this line, and when the window began.
    pub count: Option<u64>,
    pub window_start: Option<String>,
    /// When the event was made, for the audit lag metric; not written.
    #[serde(skip)]
    pub made_at: Option<Instant>,
}

impl AuditEvent {
    /// A blank event of `kind` stamped now.
    pub fn new(kind: EventKind, request_id: String) -> AuditEvent {
        AuditEvent {
            schema_version: SCHEMA_VERSION,
            event: kind,
            created_at: jiff::Timestamp::now().to_string(),
            request_id,
            client_addr: None,
            task_id: None,
            project_id: None,
            job_id: None,
            decision: None,
            reason_code: None,
            scheme: None,
            method: None,
            destination_host: None,
            destination_port: None,
            resolved_ip: None,
            rule: None,
            status: None,
            bytes_sent: None,
            bytes_received: None,
            duration_ms: None,
            outcome: None,
            detail: None,
            count: None,
            window_start: None,
            made_at: Some(Instant::now()),
        }
    }
}

/// Whether the audit trail can be written now. The writer sets it; every request reads it
/// before it is decided, so while the trail is broken no new traffic passes unrecorded.
#[derive(Debug, Default)]
pub struct AuditHealth {
    failing: AtomicBool,
    cause: Mutex<String>,
}

impl AuditHealth {
    /// `Err(cause)` while the writer cannot write (for example `"No space left on device"`).
    pub fn check(&self) -> Result<(), String> {
        if !self.failing.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(match self.cause.lock() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        })
    }

    fn fail(&self, cause: String) {
        match self.cause.lock() {
            Ok(mut c) => *c = cause,
            Err(poisoned) => *poisoned.into_inner() = cause,
        }
        self.failing.store(true, Ordering::Release);
    }

    fn recover(&self) {
        self.failing.store(false, Ordering::Release);
    }

    fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }
}

/// Cloneable handle that queues events.
#[derive(Debug, Clone)]
pub struct Audit {
    tx: mpsc::Sender<Box<AuditEvent>>,
    metrics: Arc<Metrics>,
    health: Arc<AuditHealth>,
}

/// A handle that does not keep the writer open (for long-lived helpers such as the policy
/// reloader, which must not hold up shutdown).
#[derive(Debug, Clone)]
pub struct WeakAudit {
    tx: mpsc::WeakSender<Box<AuditEvent>>,
    metrics: Arc<Metrics>,
    health: Arc<AuditHealth>,
}

impl WeakAudit {
    /// Queues an event if the proxy is still running.
    pub async fn record(&self, event: AuditEvent) {
        if let Some(tx) = self.tx.upgrade() {
            Audit {
                tx,
                metrics: self.metrics.clone(),
                health: self.health.clone(),
            }
            .record(event)
            .await;
        }
    }
}

impl Audit {
    pub fn downgrade(&self) -> WeakAudit {
        WeakAudit {
            tx: self.tx.downgrade(),
            metrics: self.metrics.clone(),
            health: self.health.clone(),
        }
    }

    /// `Err(cause)` while the audit trail cannot be written: the caller must not let new
    /// traffic through.
    pub fn available(&self) -> Result<(), String> {
        self.health.check()
    }

    /// Queues an event, waiting while the queue is full: an event is never dropped. While
    /// the writer cannot write it holds what it has and stops taking more, so the queue
    /// fills and senders wait until it recovers. Only fails if the writer is gone, which
    /// happens only after shutdown; the event is then logged on stderr.
    /// The event is boxed before the future starts, so a caller's future (a tunnel's, for
    /// its whole life) holds a pointer rather than the event.
    pub fn record(&self, event: AuditEvent) -> impl Future<Output = ()> + Send + '_ {
        self.metrics.observe(&event);
        let event = Box::new(event);
        async move {
            if self.tx.capacity() == 0 {
                self.metrics.audit_waits.inc();
            }
            if let Err(e) = self.tx.send(event).await {
                let line = serde_json::to_string(&e.0).unwrap_or_default();
                tracing::error!(event = %line, "audit writer gone; event written here instead");
            }
            self.update_depth();
        }
    }

    /// Queues an event only if there is room now; otherwise logs it on stderr and counts it
    /// in `sandgate_audit_events_not_queued_total`. For refusals made *because* the trail
    /// is broken: their client is answered 503 whatever happens to the record, and they must
    /// never wait behind a queue that cannot drain.
    pub fn record_now_or_log(&self, event: AuditEvent) {
        self.metrics.observe(&event);
        match self.tx.try_send(Box::new(event)) {
            Ok(()) => self.update_depth(),
            Err(e) => {
                let event = match e {
                    mpsc::error::TrySendError::Full(ev) | mpsc::error::TrySendError::Closed(ev) => ev,
                };
                self.metrics.audit_events_not_queued.inc();
                let line = serde_json::to_string(&event).unwrap_or_default();
                tracing::warn!(event = %line, "audit queue full while the audit log is failing; event logged here");
            }
        }
    }

    fn update_depth(&self) {
        let depth = self.tx.max_capacity().saturating_sub(self.tx.capacity());
        self.metrics.audit_queue_depth.set(depth as i64);
    }
}

/// The writer thread; [`finish`](AuditWriter::finish) waits for it to drain.
#[derive(Debug)]
pub struct AuditWriter {
    thread: std::thread::JoinHandle<io::Result<u64>>,
}

impl AuditWriter {
    /// Opens the destination (appending to a file) and starts the writer thread. A
    /// destination that cannot be opened is an error: a proxy with no audit trail serves
    /// nothing.
    pub fn start(
        dest: &AuditDestination,
        options: &AuditOptions,
        metrics: Arc<Metrics>,
    ) -> io::Result<(Audit, AuditWriter)> {
        let sink = Sink::open(dest, options)?;
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let window = options.aggregate_window;
        let health = Arc::new(AuditHealth::default());
        metrics.audit_healthy.set(1);
        let thread = std::thread::Builder::new()
            .name("sandgate-audit".to_owned())
            .spawn({
                let metrics = metrics.clone();
                let health = health.clone();
                move || write_loop(rx, sink, &metrics, &health, window)
            })?;
        Ok((Audit { tx, metrics, health }, AuditWriter { thread }))
    }

    /// Waits until every handle is dropped and every queued event is written and flushed.
    /// Returns the number of events written.
    pub async fn finish(self) -> io::Result<u64> {
        let joined = tokio::task::spawn_blocking(move || self.thread.join()).await;
        match joined {
            Ok(Ok(result)) => result,
            _ => Err(io::Error::other("audit writer thread panicked")),
        }
    }
}

/// First and longest pause between attempts to write again after a failure.
const RETRY_FIRST: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// After shutdown began, how long a failing writer keeps trying before the remaining lines
/// go to stderr instead.
const FINAL_RETRY: Duration = Duration::from_secs(5);

fn write_loop(
    rx: mpsc::Receiver<Box<AuditEvent>>,
    sink: Sink,
    metrics: &Metrics,
    health: &AuditHealth,
    window: Option<Duration>,
) -> io::Result<u64> {
    // A small runtime of the writer's own, so it can wait for events with a timeout (to
    // close aggregation windows while the proxy is idle).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let mut w = Writer {
        rx,
        sink,
        metrics,
        health,
        written: 0,
        line: Vec::with_capacity(1024),
        agg: window.map(Aggregator::new),
    };
    loop {
        let next = match w.agg.as_ref().map(Aggregator::due_in) {
            Some(wait) => rt.block_on(async { tokio::time::timeout(wait, w.rx.recv()).await.ok() }),
            None => Some(w.rx.blocking_recv()),
        };
        match next {
            // The window closed with no event: write its aggregates.
            None => {
                w.close_window();
                w.commit();
            }
            Some(None) => break,
            Some(Some(event)) => {
                w.take(*event);
                // Coalesce: keep taking events for up to FLUSH_DELAY before one write, so a
                // busy proxy makes a few hundred write calls a second instead of one per event.
                let first = Instant::now();
                loop {
                    while let Ok(event) = w.rx.try_recv() {
                        w.take(*event);
                    }
                    let waited = first.elapsed();
                    if waited >= FLUSH_DELAY
                        || w.rx.is_closed()
                        || w.rx.is_empty() && waited >= FLUSH_DELAY / 4
                    {
                        break;
                    }
                    std::thread::sleep(FLUSH_DELAY / 8);
                }
                if w.agg.as_ref().is_some_and(|a| a.due_in().is_zero()) {
                    w.close_window();
                }
                w.commit();
            }
        }
    }
    w.close_window();
    w.finish()
}

struct Writer<'a> {
    rx: mpsc::Receiver<Box<AuditEvent>>,
    sink: Sink,
    metrics: &'a Metrics,
    health: &'a AuditHealth,
    written: u64,
    line: Vec<u8>,
    agg: Option<Aggregator>,
}

impl Writer<'_> {
    fn take(&mut self, event: AuditEvent) {
        if let Some(agg) = &mut self.agg
            && agg.absorb(&event)
        {
            return;
        }
        self.push(&event);
    }

    fn push(&mut self, event: &AuditEvent) {
        match encode(&mut self.line, event, self.metrics) {
            Ok(line) => {
                self.sink.push(line);
                self.written += 1;
            }
            // Serialising these plain fields cannot fail; if it ever did, say so loudly.
            Err(e) => {
                tracing::error!(request_id = %event.request_id, error = %e, "audit event could not be encoded")
            }
        }
    }

    fn close_window(&mut self) {
        let Some(agg) = &mut self.agg else { return };
        for event in agg.drain() {
            self.push(&event);
        }
    }

    /// Writes what is pending. On failure it marks the trail as failing (new requests are
    /// then refused) and keeps trying, with growing pauses, until a write succeeds; it takes
    /// no new events meanwhile, so memory stays bounded and senders wait.
    fn commit(&mut self) {
        let mut pause = RETRY_FIRST;
        loop {
            match self.sink.flush(false) {
                Ok(()) => {
                    if self.health.is_failing() {
                        self.health.recover();
                        self.metrics.audit_healthy.set(1);
                        tracing::warn!("audit log writable again; traffic resumes");
                    }
                    return;
                }
                Err(e) => {
                    self.metrics.audit_write_errors.inc();
                    if !self.health.is_failing() {
                        tracing::error!(
                            error = %e,
                            pending_bytes = self.sink.pending_len(),
                            "cannot write the audit log; refusing new requests (503) until it can be written"
                        );
                        self.health.fail(e.to_string());
                        self.metrics.audit_healthy.set(0);
                    }
                    if self.rx.is_closed() {
                        // Shutting down: `finish` retries for a bounded time.
                        return;
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// At shutdown: everything still queued is written, trying for a bounded time; what
    /// cannot be written goes to stderr, so no event is lost without a trace.
    fn finish(mut self) -> io::Result<u64> {
        let deadline = Instant::now() + FINAL_RETRY;
        let mut pause = RETRY_FIRST;
        loop {
            match self.sink.flush(true) {
                Ok(()) => return Ok(self.written),
                Err(e) if Instant::now() >= deadline => {
                    let rest = self.sink.take_pending();
                    tracing::error!(error = %e, bytes = rest.len(), "audit log still unwritable at shutdown; the remaining events follow on stderr");
                    let mut err = io::stderr().lock();
                    let _ = err.write_all(&rest);
                    let _ = err.flush();
                    return Err(e);
                }
                Err(_) => {
                    self.metrics.audit_write_errors.inc();
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }
}

/// Folds allowed traffic into one event per destination and identity per window. Denies,
/// failures, reloads and anything unusual are never absorbed.
struct Aggregator {
    window: Duration,
    started: Instant,
    started_at: jiff::Timestamp,
    by_key: std::collections::BTreeMap<AggKey, AuditEvent>,
    next_id: u64,
}

type AggKey = (
    Option<&'static str>,
    Option<String>,
    Option<u16>,
    Option<String>,
    Option<String>,
);

impl Aggregator {
    fn new(window: Duration) -> Aggregator {
        Aggregator {
            window,
            started: Instant::now(),
            started_at: jiff::Timestamp::now(),
            by_key: std::collections::BTreeMap::new(),
            next_id: 1,
        }
    }

    fn due_in(&self) -> Duration {
        self.window.saturating_sub(self.started.elapsed())
    }

    fn absorb(&mut self, e: &AuditEvent) -> bool {
        let allowed_decision = e.event == EventKind::Decision && e.decision == Some(Verdict::Allow);
        let clean_close = e.event == EventKind::Close && e.outcome.as_deref() == Some("ok");
        if !allowed_decision && !clean_close {
            return false;
        }
        let key = (
            e.scheme,
            e.destination_host.clone(),
            e.destination_port,
            e.task_id.clone(),
            e.project_id.clone(),
        );
        let agg = self.by_key.entry(key).or_insert_with(|| {
            let mut a = AuditEvent::new(EventKind::Aggregate, String::new());
            a.decision = Some(Verdict::Allow);
            a.scheme = e.scheme;
            a.destination_host = e.destination_host.clone();
            a.destination_port = e.destination_port;
            a.task_id = e.task_id.clone();
            a.project_id = e.project_id.clone();
            a.count = Some(0);
            a.bytes_sent = Some(0);
            a.bytes_received = Some(0);
            a
        });
        if allowed_decision {
            agg.count = Some(agg.count.unwrap_or(0) + 1);
        } else {
            agg.bytes_sent = Some(agg.bytes_sent.unwrap_or(0) + e.bytes_sent.unwrap_or(0));
            agg.bytes_received = Some(agg.bytes_received.unwrap_or(0) + e.bytes_received.unwrap_or(0));
        }
        true
    }

    fn drain(&mut self) -> Vec<AuditEvent> {
        let window_start = self.started_at.to_string();
        let mut out = Vec::with_capacity(self.by_key.len());
        for (_, mut e) in std::mem::take(&mut self.by_key) {
            e.request_id = format!("aggregate-{}", self.next_id);
            self.next_id += 1;
            e.created_at = jiff::Timestamp::now().to_string();
            e.window_start = Some(window_start.clone());
            out.push(e);
        }
        self.started = Instant::now();
        self.started_at = jiff::Timestamp::now();
        out
    }
}

/// Serialises one event as a JSON line into `line` (reused between events).
fn encode<'a>(line: &'a mut Vec<u8>, event: &AuditEvent, metrics: &Metrics) -> io::Result<&'a [u8]> {
    line.clear();
    serde_json::to_writer(&mut *line, event)?;
    line.push(b'\n');
    metrics.audit_events_written.inc();
    if let Some(made) = event.made_at {
        metrics.audit_lag_seconds.set(made.elapsed().as_secs_f64());
    }
    Ok(line)
}

/// Rotation and durability settings for a file audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditOptions {
    /// Rotate before a line would take the file past this size.
    pub max_bytes: Option<u64>,
    /// Rotated files kept (`audit.jsonl.1` is the newest); older ones are deleted.
    pub keep: usize,
    /// fsync at most this often while events flow (`None`: only at shutdown).
    pub fsync_interval: Option<Duration>,
    /// Fold allowed traffic into one `aggregate` event per destination per window.
    pub aggregate_window: Option<Duration>,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            max_bytes: None,
            keep: 5,
            fsync_interval: Some(Duration::from_secs(1)),
            aggregate_window: None,
        }
    }
}
