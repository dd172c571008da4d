//! What the proxy's rules hold, kept true to the store: publication (the active exceptions'
//! entries), expiry at each exception's second, and, with a store several proxies share,
//! the resync on every notification and every few seconds.
//!
//! The exceptions last published are kept ([`Control::known`]). A publication cuts what was
//! in them and is no longer active, so a revocation or an expiry stored by another proxy
//! ends this proxy's connections too. While the store cannot be read, decisions go on with
//! those exceptions, each only until its own expiry: the rules drop an entry at its second
//! by themselves, and [`Control::tick`] cuts what it let through.

use std::sync::atomic::Ordering;
use std::time::Duration;

use sandgate_policy::{Exception, ExceptionState};
use sandgate_proxy::audit::event::Change;

use super::{Control, ControlError};
use crate::store::StoreError;

impl Control {
    /// Hands the proxy the entries of every active exception in the store within this
    /// policy's bounds, and cuts what was active at the last publication and no longer is.
    pub(super) async fn publish(&self) -> Result<(), ControlError> {
        let approved = self.store.list_in(ExceptionState::Approved).await?;
        let active =
            crate::applied::in_force(approved, &self.policy, self.now(), crate::applied::Stray::Warn);
        self.known.install(&self.proxy, active);
        Ok(())
    }

    /// Reads the store again and publishes what it holds (after another proxy's change, or
    /// every resync period).
    pub async fn sync(&self) -> Result<(), ControlError> {
        let _serial = self.changes.lock().await;
        let result = self.publish().await;
        self.note_store(result.as_ref().err());
        result
    }

    /// Marks approved exceptions whose second has come as expired (stored once, whichever
    /// proxy does it first, and recorded by that one) and cuts what they let through here.
    /// Their entries stop matching at that second on their own; this keeps the record true.
    pub async fn tick(&self) -> Result<usize, ControlError> {
        let _serial = self.changes.lock().await;
        let now = self.now();
        // What the rules hold ends at its second first, however long the store takes to
        // answer, or if it cannot.
        self.expire_known(now);
        let approved = self.store.list_in(ExceptionState::Approved).await?;
        let mut expired = 0;
        for mut ex in approved {
            if ex.expire_if_due(now) {
                self.proxy.cut(&ex.rule_label());
                self.expired(&ex).await?;
                expired += 1;
            }
        }
        if expired > 0 {
            self.publish().await?;
        }
        Ok(expired)
    }

    /// Drops (and cuts) the known exceptions whose second has come, with no store needed.
    fn expire_known(&self, now: i64) {
        let known = self.known.known();
        if known.iter().any(|e| !e.is_active(now)) {
            let active = known.into_iter().filter(|e| e.is_active(now)).collect();
            self.known.install(&self.proxy, active);
        }
    }

    /// Stores an approved exception's expiry unless another proxy stored it first, and
    /// records it only then (once in all).
    pub(super) async fn expired(&self, ex: &Exception) -> Result<(), ControlError> {
        match self.store.transition(ex, ExceptionState::Approved).await {
            Ok(()) => {
                self.record(Change::Expired, ex, None).await;
                Ok(())
            }
            Err(StoreError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the store answers and its rows can be read.
    pub async fn ready(&self) -> Result<(), ControlError> {
        self.store.ping().await?;
        self.store.list().await?;
        Ok(())
    }

    /// The store's kind and place (no secret), for logs and readiness.
    pub fn store_name(&self) -> String {
        self.store.describe()
    }

    /// Logs the store's failure once per outage, and its return; other failures each time.
    fn note_store(&self, error: Option<&ControlError>) {
        match error {
            Some(e) if e.is_store() => self.proxy.note_store(false),
            None => self.proxy.note_store(true),
            Some(_) => {}
        }
        match error {
            Some(e) if e.is_store() => {
                if !self.store_down.swap(true, Ordering::Relaxed) {
                    let known = self.known.known().len();
                    tracing::error!(store = %self.store.describe(), error = %e, known,
                        "exception store unavailable: decisions go on with the exceptions last known, each until its expiry; requests and approvals get 503");
                }
            }
            Some(e) => tracing::error!(error = %e, "exceptions: keeping the rules true to the store failed"),
            None => {
                if self.store_down.swap(false, Ordering::Relaxed) {
                    tracing::info!(store = %self.store.describe(), "exception store available again");
                }
            }
        }
    }

    /// Expires approved exceptions at their second, until the runtime ends.
    pub async fn expire_loop(&self) {
        let mut every = tokio::time::interval(Duration::from_millis(250));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let result = self.tick().await;
            self.note_store(result.err().as_ref());
        }
    }

    /// With a shared store: reads it again on every notification of a change and at least
    /// every `every`, so a missed notification cannot leave this proxy stale for longer.
    /// Returns at once for a store only this proxy writes.
    pub async fn sync_loop(&self, every: Duration) {
        let Some(changed) = self.store.changed() else {
            return;
        };
        loop {
            tokio::select! {
                () = changed.notified() => {}
                () = tokio::time::sleep(every) => {}
            }
            // Logged (once per outage) inside; the next wake or period tries again.
            let _ = self.sync().await;
            // At most ten re-reads a second, however many notifications come (a flood of
            // them, sent by anyone who may connect to the database, coalesces meanwhile).
            tokio::time::sleep(MIN_SYNC_GAP).await;
        }
    }
}

/// The least time between two re-reads of a shared store.
const MIN_SYNC_GAP: Duration = Duration::from_millis(100);
