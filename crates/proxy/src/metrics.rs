//! Prometheus metrics (prometheus-client), served in OpenMetrics text by [`crate::admin`].
//!
//! Decisions, bytes and upstream errors are counted from the typed audit events themselves
//! ([`Metrics::observe`], which knows the event types but not the writer), so the metrics
//! and the audit log can never disagree about what happened. Latencies are observed where they are measured (the dialer), connection counts
//! in the accept loop, audit queue depth and lag by the audit path, reloads by the policy
//! handle. The standard `process_*` metrics (no prefix) are read from /proc at each scrape
//! (`metrics/process.rs`); `sandgate_build_info` names the binary.

use std::borrow::Cow;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::audit::event::{Event, Outcome};

mod process;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub decision: Cow<'static, str>,
    pub reason: Cow<'static, str>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: Cow<'static, str>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabels {
    pub path: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: Cow<'static, str>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
    pub commit: String,
}

/// Every metric the proxy exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub connections_active: Gauge,
    pub connections: Counter,
    pub decisions: Family<DecisionLabels, Counter>,
    pub bytes_sent: Counter,
    pub bytes_received: Counter,
    pub upstream_errors: Family<KindLabels, Counter>,
    pub dns_seconds: Histogram,
    pub connect_seconds: Histogram,
    /// The audit trail's own (`sandgate_audit_*`).
    pub audit: std::sync::Arc<crate::audit::AuditMetrics>,
    pub state_store_unavailable: Gauge,
    pub connections_refused: Family<KindLabels, Counter>,
    pub policy_reloads: Family<OutcomeLabels, Counter>,
    pub policy_generation: Gauge,
    /// When each TLS certificate file in force expires (Unix seconds), by path.
    pub tls_certificate_expiry: Family<PathLabels, Gauge>,
    /// TLS configurations whose changed files do not load.
    pub tls_reload_failing: Gauge,
    /// 1, labelled with the binary's version and commit ([`Metrics::set_build_info`]).
    build_info: Family<BuildLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        // The root has no prefix (the process collector's names are the standard ones); every
        // metric of sandgate's own is in the `sandgate` sub-registry.
        let mut root = Registry::default();
        root.register_collector(Box::new(process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("sandgate");
        let m = Metrics {
            connections_active: Gauge::default(),
            connections: Counter::default(),
            decisions: Family::default(),
            bytes_sent: Counter::default(),
            bytes_received: Counter::default(),
            upstream_errors: Family::default(),
            // 100 µs to ~6.5 s.
            dns_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 17)),
            connect_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 17)),
            audit: Default::default(),
            state_store_unavailable: Gauge::default(),
            connections_refused: Family::default(),
            policy_reloads: Family::default(),
            policy_generation: Gauge::default(),
            tls_certificate_expiry: Family::default(),
            tls_reload_failing: Gauge::default(),
            build_info: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "connections_active",
            "Client connections open now",
            m.connections_active.clone(),
        );
        registry.register(
            "connections",
            "Client connections accepted",
            m.connections.clone(),
        );
        registry.register(
            "decisions",
            "Requests decided, by decision and reason",
            m.decisions.clone(),
        );
        registry.register(
            "bytes_sent",
            "Bytes relayed from clients toward upstreams",
            m.bytes_sent.clone(),
        );
        registry.register(
            "bytes_received",
            "Bytes relayed from upstreams toward clients",
            m.bytes_received.clone(),
        );
        registry.register(
            "upstream_errors",
            "Allowed requests that failed upstream, by kind",
            m.upstream_errors.clone(),
        );
        registry.register("dns_seconds", "DNS resolution latency", m.dns_seconds.clone());
        registry.register(
            "connect_seconds",
            "Upstream TCP connect latency",
            m.connect_seconds.clone(),
        );
        registry.register(
            "audit_queue_depth",
            "Audit events waiting for the writer",
            m.audit.queue_depth.clone(),
        );
        registry.register(
            "audit_waits",
            "Times a request waited because the audit queue was full",
            m.audit.waits.clone(),
        );
        registry.register(
            "audit_lag_seconds",
            "Age of the last audit event when it was written",
            m.audit.lag_seconds.clone(),
        );
        registry.register(
            "audit_events_written",
            "Audit events written",
            m.audit.events_written.clone(),
        );
        registry.register(
            "audit_healthy",
            "1 while the audit log can be written; 0 while it cannot (new requests get 503)",
            m.audit.healthy.clone(),
        );
        registry.register(
            "state_store_unavailable",
            "1 while the exception store (SQLite or PostgreSQL), or the control plane this proxy follows (--exceptions-from), cannot be read: decisions go on with the exceptions last known, each until its expiry; 0 otherwise, and without either",
            m.state_store_unavailable.clone(),
        );
        registry.register(
            "audit_write_errors",
            "Failed attempts to write the audit log (each retried)",
            m.audit.write_errors.clone(),
        );
        registry.register(
            "audit_events_not_queued",
            "Refusals made while the audit log failed whose event went to stderr (queue full)",
            m.audit.events_not_queued.clone(),
        );
        registry.register(
            "connections_refused",
            "Client connections answered 503 at a connection limit, by limit",
            m.connections_refused.clone(),
        );
        registry.register(
            "policy_reloads",
            "Policy reloads, by outcome",
            m.policy_reloads.clone(),
        );
        registry.register(
            "policy_generation",
            "Generation of the policy in force (1 at start)",
            m.policy_generation.clone(),
        );
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the earliest-expiring certificate of each TLS file in force expires (Unix time; 0: none parses), by path: a node listener's certificate (chain) and client CA bundle, a node's certificate and the CA of its central proxies",
            m.tls_certificate_expiry.clone(),
        );
        registry.register(
            "tls_reload_failing",
            "TLS configurations whose files changed on disk but do not load (the previous files stay in force; tried again every second)",
            m.tls_reload_failing.clone(),
        );
        registry.register(
            "build_info",
            "1, labelled with the version and commit of the running binary",
            m.build_info.clone(),
        );
        m.policy_generation.set(1);
        m.set_build_info(env!("CARGO_PKG_VERSION"), "unknown");
        Metrics { registry: root, ..m }
    }

    /// Labels `sandgate_build_info` with `version` and `commit` (one series, value 1).
    pub fn set_build_info(&self, version: &str, commit: &str) {
        self.build_info.clear();
        self.build_info
            .get_or_create(&BuildLabels {
                version: version.to_owned(),
                commit: commit.to_owned(),
            })
            .set(1);
    }

    /// Counts what an audit event records.
    fn count(&self, e: &Event) {
        match e {
            Event::Decision(d) => {
                let decision = match d.verdict {
                    sandgate_policy::Verdict::Allow => "allow",
                    sandgate_policy::Verdict::Deny => "deny",
                };
                self.decisions
                    .get_or_create(&DecisionLabels {
                        decision: decision.into(),
                        reason: d.reason_code.clone(),
                    })
                    .inc();
            }
            Event::Close(c) => {
                self.bytes_sent.inc_by(c.bytes_sent);
                self.bytes_received.inc_by(c.bytes_received);
                if let Outcome::Upstream(failure) = c.outcome {
                    self.upstream_errors
                        .get_or_create(&KindLabels {
                            kind: failure.kind().into(),
                        })
                        .inc();
                }
            }
            Event::PolicyReload(_) | Event::Aggregate(_) | Event::Exception(_) | Event::AdminRefused(_) => {}
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl crate::audit::Observe for Metrics {
    fn observe(&self, event: &Event) {
        self.count(event);
    }
}
