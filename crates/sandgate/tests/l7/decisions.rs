//! Decision events read back the way these tests ask about them: the one for a method and
//! path on a host, waited for (the audit writer flushes on its own schedule), and whether
//! its `rule` names a given entry of the policy file (by the `file:line` the label carries).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::read_audit;

/// The audit events in `audit` once one satisfies `found` (polls for at most 5 s; returns
/// what is there then).
pub fn events_once(audit: &Path, found: impl Fn(&Value) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let events = read_audit(audit);
        if events.iter().any(&found) || Instant::now() > deadline {
            return events;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Is `e` the decision about `method` on `host` for `path`?
pub fn is_decision(e: &Value, host: &str, method: &str, path: &str) -> bool {
    e["event"] == "decision" && e["destination_host"] == host && e["method"] == method && e["path"] == path
}

/// The decision about `method` on `host` for `path`, waited for; fails listing the log.
pub fn decision(audit: &Path, host: &str, method: &str, path: &str) -> Value {
    let events = events_once(audit, |e| is_decision(e, host, method, path));
    events
        .iter()
        .find(|e| is_decision(e, host, method, path))
        .cloned()
        .unwrap_or_else(|| panic!("no decision for {method} {host} {path}:\n{events:#?}"))
}

/// Checks that `d` is a deny for `reason` whose rule names the entry starting at one of
/// `lines` in the policy file `file_name`.
pub fn assert_refused_by(d: &Value, reason: &str, file_name: &str, lines: &[usize]) {
    assert_eq!(d["decision"], "deny", "{d:#}");
    assert_eq!(d["reason_code"], reason, "{d:#}");
    assert_names_entry(d, file_name, lines);
}

/// Checks that `d`'s rule names the entry starting at one of `lines` of `file_name`.
pub fn assert_names_entry(d: &Value, file_name: &str, lines: &[usize]) {
    let rule = d["rule"].as_str().unwrap_or_default();
    let line = rule_line(rule, file_name);
    assert!(
        line.is_some_and(|l| lines.contains(&l)),
        "the rule should name an entry at {file_name}:{lines:?}: {d:#}"
    );
}

/// The line a rule label names in `file_name` (`... (/dir/policy.yaml:12)`).
pub fn rule_line(rule: &str, file_name: &str) -> Option<usize> {
    let at = rule.find(&format!("{file_name}:"))? + file_name.len() + 1;
    let digits: String = rule[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The 1-based lines of `text` where an allowlist entry begins (`- host:`), in order.
pub fn entry_lines(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim_start().starts_with("- host:"))
        .map(|(i, _)| i + 1)
        .collect()
}
