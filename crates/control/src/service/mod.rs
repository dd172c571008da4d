//! The exceptions service: who may do what (roles), the pure model's transitions, the store,
//! the audit trail, and the proxy's rules. Every change is stored first (conditional on the
//! state it was made from, so proxies sharing a store cannot both make it), then published
//! to the proxy (the exceptions layer of its rules, so it takes effect on every listener at
//! once, with no reload), then recorded. A revocation also cuts what the exception let
//! through. Filing a request (and what already answers one, so duplicates are not filed) and
//! an approver's one-step allow are in [`request`]; publication, expiry and the resync with a
//! shared store in [`sync`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sandgate_policy::exception::Narrowing;
use sandgate_policy::{Exception, ExceptionPolicy, Principal, RequestError, Role, TransitionError};
use sandgate_proxy::PolicyHandle;
use sandgate_proxy::audit::event::{Change, Event, ExceptionChange};

use crate::store::{ExceptionStore, StoreError};

mod request;
mod sync;

pub use request::Filed;

/// The clock, injected so tests can set the second.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Why a call was refused; each maps to one HTTP status in `api.rs`.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("no exception {0}")]
    NotFound(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    TooMany(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ControlError {
    /// Whether a store failed (an error of the service, not of the caller).
    pub fn is_store(&self) -> bool {
        matches!(self, ControlError::Store(_))
    }
}

/// The control plane's exceptions.
pub struct Control {
    store: Arc<dyn ExceptionStore>,
    policy: ExceptionPolicy,
    proxy: PolicyHandle,
    clock: Clock,
    next_id: AtomicU64,
    /// Serialises changes, so store, rules and audit see them in one order.
    changes: tokio::sync::Mutex<()>,
    /// The project of each task the policy knows (listeners, credentials).
    projects: std::collections::HashMap<String, String>,
    /// The active exceptions last published: what decisions go on with while the
    /// store cannot be read, and what a resync compares with to cut what ended elsewhere.
    pub(crate) known: crate::applied::Applied,
    /// Whether the store failed its last call from the background (logged once per outage).
    store_down: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Control {
    /// Loads the store, expires what ran out while the proxy was down, and publishes the
    /// active exceptions to the proxy.
    pub async fn start(
        store: Arc<dyn ExceptionStore>,
        policy: ExceptionPolicy,
        projects: std::collections::HashMap<String, String>,
        proxy: PolicyHandle,
        clock: Clock,
    ) -> Result<Control, ControlError> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let control = Control {
            store,
            policy,
            proxy,
            clock,
            next_id: AtomicU64::new(seed),
            changes: tokio::sync::Mutex::new(()),
            projects,
            known: Default::default(),
            store_down: Default::default(),
        };
        control.tick().await?;
        control.enforce_bounds().await?;
        control.publish().await?;
        Ok(control)
    }

    fn now(&self) -> i64 {
        (self.clock)()
    }

    fn new_id(&self) -> String {
        // Unique per process and, through the seed, across restarts; not a secret.
        format!("ex-{:016x}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Approves (possibly narrowed). Approvers only, never the requester.
    pub async fn approve(
        &self,
        who: &Principal,
        id: &str,
        narrow: &Narrowing,
    ) -> Result<Exception, ControlError> {
        self.decide(who, id, Change::Approved, |ex, now| {
            ex.approve(&who.name, now, narrow)
        })
        .await
    }

    /// Denies a pending request.
    pub async fn deny(
        &self,
        who: &Principal,
        id: &str,
        note: Option<String>,
    ) -> Result<Exception, ControlError> {
        self.decide(who, id, Change::Denied, |ex, now| ex.deny(&who.name, now, note))
            .await
    }

    /// Revokes an active exception and cuts the connections it allowed.
    pub async fn revoke(
        &self,
        who: &Principal,
        id: &str,
        note: Option<String>,
    ) -> Result<Exception, ControlError> {
        let ex = self
            .decide(who, id, Change::Revoked, |ex, now| {
                ex.revoke(&who.name, now, note)
            })
            .await?;
        tracing::info!(exception = %ex.id, "exception revoked; its connections were cut");
        Ok(ex)
    }

    async fn decide(
        &self,
        who: &Principal,
        id: &str,
        change: Change,
        apply: impl FnOnce(&mut Exception, i64) -> Result<(), TransitionError>,
    ) -> Result<Exception, ControlError> {
        if who.role != Role::Approver {
            return Err(forbidden(who, "decide exceptions"));
        }
        let _serial = self.changes.lock().await;
        let now = self.now();
        let mut ex = self
            .store
            .get(id)
            .await?
            .ok_or_else(|| ControlError::NotFound(id.to_owned()))?;
        if ex.expire_if_due(now) {
            self.proxy.cut(&ex.rule_label());
            self.expired(&ex).await?;
        }
        if change == Change::Approved {
            // The bounds in force now, not only those when it was asked for.
            self.policy.check_bounds(&ex)?;
        }
        let from = ex.state;
        apply(&mut ex, now)?;
        if change == Change::Revoked {
            // Fail closed: the proxy stops allowing it and cuts its connections before
            // anything is stored, so a full disk or a broken store cannot keep it alive.
            self.proxy.cut(&ex.rule_label());
        }
        // Conditional: if another proxy decided first, this one's decision is refused.
        self.store.transition(&ex, from).await.map_err(conflict)?;
        self.publish().await?;
        self.record(change, &ex, Some(&who.name)).await;
        Ok(ex)
    }

    /// Exceptions `who` may see: a requester its tasks', the others all.
    pub async fn list(&self, who: &Principal) -> Result<Vec<Exception>, ControlError> {
        let now = self.now();
        Ok(self
            .store
            .list()
            .await?
            .into_iter()
            .filter(|e| visible(who, e))
            .map(|mut e| {
                e.state = e.state_at(now);
                e
            })
            .collect())
    }

    /// Exceptions `who` may see that are in `state` now, read by the store's state where
    /// that is exact: only an approved exception changes state by itself (it expires), so
    /// every state but `expired` is stored as it is shown. A long history is not read to
    /// list what is approved.
    pub async fn list_in(
        &self,
        who: &Principal,
        state: sandgate_policy::ExceptionState,
    ) -> Result<Vec<Exception>, ControlError> {
        let now = self.now();
        let rows = match state {
            sandgate_policy::ExceptionState::Expired => self.store.list().await?,
            stored => self.store.list_in(stored).await?,
        };
        Ok(rows
            .into_iter()
            .filter(|e| visible(who, e))
            .map(|mut e| {
                e.state = e.state_at(now);
                e
            })
            .filter(|e| e.state == state)
            .collect())
    }

    /// One exception, if `who` may see it.
    pub async fn show(&self, who: &Principal, id: &str) -> Result<Exception, ControlError> {
        let mut ex = self
            .store
            .get(id)
            .await?
            .filter(|e| visible(who, e))
            .ok_or_else(|| ControlError::NotFound(id.to_owned()))?;
        ex.state = ex.state_at(self.now());
        Ok(ex)
    }

    /// At start: what the policy no longer allows (a scope no longer enabled, a port or TTL
    /// now out of bounds) is denied if pending and revoked if active, by "policy".
    async fn enforce_bounds(&self) -> Result<(), ControlError> {
        let _serial = self.changes.lock().await;
        let now = self.now();
        for mut ex in self.store.list().await? {
            let Err(e) = self.policy.check_bounds(&ex) else {
                continue;
            };
            let note = Some(format!("out of the policy's bounds: {e}"));
            let from = ex.state;
            let change = match ex.state_at(now) {
                sandgate_policy::ExceptionState::Pending => {
                    ex.deny("policy", now, note)?;
                    Change::Denied
                }
                sandgate_policy::ExceptionState::Approved => {
                    ex.revoke("policy", now, note)?;
                    self.proxy.cut(&ex.rule_label());
                    Change::Revoked
                }
                _ => continue,
            };
            match self.store.transition(&ex, from).await {
                Ok(()) => self.record(change, &ex, Some("policy")).await,
                // Another proxy (on a shared store) did it first.
                Err(StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn record(&self, change: Change, ex: &Exception, by: Option<&str>) {
        let event = Event::Exception(Box::new(ExceptionChange {
            change,
            exception: ex.clone(),
            by: by.map(str::to_owned),
        }));
        self.proxy.record_event(event).await;
    }
}

/// A conflicting decision is the caller's to retry (409), not a store failure.
fn conflict(e: StoreError) -> ControlError {
    match e {
        StoreError::Conflict { .. } => ControlError::Conflict(e.to_string()),
        other => ControlError::Store(other),
    }
}

fn visible(who: &Principal, e: &Exception) -> bool {
    who.role != Role::Requester || sandgate_policy::ids::listed(&who.tasks, &e.task_id)
}

fn forbidden(who: &Principal, what: &str) -> ControlError {
    ControlError::Forbidden(format!(
        "{} has the {} role, which may not {what}",
        who.name,
        who.role.as_str()
    ))
}
