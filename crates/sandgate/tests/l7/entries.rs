//! Policy text for the method and path rule tests: allowlist entries with their rules
//! below them, an EgressPolicy holding them, and git's fetch-only pair. Kept apart from the
//! plain-HTTP tests in this directory so the HTTPS interception tests (`l7_tls_e2e.rs`) can
//! load the fixtures without those tests.

use std::path::{Path, PathBuf};

use crate::common::world::policy_doc;

/// Writes an EgressPolicy whose `spec.network.allowlist` is `entries` (YAML list items, six
/// spaces in) to `dir/policy.yaml`; returns its path and text.
pub fn egress_policy(dir: &Path, entries: &str) -> (PathBuf, String) {
    let text = policy_doc(&format!("  network:\n    allowlist:\n{entries}"));
    let path = dir.join("policy.yaml");
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

/// One allowlist entry for `host:port`, six spaces in (an EgressPolicy's), with `rules`
/// (YAML lines such as `methods: [GET]`) below it.
pub fn entry(host: &str, port: u16, rules: &[&str]) -> String {
    entry_at(6, host, port, rules)
}

/// As [`entry`], `indent` spaces in (four in a SandboxPolicy's `net.allowlist`).
pub fn entry_at(indent: usize, host: &str, port: u16, rules: &[&str]) -> String {
    let pad = " ".repeat(indent);
    let mut e = format!("{pad}- host: {host}\n{pad}  ports: [{port}]\n");
    for r in rules {
        e.push_str(&format!("{pad}  {r}\n"));
    }
    e
}

/// The entries that let git fetch `/myorg/*` from `host:port` and nothing else: GET and
/// HEAD under `/myorg/`, POST to `git-upload-pack` only (never `git-receive-pack`).
pub fn fetch_only(host: &str, port: u16, indent: usize) -> String {
    [
        entry_at(
            indent,
            host,
            port,
            &["methods: [GET, HEAD]", "paths: [\"/myorg/**\"]"],
        ),
        entry_at(
            indent,
            host,
            port,
            &["methods: [POST]", "paths: [\"/myorg/*/git-upload-pack\"]"],
        ),
    ]
    .concat()
}
