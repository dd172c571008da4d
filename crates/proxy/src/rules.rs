//! The rules in force and the handle that replaces them while the proxy runs. The file
//! watcher (`reload.rs`) builds a new rule set from the policy file and the command line's
//! patterns and hands it here; so will the exceptions of the control plane. A request
//! decides against the set it started with.

use std::sync::{Arc, RwLock};

use sandgate_policy::Ruleset;

use crate::audit::WeakAudit;
use crate::audit::event::{Event, Reload};
use crate::metrics::{Metrics, OutcomeLabels};

/// Replaces the policy of a running proxy. Holds no strong reference to the audit writer, so
/// it never delays shutdown.
#[derive(Debug, Clone)]
pub struct PolicyHandle {
    pub(crate) rules: Arc<RwLock<Arc<Ruleset>>>,
    pub(crate) audit: WeakAudit,
    pub(crate) metrics: Arc<Metrics>,
}

impl PolicyHandle {
    /// Swaps in a new rule set atomically and records the reload.
    pub async fn replace(&self, rules: Ruleset, generation: u64, detail: String) {
        match self.rules.write() {
            Ok(mut r) => *r = Arc::new(rules),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(rules),
        }
        self.record(true, generation, detail).await;
    }

    /// Records a rejected reload (the old rules stay in force).
    pub async fn rejected(&self, generation: u64, detail: String) {
        self.record(false, generation, detail).await;
    }

    async fn record(&self, applied: bool, generation: u64, detail: String) {
        let outcome = if applied { "applied" } else { "rejected" };
        self.metrics
            .policy_reloads
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
        if applied {
            self.metrics.policy_generation.set(generation as i64);
        }
        let e = Event::PolicyReload(Reload {
            generation,
            applied,
            detail,
        });
        self.audit.record(e).await;
    }
}
