//! What `request_egress` decides around the control plane's calls: which sandboxes a request
//! is for and the task their runs carry ([`plan`]: refused before anything is filed when no
//! approval could reach them), and what the exceptions seen mean for the agent ([`judge`]):
//! "approved" only when an active exception for that task holds every host and port asked
//! for and reaches a sandbox's next run, whichever request it came from (the one filed, an
//! identical one already pending, another an approver granted). Pure: time is an argument.

use sandgate_policy::exception::BelowHost;
use sandgate_policy::{Exception, ExceptionState, Host};

use crate::approvals::{Approvals, covers};
use crate::config::{Config, Sandbox};

/// A request's sandboxes and what is asked.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    /// The sandboxes the request is for, each one whose runs an approval can reach.
    pub targets: Vec<&'a Sandbox>,
    /// The task their runs carry: the request's task.
    pub task: String,
    /// The hosts as the control plane writes them (lower case, no final dot).
    pub hosts: Vec<String>,
    /// The ports asked for (default: the control plane's, 80 and 443).
    pub ports: Vec<u16>,
    /// The methods and paths asked for (default: every request).
    pub below: BelowHost,
}

/// Why a request is not filed (or a tweak not asked for): the gate and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub gate: &'static str,
    pub message: String,
}

fn refused(gate: &'static str, message: String) -> Refusal {
    Refusal {
        gate,
        message: format!("refused by gate `{gate}`: {message}"),
    }
}

/// The sandboxes a request is for (`named`, else every one an approval can reach) and the
/// task their runs carry; refused when none can apply an exception of these ports and TTL
/// filed with `admin`, or when they carry different tasks.
pub fn plan<'a>(
    config: &'a Config,
    admin: &str,
    named: Option<&str>,
    hosts: &[String],
    ports: Option<&[u16]>,
    ttl_seconds: u32,
    below: BelowHost,
) -> Result<Plan<'a>, Refusal> {
    // Refused here with the grammar's words, before a sandbox is looked at.
    let below = below
        .checked()
        .map_err(|e| refused("egress", format!("methods, paths or read_only: {e}")))?;
    let candidates: Vec<&Sandbox> = match named {
        Some(name) => {
            let Some(s) = config.sandboxes.iter().find(|s| s.name == name) else {
                let known: Vec<&str> = config.sandboxes.iter().map(|s| s.name.as_str()).collect();
                return Err(refused(
                    "sandbox",
                    format!("no sandbox {name:?} (known: {})", known.join(", ")),
                ));
            };
            if !s.approvals.can_apply(admin) {
                return Err(refused(
                    "egress",
                    format!(
                        "no approval reaches the runs of sandbox {:?}: {}",
                        s.name,
                        detail(s, admin)
                    ),
                ));
            }
            vec![s]
        }
        None => config
            .sandboxes
            .iter()
            .filter(|s| s.approvals.can_apply(admin))
            .collect(),
    };
    if candidates.is_empty() {
        let why: Vec<String> = config
            .sandboxes
            .iter()
            .map(|s| format!("{}: {}", s.name, detail(s, admin)))
            .collect();
        return Err(refused(
            "egress",
            format!(
                "no approval reaches the runs of any sandbox here ({})",
                why.join("; ")
            ),
        ));
    }
    let mut tasks: Vec<&str> = candidates.iter().map(|s| s.run_task.as_str()).collect();
    tasks.sort_unstable();
    tasks.dedup();
    if let [one, two, ..] = tasks.as_slice() {
        return Err(refused(
            "sandbox",
            format!(
                "the sandboxes' runs carry different tasks ({one}, {two}, ...): name the sandbox the hosts are for"
            ),
        ));
    }
    let task = tasks.first().map_or_else(String::new, |t| (*t).to_owned());
    let ports = ports.map_or_else(
        || sandgate_policy::exception::DEFAULT_PORTS.to_vec(),
        <[u16]>::to_vec,
    );
    let mut reasons = Vec::new();
    let targets: Vec<&Sandbox> = candidates
        .into_iter()
        .filter(|s| match s.approvals.admits(&ports, ttl_seconds, admin) {
            Ok(()) => true,
            Err(why) => {
                reasons.push(format!("{}: {why}", s.name));
                false
            }
        })
        .collect();
    if targets.is_empty() {
        return Err(refused(
            "egress",
            format!(
                "not filed: no sandbox's runs would apply it ({})",
                reasons.join("; ")
            ),
        ));
    }
    Ok(Plan {
        targets,
        task,
        hosts: hosts.iter().map(|h| written(h)).collect(),
        ports,
        below,
    })
}

fn detail(s: &Sandbox, admin: &str) -> String {
    s.approvals.detail(Some(admin), &s.run_task)
}

/// A host as the control plane writes it (its host parser: lower case, no final dot).
fn written(host: &str) -> String {
    match Host::parse(host) {
        Ok(Host::Name(name)) => name.as_str().to_owned(),
        _ => host.trim_end_matches('.').to_ascii_lowercase(),
    }
}

/// What the agent is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `exception` is active for the task, holds every host and port asked for, and
    /// applies to the next run of each of `reaches`.
    Approved {
        exception: Exception,
        reaches: Vec<String>,
    },
    /// Active and covering, but no target's runs apply it (its ports or TTL lie outside
    /// their `net.exceptions` bounds): an approval that changes nothing here.
    NotApplied { exception: Exception, why: String },
    /// The request as filed, in the state it is in (`pending`, `denied`, `revoked`,
    /// `expired`).
    Filed(Exception),
}

impl Verdict {
    /// Whether waiting longer could change it: only a pending request can.
    pub fn is_final(&self) -> bool {
        !matches!(self, Verdict::Filed(e) if e.state == ExceptionState::Pending)
    }

    /// The state the agent reads: `approved` only when the next run passes.
    pub fn state(&self, now: i64) -> String {
        match self {
            Verdict::Approved { .. } => "approved".to_owned(),
            Verdict::NotApplied { .. } => "not_applied".to_owned(),
            Verdict::Filed(e) => match e.state_at(now) {
                // Approved, yet covering nothing: it expired, or it is narrower than asked.
                ExceptionState::Approved => "expired".to_owned(),
                other => other.to_string(),
            },
        }
    }

    /// The exception the state is of.
    pub fn exception(&self) -> &Exception {
        match self {
            Verdict::Approved { exception, .. } | Verdict::NotApplied { exception, .. } => exception,
            Verdict::Filed(e) => e,
        }
    }
}

/// What `filed` (the request as the control plane last showed it) and `seen` (the task's
/// exceptions as last listed) mean for `plan`, at `now`, for approvals filed with `admin`:
/// the first active exception that covers the request and reaches a target's runs, else
/// one that covers it and reaches none, else the request's own state. A target whose runs
/// have no network now (`open` says no: its gate is closed and no tweak opens it) is reached
/// by no approval.
pub fn judge(
    plan: &Plan<'_>,
    admin: &str,
    (filed, seen): (&Exception, &[Exception]),
    now: i64,
    open: impl Fn(&Sandbox) -> bool,
) -> Verdict {
    let covering = std::iter::once(filed)
        .chain(seen.iter().filter(|e| e.id != filed.id))
        .filter(|e| covers(e, &plan.task, &plan.hosts, &plan.ports, &plan.below, now));
    let mut refused = None;
    for ex in covering {
        let mut why = Vec::new();
        let reaches: Vec<String> = plan
            .targets
            .iter()
            .filter(|s| match s.approvals.admits(&ex.ports, ex.ttl_seconds, admin) {
                Ok(()) if open(s) => true,
                Ok(()) => {
                    why.push(format!(
                        "{}: its runs have no network now; it opens only while a person grants it (request_tweak with network)",
                        s.name
                    ));
                    false
                }
                Err(reason) => {
                    why.push(format!("{}: {reason}", s.name));
                    false
                }
            })
            .map(|s| s.name.clone())
            .collect();
        if !reaches.is_empty() {
            return Verdict::Approved {
                exception: ex.clone(),
                reaches,
            };
        }
        refused.get_or_insert_with(|| Verdict::NotApplied {
            exception: ex.clone(),
            why: why.join("; "),
        });
    }
    if let Some(verdict) = refused {
        return verdict;
    }
    if filed.is_active(now) {
        // Approved, but narrowed below the ask: some hosts or ports stay refused.
        let ports: Vec<String> = filed.ports.iter().map(u16::to_string).collect();
        return Verdict::NotApplied {
            exception: filed.clone(),
            why: format!(
                "approved for {} on ports {} only, narrower than asked",
                filed.hosts.join(", "),
                ports.join(", ")
            ),
        };
    }
    Verdict::Filed(filed.clone())
}

/// The message for `verdict`: what the next run will do, and where a person decides.
pub fn message(plan: &Plan<'_>, verdict: &Verdict, approvals_url: &str) -> String {
    match verdict {
        Verdict::Approved { exception, reaches } => {
            let upstream: Vec<&str> = plan
                .targets
                .iter()
                .filter(|s| reaches.contains(&s.name) && matches!(s.approvals, Approvals::Upstream { .. }))
                .map(|s| s.name.as_str())
                .collect();
            let until = exception
                .expires_at
                .and_then(sandgate_policy::rfc3339::format)
                .unwrap_or_else(|| "it expires".to_owned());
            let mut m = format!(
                "Approved (exception {}): the next run in {} reaches {} until {until}, unless it is revoked.",
                exception.id,
                reaches.join(", "),
                plan.hosts.join(", ")
            );
            if !upstream.is_empty() {
                m.push_str(&format!(
                    " In {} the upstream proxy decides: it applies the approval only if it hosts or follows this control plane.",
                    upstream.join(", ")
                ));
            }
            m
        }
        Verdict::NotApplied { exception, why } => format!(
            "Exception {} is approved, but no sandbox's next run applies it ({why}); ask again within those bounds.",
            exception.id
        ),
        Verdict::Filed(e) if e.state == ExceptionState::Pending => {
            format!("Waiting for a person to decide at {approvals_url}.")
        }
        Verdict::Filed(e) => format!("The request is {}.", e.state),
    }
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
