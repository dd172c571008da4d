//! The summary `sandgate run` prints on exit in the proxied modes, from the run's audit log:
//! one line per destination the command did not reach, with the reason and a count.
//!
//! `blocked:` lines are the policy's denials (decision events with `decision: deny`) and
//! an upstream proxy's (`upstream_failure:upstream_denied`); `failed:` lines are allowed
//! requests that failed upstream (close events with another `upstream_failure:*` outcome:
//! DNS, connect, response).

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

/// Prints the summary of the audit log at `audit` on stderr.
pub fn print(audit: &Path) {
    let Ok((events, _)) = sandgate_proxy::audit_query::read_events(&[audit.to_path_buf()]) else {
        return;
    };
    for line in lines(&events) {
        eprintln!("{line}");
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
    }
}
