//! The exceptions in force on this proxy, whichever way they arrive: from the store it hosts
//! (`service/sync.rs`) or from a control plane it follows (`follow.rs`). Both choose the
//! same way ([`in_force`]: approved, active now, within this proxy's bounds) and install the
//! same way ([`Applied::install`]: the rules' exceptions layer replaced whole, and the
//! connections of every exception that left it cut).

use sandgate_policy::{Exception, ExceptionPolicy, ExceptionState};
use sandgate_proxy::PolicyHandle;

/// Of `rows`, the exceptions that may apply here at `now`: approved, not yet expired, and
/// within `bounds`. A row out of bounds (written into a shared database by hand, by a proxy
/// with another policy, or published by a control plane with wider bounds) allows nothing.
/// A row out of bounds is a warning where it should not be (`Stray::Warn`: the store this
/// proxy hosts) and routine where it may well be (`Stray::Expected`: a followed control plane
/// serves other tasks with bounds of its own).
pub(crate) fn in_force(
    rows: Vec<Exception>,
    bounds: &ExceptionPolicy,
    now: i64,
    stray: Stray,
) -> Vec<Exception> {
    rows.into_iter()
        .filter(|e| e.state == ExceptionState::Approved && e.is_active(now))
        .filter(|e| match bounds.check_bounds(e) {
            Ok(()) => true,
            Err(error) => {
                match stray {
                    Stray::Warn => {
                        tracing::warn!(exception = %e.id, %error, "a stored exception is out of this policy's bounds; not applied")
                    }
                    Stray::Expected => {
                        tracing::debug!(exception = %e.id, %error, "a followed exception is out of this policy's bounds; not applied")
                    }
                }
                false
            }
        })
        .collect()
}

/// How [`in_force`] reports a row out of bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stray {
    Warn,
    Expected,
}

/// The exceptions last installed: what decisions go on with while their source cannot be
/// read, and what the next installation compares with to cut what ended.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    known: std::sync::Mutex<Vec<Exception>>,
}

impl Applied {
    /// Makes `active` the exceptions layer of `proxy`'s rules, cutting what left it.
    pub(crate) fn install(&self, proxy: &PolicyHandle, active: Vec<Exception>) {
        let mut known = match self.known.lock() {
            Ok(k) => k,
            Err(poisoned) => poisoned.into_inner(),
        };
        for gone in known.iter().filter(|k| !active.iter().any(|a| a.id == k.id)) {
            let cut = proxy.cut(&gone.rule_label());
            tracing::info!(exception = %gone.id, connections = cut, "exception no longer active here; its connections were cut");
        }
        for new in active.iter().filter(|a| !known.iter().any(|k| k.id == a.id)) {
            tracing::debug!(exception = %new.id, task = %new.task_id, hosts = ?new.hosts, "exception applied");
        }
        proxy.set_exceptions(active.iter().flat_map(Exception::entries).collect());
        *known = active;
    }

    /// The exceptions installed last.
    pub(crate) fn known(&self) -> Vec<Exception> {
        match self.known.lock() {
            Ok(k) => k.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}
