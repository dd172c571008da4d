//! The audit trail: one JSON object per line for every decision and every close.
//!
//! Events go through a bounded channel to a dedicated writer thread, so disk latency never
//! stalls a proxy worker; when the writer falls behind, senders wait (back-pressure) rather
//! than drop an event. The writer serialises, writes, and flushes whenever the queue runs
//! empty or at most a few milliseconds after an event arrived; on shutdown every queued event is written and flushed before [`AuditWriter::finish`]
//! returns. Field names follow the seed spec (`docs/audit.md` lists them all).

use std::borrow::Cow;
use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandgate_policy::Verdict;
use serde::Serialize;
use tokio::sync::mpsc;

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
        }
    }
}

/// Cloneable handle that queues events.
#[derive(Debug, Clone)]
pub struct Audit {
    tx: mpsc::Sender<AuditEvent>,
}

/// A handle that does not keep the writer open (for long-lived helpers such as the policy
/// reloader, which must not hold up shutdown).
#[derive(Debug, Clone)]
pub struct WeakAudit {
    tx: mpsc::WeakSender<AuditEvent>,
}

impl WeakAudit {
    /// Queues an event if the proxy is still running.
    pub async fn record(&self, event: AuditEvent) {
        if let Some(tx) = self.tx.upgrade() {
            Audit { tx }.record(event).await;
        }
    }
}

impl Audit {
    pub fn downgrade(&self) -> WeakAudit {
        WeakAudit {
            tx: self.tx.downgrade(),
        }
    }

    /// Queues an event, waiting while the queue is full. Only fails if the writer died,
    /// which it reports itself; the event is then logged as lost.
    pub async fn record(&self, event: AuditEvent) {
        if let Err(e) = self.tx.send(event).await {
            tracing::error!(request_id = %e.0.request_id, "audit writer gone; event lost");
        }
    }
}

/// The writer thread; [`finish`](AuditWriter::finish) waits for it to drain.
#[derive(Debug)]
pub struct AuditWriter {
    thread: std::thread::JoinHandle<io::Result<u64>>,
}

impl AuditWriter {
    /// Opens the destination (appending to a file) and starts the writer thread.
    pub fn start(dest: &AuditDestination) -> io::Result<(Audit, AuditWriter)> {
        let out: Box<dyn Write + Send> = match dest {
            AuditDestination::Stdout => Box::new(io::stdout()),
            AuditDestination::File(path) => {
                Box::new(OpenOptions::new().create(true).append(true).open(path)?)
            }
        };
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let thread = std::thread::Builder::new()
            .name("sandgate-audit".to_owned())
            .spawn(move || write_loop(rx, BufWriter::with_capacity(64 * 1024, out)))?;
        Ok((Audit { tx }, AuditWriter { thread }))
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

fn write_loop(mut rx: mpsc::Receiver<AuditEvent>, mut out: impl Write) -> io::Result<u64> {
    let mut written = 0u64;
    while let Some(event) = rx.blocking_recv() {
        write_event(&mut out, &event)?;
        written += 1;
        // Coalesce: keep taking events for up to FLUSH_DELAY before one write, so a busy
        // proxy makes a few hundred write calls a second instead of one per event.
        let first = Instant::now();
        loop {
            while let Ok(event) = rx.try_recv() {
                write_event(&mut out, &event)?;
                written += 1;
            }
            let waited = first.elapsed();
            if waited >= FLUSH_DELAY || rx.is_closed() || rx.is_empty() && waited >= FLUSH_DELAY / 4 {
                break;
            }
            std::thread::sleep(FLUSH_DELAY / 8);
        }
        out.flush()?;
    }
    out.flush()?;
    Ok(written)
}

fn write_event(out: &mut impl Write, event: &AuditEvent) -> io::Result<()> {
    serde_json::to_writer(&mut *out, event)?;
    out.write_all(b"\n")
}
