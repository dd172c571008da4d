//! What an entry's `ttl_seconds` counts from: the second that entry was first loaded, kept
//! across reloads until the entry itself changes.
//!
//! A reload (SIGHUP, an edit of the file) must not renew a TTL: an entry granted for an hour
//! stays granted for an hour however often the file is read again. So each entry with a TTL
//! is known by its text (the list it is in and every field as written: host, ports, scope,
//! `ttl_seconds`, `created_by`, `reason`; not its line, so moving it or editing another entry
//! changes nothing), and the record maps that text to the second it was first loaded. A
//! changed entry is a new entry and starts its TTL again; so does one removed by a reload and
//! added back by a later one. The record is plain data: the reloading layer keeps the one of
//! the file in force and hands it to the next parse; this module reads no clock.

use std::collections::BTreeMap;

use super::raw::RawEntryFull;

/// When each entry with a `ttl_seconds` was first loaded (Unix seconds), by its text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FirstLoaded(BTreeMap<String, i64>);

impl FirstLoaded {
    /// An empty record: every TTL counts from the parse's `now`.
    pub fn new() -> FirstLoaded {
        FirstLoaded::default()
    }

    /// How many entries it knows.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The second the entry `text` was first loaded, as `earlier` records it, else `now`;
    /// noted in this record (the one of the document being parsed).
    pub(super) fn note(&mut self, earlier: &FirstLoaded, text: String, now: i64) -> i64 {
        let since = earlier.0.get(&text).copied().unwrap_or(now);
        *self.0.entry(text).or_insert(since)
    }
}

/// An entry's text for the record: the list it is in (`field`) and every field as written,
/// but not where it is written.
pub(super) fn entry_text(field: &str, e: &RawEntryFull) -> String {
    format!(
        "{field} {:?}",
        (
            e.host.trim(),
            &e.ports,
            e.scope.as_ref().map(|s| &s.0),
            e.ttl_seconds,
            &e.created_by,
            &e.reason,
            (&e.methods, &e.paths, e.read_only),
        )
    )
}

#[cfg(test)]
mod tests {
    use crate::{Access, Context, Ruleset, Verdict, parse_connect_target, parse_policy, parse_policy_since};

    const NOW: i64 = 1_800_000_000;

    fn doc(entries: &str) -> String {
        format!(
            "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: t }}\nspec:\n  network:\n    allowlist:\n{entries}"
        )
    }

    const BRIEF: &str = "      - host: brief.example\n        ttl_seconds: 60\n        reason: build\n";

    fn expiry_of(file: &crate::PolicyFile, host: &str) -> Option<i64> {
        file.allow
            .iter()
            .find(|e| e.pattern.to_string() == host)
            .and_then(|e| e.expires_at)
    }

    fn allows(file: &crate::PolicyFile, target: &str, now: i64) -> bool {
        let rules = Ruleset::from_parts(&[], &[], Some(file));
        let t = parse_connect_target(target).unwrap();
        rules.decide(&t, Access::Connect, &Context::system(now)).verdict == Verdict::Allow
    }

    #[test]
    fn a_reload_does_not_renew_a_ttl() {
        let first = parse_policy(&doc(BRIEF), "p.yaml", NOW).unwrap();
        assert_eq!(expiry_of(&first, "brief.example"), Some(NOW + 60));
        assert_eq!(first.first_loaded.len(), 1);
        // Read again 50 s later, and again after that, each time from the version in force:
        // the entry still ends at NOW + 60.
        let again = parse_policy_since(&doc(BRIEF), "p.yaml", NOW + 50, &first.first_loaded).unwrap();
        assert_eq!(expiry_of(&again, "brief.example"), Some(NOW + 60));
        assert!(allows(&again, "brief.example:443", NOW + 59));
        let late = parse_policy_since(&doc(BRIEF), "p.yaml", NOW + 61, &again.first_loaded).unwrap();
        assert!(
            !allows(&late, "brief.example:443", NOW + 61),
            "renewed by a reload"
        );
        assert!(
            late.warnings
                .iter()
                .any(|w| w.field.ends_with("ttl_seconds") && w.message.contains("does not renew")),
            "{:?}",
            late.warnings
        );
    }

    #[test]
    fn moving_an_entry_or_editing_another_keeps_its_start() {
        let first = parse_policy(&doc(BRIEF), "p.yaml", NOW).unwrap();
        let edited = doc(&format!(
            "      - other.example\n      - host: new.example\n        ttl_seconds: 60\n{BRIEF}"
        ));
        let again = parse_policy_since(&edited, "p.yaml", NOW + 30, &first.first_loaded).unwrap();
        assert_eq!(expiry_of(&again, "brief.example"), Some(NOW + 60));
        // The entry new to this version counts from this load.
        assert_eq!(expiry_of(&again, "new.example"), Some(NOW + 90));
        // The flow style is the same entry: same fields, other text on the page.
        let flow = doc("      - { host: brief.example, ttl_seconds: 60, reason: build }\n");
        let flowed = parse_policy_since(&flow, "p.yaml", NOW + 40, &again.first_loaded).unwrap();
        assert_eq!(expiry_of(&flowed, "brief.example"), Some(NOW + 60));
    }

    #[test]
    fn a_changed_entry_starts_again() {
        let first = parse_policy(&doc(BRIEF), "p.yaml", NOW).unwrap();
        for changed in [
            BRIEF.replace("60", "120"),
            BRIEF.replace("build", "build 2"),
            BRIEF.replace("brief.example", "brief.example:8443"),
            format!("{BRIEF}        scope: {{ task: t-1 }}\n"),
        ] {
            let again = parse_policy_since(&doc(&changed), "p.yaml", NOW + 30, &first.first_loaded).unwrap();
            let expiry = again.allow[0].expires_at.unwrap();
            assert!(expiry >= NOW + 30 + 60, "{changed}: {expiry}");
        }
        // Removed by one reload and added back by the next: a new entry.
        let without = parse_policy_since(
            &doc("      - other.example\n"),
            "p.yaml",
            NOW + 10,
            &first.first_loaded,
        )
        .unwrap();
        assert!(without.first_loaded.is_empty());
        let back = parse_policy_since(&doc(BRIEF), "p.yaml", NOW + 20, &without.first_loaded).unwrap();
        assert_eq!(expiry_of(&back, "brief.example"), Some(NOW + 80));
    }

    #[test]
    fn an_allow_and_a_deny_entry_of_the_same_text_are_two_entries() {
        let text = format!(
            "{}    denylist:\n      - host: brief.example\n        ttl_seconds: 60\n        reason: build\n",
            doc("      - host: other.example\n        ttl_seconds: 60\n")
        );
        let file = parse_policy(&text, "p.yaml", NOW).unwrap();
        assert_eq!(file.first_loaded.len(), 2);
    }
}
