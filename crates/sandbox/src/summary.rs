//! The summary `sandgate run` prints on exit in the proxied modes, from the run's audit log
//! (read through the audit trail's one reader): one line per destination the command did
//! not reach, with the reason and a count.
//!
//! `blocked:` lines are the policy's denials (deny decisions) and an upstream proxy's
//! (`upstream_failure:upstream_denied`); `failed:` lines are allowed requests that failed
//! upstream (closes with another upstream failure: DNS, connect, response). The MCP runner
//! reports the same blocked destinations ([`misses`]).
//!
//! Then one line for the whole run: requests allowed (and of those, let through by
//! `--learn`) and denied, bytes each way, and where the audit log is kept. A request the
//! run's proxy allowed and an upstream proxy refused counts as denied: it did not get
//! through.
//!
//! `exit.rs` gathers all of it, with the run's ids and exit status, into one
//! [`RunSummary`] that the text on stderr and `--summary-json FILE` both render.

mod exit;

pub use exit::{AuditPlace, JSON_VERSION, RunIds, RunSummary};
pub(crate) use exit::{ExitOutput, at_exit};

use std::collections::BTreeMap;
use std::path::Path;

use sandgate_policy::Verdict;
use sandgate_proxy::audit::record::{Destination, Record, Recorded};
use sandgate_proxy::audit::{Outcome, UpstreamFailure, UpstreamRefusals};

/// Why a request did not reach its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unreached {
    /// Refused: by the policy (a deny decision) or by an upstream proxy.
    Blocked,
    /// Allowed, then failed upstream (DNS, connect, response).
    Failed,
}

/// One request that did not reach its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Miss<'a> {
    pub unreached: Unreached,
    /// `None` when the request named no valid destination.
    pub dest: Option<&'a Destination>,
    /// The reason code: a deny's `reason_code` (`not_allowlisted`, ...), or the upstream
    /// failure's kind (`upstream_denied`, `dns`, `connection_refused`, ...).
    pub reason: &'a str,
}

/// Every request of `records` that did not reach its destination, in order.
pub fn misses(records: &[Record]) -> impl Iterator<Item = Miss<'_>> {
    records.iter().filter_map(|r| match &r.event {
        Recorded::Decision(d) if d.verdict == Verdict::Deny => Some(Miss {
            unreached: Unreached::Blocked,
            dest: d.dest.as_ref(),
            reason: d.reason_code.as_deref().unwrap_or("denied"),
        }),
        Recorded::Close(c) => match c.outcome {
            Outcome::Upstream(failure) => Some(Miss {
                unreached: if failure == UpstreamFailure::UpstreamDenied {
                    Unreached::Blocked
                } else {
                    Unreached::Failed
                },
                dest: c.dest.as_ref(),
                reason: failure.kind(),
            }),
            _ => None,
        },
        _ => None,
    })
}

impl Unreached {
    /// How the summary names it: `blocked` or `failed`.
    pub fn label(self) -> &'static str {
        match self {
            Unreached::Blocked => "blocked",
            Unreached::Failed => "failed",
        }
    }
}

/// The requests to one destination that did not reach it for one reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    pub unreached: Unreached,
    /// `host:port`; `None` when the request named no valid destination.
    pub destination: Option<String>,
    /// The reason code, as [`Miss::reason`].
    pub reason: String,
    pub count: u64,
}

impl Counted {
    /// `blocked: evil.test:443 (not allowlisted), 2 times`.
    pub fn line(&self) -> String {
        let times = match self.count {
            1 => "once".to_owned(),
            n => format!("{n} times"),
        };
        format!(
            "{}: {} ({}), {times}",
            self.unreached.label(),
            self.destination.as_deref().unwrap_or("(malformed request)"),
            self.reason.replace('_', " ")
        )
    }
}

/// The destinations `records` did not reach, counted: blocked first, each group sorted by
/// destination and reason as the lines print them.
pub fn counted(records: &[Record]) -> Vec<Counted> {
    let mut by: BTreeMap<(Unreached, String, String), Counted> = BTreeMap::new();
    for m in misses(records) {
        let destination = m.dest.map(ToString::to_string);
        let shown = destination
            .clone()
            .unwrap_or_else(|| "(malformed request)".to_owned());
        by.entry((m.unreached, shown, m.reason.replace('_', " ")))
            .or_insert_with(|| Counted {
                unreached: m.unreached,
                destination,
                reason: m.reason.to_owned(),
                count: 0,
            })
            .count += 1;
    }
    by.into_values().collect()
}

/// The summary lines for these audit records, blocked first, each group sorted.
pub fn lines(records: &[Record]) -> Vec<String> {
    counted(records).iter().map(Counted::line).collect()
}

/// The run's totals: requests allowed (`learned` of them let through by `--learn`) and
/// denied (by the run's proxy, or by an upstream proxy after the run's allowed them), bytes
/// the command sent and received through allowed requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    pub allowed: u64,
    pub learned: u64,
    pub denied: u64,
    pub sent: u64,
    pub received: u64,
}

pub fn totals(records: &[Record]) -> Totals {
    // Requests an upstream proxy refused: their allow (this proxy's) is not what happened,
    // counted as `sandgate audit summary` counts them.
    let upstream = UpstreamRefusals::among(records);
    let mut t = Totals::default();
    for r in records {
        match &r.event {
            Recorded::Decision(_) if upstream.verdict(r) == Some(Verdict::Deny) => t.denied += 1,
            Recorded::Decision(d) if d.verdict == Verdict::Allow => {
                t.allowed += 1;
                t.learned += u64::from(d.would_deny.is_some());
            }
            Recorded::Decision(_) => {}
            Recorded::Close(c) => {
                t.sent += c.bytes_sent;
                t.received += c.bytes_received;
            }
            Recorded::Aggregate(a) => {
                t.sent += a.bytes_sent;
                t.received += a.bytes_received;
            }
            _ => {}
        }
    }
    t
}

/// The run's one closing line. `kept`: where the audit log stays, if it does.
pub fn total_line(t: &Totals, kept: Option<&Path>) -> String {
    let learned = if t.learned > 0 {
        format!(" ({} only because of --learn)", t.learned)
    } else {
        String::new()
    };
    let log = match kept {
        Some(p) => format!("audit log: {}", p.display()),
        None => "audit log: not kept".to_owned(),
    };
    format!(
        "sandgate: {} allowed{learned}, {} denied, {} bytes sent, {} bytes received; {log}",
        t.allowed, t.denied, t.sent, t.received
    )
}

/// The records of a run's audit log (none when it cannot be read, or is not a regular
/// file: `--audit-log /dev/full` would be read forever, a pipe waited on), and a line for
/// each line of it that is not an event.
pub fn read(audit: &Path) -> (Vec<Record>, Vec<String>) {
    if !std::fs::metadata(audit).is_ok_and(|m| m.is_file()) {
        return (Vec::new(), Vec::new());
    }
    match sandgate_proxy::audit_query::read_events(&[audit.to_path_buf()]) {
        Ok((entries, skipped)) => (
            entries.into_iter().map(|e| e.record).collect(),
            skipped.iter().map(ToString::to_string).collect(),
        ),
        Err(_) => (Vec::new(), Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Records read from lines with these fields, as the audit reader reads any log.
    fn records(lines: &[serde_json::Value]) -> Vec<Record> {
        lines
            .iter()
            .map(|fields| {
                let mut line = json!({"created_at": "2026-11-22T10:00:00Z", "request_id": "r"});
                if let (Some(line), Some(more)) = (line.as_object_mut(), fields.as_object()) {
                    line.extend(more.clone());
                }
                Record::parse(&line.to_string()).unwrap()
            })
            .collect()
    }

    #[test]
    fn denials_and_upstream_failures_are_both_summarised() {
        let events = records(&[
            json!({"event": "decision", "decision": "deny", "reason_code": "not_allowlisted", "destination_host": "evil.test", "destination_port": 443}),
            json!({"event": "decision", "decision": "deny", "reason_code": "not_allowlisted", "destination_host": "evil.test", "destination_port": 443}),
            json!({"event": "decision", "decision": "allow", "destination_host": "ok.test", "destination_port": 443}),
            json!({"event": "close", "outcome": "ok", "destination_host": "ok.test", "destination_port": 443}),
            json!({"event": "close", "outcome": "upstream_failure:dns", "destination_host": "gone.test", "destination_port": 443}),
            json!({"event": "close", "outcome": "upstream_failure:connection_refused", "destination_host": "down.test", "destination_port": 80}),
            json!({"event": "decision", "decision": "allow", "request_id": "up", "destination_host": "up.test", "destination_port": 443}),
            json!({"event": "close", "outcome": "upstream_failure:upstream_denied", "request_id": "up", "destination_host": "up.test", "destination_port": 443}),
            json!({"event": "decision", "decision": "deny", "reason_code": "malformed_request", "destination_host": null, "destination_port": null}),
        ]);
        assert_eq!(
            lines(&events),
            [
                "blocked: (malformed request) (malformed request), once",
                "blocked: evil.test:443 (not allowlisted), 2 times",
                "blocked: up.test:443 (upstream denied), once",
                "failed: down.test:80 (connection refused), once",
                "failed: gone.test:443 (dns), once",
            ]
        );
        // The upstream's refusal is a denial: its allow here is not what happened.
        let t = totals(&events);
        assert_eq!((t.allowed, t.learned, t.denied), (1, 0, 4));
    }

    #[test]
    fn a_request_an_upstream_proxy_refused_counts_as_denied() {
        let line = |id: &str, fields: serde_json::Value| {
            let mut v = fields;
            v["request_id"] = json!(id);
            v
        };
        let events = records(&[
            line(
                "a",
                json!({"event": "decision", "decision": "allow", "reason_code": "allowlisted"}),
            ),
            line(
                "a",
                json!({"event": "close", "outcome": "ok", "bytes_received": 7}),
            ),
            line(
                "b",
                json!({"event": "decision", "decision": "allow", "reason_code": "report_only", "would_deny": "not_allowlisted"}),
            ),
            line(
                "b",
                json!({"event": "close", "outcome": "upstream_failure:upstream_denied", "status": 403}),
            ),
            line(
                "c",
                json!({"event": "decision", "decision": "deny", "reason_code": "not_allowlisted"}),
            ),
        ]);
        assert_eq!(
            total_line(&totals(&events), None),
            "sandgate: 1 allowed, 2 denied, 0 bytes sent, 7 bytes received; audit log: not kept"
        );
    }

    #[test]
    fn the_total_line_counts_decisions_and_bytes() {
        let events = records(&[
            json!({"event": "decision", "decision": "allow", "reason_code": "allowlisted"}),
            json!({"event": "decision", "decision": "allow", "reason_code": "report_only", "would_deny": "not_allowlisted"}),
            json!({"event": "decision", "decision": "deny", "reason_code": "not_allowlisted"}),
            json!({"event": "close", "outcome": "ok", "bytes_sent": 10, "bytes_received": 200}),
            json!({"event": "close", "outcome": "ok", "bytes_sent": 5, "bytes_received": null}),
        ]);
        assert_eq!(
            total_line(&totals(&events), Some(Path::new("/s/run-1.jsonl"))),
            "sandgate: 2 allowed (1 only because of --learn), 1 denied, 15 bytes sent, 200 bytes received; audit log: /s/run-1.jsonl"
        );
        assert_eq!(
            total_line(&Totals::default(), None),
            "sandgate: 0 allowed, 0 denied, 0 bytes sent, 0 bytes received; audit log: not kept"
        );
    }
}
