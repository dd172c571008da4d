//! The writer thread: takes events from the queue, encodes them as lines, coalesces writes,
//! and fails closed. When a write fails it marks [`AuditHealth`] as failing (the request path
//! then refuses new requests), keeps every unwritten line, takes no new events (so memory
//! stays bounded and senders wait), and retries with growing pauses until a write succeeds.

use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::aggregate::Aggregator;
use super::event::Stamped;
use super::line::Line;
use super::sink::Sink;
use super::{Audit, AuditDestination, AuditHealth, AuditMetrics, AuditOptions, Observe};

/// Events queued before senders wait.
const QUEUE_DEPTH: usize = 8192;
/// Longest an event waits in the writer before it is handed to the OS.
const FLUSH_DELAY: Duration = Duration::from_millis(4);
/// The most encoded bytes the writer gathers before it writes them.
const BATCH_BYTES: usize = 1 << 20;

/// The writer thread; [`finish`](AuditWriter::finish) waits for it to drain.
#[derive(Debug)]
pub struct AuditWriter {
    thread: std::thread::JoinHandle<io::Result<u64>>,
    /// Set by `finish`: a writer retrying a failed write stops waiting for senders to go.
    closing: Arc<AtomicBool>,
}

impl AuditWriter {
    /// Opens the destination (appending to a file) and starts the writer thread. A
    /// destination that cannot be opened is an error: a proxy with no audit trail serves
    /// nothing.
    pub fn start(
        dest: &AuditDestination,
        options: &AuditOptions,
        metrics: Arc<AuditMetrics>,
        observer: Arc<dyn Observe>,
    ) -> io::Result<(Audit, AuditWriter)> {
        let sink = Sink::open(dest, options)?;
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let window = options.aggregate_window;
        let health = Arc::new(AuditHealth::default());
        metrics.healthy.set(1);
        let closing = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("sandgate-audit".to_owned())
            .spawn({
                let metrics = metrics.clone();
                let health = health.clone();
                let closing = closing.clone();
                move || write_loop(rx, sink, &metrics, &health, window, closing)
            })?;
        Ok((
            Audit {
                tx,
                metrics,
                observer,
                health,
                live: super::Live::default(),
            },
            AuditWriter { thread, closing },
        ))
    }

    /// Waits until every handle is dropped and every queued event is written and flushed.
    /// Returns the number of events written. A writer that cannot write (a full disk) does
    /// not wait for the handles: it closes the queue (a sender still waiting then logs its
    /// event on stderr), takes what is queued, and ends after its bounded last attempts,
    /// the rest on stderr. Before, a task that still held a handle and waited on the full
    /// queue kept it from ever ending, and the shutdown with it.
    pub async fn finish(self) -> io::Result<u64> {
        self.closing.store(true, Ordering::Release);
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
    rx: mpsc::Receiver<Box<Stamped>>,
    sink: Sink,
    metrics: &AuditMetrics,
    health: &AuditHealth,
    window: Option<Duration>,
    closing: Arc<AtomicBool>,
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
        closing,
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
                // A batch also ends once its lines reach BATCH_BYTES, or FLUSH_DELAY has
                // passed (read every 64 events; aggregated events add no bytes): senders that
                // kept the queue from ever running empty grew it without bound, and nothing
                // was written for as long as they kept up (nor, the trail failing, did
                // senders ever wait).
                let first = Instant::now();
                let mut taken: u32 = 0;
                loop {
                    while w.sink.pending_len() < BATCH_BYTES
                        && !(taken % 64 == 63 && first.elapsed() >= FLUSH_DELAY)
                        && let Ok(event) = w.rx.try_recv()
                    {
                        w.take(*event);
                        taken = taken.wrapping_add(1);
                    }
                    let waited = first.elapsed();
                    if waited >= FLUSH_DELAY
                        || w.sink.pending_len() >= BATCH_BYTES
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
        // Only the writer sets the depth, after each batch: a sender that set it after its
        // own send could leave a stale 1 behind once the writer had drained the queue.
        metrics.queue_depth.set(w.rx.len() as i64);
    }
    w.close_window();
    w.finish()
}

struct Writer<'a> {
    rx: mpsc::Receiver<Box<Stamped>>,
    sink: Sink,
    metrics: &'a AuditMetrics,
    health: &'a AuditHealth,
    written: u64,
    line: Vec<u8>,
    agg: Option<Aggregator>,
    closing: Arc<AtomicBool>,
}

impl Writer<'_> {
    fn take(&mut self, event: Stamped) {
        if let Some(agg) = &mut self.agg
            && agg.absorb(&event.event)
        {
            return;
        }
        self.push(&event);
    }

    fn push(&mut self, event: &Stamped) {
        self.sink.push(encode(&mut self.line, event, self.metrics));
        self.written += 1;
    }

    fn close_window(&mut self) {
        let Some(agg) = &mut self.agg else { return };
        for event in agg.drain() {
            self.push(&event.stamp());
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
                        self.metrics.healthy.set(1);
                        tracing::warn!("audit log writable again; traffic resumes");
                    }
                    return;
                }
                Err(e) => {
                    self.metrics.write_errors.inc();
                    if !self.health.is_failing() {
                        // Failing first, then said: once the line is out, every new request
                        // is refused (a test, or an operator, may act on the line at once).
                        self.health.fail(e.to_string());
                        self.metrics.healthy.set(0);
                        tracing::error!(
                            error = %e,
                            pending_bytes = self.sink.pending_len(),
                            "cannot write the audit log; refusing new requests (503) until it can be written"
                        );
                    }
                    if self.closing.load(Ordering::Acquire) {
                        // Shutting down with senders left: none gets in now.
                        self.rx.close();
                    }
                    if self.rx.is_closed() {
                        // Shutting down: `finish` retries for a bounded time.
                        return;
                    }
                    // The queue fills while this waits; the gauge shows it.
                    self.metrics.queue_depth.set(self.rx.len() as i64);
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
                    self.metrics.write_errors.inc();
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }
}

/// Serialises one event as a JSON line into `line` (reused between events).
fn encode<'a>(line: &'a mut Vec<u8>, event: &Stamped, metrics: &AuditMetrics) -> &'a [u8] {
    line.clear();
    Line::of(event).write_json(line);
    line.push(b'\n');
    metrics.events_written.inc();
    metrics.lag_seconds.set(event.made_at.elapsed().as_secs_f64());
    line
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
