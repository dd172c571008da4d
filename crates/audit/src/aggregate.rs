//! Aggregation: allowed traffic (allow decisions and clean closes) folded into one event per
//! destination and identity per window. Denies, failures, reloads and anything unusual are
//! never absorbed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sandgate_policy::Verdict;

use super::event::{Aggregate, Dest, Event, Outcome};

/// Destination, task and project.
type Key = (Option<Dest>, Option<String>, Option<String>);

/// The window being filled.
pub(super) struct Aggregator {
    window: Duration,
    started: Instant,
    started_at: jiff::Timestamp,
    by_key: BTreeMap<Key, Aggregate>,
    next_id: u64,
}

impl Aggregator {
    pub fn new(window: Duration) -> Aggregator {
        Aggregator {
            window,
            started: Instant::now(),
            started_at: jiff::Timestamp::now(),
            by_key: BTreeMap::new(),
            next_id: 1,
        }
    }

    /// Time left in the window.
    pub fn due_in(&self) -> Duration {
        self.window.saturating_sub(self.started.elapsed())
    }

    /// Folds `e` in if it is allowed traffic; false means it must be written on its own.
    pub fn absorb(&mut self, e: &Event) -> bool {
        let (party, dest) = match e {
            // A report-only pass stays its own event: it says what the policy would deny.
            Event::Decision(d) if d.verdict == Verdict::Allow && d.would_deny.is_none() => {
                (&d.party, d.dest.clone())
            }
            Event::Close(c) if c.outcome == Outcome::Ok => (&c.party, Some(c.dest.clone())),
            _ => return false,
        };
        let key = (dest, party.identity.task.clone(), party.identity.project.clone());
        let agg = self
            .by_key
            .entry(key)
            .or_insert_with_key(|(dest, task, project)| Aggregate {
                id: 0,
                dest: dest.clone(),
                task_id: task.clone(),
                project_id: project.clone(),
                count: 0,
                bytes_sent: 0,
                bytes_received: 0,
                window_start: String::new(),
            });
        match e {
            Event::Close(c) => {
                agg.bytes_sent += c.bytes_sent;
                agg.bytes_received += c.bytes_received;
            }
            _ => agg.count += 1,
        }
        true
    }

    /// The window's aggregates, numbered; a new window starts.
    pub fn drain(&mut self) -> Vec<Event> {
        let window_start = self.started_at.to_string();
        let mut out = Vec::with_capacity(self.by_key.len());
        for (_, mut a) in std::mem::take(&mut self.by_key) {
            a.id = self.next_id;
            self.next_id += 1;
            a.window_start = window_start.clone();
            out.push(Event::Aggregate(a));
        }
        self.started = Instant::now();
        self.started_at = jiff::Timestamp::now();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::event::{Close, Decision, Party};
    use super::*;

    fn party(task: &str) -> Party {
        Party {
            path: None,
            request_id: "r".into(),
            client_addr: ([127, 0, 0, 1], 9).into(),
            identity: std::sync::Arc::new(sandgate_policy::Identity {
                task: Some(task.into()),
                project: None,
                job: None,
                subject: None,
                agent: None,
            }),
            method: Some("GET".into()),
            node: None,
        }
    }

    fn dest() -> Dest {
        Dest {
            scheme: "http",
            host: "a.test".into(),
            port: 80,
        }
    }

    #[test]
    fn allowed_traffic_folds_per_destination_and_task_and_the_rest_stays_apart() {
        let mut agg = Aggregator::new(Duration::from_secs(60));
        let allow = |task: &str| {
            Event::Decision(Decision {
                party: party(task),
                dest: Some(dest()),
                verdict: Verdict::Allow,
                reason_code: "allowlisted".into(),
                resolved_ip: None,
                rule: None,
                status: None,
                tls_server_name: None,
                would_deny: None,
                detail: None,
            })
        };
        let close = |outcome| {
            Event::Close(Close {
                party: party("t1"),
                dest: dest(),
                resolved_ip: None,
                status: Some(200),
                bytes_sent: 10,
                bytes_received: 90,
                duration_ms: 1,
                outcome,
            })
        };
        assert!(agg.absorb(&allow("t1")) && agg.absorb(&allow("t1")) && agg.absorb(&allow("t2")));
        assert!(agg.absorb(&close(Outcome::Ok)));
        assert!(
            !agg.absorb(&close(Outcome::UpstreamReset)),
            "a failure stays its own event"
        );
        let mut deny = allow("t1");
        if let Event::Decision(d) = &mut deny {
            d.verdict = Verdict::Deny;
        }
        assert!(!agg.absorb(&deny));
        let mut learned = allow("t1");
        if let Event::Decision(d) = &mut learned {
            d.reason_code = "report_only".into();
            d.would_deny = Some(sandgate_policy::PolicyReason::NotAllowlisted);
        }
        assert!(!agg.absorb(&learned), "a report-only pass stays its own event");
        let out = agg.drain();
        assert_eq!(out.len(), 2);
        let Event::Aggregate(t1) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(
            (t1.count, t1.bytes_sent, t1.bytes_received, t1.id),
            (2, 10, 90, 1)
        );
        assert!(agg.drain().is_empty());
    }
}
