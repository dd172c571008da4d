//! `spec.listeners` and `spec.auth.tasks` of a policy document: where the proxy listens and
//! the identity of what arrives on each listener, the task credentials an `auth: basic`
//! listener checks, and the addresses the file binds, two of which must not overlap.

use std::net::SocketAddr;

use serde_saphyr::Spanned;

use super::raw::{RawAuth, RawListener, RawTaskSecret};
use super::{Checker, ListenerSpec, SecretSource, TaskSecretSpec, binds_overlap, nodes};

/// An address the file binds, with the line and field that name it.
pub(super) type Bind = (SocketAddr, u64, &'static str);

/// Every valid listener, its address added to `binds`.
pub(super) fn listeners(
    c: &mut Checker<'_>,
    raw: &[Spanned<RawListener>],
    binds: &mut Vec<Bind>,
) -> Vec<ListenerSpec> {
    let mut listeners = Vec::new();
    for l in raw {
        let line = l.referenced.line();
        let require_auth = auth(c, line, &l.value);
        identity(c, line, &l.value, require_auth);
        let socks5 = match l.value.protocol.as_deref() {
            None | Some("http") => false,
            Some("socks5") => true,
            Some(other) => {
                c.error(
                    line,
                    "spec.listeners.protocol",
                    format!("{other:?}: use http or socks5"),
                );
                false
            }
        };
        let node_tls = nodes::listener_role(c, line, &l.value);
        match l.value.listen.parse::<SocketAddr>() {
            Ok(listen) => {
                binds.push((listen, line, "spec.listeners.listen"));
                listeners.push(ListenerSpec {
                    listen,
                    task: l.value.task.clone(),
                    project: l.value.project.clone(),
                    job: l.value.job.clone(),
                    subject: l.value.subject.clone(),
                    require_auth,
                    socks5,
                    node_tls,
                });
            }
            Err(_) => c.error(
                line,
                "spec.listeners.listen",
                format!("{:?} is not IP:PORT", l.value.listen),
            ),
        }
    }
    listeners
}

/// Whether the listener requires task credentials (`auth: basic`).
fn auth(c: &mut Checker<'_>, line: u64, l: &RawListener) -> bool {
    match l.auth.as_deref() {
        None | Some("none") => false,
        Some("basic") => true,
        Some(other) => {
            c.error(
                line,
                "spec.listeners.auth",
                format!("{other:?}: use basic or none"),
            );
            false
        }
    }
}

/// The identity fields: valid ids, and none that credentials give instead.
fn identity(c: &mut Checker<'_>, line: u64, l: &RawListener, require_auth: bool) {
    for (value, field) in [
        (&l.task, "spec.listeners.task"),
        (&l.project, "spec.listeners.project"),
        (&l.job, "spec.listeners.job"),
        (&l.subject, "spec.listeners.subject"),
    ] {
        if let Some(v) = value.as_deref().filter(|v| !crate::ids::valid(v)) {
            c.error(line, field, format!("{v:?}: {}", crate::ids::ID_RULE));
        }
    }
    if require_auth && l.task.is_some() {
        c.error(
            line,
            "spec.listeners.task",
            "a listener takes its task from credentials (auth: basic) or from `task`, not both",
        );
    }
    // A credential's identity comes only from its own record: a listener-wide project
    // would let a task with none pick a project's scope by choosing the listener.
    if require_auth && l.project.is_some() {
        c.error(
            line,
            "spec.listeners.project",
            "an auth: basic listener takes the project from each task's credential (spec.auth.tasks[].project), not from the listener",
        );
    }
}

/// `spec.auth.tasks`: each task's secret hash, inline or in a file, with valid ids.
pub(super) fn task_secrets(c: &mut Checker<'_>, raw: Option<&RawAuth>, file: &str) -> Vec<TaskSecretSpec> {
    let mut task_secrets = Vec::new();
    for t in raw.iter().flat_map(|a| a.tasks.iter()) {
        let line = t.referenced.line();
        let secret = secret(c, line, &t.value);
        if !crate::ids::valid(&t.value.task) {
            let m = format!("{:?}: {}", t.value.task, crate::ids::ID_RULE);
            c.error(line, "spec.auth.tasks.task", m);
        }
        if let Some(p) = t.value.project.as_deref().filter(|p| !crate::ids::valid(p)) {
            c.error(
                line,
                "spec.auth.tasks.project",
                format!("{p:?}: {}", crate::ids::ID_RULE),
            );
        }
        if let Some(secret) = secret {
            task_secrets.push(TaskSecretSpec {
                task: t.value.task.clone(),
                project: t.value.project.clone(),
                secret,
                origin: format!("{file}:{line}"),
            });
        }
    }
    task_secrets
}

/// Where a task's secret hash is: exactly one of `secret_sha256` (checked here) and
/// `secret_sha256_file` (read by the loader).
fn secret(c: &mut Checker<'_>, line: u64, t: &RawTaskSecret) -> Option<SecretSource> {
    match (&t.secret_sha256, &t.secret_sha256_file) {
        (Some(hex), None) => match crate::auth::TaskCredential::from_hex(t.task.clone(), None, hex) {
            Ok(_) => Some(SecretSource::Inline(hex.clone())),
            Err(e) => {
                c.error(line, "spec.auth.tasks.secret_sha256", e.to_string());
                None
            }
        },
        (None, Some(path)) => Some(SecretSource::File(path.clone())),
        _ => {
            c.error(
                line,
                "spec.auth.tasks",
                "give exactly one of secret_sha256 or secret_sha256_file",
            );
            None
        }
    }
}

/// An error on each address that overlaps one named before it: both cannot be bound, and
/// that is known before binding.
pub(super) fn overlapping_binds(c: &mut Checker<'_>, binds: &[Bind]) {
    for (i, (addr, line, field)) in binds.iter().enumerate() {
        if let Some((other, other_line, _)) = binds.iter().take(i).find(|(a, _, _)| binds_overlap(*a, *addr))
        {
            c.error(
                *line,
                *field,
                format!("{addr} overlaps {other} (line {other_line}): both cannot be bound; give each listener its own address or port"),
            );
        }
    }
}
