//! The summary `sandgate run` prints on exit in the proxied modes, from the run's audit log:
//! one line per destination the command did not reach, with the reason and a count.
//!
//! `blocked:` lines are the policy's denials (decision events with `decision: deny`) and
//! an upstream proxy's (`upstream_failure:upstream_denied`); `failed:` lines are allowed
//! requests that failed upstream (close events with another `upstream_failure:*` outcome:
//! DNS, connect, response).
//!
//! Then one line for the whole run: requests allowed (and of those, let through by
//! `--learn`) and denied, bytes each way, and where the audit log is kept.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

fn destination(e: &Value) -> String {
    match (e["destination_host"].as_str(), e["destination_port"].as_u64()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        _ => "(malformed request)".to_owned(),
    }
}

/// The summary lines for these audit events, blocked first, each group sorted.
pub fn lines(events: &[Value]) -> Vec<String> {
    let mut blocked: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut failed: BTreeMap<(String, String), usize> = BTreeMap::new();
    for e in events {
        if e["event"] == "decision" && e["decision"] == "deny" {
            let reason = e["reason_code"].as_str().unwrap_or("denied").replace('_', " ");
            *blocked.entry((destination(e), reason)).or_default() += 1;
        } else if e["event"] == "close"
            && let Some(kind) = e["outcome"]
                .as_str()
                .and_then(|o| o.strip_prefix("upstream_failure:"))
        {
            let group = if kind == "upstream_denied" {
                &mut blocked
            } else {
                &mut failed
            };
            *group.entry((destination(e), kind.replace('_', " "))).or_default() += 1;
        }
    }
    let times = |n: usize| {
        if n == 1 {
            "once".to_owned()
        } else {
            format!("{n} times")
        }
    };
    let blocked = blocked
        .into_iter()
        .map(|((dest, reason), n)| format!("blocked: {dest} ({reason}), {}", times(n)));
    let failed = failed
        .into_iter()
        .map(|((dest, reason), n)| format!("failed: {dest} ({reason}), {}", times(n)));
    blocked.chain(failed).collect()
}

/// The run's totals: decisions allowed (`learned` of them let through by `--learn`) and
/// denied, bytes the command sent and received through allowed requests.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub allowed: u64,
    pub learned: u64,
    pub denied: u64,
    pub sent: u64,
    pub received: u64,
}

pub fn totals(events: &[Value]) -> Totals {
    let mut t = Totals::default();
    for e in events {
        match (e["event"].as_str(), e["decision"].as_str()) {
            (Some("decision"), Some("allow")) => {
                t.allowed += 1;
                t.learned += u64::from(e["reason_code"] == "report_only");
            }
            (Some("decision"), Some("deny")) => t.denied += 1,
            (Some("close" | "aggregate"), _) => {
                t.sent += e["bytes_sent"].as_u64().unwrap_or(0);
                t.received += e["bytes_received"].as_u64().unwrap_or(0);
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

/// Prints the summary of the audit log at `audit` on stderr. `kept`: where it stays after
/// the run (`None`: it goes with the run's state); `learn`: say how to turn it into a policy.
pub fn print(audit: &Path, kept: Option<&Path>, learn: bool) {
    let Ok((events, _)) = sandgate_proxy::audit_query::read_events(&[audit.to_path_buf()]) else {
        return;
    };
    for line in lines(&events) {
        eprintln!("{line}");
    }
    eprintln!("{}", total_line(&totals(&events), kept));
    if let (true, Some(kept)) = (learn, kept) {
        eprintln!(
            "sandgate: learn: sandgate policy suggest --from {} --output learned.yaml (then net.egress_policy: learned.yaml)",
            kept.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn denials_and_upstream_failures_are_both_summarised() {
        let events = [
            json!({"event": "decision", "decision": "deny", "reason_code": "not_allowlisted", "destination_host": "evil.test", "destination_port": 443}),
            json!({"event": "decision", "decision": "deny", "reason_code": "not_allowlisted", "destination_host": "evil.test", "destination_port": 443}),
            json!({"event": "decision", "decision": "allow", "destination_host": "ok.test", "destination_port": 443}),
            json!({"event": "close", "outcome": "ok", "destination_host": "ok.test", "destination_port": 443}),
            json!({"event": "close", "outcome": "upstream_failure:dns", "destination_host": "gone.test", "destination_port": 443}),
            json!({"event": "close", "outcome": "upstream_failure:connection_refused", "destination_host": "down.test", "destination_port": 80}),
            json!({"event": "close", "outcome": "upstream_failure:upstream_denied", "destination_host": "up.test", "destination_port": 443}),
            json!({"event": "decision", "decision": "deny", "reason_code": "malformed_request", "destination_host": null, "destination_port": null}),
        ];
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
        let t = totals(&events);
        assert_eq!((t.allowed, t.learned, t.denied), (1, 0, 3));
    }

    #[test]
    fn the_total_line_counts_decisions_and_bytes() {
        let events = [
            json!({"event": "decision", "decision": "allow", "reason_code": "allowlisted"}),
            json!({"event": "decision", "decision": "allow", "reason_code": "report_only"}),
            json!({"event": "decision", "decision": "deny", "reason_code": "not_allowlisted"}),
            json!({"event": "close", "bytes_sent": 10, "bytes_received": 200}),
            json!({"event": "close", "bytes_sent": 5, "bytes_received": null}),
        ];
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
