//! `spec.nodes` and the `role: node` listener: a central proxy's side of the node-to-central
//! transport (docs/central.md).

use super::checker::Checker;
use super::raw::{RawListener, RawNode};
use crate::node::{NodeSpec, Nodes};
use serde_saphyr::Spanned;

/// A `role: node` listener's TLS files, as written (relative paths are relative to the
/// policy file; the loader reads them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSpec {
    pub cert: String,
    pub key: String,
    pub client_ca: String,
}

/// The listener's role: `None` for an ordinary proxy listener, the TLS files for a node
/// listener. Errors for what a node listener cannot have.
pub(super) fn listener_role(c: &mut Checker<'_>, line: u64, l: &RawListener) -> Option<TlsSpec> {
    match l.role.as_deref() {
        None | Some("proxy") => {
            if l.tls.is_some() {
                c.error(
                    line,
                    "spec.listeners.tls",
                    "TLS is for node listeners (role: node); a proxy listener speaks plain HTTP or SOCKS5 on a trusted network",
                );
            }
            None
        }
        Some("node") => {
            for (set, field) in [
                (l.task.is_some(), "spec.listeners.task"),
                (l.project.is_some(), "spec.listeners.project"),
                (l.job.is_some(), "spec.listeners.job"),
                (l.subject.is_some(), "spec.listeners.subject"),
                (l.auth.is_some(), "spec.listeners.auth"),
                (l.protocol.is_some(), "spec.listeners.protocol"),
            ] {
                if set {
                    c.error(
                        line,
                        field,
                        "a node listener takes the task from each node's attribution, within spec.nodes; remove this field",
                    );
                }
            }
            match &l.tls {
                Some(t) => Some(TlsSpec {
                    cert: t.cert.clone(),
                    key: t.key.clone(),
                    client_ca: t.client_ca.clone(),
                }),
                None => {
                    c.error(
                        line,
                        "spec.listeners.tls",
                        "a node listener needs tls: { cert, key, client_ca } (nodes are known by their client certificates)",
                    );
                    None
                }
            }
        }
        Some(other) => {
            c.error(
                line,
                "spec.listeners.role",
                format!("{other:?}: use proxy or node"),
            );
            None
        }
    }
}

/// Whether a node's task pattern names any id in another node's run namespace: a run of
/// node `name` is `name:run-...` (`sandgate run` names it under its certificate's name), so
/// `pattern` names one when it is a prefix reaching into `name:`, a prefix of `name:`
/// itself (`node-a*` names `node-ab:...`; IPv6 names: `fd00::1:*` names the runs of
/// `fd00::1:5`), or one id in it. `*` alone names every task on purpose and is not counted.
fn names_runs_of(pattern: &str, name: &str) -> bool {
    let namespace = format!("{name}:");
    match pattern.strip_suffix('*') {
        Some("") => false,
        Some(prefix) => prefix.starts_with(&namespace) || namespace.starts_with(prefix),
        None => pattern.starts_with(&namespace),
    }
}

/// `spec.nodes`; `node_listeners` says whether any listener has `role: node`. A node's
/// task patterns may not reach into another listed node's runs (each node vouches for its
/// own; `*` alone is the operator's explicit "any").
pub(super) fn nodes(c: &mut Checker<'_>, raw: &[Spanned<RawNode>], node_listeners: bool) -> Nodes {
    let mut out: Vec<NodeSpec> = Vec::new();
    let mut lines = Vec::new();
    for n in raw {
        let line = n.referenced.line();
        let name = n.value.name.trim().to_ascii_lowercase();
        if name.is_empty() || name.len() > 253 || name.chars().any(|ch| ch.is_whitespace() || ch.is_control())
        {
            c.error(
                line,
                "spec.nodes.name",
                format!("{:?} is not a certificate name", n.value.name),
            );
            continue;
        }
        if out.iter().any(|o| o.name == name) {
            c.error(line, "spec.nodes.name", format!("node {name} is listed twice"));
            continue;
        }
        for (list, field) in [
            (&n.value.projects, "spec.nodes.projects"),
            (&n.value.tasks, "spec.nodes.tasks"),
        ] {
            for v in list {
                if let Err(m) = crate::ids::check(v, true) {
                    c.error(line, field, format!("{v:?}: {m}"));
                }
            }
        }
        out.push(NodeSpec {
            name,
            projects: n.value.projects.clone(),
            tasks: n.value.tasks.clone(),
        });
        lines.push(line);
    }
    for (a, line) in out.iter().zip(&lines) {
        for (pattern, b) in a.tasks.iter().flat_map(|p| out.iter().map(move |b| (p, b))) {
            if b.name != a.name && names_runs_of(pattern, &b.name) {
                c.error(
                    *line,
                    "spec.nodes.tasks",
                    format!(
                        "node {}: {pattern:?} also names runs of node {} (whose ids start {:?}); a node may vouch only for its own runs{}",
                        a.name,
                        b.name,
                        format!("{}:", b.name),
                        if a.name.contains(':') || b.name.contains(':') {
                            " (IPv6 addresses as node names make run ids ambiguous: name nodes by DNS names)"
                        } else {
                            ""
                        }
                    ),
                );
            }
        }
    }
    if node_listeners && out.is_empty() {
        c.error(
            0,
            "spec.nodes",
            "a node listener (role: node) serves only the nodes listed here; list at least one",
        );
    }
    if !node_listeners && !out.is_empty() {
        c.warn(
            0,
            "spec.nodes",
            "nodes are listed but no listener has role: node, so none can connect",
        );
    }
    Nodes(out)
}
