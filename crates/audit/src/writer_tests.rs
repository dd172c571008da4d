use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::event::{Event, Reload};

#[derive(Debug)]
struct Nobody;

impl Observe for Nobody {
    fn observe(&self, _: &Event) {}
}

fn reload(n: u64) -> Event {
    Event::PolicyReload(Reload {
        generation: n,
        applied: true,
        rejection: 0,
        detail: "x".repeat(400),
    })
}

/// The disk that fills, at the writer: every write to `/dev/full` fails. The trail is
/// failing at once; events are taken only up to the bounds (the queue, one batch), after
/// which a sender waits, however fast the senders are; a record given up while it waits
/// is logged, not lost; and a shutdown with the disk still full ends within its bounded
/// last attempts, the lines on stderr, instead of hanging, even while a task still holds a
/// handle and waits.
#[test]
fn a_full_disk_fails_the_trail_holds_the_senders_and_lets_shutdown_end() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let metrics = Arc::new(AuditMetrics::default());
    let dest = AuditDestination::File("/dev/full".into());
    let options = AuditOptions {
        fsync_interval: None,
        ..AuditOptions::default()
    };
    let (audit, writer) = AuditWriter::start(&dest, &options, metrics.clone(), Arc::new(Nobody)).unwrap();
    let held = rt.block_on(async {
        // Bounded: the queue and one batch hold about 9,100 of these.
        for n in 0..200_000 {
            if tokio::time::timeout(Duration::from_secs(2), audit.record(reload(n)))
                .await
                .is_err()
            {
                return Some(n);
            }
        }
        None
    });
    let held = held.expect("a sender never waited: events taken without bound");
    // What the queue holds, and one batch: its lines up to the first past BATCH_BYTES.
    let line = encode(&mut Vec::new(), &reload(0).stamp(), &AuditMetrics::default()).len();
    let most = (QUEUE_DEPTH + BATCH_BYTES / line + 2) as u64;
    assert!(
        held > QUEUE_DEPTH as u64 && held <= most,
        "held after {held} (at most {most})"
    );
    assert!(audit.available().is_err(), "the trail is not failing");
    assert!(metrics.write_errors.get() > 0);
    // As a shutdown or a cut does to a task: a record given up while it waits for room.
    // The writer takes nothing while it fails, so the queue stays full and this one waits
    // for certain; its event goes to stderr, counted. (Before, it was lost without a trace:
    // the caller had already counted it as written.)
    let before = metrics.events_not_queued.get();
    let abandoned = rt.block_on(async {
        tokio::time::timeout(Duration::from_millis(100), audit.record(reload(u64::MAX))).await
    });
    assert!(abandoned.is_err(), "the queue had room");
    assert_eq!(
        metrics.events_not_queued.get(),
        before + 1,
        "the given-up record's event was neither queued nor logged"
    );
    // A task that still holds a handle does not keep the shutdown from ending: it waits on
    // the full queue while `finish` runs, and its event goes to stderr once the queue
    // closes. (Before, the writer waited for every handle to go, and never ended.)
    let held_by_task = audit.clone();
    let waiting = rt.spawn(async move { held_by_task.record(reload(u64::MAX - 1)).await });
    drop(audit);
    let started = Instant::now();
    let finished = rt.block_on(async {
        tokio::time::timeout(FINAL_RETRY + Duration::from_secs(30), writer.finish()).await
    });
    let finished = finished.expect("the writer never ended while a task held a handle");
    assert!(finished.is_err(), "the last lines could not be written");
    assert!(
        started.elapsed() < FINAL_RETRY + Duration::from_secs(10),
        "shutdown took {:?}",
        started.elapsed()
    );
    rt.block_on(waiting).expect("the waiting task ended");
}

/// A record future dropped before it was ever polled (a losing `select!` branch) still
/// owes its event: it is queued, and written. (Before, the event the caller had already
/// counted as recorded was gone.)
#[test]
fn a_record_dropped_unpolled_is_still_written() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let metrics = Arc::new(AuditMetrics::default());
    let dest = AuditDestination::File(path.clone());
    let (audit, writer) =
        AuditWriter::start(&dest, &AuditOptions::default(), metrics, Arc::new(Nobody)).unwrap();
    drop(audit.record(reload(7)));
    drop(audit);
    let written = rt.block_on(writer.finish()).unwrap();
    assert_eq!(written, 1, "the unpolled record's event was not written");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
}
