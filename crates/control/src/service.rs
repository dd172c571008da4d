//! The exceptions service: who may do what (roles), the pure model's transitions, the store,
//! the audit trail, and the proxy's rules. Every change is stored first, then published to
//! the proxy (the exceptions layer of its rules, so it takes effect on every listener at
//! once, with no reload), then recorded. A revocation also cuts what the exception let
//! through. [`Control::tick`] expires approved exceptions at their second.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sandgate_policy::exception::Narrowing;
use sandgate_policy::{
    Exception, ExceptionPolicy, NewRequest, Principal, RequestError, Role, TransitionError,
};
use sandgate_proxy::PolicyHandle;
use sandgate_proxy::audit::event::{Change, Event, ExceptionChange};

use crate::store::{ExceptionStore, StoreError};

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
    #[error(transparent)]
    Store(#[from] StoreError),
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
        };
        control.tick().await?;
        control.publish()?;
        Ok(control)
    }

    fn now(&self) -> i64 {
        (self.clock)()
    }

    fn new_id(&self) -> String {
        // Unique per process and, through the seed, across restarts; not a secret.
        format!("ex-{:016x}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Files a request. Requesters may ask only for the tasks their token names.
    pub async fn request(&self, who: &Principal, req: NewRequest) -> Result<Exception, ControlError> {
        match who.role {
            Role::Requester if who.tasks.contains(&req.task_id) => {}
            Role::Requester => {
                return Err(ControlError::Forbidden(format!(
                    "{} may not request exceptions for task {:?}",
                    who.name, req.task_id
                )));
            }
            Role::Approver => {}
            Role::Viewer => return Err(forbidden(who, "request exceptions")),
        }
        let _serial = self.changes.lock().await;
        let ex = self.policy.admit(req, self.new_id(), &who.name, self.now())?;
        self.store.insert(&ex)?;
        self.record(Change::Requested, &ex, Some(&who.name)).await;
        Ok(ex)
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
        let cut = self.proxy.cut(&ex.rule_label());
        tracing::info!(exception = %ex.id, connections = cut, "exception revoked; its connections were cut");
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
            .get(id)?
            .ok_or_else(|| ControlError::NotFound(id.to_owned()))?;
        if ex.expire_if_due(now) {
            self.store.update(&ex)?;
            self.record(Change::Expired, &ex, None).await;
        }
        apply(&mut ex, now)?;
        self.store.update(&ex)?;
        self.publish()?;
        self.record(change, &ex, Some(&who.name)).await;
        Ok(ex)
    }

    /// Exceptions `who` may see: a requester its tasks', the others all.
    pub fn list(&self, who: &Principal) -> Result<Vec<Exception>, ControlError> {
        let now = self.now();
        Ok(self
            .store
            .list()?
            .into_iter()
            .filter(|e| visible(who, e))
            .map(|mut e| {
                e.state = e.state_at(now);
                e
            })
            .collect())
    }

    /// One exception, if `who` may see it.
    pub fn show(&self, who: &Principal, id: &str) -> Result<Exception, ControlError> {
        let mut ex = self
            .store
            .get(id)?
            .filter(|e| visible(who, e))
            .ok_or_else(|| ControlError::NotFound(id.to_owned()))?;
        ex.state = ex.state_at(self.now());
        Ok(ex)
    }

    /// Marks approved exceptions whose second has come as expired (stored and recorded).
    /// Their entries stop matching at that second on their own; this keeps the record true.
    pub async fn tick(&self) -> Result<usize, ControlError> {
        let _serial = self.changes.lock().await;
        let now = self.now();
        let mut expired = 0;
        for mut ex in self.store.list()? {
            if ex.expire_if_due(now) {
                self.store.update(&ex)?;
                self.record(Change::Expired, &ex, None).await;
                expired += 1;
            }
        }
        if expired > 0 {
            self.publish()?;
        }
        Ok(expired)
    }

    /// Whether the store answers.
    pub fn ready(&self) -> Result<(), ControlError> {
        Ok(self.store.ping()?)
    }

    /// Hands the proxy the entries of every active exception.
    fn publish(&self) -> Result<(), ControlError> {
        let now = self.now();
        let entries = self
            .store
            .list()?
            .iter()
            .filter(|e| e.is_active(now))
            .flat_map(Exception::entries)
            .collect();
        self.proxy.set_exceptions(entries);
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

fn visible(who: &Principal, e: &Exception) -> bool {
    who.role != Role::Requester || who.tasks.contains(&e.task_id)
}

fn forbidden(who: &Principal, what: &str) -> ControlError {
    ControlError::Forbidden(format!(
        "{} has the {} role, which may not {what}",
        who.name,
        who.role.as_str()
    ))
}
