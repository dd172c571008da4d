//! The entry model for documents that embed it: a SandboxPolicy's `net.allowlist` and
//! `net.denylist` take the same entries as an EgressPolicy's (a pattern, or a map with
//! `ports`, `scope`, `ttl_seconds`, `expires_at`, `created_by`, `reason`), checked by the same
//! code and reported in the same `file:line: field: message` form.

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::checker::{self, Checker, Kind};
use super::first_loaded::FirstLoaded;
use super::raw::RawEntry;
use super::{DocError, DocErrors};
use crate::entry::Entry;

/// A list of entries as written (deserialize it inside the embedding document).
#[derive(Debug, Default, Deserialize)]
#[serde(transparent)]
pub struct EntryList(Vec<Spanned<RawEntry>>);

impl EntryList {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Validated allow and deny entries, with what is valid but probably not meant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    pub allow: Vec<Entry>,
    pub deny: Vec<Entry>,
    pub warnings: Vec<DocError>,
}

/// Validates `allow` and `deny`, written as the fields `{prefix}.allowlist` and
/// `{prefix}.denylist` of `file`; `now` (Unix seconds) anchors `ttl_seconds`. Every error is
/// reported.
pub fn entries(
    allow: &EntryList,
    deny: &EntryList,
    prefix: &str,
    file: &str,
    now: i64,
) -> Result<Entries, DocErrors> {
    // Nothing embedding entries is reloaded: every TTL counts from `now`.
    let earlier = FirstLoaded::new();
    let mut c = Checker {
        file,
        errors: Vec::new(),
        warnings: Vec::new(),
        earlier: &earlier,
        loaded: FirstLoaded::new(),
    };
    let (allow_field, deny_field) = (format!("{prefix}.allowlist"), format!("{prefix}.denylist"));
    let allow: Vec<Entry> = allow
        .0
        .iter()
        .filter_map(|e| c.entry(e, &allow_field, Kind::Allow, now))
        .collect();
    let deny: Vec<Entry> = deny
        .0
        .iter()
        .filter_map(|e| c.entry(e, &deny_field, Kind::Deny, now))
        .collect();
    checker::shadowed(&mut c, &allow_field, &allow, &deny);
    if !c.errors.is_empty() {
        return Err(DocErrors(c.errors));
    }
    Ok(Entries {
        allow,
        deny,
        warnings: c.warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Net {
        #[serde(default)]
        allowlist: EntryList,
        #[serde(default)]
        denylist: EntryList,
    }

    #[test]
    fn embedded_entries_take_every_field_and_name_their_line() {
        let text = "allowlist:\n  - pypi.org\n  - host: api.test\n    ports: [8443]\n    reason: model\n    created_by: me\n    ttl_seconds: 60\n  - host: gone.test\n    expires_at: 2000-01-01T00:00:00Z\ndenylist: [ \"*.evil.test\" ]\n";
        let net: Net = serde_saphyr::from_str(text).unwrap();
        let e = entries(&net.allowlist, &net.denylist, "net", "s.yaml", 2_000_000_000).unwrap();
        assert_eq!((e.allow.len(), e.deny.len()), (3, 1));
        assert_eq!(e.allow[1].ports, Some(vec![8443]));
        assert_eq!(e.allow[1].expires_at, Some(2_000_000_060));
        assert_eq!(&*e.allow[1].origin, "s.yaml:3");
        assert_eq!(e.warnings.len(), 1, "{:?}", e.warnings);
        let bad: Net = serde_saphyr::from_str(
            "allowlist:\n  - host: https://x.test\n  - host: y.test\n    ports: [0]\n",
        )
        .unwrap();
        let err = entries(&bad.allowlist, &bad.denylist, "net", "s.yaml", 0).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("s.yaml:2: net.allowlist.host: "), "{text}");
        assert!(
            text.contains("s.yaml:3: net.allowlist.ports: port 0 out of range"),
            "{text}"
        );
    }
}
