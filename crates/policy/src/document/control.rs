//! The control plane's part of a policy document: `spec.exceptions` (who may request
//! temporary exceptions, within which bounds) and `spec.admin` (the admin listener and its
//! bearer tokens with roles).

use std::net::SocketAddr;

use serde_saphyr::Spanned;

use super::raw::{RawAdmin, RawExceptions};
use super::{AdminSpec, Checker, SecretSource, TokenSpec};
use crate::entry::Scope;

pub(super) fn exception_policy(
    c: &mut Checker<'_>,
    raw: &[Spanned<RawExceptions>],
) -> crate::exception::ExceptionPolicy {
    use crate::exception::{DEFAULT_MAX_TTL, DEFAULT_PORTS, Enablement, ExceptionPolicy};
    let mut enabled = Vec::new();
    for e in raw {
        let line = e.referenced.line();
        let scope = match &e.value.scope.0 {
            Ok(Scope::System) => {
                c.error(
                    line,
                    "spec.exceptions.scope",
                    "name a project or a task: exceptions are never enabled for everyone",
                );
                continue;
            }
            Ok(Scope::Task(t)) if let Err(m) = crate::ids::check(t, false) => {
                c.error(line, "spec.exceptions.scope.task", format!("{t:?}: {m}"));
                continue;
            }
            Ok(Scope::Project(p)) if p.contains('*') => {
                c.error(
                    line,
                    "spec.exceptions.scope.project",
                    "a project is named exactly (a prefix pattern names tasks: `task: node-a:*`)",
                );
                continue;
            }
            Ok(scope) => scope.clone(),
            Err(m) => {
                c.error(line, "spec.exceptions.scope", m.clone());
                continue;
            }
        };
        let ports = match &e.value.ports {
            None => DEFAULT_PORTS.to_vec(),
            Some(list) => list
                .iter()
                .filter_map(|p| match u16::try_from(*p) {
                    Ok(p) if p > 0 => Some(p),
                    _ => {
                        c.error(line, "spec.exceptions.ports", format!("{p} is not a port"));
                        None
                    }
                })
                .collect(),
        };
        let max_ttl_seconds = match e.value.max_ttl_seconds {
            None => DEFAULT_MAX_TTL,
            // A day at most: an exception is a temporary answer, not a second allowlist.
            Some(t) if (1..=86_400).contains(&t) => t as u32,
            Some(t) => {
                c.error(
                    line,
                    "spec.exceptions.max_ttl_seconds",
                    format!("{t}: use 1..=86400"),
                );
                continue;
            }
        };
        enabled.push(Enablement {
            scope,
            ports,
            max_ttl_seconds,
        });
    }
    ExceptionPolicy { enabled }
}

pub(super) fn admin_spec(c: &mut Checker<'_>, raw: Option<&Spanned<RawAdmin>>, file: &str) -> AdminSpec {
    let Some(raw) = raw else {
        return AdminSpec::default();
    };
    let line = raw.referenced.line();
    let listen = raw
        .value
        .listen
        .as_ref()
        .and_then(|l| match l.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                c.error(line, "spec.admin.listen", format!("{l:?} is not IP:PORT"));
                None
            }
        });
    let mut tokens = Vec::new();
    for t in &raw.value.tokens {
        let line = t.referenced.line();
        let Some(role) = crate::auth::Role::parse(&t.value.role) else {
            c.error(
                line,
                "spec.admin.tokens.role",
                format!("{:?}: use requester, approver, viewer or follower", t.value.role),
            );
            continue;
        };
        let secret = match (&t.value.secret_sha256, &t.value.secret_sha256_file) {
            (Some(hex), None) => match crate::auth::TaskCredential::from_hex(String::new(), None, hex) {
                Ok(_) => SecretSource::Inline(hex.clone()),
                Err(e) => {
                    c.error(line, "spec.admin.tokens.secret_sha256", e.to_string());
                    continue;
                }
            },
            (None, Some(path)) => SecretSource::File(path.clone()),
            _ => {
                c.error(
                    line,
                    "spec.admin.tokens",
                    "give exactly one of secret_sha256 or secret_sha256_file",
                );
                continue;
            }
        };
        if t.value.name.is_empty() {
            c.error(line, "spec.admin.tokens.name", "empty name");
        }
        if role == crate::auth::Role::Requester && t.value.tasks.is_empty() {
            c.error(
                line,
                "spec.admin.tokens.tasks",
                "a requester token names the tasks it may ask for",
            );
        }
        for task in &t.value.tasks {
            if let Err(m) = crate::ids::check(task, false) {
                c.error(line, "spec.admin.tokens.tasks", format!("{task:?}: {m}"));
            }
        }
        tokens.push(TokenSpec {
            name: t.value.name.clone(),
            role,
            secret,
            tasks: t.value.tasks.clone(),
            origin: format!("{file}:{line}"),
        });
    }
    AdminSpec { listen, tokens }
}
