//! The bounds a policy sets on exceptions (who may ask, for which ports, for how long), and
//! the check of a request against them that makes it a pending exception.

use std::collections::BTreeSet;

use super::{Exception, NewRequest, State};
use crate::entry::Scope;
use crate::host::Host;

/// The default bounds: ports 80 and 443, at most 15 minutes.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];
pub const DEFAULT_MAX_TTL: u32 = 15 * 60;
/// Hosts in one request, and characters in a reason.
const MAX_HOSTS: usize = 16;
const MAX_REASON: usize = 1000;

/// Who may ask, and within which bounds: a scope (a project or a task) with its bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enablement {
    pub scope: Scope,
    pub ports: Vec<u16>,
    pub max_ttl_seconds: u32,
}

/// The exceptions part of a policy: default deny, enabled per project or task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExceptionPolicy {
    pub enabled: Vec<Enablement>,
}

/// Why a request is refused when it is made; each names the rule (a 4xx for the API).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("exceptions are not enabled for task {task:?}{}", project.as_ref().map(|p| format!(" or project {p:?}")).unwrap_or_default())]
    NotEnabled { task: String, project: Option<String> },
    #[error("requested_hosts is empty")]
    NoHosts,
    #[error("at most {MAX_HOSTS} hosts per request")]
    TooManyHosts,
    #[error("{0:?}: exact host names only, no wildcard")]
    Wildcard(String),
    #[error("{0:?}: host names only, no IP literal")]
    IpLiteral(String),
    #[error("{0:?}: a host name, not a URL (no scheme, port or path)")]
    NotAHostName(String),
    #[error("{host:?}: {message}")]
    BadHost { host: String, message: String },
    #[error("port {port} is not allowed for exceptions here (allowed: {allowed:?})")]
    Port { port: u16, allowed: Vec<u16> },
    #[error("ttl_seconds {ttl} is over the limit of {max} seconds")]
    TtlTooLong { ttl: u32, max: u32 },
    #[error("ttl_seconds must be at least 1")]
    TtlZero,
    #[error("a reason is required (at most {MAX_REASON} characters)")]
    Reason,
    #[error("task_id is empty")]
    NoTask,
    #[error("methods, paths or read_only: {0}")]
    Rules(crate::request::RulesError),
    #[error("a tweak asks for no hosts, ports, methods or paths; file those as a request of their own")]
    TweakWithHosts,
    #[error("tweak: {0}")]
    Tweak(super::TweakError),
}

impl ExceptionPolicy {
    /// The bounds for a task of a project: an entry naming the task exactly wins over one
    /// naming it by a prefix (`node-a:*`; the longest prefix that matches), which wins over
    /// its project's.
    pub fn bounds_for(&self, task: &str, project: Option<&str>) -> Option<&Enablement> {
        let by_task = self
            .enabled
            .iter()
            .find(|e| matches!(&e.scope, Scope::Task(t) if t == task))
            .or_else(|| {
                self.enabled
                    .iter()
                    .filter_map(|e| match &e.scope {
                        Scope::Task(t) if crate::ids::matches(t, task) => Some((t.len(), e)),
                        _ => None,
                    })
                    .max_by_key(|(len, _)| *len)
                    .map(|(_, e)| e)
            });
        by_task.or_else(|| {
            self.enabled
                .iter()
                .find(|e| matches!((&e.scope, project), (Scope::Project(p), Some(q)) if p == q))
        })
    }

    /// Checks a request against the bounds and makes it a pending exception.
    pub fn admit(
        &self,
        req: NewRequest,
        id: String,
        requested_by: &str,
        now: i64,
    ) -> Result<Exception, RequestError> {
        if req.task_id.is_empty() {
            return Err(RequestError::NoTask);
        }
        let bounds = self
            .bounds_for(&req.task_id, req.project_id.as_deref())
            .ok_or_else(|| RequestError::NotEnabled {
                task: req.task_id.clone(),
                project: req.project_id.clone(),
            })?;
        let (hosts, ports, below) = match &req.tweak {
            Some(tweak) => {
                if !req.requested_hosts.is_empty()
                    || req.requested_ports.is_some()
                    || req.methods.is_some()
                    || req.paths.is_some()
                    || req.read_only
                {
                    return Err(RequestError::TweakWithHosts);
                }
                tweak.check().map_err(RequestError::Tweak)?;
                (BTreeSet::new(), BTreeSet::new(), super::BelowHost::default())
            }
            None => hosts_asked(&req, bounds)?,
        };
        if req.ttl_seconds == 0 {
            return Err(RequestError::TtlZero);
        }
        if req.ttl_seconds > bounds.max_ttl_seconds {
            return Err(RequestError::TtlTooLong {
                ttl: req.ttl_seconds,
                max: bounds.max_ttl_seconds,
            });
        }
        let reason = req.reason.trim();
        if reason.is_empty() || reason.chars().count() > MAX_REASON {
            return Err(RequestError::Reason);
        }
        Ok(Exception {
            id,
            task_id: req.task_id,
            project_id: req.project_id,
            hosts: hosts.into_iter().collect(),
            ports: ports.into_iter().collect(),
            ttl_seconds: req.ttl_seconds,
            reason: reason.to_owned(),
            requested_by: requested_by.to_owned(),
            requested_at: now,
            state: State::Pending,
            decided_by: None,
            decided_at: None,
            note: None,
            expires_at: None,
            below,
            tweak: req.tweak,
        })
    }
}

/// The hosts, ports and rules below them that a request for hosts asks, each checked.
fn hosts_asked(
    req: &NewRequest,
    bounds: &Enablement,
) -> Result<(BTreeSet<String>, BTreeSet<u16>, super::BelowHost), RequestError> {
    if req.requested_hosts.is_empty() {
        return Err(RequestError::NoHosts);
    }
    if req.requested_hosts.len() > MAX_HOSTS {
        return Err(RequestError::TooManyHosts);
    }
    let hosts = req
        .requested_hosts
        .iter()
        .map(|h| exact_host(h))
        .collect::<Result<BTreeSet<String>, _>>()?;
    let below = req.below().checked().map_err(RequestError::Rules)?;
    let ports = req
        .requested_ports
        .clone()
        .unwrap_or_else(|| DEFAULT_PORTS.to_vec());
    if let Some(&port) = ports.iter().find(|p| !bounds.ports.contains(p)) {
        return Err(RequestError::Port {
            port,
            allowed: bounds.ports.clone(),
        });
    }
    Ok((hosts, ports.into_iter().collect(), below))
}

impl ExceptionPolicy {
    /// Checks an exception against the bounds in force now (the policy may have changed
    /// since it was asked for): enabled for its task or project, its ports and TTL within.
    pub fn check_bounds(&self, ex: &Exception) -> Result<(), RequestError> {
        let bounds = self
            .bounds_for(&ex.task_id, ex.project_id.as_deref())
            .ok_or_else(|| RequestError::NotEnabled {
                task: ex.task_id.clone(),
                project: ex.project_id.clone(),
            })?;
        if let Some(&port) = ex.ports.iter().find(|p| !bounds.ports.contains(p)) {
            return Err(RequestError::Port {
                port,
                allowed: bounds.ports.clone(),
            });
        }
        if ex.ttl_seconds > bounds.max_ttl_seconds {
            return Err(RequestError::TtlTooLong {
                ttl: ex.ttl_seconds,
                max: bounds.max_ttl_seconds,
            });
        }
        Ok(())
    }
}

/// An exact host name: no wildcard, no IP literal, no scheme, port or path; lower case.
pub(super) fn exact_host(text: &str) -> Result<String, RequestError> {
    if text.contains('*') {
        return Err(RequestError::Wildcard(text.to_owned()));
    }
    if text.contains(['/', ':', '?', '#', '@']) {
        return Err(RequestError::NotAHostName(text.to_owned()));
    }
    match Host::parse(text) {
        Ok(Host::Ip(_)) | Err(crate::host::HostError::NonCanonicalIpv4) => {
            Err(RequestError::IpLiteral(text.to_owned()))
        }
        Ok(Host::Name(name)) => Ok(name.as_str().to_owned()),
        Err(e) => Err(RequestError::BadHost {
            host: text.to_owned(),
            message: e.to_string(),
        }),
    }
}
