//! The rules in force, built from layers, and the handle that changes them while the proxy
//! runs. The base layer is the policy file with the command line's patterns (the file
//! watcher, `reload.rs`, replaces it); the exceptions layer holds the task-scoped entries of
//! approved exceptions (the control plane replaces it). Every change publishes one new rule
//! set atomically; a request decides against the set it started with.
//!
//! Revocation must also end what an exception already let through: connections granted by an
//! exception's rule register a cancellation token under its label ([`crate::cuts`]), and
//! [`PolicyHandle::cut`] cancels them all.

use std::sync::{Arc, Mutex, RwLock};

use sandgate_policy::{Entry, Ruleset};
use tokio_util::sync::CancellationToken;

use crate::audit::WeakAudit;
use crate::audit::event::{Event, Reload};
use crate::cuts::Cuts;
use crate::metrics::{Metrics, OutcomeLabels};

/// The layers the published rule set is built from.
#[derive(Debug, Default)]
pub(crate) struct Layers {
    base: Ruleset,
    exceptions: Vec<Entry>,
    /// The control plane publishes exceptions (so a refusal may say how to ask).
    enabled: bool,
}

impl Layers {
    pub fn new(base: Ruleset) -> Layers {
        Layers {
            base,
            exceptions: Vec::new(),
            enabled: false,
        }
    }

    pub fn exceptions_enabled(&self) -> bool {
        self.enabled
    }

    fn combined(&self) -> Ruleset {
        let mut rules = self.base.clone();
        for e in &self.exceptions {
            rules.allow_entry(e.clone());
        }
        rules
    }
}

/// Changes the layers and publishes the rule set they make, atomically.
pub(crate) fn change(layers: &Mutex<Layers>, rules: &RwLock<Arc<Ruleset>>, f: impl FnOnce(&mut Layers)) {
    let mut layers = match layers.lock() {
        Ok(l) => l,
        Err(poisoned) => poisoned.into_inner(),
    };
    f(&mut layers);
    let combined = Arc::new(layers.combined());
    match rules.write() {
        Ok(mut r) => *r = combined,
        Err(poisoned) => *poisoned.into_inner() = combined,
    }
}

impl Layers {
    /// Adds entries to the exceptions layer (answers given at the terminal).
    pub(crate) fn add_exceptions(&mut self, entries: Vec<Entry>) {
        self.exceptions.extend(entries);
    }
}

/// Changes the policy of a running proxy. Holds no strong reference to the audit writer, so
/// it never delays shutdown.
#[derive(Debug, Clone)]
pub struct PolicyHandle {
    pub(crate) rules: Arc<RwLock<Arc<Ruleset>>>,
    pub(crate) layers: Arc<Mutex<Layers>>,
    pub(crate) cuts: Arc<Cuts>,
    /// Cancelled when the proxy begins to shut down.
    pub(crate) stopping: CancellationToken,
    pub(crate) audit: WeakAudit,
    pub(crate) metrics: Arc<Metrics>,
    /// The node listeners, whose `spec.nodes` follow the file.
    pub(crate) node_listeners: Vec<Arc<crate::transport::NodeListener>>,
}

impl PolicyHandle {
    /// Notes whether the control plane's exception store answers (a metric).
    pub fn note_store(&self, available: bool) {
        self.metrics.state_store_unavailable.set(i64::from(!available));
    }

    /// Replaces the nodes every node listener serves (`spec.nodes` of a reloaded file):
    /// each new stream is checked against them, on connections already up too.
    pub fn set_nodes(&self, nodes: &sandgate_policy::Nodes) {
        for l in &self.node_listeners {
            l.set_nodes(nodes.clone());
        }
    }

    /// Replaces the base layer (file and flags) atomically and records the reload.
    pub async fn replace(&self, rules: Ruleset, generation: u64, detail: String) {
        self.change(|layers| layers.base = rules);
        self.record(true, (generation, 0), detail).await;
    }

    /// Replaces the exceptions layer: the entries of every approved, unexpired exception
    /// (never those of one already cut).
    pub fn set_exceptions(&self, mut entries: Vec<Entry>) {
        entries.retain(|e| !self.cuts.is_dead(&e.origin));
        self.change(|layers| {
            layers.exceptions = entries;
            layers.enabled = true;
        });
    }

    /// Ends an exception at once, before anything is stored: its entries leave the rules
    /// and every connection granted under `rule_label` (tunnels, kept-alive connections,
    /// exchanges in flight) is cut, including one decided just before and registering
    /// after. Returns how many were cut.
    pub fn cut(&self, rule_label: &str) -> usize {
        // The entries leave the rules before any connection is cut: a client woken by the
        // cut (its tunnel closed) and asking again at once is decided without them, and gets
        // a 403, not a connection granted and cut in the same instant.
        self.change(|layers| layers.exceptions.retain(|e| &*e.origin != rule_label));
        let cut = self.cuts.cut(rule_label);
        // Once more, now that the label is dead: a publication racing the first change
        // cannot bring the entries back.
        let cuts = self.cuts.clone();
        self.change(|layers| layers.exceptions.retain(|e| !cuts.is_dead(&e.origin)));
        cut
    }

    /// Records a rejected reload: `generation` stays in force, and this is the
    /// `rejection`th file rejected since it came into force.
    pub async fn rejected(&self, generation: u64, rejection: u64, detail: String) {
        self.record(false, (generation, rejection), detail).await;
    }

    /// Cancelled when the proxy begins to shut down (live streams end then).
    pub fn stopping(&self) -> CancellationToken {
        self.stopping.clone()
    }

    /// Every audit event recorded from now on, live (decisions, closes, exception changes).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<crate::audit::Stamped>> {
        self.audit.subscribe()
    }

    /// Records a control-plane event (an exception's change) in the audit trail.
    pub async fn record_event(&self, event: Event) {
        self.audit.record(event).await;
    }

    fn change(&self, f: impl FnOnce(&mut Layers)) {
        change(&self.layers, &self.rules, f);
    }

    async fn record(&self, applied: bool, (generation, rejection): (u64, u64), detail: String) {
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
            rejection,
            detail,
        });
        self.audit.record(e).await;
    }
}
