//! Filing requests: who may ask, the ids and the project checked, the policy's bounds (the
//! pure `admit`), then what already answers the request, and only then a new pending row.
//! Also an approver's own one-step allow (the approvals page's "allow for N minutes" on a
//! live deny): filed and approved at once, within the same bounds.
//!
//! What already answers a request, so an agent that asks again (a retry, a second tool call,
//! a loop) cannot pile up rows for an approver to pick from:
//! - a request still pending for the same task and project, the same set of hosts, the same
//!   set of ports, the same methods and paths and the same tweak (its TTL and reason may differ; the pending
//!   one is returned as it is);
//! - an exception active now for the task whose hosts and ports include every one asked for
//!   and whose methods and paths allow all it asks (and that this policy's bounds still
//!   allow, so it applies here); for a tweak, an active tweak of the task that asks at
//!   least as much ([`Tweak::within`](sandgate_policy::exception::Tweak::within)), and a
//!   request for hosts never by a tweak.
//!
//! The check and the insert are one step under the service's lock (`changes`), so requests
//! to one proxy, concurrent or not, file one row. Across proxies sharing a PostgreSQL store
//! the store makes them one step too: the insert is `insert_pending_unless`, which checks
//! for a pending request of the same ask (`same_ask`, the one definition of identical)
//! and inserts in one transaction under an advisory lock on the task, so two identical
//! requests sent to two proxies at the same instant file one row, and the second proxy
//! returns it. (An active exception that covers the ask is checked under the service's
//! lock only: one approved through another proxy meanwhile leaves a pending request that
//! the next identical request returns.)

use sandgate_policy::{Exception, ExceptionState, NewRequest, Principal, Role};
use sandgate_proxy::audit::event::Change;

use super::{Control, ControlError, forbidden};

/// Pending requests one requester may have at a time.
const MAX_PENDING_PER_REQUESTER: usize = 100;

/// What a request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filed {
    /// Filed now (pending; approved at once for an approver's [`Control::allow`]).
    New(Exception),
    /// An identical request still pending, returned instead of a second.
    Pending(Exception),
    /// An exception active now that already covers every host and port asked for.
    Active(Exception),
}

impl Filed {
    /// Whether a row was filed (201 for the API) rather than an existing one returned (200).
    pub fn is_new(&self) -> bool {
        matches!(self, Filed::New(_))
    }

    pub fn exception(&self) -> &Exception {
        match self {
            Filed::New(e) | Filed::Pending(e) | Filed::Active(e) => e,
        }
    }

    pub fn into_exception(self) -> Exception {
        match self {
            Filed::New(e) | Filed::Pending(e) | Filed::Active(e) => e,
        }
    }
}

impl Control {
    /// Files a request, or returns the pending or active exception that already answers it.
    /// Requesters may ask only for the tasks their token names.
    pub async fn request(&self, who: &Principal, req: NewRequest) -> Result<Filed, ControlError> {
        match who.role {
            Role::Requester if sandgate_policy::ids::listed(&who.tasks, &req.task_id) => {}
            Role::Requester => {
                return Err(ControlError::Forbidden(format!(
                    "{} may not request exceptions for task {:?}",
                    who.name, req.task_id
                )));
            }
            Role::Approver => {}
            Role::Viewer | Role::Follower => return Err(forbidden(who, "request exceptions")),
        }
        let req = self.with_project(req)?;
        let _serial = self.changes.lock().await;
        let now = self.now();
        // Bounds first: a request the policy refuses is refused, whatever is stored.
        let ex = self.policy.admit(req, self.new_id(), &who.name, now)?;
        let pending = self.store.list_in(ExceptionState::Pending).await?;
        if let Some(same) = pending.iter().find(|p| same_ask(p, &ex)) {
            tracing::debug!(exception = %same.id, by = %who.name, "an identical request is pending; returned");
            return Ok(Filed::Pending(same.clone()));
        }
        if let Some(active) = self.covering(&ex, now).await? {
            return Ok(Filed::Active(active));
        }
        let mine = pending.iter().filter(|e| e.requested_by == who.name).count();
        if mine >= MAX_PENDING_PER_REQUESTER {
            return Err(ControlError::TooMany(format!(
                "{} already has {mine} pending requests; wait for decisions",
                who.name
            )));
        }
        // Checked again by the store as it inserts: another proxy on a shared database may
        // have filed the same ask since the check above.
        if let Some(same) = self.store.insert_pending_unless(&ex, same_ask).await? {
            tracing::debug!(exception = %same.id, by = %who.name, "an identical request was filed meanwhile; returned");
            return Ok(Filed::Pending(same));
        }
        self.record(Change::Requested, &ex, Some(&who.name)).await;
        Ok(Filed::New(ex))
    }

    /// An approver allows `req` on their own word: filed and approved in one step, requested
    /// and decided by `who`, within the policy's bounds like any request (a host or port
    /// outside them is refused with the rule), and on record as a request and an approval.
    /// An exception active now that already covers it is returned instead. A pending request
    /// of the same ask is left as it is, for the approver to decide.
    pub async fn allow(&self, who: &Principal, req: NewRequest) -> Result<Filed, ControlError> {
        if who.role != Role::Approver {
            return Err(forbidden(who, "allow exceptions"));
        }
        let req = self.with_project(req)?;
        let _serial = self.changes.lock().await;
        let now = self.now();
        let asked = self.policy.admit(req, self.new_id(), &who.name, now)?;
        if let Some(active) = self.covering(&asked, now).await? {
            return Ok(Filed::Active(active));
        }
        // The model's `approve` refuses the requester's own approval: that rule keeps an
        // agent's request from being granted by the same token. Here the one asking is the
        // approver, deciding on a deny they saw, as they could by writing an allow entry.
        let mut ex = asked.clone();
        ex.state = ExceptionState::Approved;
        ex.decided_by = Some(who.name.clone());
        ex.decided_at = Some(now);
        ex.expires_at = Some(now + i64::from(ex.ttl_seconds));
        // One insert, already approved: no pending row exists for another approver to act on.
        self.store.insert(&ex).await?;
        self.publish().await?;
        self.record(Change::Requested, &asked, Some(&who.name)).await;
        self.record(Change::Approved, &ex, Some(&who.name)).await;
        Ok(Filed::New(ex))
    }

    /// The request with its ids checked and the project the policy gives its task (never the
    /// caller's claim).
    fn with_project(&self, req: NewRequest) -> Result<NewRequest, ControlError> {
        for (field, value) in [
            ("task_id", Some(&req.task_id)),
            ("project_id", req.project_id.as_ref()),
        ] {
            if let Some(v) = value
                && !sandgate_policy::ids::valid(v)
            {
                return Err(ControlError::Invalid(format!(
                    "{field}: use 1 to 128 of A-Z a-z 0-9 . _ : -"
                )));
            }
        }
        match (self.projects.get(&req.task_id), &req.project_id) {
            (Some(known), Some(claimed)) if known != claimed => {
                return Err(ControlError::Forbidden(format!(
                    "task {:?} belongs to project {known:?}, not {claimed:?}",
                    req.task_id
                )));
            }
            (None, Some(claimed)) => {
                return Err(ControlError::Forbidden(format!(
                    "task {:?} is in no project of the policy, not {claimed:?}",
                    req.task_id
                )));
            }
            _ => {}
        }
        Ok(NewRequest {
            project_id: self.projects.get(&req.task_id).cloned(),
            ..req
        })
    }

    /// The oldest exception active at `now` for `ask`'s task that includes every host and
    /// port of `ask` and is within this policy's bounds (so it is one the rules hold).
    async fn covering(&self, ask: &Exception, now: i64) -> Result<Option<Exception>, ControlError> {
        let approved = self.store.list_in(ExceptionState::Approved).await?;
        Ok(approved.into_iter().find(|a| {
            a.is_active(now)
                && a.task_id == ask.task_id
                && tweak_covered(ask, a)
                && ask.hosts.iter().all(|h| a.hosts.contains(h))
                && ask.ports.iter().all(|p| a.ports.contains(p))
                && ask.below.within(&a.below)
                && self.policy.check_bounds(a).is_ok()
        }))
    }
}

/// The same ask: task, project, the same sets of hosts and ports (compared as sets, so a
/// row written in another order by another proxy matches too), and the same methods and
/// paths (kept sorted by `admit`).
fn same_ask(a: &Exception, b: &Exception) -> bool {
    use std::collections::BTreeSet;
    let hosts = |e: &Exception| e.hosts.iter().cloned().collect::<BTreeSet<_>>();
    let ports = |e: &Exception| e.ports.iter().copied().collect::<BTreeSet<_>>();
    a.task_id == b.task_id
        && a.project_id == b.project_id
        && hosts(a) == hosts(b)
        && ports(a) == ports(b)
        && a.below == b.below
        && a.tweak == b.tweak
}

/// A tweak is covered only by a tweak that asks at least as much (the same sandbox, each
/// value at least as large, a workspace it lies under); a request for hosts never by a tweak.
fn tweak_covered(ask: &Exception, by: &Exception) -> bool {
    match (&ask.tweak, &by.tweak) {
        (None, None) => true,
        (Some(asked), Some(active)) => asked.within(active),
        _ => false,
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
