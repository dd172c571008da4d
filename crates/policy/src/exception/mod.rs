//! Temporary egress exceptions: a task asks for exact hosts for a bounded time, a person
//! approves (or narrows, or denies), and while approved the exception is one more task-scoped
//! allow entry in the ordinary decision path (`rule: exception:ID`), address guard included.
//!
//! Pure: the bounds, the state machine and the entries an exception contributes, with time
//! as an argument (expiry is exact to the second). Storage, the API and the audit trail are
//! the control plane's; nothing here does I/O.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::entry::{Entry, Scope};
use crate::host::{DomainName, Host};
use crate::pattern::{HostPattern, Pattern};

mod below;
mod bounds;
mod tweak;

pub use below::BelowHost;
use bounds::exact_host;
pub use bounds::{DEFAULT_MAX_TTL, DEFAULT_PORTS, Enablement, ExceptionPolicy, RequestError};
pub use tweak::{Tweak, TweakError};

/// Where an exception stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Pending,
    Approved,
    Denied,
    Expired,
    Revoked,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Approved => "approved",
            State::Denied => "denied",
            State::Expired => "expired",
            State::Revoked => "revoked",
        }
    }

    pub fn parse(text: &str) -> Option<State> {
        match text {
            "pending" => Some(State::Pending),
            "approved" => Some(State::Approved),
            "denied" => Some(State::Denied),
            "expired" => Some(State::Expired),
            "revoked" => Some(State::Revoked),
            _ => None,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An exception and its whole history so far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exception {
    pub id: String,
    pub task_id: String,
    pub project_id: Option<String>,
    /// Exact host names, lower case, no trailing dot.
    pub hosts: Vec<String>,
    pub ports: Vec<u16>,
    /// Asked for; an approval may shorten it.
    pub ttl_seconds: u32,
    pub reason: String,
    /// The subject that asked (an agent, a service, a user).
    pub requested_by: String,
    /// Unix seconds, like the other times here; RFC 3339 in JSON ([`crate::rfc3339`]).
    #[serde(with = "crate::rfc3339")]
    pub requested_at: i64,
    pub state: State,
    pub decided_by: Option<String>,
    #[serde(default, with = "crate::rfc3339::option")]
    pub decided_at: Option<i64>,
    /// Why it was denied or revoked, when the decider said.
    pub note: Option<String>,
    /// Set on approval: the exception is absent from this second on.
    #[serde(default, with = "crate::rfc3339::option")]
    pub expires_at: Option<i64>,
    /// The methods and paths it allows on its hosts (`methods`, `paths`, `read_only` in
    /// JSON, absent when it allows every request).
    #[serde(flatten)]
    pub below: BelowHost,
    /// For a tweak (more than egress for one sandbox of `sandgate mcp`): what it asks. Such
    /// an exception has no hosts or ports and contributes no network entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tweak: Option<Tweak>,
}

/// A request as it arrives (from the API, the CLI, or `sandgate run --ask`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRequest {
    pub task_id: String,
    #[serde(default)]
    pub project_id: Option<String>,
    pub requested_hosts: Vec<String>,
    #[serde(default)]
    pub requested_ports: Option<Vec<u16>>,
    pub ttl_seconds: u32,
    pub reason: String,
    /// Below the hosts, as an allow entry says it: absent, every request.
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    #[serde(default)]
    pub read_only: bool,
    /// A tweak instead of hosts (then `requested_hosts` is empty and no ports are given).
    #[serde(default)]
    pub tweak: Option<Tweak>,
}

impl NewRequest {
    /// What it asks for below the hosts.
    pub fn below(&self) -> BelowHost {
        BelowHost::new(self.methods.clone(), self.paths.clone(), self.read_only)
    }
}

/// Why a state change is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("exception {id} is {state}, not pending")]
    NotPending { id: String, state: State },
    #[error("exception {id} is {state}, not approved")]
    NotApproved { id: String, state: State },
    #[error("{who:?} asked for exception {id} and may not approve it")]
    SelfApproval { id: String, who: String },
    #[error("an approval may only narrow a request: {0}")]
    Widens(String),
}

/// What an approver may change: fewer hosts, a shorter TTL, fewer methods or paths (given,
/// they replace what was asked below the hosts, and must lie within it), a tweak that asks
/// no more than the one asked (given, it replaces it whole).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Narrowing {
    #[serde(default)]
    pub hosts: Option<Vec<String>>,
    #[serde(default)]
    pub ttl_seconds: Option<u32>,
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    #[serde(default)]
    pub read_only: bool,
    /// For a tweak: what is granted instead of what was asked, every field of it
    /// [`within`](Tweak::within) the tweak asked (a field left out is not granted).
    #[serde(default)]
    pub tweak: Option<Tweak>,
}

impl Narrowing {
    /// What `asked` becomes below the hosts: a field it gives replaces the one asked for
    /// (`read_only` the methods), one it leaves out is kept; `None` when it gives none.
    fn below(&self, asked: &BelowHost) -> Option<BelowHost> {
        if self.methods.is_none() && self.paths.is_none() && !self.read_only {
            return None;
        }
        let (methods, read_only) = match (&self.methods, self.read_only) {
            (None, false) => (asked.methods.clone(), asked.read_only),
            (methods, read_only) => (methods.clone(), read_only),
        };
        let paths = self.paths.clone().or_else(|| asked.paths.clone());
        Some(BelowHost::new(methods, paths, read_only))
    }
}

impl Exception {
    /// Approves a pending exception, from `now` for its (possibly shortened) TTL. The
    /// requester may not approve their own request.
    pub fn approve(&mut self, by: &str, now: i64, narrow: &Narrowing) -> Result<(), TransitionError> {
        self.expect_pending()?;
        if by == self.requested_by {
            return Err(TransitionError::SelfApproval {
                id: self.id.clone(),
                who: by.to_owned(),
            });
        }
        if let Some(hosts) = &narrow.hosts {
            let mut kept = BTreeSet::new();
            for h in hosts {
                let h = exact_host(h).map_err(|e| TransitionError::Widens(e.to_string()))?;
                if !self.hosts.contains(&h) {
                    return Err(TransitionError::Widens(format!("{h:?} was not requested")));
                }
                kept.insert(h);
            }
            if kept.is_empty() {
                return Err(TransitionError::Widens("no hosts left; deny instead".to_owned()));
            }
            self.hosts = kept.into_iter().collect();
        }
        if let Some(ttl) = narrow.ttl_seconds {
            if ttl == 0 || ttl > self.ttl_seconds {
                return Err(TransitionError::Widens(format!(
                    "ttl_seconds {ttl} is not within 1..={}",
                    self.ttl_seconds
                )));
            }
            self.ttl_seconds = ttl;
        }
        if let Some(given) = &narrow.tweak {
            self.tweak = Some(self.narrowed_tweak(given)?);
        }
        if let Some(below) = narrow.below(&self.below) {
            // A tweak has nothing below hosts to narrow: its own fields narrow it.
            if self.tweak.is_some() {
                return Err(TransitionError::Widens(
                    "a tweak takes no methods, paths or read_only; narrow it with `tweak`".to_owned(),
                ));
            }
            let below = below
                .checked()
                .map_err(|e| TransitionError::Widens(e.to_string()))?;
            if !below.within(&self.below) {
                return Err(TransitionError::Widens(format!(
                    "{below} is not within what was asked ({})",
                    self.below
                )));
            }
            self.below = below;
        }
        self.state = State::Approved;
        self.decided_by = Some(by.to_owned());
        self.decided_at = Some(now);
        self.expires_at = Some(now + i64::from(self.ttl_seconds));
        Ok(())
    }

    /// The tweak `given` to grant instead of the one asked: a tweak's form, and no field
    /// beyond what was asked ([`Tweak::beyond`] names the one that is). An exception for
    /// hosts takes none.
    fn narrowed_tweak(&self, given: &Tweak) -> Result<Tweak, TransitionError> {
        let Some(asked) = &self.tweak else {
            return Err(TransitionError::Widens(format!(
                "tweak: exception {} asks for hosts, not a tweak; approve it without `tweak`",
                self.id
            )));
        };
        given
            .check()
            .map_err(|e| TransitionError::Widens(format!("tweak: {e}")))?;
        match given.beyond(asked) {
            Some(why) => Err(TransitionError::Widens(why)),
            None => Ok(given.clone()),
        }
    }

    /// Denies a pending exception.
    pub fn deny(&mut self, by: &str, now: i64, note: Option<String>) -> Result<(), TransitionError> {
        self.expect_pending()?;
        self.finish(State::Denied, by, now, note);
        Ok(())
    }

    /// Revokes an approved exception (a pending one is denied instead).
    pub fn revoke(&mut self, by: &str, now: i64, note: Option<String>) -> Result<(), TransitionError> {
        if self.state != State::Approved || !self.is_active(now) {
            return Err(TransitionError::NotApproved {
                id: self.id.clone(),
                state: self.state_at(now),
            });
        }
        self.finish(State::Revoked, by, now, note);
        self.expires_at = Some(now);
        Ok(())
    }

    /// Marks an approved exception expired once its time is up; true when it changed.
    pub fn expire_if_due(&mut self, now: i64) -> bool {
        if self.state == State::Approved && self.expires_at.is_some_and(|at| now >= at) {
            self.state = State::Expired;
            return true;
        }
        false
    }

    /// Approved and not yet expired at `now`.
    pub fn is_active(&self, now: i64) -> bool {
        self.state == State::Approved && self.expires_at.is_some_and(|at| now < at)
    }

    /// The state as of `now` (an approved exception past its expiry reads as expired).
    pub fn state_at(&self, now: i64) -> State {
        if self.state == State::Approved && !self.is_active(now) {
            State::Expired
        } else {
            self.state
        }
    }

    /// The `rule` label of the entries this exception contributes.
    pub fn rule_label(&self) -> String {
        format!("exception:{}", self.id)
    }

    /// The task-scoped allow entries of an approved exception (none otherwise, and none for
    /// a tweak, which asks for no network destination): one per
    /// host, on exactly the approved ports and with its methods and paths, absent from
    /// `expires_at` on. Rules that no longer read (a row written by hand) give no entry.
    pub fn entries(&self) -> Vec<Entry> {
        if self.state != State::Approved || self.tweak.is_some() {
            return Vec::new();
        }
        let Ok(request) = self.below.rules() else {
            return Vec::new();
        };
        let request = request.map(Arc::new);
        let origin: Arc<str> = Arc::from(self.rule_label());
        self.hosts
            .iter()
            .filter_map(|h| DomainName::parse(h).ok())
            .map(|name| Entry {
                pattern: Pattern {
                    host: HostPattern::Exact(Host::Name(name)),
                    port: None,
                },
                ports: Some(self.ports.clone()),
                scope: Scope::Task(self.task_id.clone()),
                expires_at: self.expires_at,
                created_by: self.decided_by.clone(),
                reason: Some(self.reason.clone()),
                origin: origin.clone(),
                request: request.clone(),
            })
            .collect()
    }

    fn expect_pending(&self) -> Result<(), TransitionError> {
        if self.state == State::Pending {
            Ok(())
        } else {
            Err(TransitionError::NotPending {
                id: self.id.clone(),
                state: self.state,
            })
        }
    }

    fn finish(&mut self, state: State, by: &str, now: i64, note: Option<String>) {
        self.state = state;
        self.decided_by = Some(by.to_owned());
        self.decided_at = Some(now);
        self.note = note;
    }
}

#[cfg(test)]
#[path = "../exception_tests.rs"]
mod tests;
