//! The audit trail: one JSON object per line for every decision and every close.
//!
//! Events go through a bounded channel to a dedicated writer thread, so a proxy worker never
//! writes or syncs the file itself; when the writer falls behind, senders wait
//! (back-pressure) rather than drop an event. (A write or a sync that blocks still shows in
//! the tail: the writer then encodes its backlog in one run, docs/benchmarks.md.) The writer serialises, writes, and flushes whenever the queue runs
//! empty or at most a few milliseconds after an event arrived; on shutdown every queued
//! event is written and flushed before [`AuditWriter::finish`] returns.
//!
//! Fail closed: when a write fails (a full disk, `EMFILE` while rotating), the writer keeps
//! the unwritten lines (`sink`), marks [`AuditHealth`] as failing, and retries
//! until it can write again. While it fails, the request path refuses new requests with 503
//! (`Audit::available`), so no traffic passes unrecorded; requests already allowed finish
//! and their events wait in memory. Field names follow the seed spec (`docs/audit.md`).
//!
//! Modules: [`event`] (the typed events as recorded), [`line`] (the one flat JSON line every
//! kind is written as), `writer` (the thread, its retries and fail-closed health),
//! `aggregate` (folding allowed traffic per window), `sink` (the file or stdout behind a
//! lossless buffer, with rotation), `stamp` (the time an event was made, as text); and for
//! reading back, [`read`] (the one reader: bounded lines in, typed entries or typed errors
//! out), [`record`] (what a line holds, by kind) and
//! [`query`] (files, filters and summaries for `sandgate audit` and `policy suggest`), and
//! [`upstream`] (an upstream proxy's refusal of what this proxy allowed, counted as denied
//! by every reader that counts requests).

mod aggregate;
pub mod event;
pub mod line;
pub mod query;
pub mod read;
pub mod record;
mod sink;
mod stamp;
pub mod upstream;
mod writer;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

pub use event::{Event, EventKind, Outcome, SCHEMA_VERSION, Stamped, UpstreamFailure};
pub use line::Line;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
pub use read::{Entry, MAX_LINE_BYTES, ReadError, Reader};
pub use record::{Record, Recorded};
pub use upstream::UpstreamRefusals;
pub use writer::AuditWriter;

/// Where audit lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditDestination {
    Stdout,
    File(PathBuf),
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

/// The audit trail's own metrics; the proxy registers them as `sandgate_audit_*`.
#[derive(Debug, Default)]
pub struct AuditMetrics {
    /// Events waiting for the writer.
    pub queue_depth: Gauge,
    /// Times a request waited because the queue was full.
    pub waits: Counter,
    /// Age of the last event when it was written.
    pub lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub events_written: Counter,
    /// 1 while the trail can be written; 0 while it cannot.
    pub healthy: Gauge,
    /// Failed attempts to write (each retried).
    pub write_errors: Counter,
    /// Refusals made while the trail failed whose event went to stderr (queue full).
    pub events_not_queued: Counter,
}

/// Told of every event as it is recorded (the proxy counts decisions and bytes from them).
pub trait Observe: Send + Sync + std::fmt::Debug {
    fn observe(&self, event: &Event);
}

/// Cloneable handle that queues events.
#[derive(Debug, Clone)]
pub struct Audit {
    tx: mpsc::Sender<Box<Stamped>>,
    metrics: Arc<AuditMetrics>,
    observer: Arc<dyn Observe>,
    health: Arc<AuditHealth>,
    live: Live,
}

/// Events as they are recorded, for live views (`/v1/events`). A subscriber that falls more
/// than [`LIVE_DEPTH`] events behind skips ahead; with no subscriber nothing is copied.
#[derive(Debug, Clone)]
pub struct Live(tokio::sync::broadcast::Sender<Arc<Stamped>>);

/// Events a live subscriber may fall behind before it skips ahead.
pub const LIVE_DEPTH: usize = 1024;

impl Default for Live {
    fn default() -> Live {
        Live(tokio::sync::broadcast::channel(LIVE_DEPTH).0)
    }
}

impl Live {
    fn publish(&self, event: &Stamped) {
        if self.0.receiver_count() > 0 {
            let _ = self.0.send(Arc::new(event.clone()));
        }
    }

    /// A receiver of every event recorded from now on.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<Stamped>> {
        self.0.subscribe()
    }
}

/// A handle that does not keep the writer open (for long-lived helpers such as the policy
/// reloader, which must not hold up shutdown).
#[derive(Debug, Clone)]
pub struct WeakAudit {
    tx: mpsc::WeakSender<Box<Stamped>>,
    metrics: Arc<AuditMetrics>,
    observer: Arc<dyn Observe>,
    health: Arc<AuditHealth>,
    live: Live,
}

impl WeakAudit {
    /// Events recorded from now on, live.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<Stamped>> {
        self.live.subscribe()
    }

    /// Queues an event if the proxy is still running.
    pub async fn record(&self, event: Event) {
        if let Some(tx) = self.tx.upgrade() {
            Audit {
                tx,
                metrics: self.metrics.clone(),
                observer: self.observer.clone(),
                health: self.health.clone(),
                live: self.live.clone(),
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
            observer: self.observer.clone(),
            health: self.health.clone(),
            live: self.live.clone(),
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
    ///
    /// Cancel-safe: the caller has already counted the event as written (a grant's close,
    /// a decision), so a future dropped while it waits for room (a shutdown ending its task,
    /// a cut, a client's reset of an intercepted stream) still queues the event if there is
    /// room then, else logs it on stderr and counts it in
    /// `sandgate_audit_events_not_queued_total`. Before, it was lost without a trace.
    pub fn record(&self, event: Event) -> impl Future<Output = ()> + Send + '_ {
        self.observer.observe(&event);
        let event = Box::new(event.stamp());
        self.live.publish(&event);
        // Owed from here, before the first poll: a future dropped unpolled owes it too.
        let mut owed = Owed {
            audit: self,
            event: Some(event),
        };
        async move {
            if self.tx.capacity() == 0 {
                self.metrics.waits.inc();
            }
            // Room first, the event after: a wait given up loses nothing (`Owed`).
            match self.tx.reserve().await {
                Ok(permit) => {
                    if let Some(event) = owed.event.take() {
                        permit.send(event);
                    }
                }
                Err(_) => {
                    if let Some(event) = owed.event.take() {
                        self.metrics.events_not_queued.inc();
                        let line = serde_json::to_string(&Line::of(&event)).unwrap_or_default();
                        tracing::error!(event = %line, "audit queue closed (shutdown); event written here instead");
                    }
                }
            }
        }
    }

    /// Queues an event only if there is room now; otherwise logs it on stderr and counts it
    /// in `sandgate_audit_events_not_queued_total`. For refusals made while the trail is
    /// broken (the 503s it causes, and any other): their client is answered whatever happens
    /// to the record, and they must never wait behind a queue that cannot drain.
    pub fn record_now_or_log(&self, event: Event) {
        self.observer.observe(&event);
        let event = Box::new(event.stamp());
        self.live.publish(&event);
        self.queue_now_or_log(
            event,
            "audit queue full while the audit log is failing; event logged here",
        );
    }

    /// Queues a stamped event if there is room now, else logs it on stderr (`why`) and
    /// counts it.
    fn queue_now_or_log(&self, event: Box<Stamped>, why: &'static str) {
        if let Err(e) = self.tx.try_send(event) {
            let event = match e {
                mpsc::error::TrySendError::Full(ev) | mpsc::error::TrySendError::Closed(ev) => ev,
            };
            self.metrics.events_not_queued.inc();
            let line = serde_json::to_string(&Line::of(&event)).unwrap_or_default();
            tracing::warn!(event = %line, "{why}");
        }
    }
}

/// An event [`Audit::record`] has not handed over yet: dropped with it (the recording
/// future given up), it is queued if there is room, else logged on stderr.
struct Owed<'a> {
    audit: &'a Audit,
    event: Option<Box<Stamped>>,
}

impl Drop for Owed<'_> {
    fn drop(&mut self) {
        if let Some(event) = self.event.take() {
            self.audit.queue_now_or_log(
                event,
                "an event's record was given up while the audit queue was full or closed; event logged here",
            );
        }
    }
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
