//! What ends a grant early while the proxy runs on: the revocation of the exception that
//! allowed it, and the expiry of the entry that allowed it. A grant that either can end (a
//! tunnel, a kept-alive client connection, an exchange in flight) registers its cancellation
//! token here and holds a [`CutGuard`], which removes the registration when the grant ends.
//! What a cut grant is recorded as (`revoked`, `expired`) is the egress core's business.
//!
//! - **Revocation** is by rule label: [`Cuts::cut`] cancels every grant under an exception's
//!   label (`exception:ID`) and marks the label dead, so a grant decided just before and
//!   registering after ends at once.
//! - **Expiry** is by time: a grant whose deciding entry has an expiry (a policy file's
//!   `expires_at` or `ttl_seconds`, an exception's end) registers under that second, and one
//!   timer per second ends every grant under it when the wall clock reaches it; a grant
//!   registering at or after its second ends at once. The entry stops matching new requests
//!   at that second by itself (the pure policy takes the time as an argument); this ends
//!   what it let through before (issue 28).
//!
//! The timers sleep on the monotonic clock but end on the wall clock, which the policy's
//! seconds are in: they read it again at least every [`RECHECK`], so a step of the clock
//! delays a cut by at most that much and never brings one forward. A second keeps its one
//! timer however many grants come and go before it, and a timer holds the registry weakly.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

/// The longest an expiry timer sleeps before it reads the wall clock again.
const RECHECK: Duration = Duration::from_secs(30);

/// The open grants under one key: registration id and cancellation token.
type Open = Vec<(u64, CancellationToken)>;

/// Grants that a revocation or an expiry may end, by rule label and by second.
#[derive(Debug, Default)]
pub(crate) struct Cuts {
    state: Mutex<CutState>,
    next: AtomicU64,
}

#[derive(Debug, Default)]
struct CutState {
    /// By the label of the (revocable) rule that allowed them.
    by_label: HashMap<Arc<str>, Open>,
    /// Labels already cut.
    dead: HashSet<Arc<str>>,
    /// By the second their deciding entry expires. A second stays here, empty or not, until
    /// its timer fires, so grants coming and going before it start no second timer.
    by_expiry: HashMap<i64, Open>,
}

/// Removes its grant's registrations when the grant ends.
#[derive(Debug)]
pub(crate) struct CutGuard {
    cuts: Arc<Cuts>,
    id: u64,
    label: Option<Arc<str>>,
    expires: Option<i64>,
}

impl Cuts {
    /// Registers `token` to be cancelled when `label` is cut and at the second `expires`
    /// (Unix seconds); cancels it at once when either has happened already.
    pub fn register(
        cuts: &Arc<Cuts>,
        label: Option<Arc<str>>,
        expires: Option<i64>,
        token: &CancellationToken,
    ) -> CutGuard {
        let id = cuts.next.fetch_add(1, Ordering::Relaxed);
        let mut new_second = None;
        {
            let mut state = cuts.lock();
            let revoked = label.as_ref().is_some_and(|l| state.dead.contains(l));
            if revoked || expires.is_some_and(|at| until(at).is_zero()) {
                // Revoked or expired between the decision and now: ends at once.
                token.cancel();
            } else {
                if let Some(label) = &label {
                    let open = state.by_label.entry(label.clone()).or_default();
                    open.push((id, token.clone()));
                }
                if let Some(at) = expires {
                    match state.by_expiry.entry(at) {
                        Entry::Occupied(mut open) => open.get_mut().push((id, token.clone())),
                        Entry::Vacant(slot) => {
                            slot.insert(vec![(id, token.clone())]);
                            new_second = Some(at);
                        }
                    }
                }
            }
        }
        if let Some(at) = new_second {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(expire_at(Arc::downgrade(cuts), at))),
                // Nothing could end it on time (grants are made on the runtime): fail closed.
                Err(_) => drop(cuts.expire(at)),
            }
        }
        CutGuard {
            cuts: cuts.clone(),
            id,
            label,
            expires,
        }
    }

    /// Cancels every grant under `label` and marks it dead, so one registering later is
    /// cancelled at once too. Returns how many were cut.
    pub fn cut(&self, label: &str) -> usize {
        let tokens = {
            let mut state = self.lock();
            state.dead.insert(Arc::from(label));
            state.by_label.remove(label).unwrap_or_default()
        };
        tokens.iter().for_each(|(_, t)| t.cancel());
        tokens.len()
    }

    pub fn is_dead(&self, label: &str) -> bool {
        self.lock().dead.contains(label)
    }

    /// Cancels every grant whose entry expires at the second `at`.
    fn expire(&self, at: i64) -> usize {
        let tokens = self.lock().by_expiry.remove(&at).unwrap_or_default();
        tokens.iter().for_each(|(_, t)| t.cancel());
        tokens.len()
    }

    /// A poisoned lock is still used: the registry must go on cutting.
    fn lock(&self) -> MutexGuard<'_, CutState> {
        match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

impl Drop for CutGuard {
    fn drop(&mut self) {
        let mut state = self.cuts.lock();
        if let Some(label) = &self.label
            && let Some(open) = state.by_label.get_mut(label)
        {
            open.retain(|(id, _)| *id != self.id);
            if open.is_empty() {
                state.by_label.remove(label);
            }
        }
        // The second itself stays until its timer fires (see `CutState::by_expiry`).
        if let Some(open) = self.expires.and_then(|at| state.by_expiry.get_mut(&at)) {
            open.retain(|(id, _)| *id != self.id);
        }
    }
}

/// The timer of the second `at`: ends what is registered under it once the wall clock has
/// reached it (or gives up when the proxy is gone).
async fn expire_at(cuts: Weak<Cuts>, at: i64) {
    loop {
        let left = until(at);
        if left.is_zero() {
            break;
        }
        tokio::time::sleep(left.min(RECHECK)).await;
        if cuts.strong_count() == 0 {
            return;
        }
    }
    if let Some(cuts) = cuts.upgrade() {
        let cut = cuts.expire(at);
        if cut > 0 {
            tracing::info!(
                expires_at = at,
                connections = cut,
                "entry expired; its connections were cut"
            );
        }
    }
}

/// How long until the wall clock reaches the second `at` (zero from that second on).
fn until(at: i64) -> Duration {
    let Ok(secs) = u64::try_from(at) else {
        return Duration::ZERO;
    };
    match UNIX_EPOCH.checked_add(Duration::from_secs(secs)) {
        Some(then) => then.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO),
        None => Duration::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> i64 {
        crate::egress::unix_now()
    }

    #[test]
    fn a_grant_registering_after_its_revocation_or_its_second_ends_at_once() {
        let cuts = Arc::new(Cuts::default());
        let late = CancellationToken::new();
        let _g = Cuts::register(&cuts, None, Some(now() - 1), &late);
        assert!(late.is_cancelled(), "expired before it registered");
        assert_eq!(cuts.cut("exception:x"), 0);
        let revoked = CancellationToken::new();
        let _g = Cuts::register(
            &cuts,
            Some(Arc::from("exception:x")),
            Some(now() + 3600),
            &revoked,
        );
        assert!(revoked.is_cancelled(), "revoked before it registered");
        assert!(cuts.lock().by_expiry.is_empty(), "and nothing left to time");
    }

    #[tokio::test]
    async fn grants_end_at_their_entrys_second_not_before_and_one_timer_serves_a_second() {
        let cuts = Arc::new(Cuts::default());
        let at = now() + 1;
        let tokens: Vec<CancellationToken> = (0..3).map(|_| CancellationToken::new()).collect();
        let mut guards: Vec<CutGuard> = tokens
            .iter()
            .map(|t| Cuts::register(&cuts, None, Some(at), t))
            .collect();
        let later = CancellationToken::new();
        let _later = Cuts::register(&cuts, Some(Arc::from("allow:x")), Some(at + 3600), &later);
        // A grant that ended before its second leaves no registration behind.
        drop(guards.remove(0));
        assert_eq!(cuts.lock().by_expiry.get(&at).map(Vec::len), Some(2));
        let cut = tokio::time::timeout(Duration::from_secs(10), tokens[1].cancelled()).await;
        assert!(cut.is_ok(), "not cut within 10 s of its second");
        assert!(now() >= at, "cut before its second");
        assert!(tokens[2].is_cancelled() && !tokens[0].is_cancelled());
        assert!(!later.is_cancelled(), "an entry expiring later is not cut");
        assert!(!cuts.lock().by_expiry.contains_key(&at));
        // Revocation still cuts by label, whatever the expiry.
        assert_eq!(cuts.cut("allow:x"), 1);
        assert!(later.is_cancelled());
    }
}
