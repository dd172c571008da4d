//! The egress core: every front end (HTTP/1, SOCKS5, a central's node streams) hands it a
//! typed request and gets back an open upstream connection or a classified refusal. The
//! core decides (the pure policy), vets (the dialer's resolution and address guard, and
//! address deny entries), records the decision, and dials; it writes no byte to a client.
//!
//! It fails closed on the audit trail in one place: [`Egress::decide`] refuses every request
//! with 503 (`audit_unavailable`) while the audit log cannot be written, before the policy
//! is asked. Nothing passes without a [`Decided`], so no front end can skip the check.
//!
//! Exactly one decision event per request, and one close per allow, hold by construction
//! (`states.rs`): a request starts as a [`Pending`] (from [`Egress::begin`]), which
//! [`Egress::refuse`] (a deny) or [`Egress::decide`] consumes; an allowed [`Decided`] is
//! consumed by [`Decided::open`] or [`Decided::reuse`], each of which records the allow (or
//! the deny the guard found). What they return, a [`Grant`], is consumed by
//! [`Egress::close`] or [`Egress::fail`], which record the close. A state dropped before
//! any of these records what it owes from its `Drop`.
//!
//! The order is decide, vet, record, dial: [`Decided::open`] records the allow once the
//! guard passed the addresses and before it connects, so a slow connect never delays the
//! record (a failed connect is the allow's close). A tunnel is the one exception, since its
//! first bytes decide it: it is vetted and dialled first ([`Decided::dial`]), and the
//! [`Dialed`] connection is admitted (the allow, with the TLS server name read) or refused
//! (the deny) by [`Egress::carry`] (`tunnel.rs`) before a byte goes upstream.
//!
//! A grant lasts no longer than the rule that allowed it: one under an exception registers
//! where a revocation cuts it, one under an entry with an expiry where that second does
//! ([`crate::cuts`]), and its close says `revoked` or `expired`.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};

use sandgate_policy::{Access, Context, Ruleset, Target, Verdict};
use tokio_util::future::FutureExt as _;
use tokio_util::sync::CancellationToken;

use crate::ask::Asker;
use crate::audit::Audit;
use crate::audit::event::{Decision, Event, Outcome, Party};
use crate::config::{Identity, Limits, Remedies};
use crate::cuts::{CutGuard, Cuts};
use crate::dial::{DialError, Dialer};
use crate::metrics::Metrics;
use crate::refusal::Refusal;
use crate::rules::Layers;

mod ask;
mod clear;
mod open;
mod states;
mod tunnel;

pub(crate) use clear::Request;
pub(crate) use states::{Decided, Dialed, End, Grant, Opened, Pending, Refused};
use states::{RequestIds, dest_of};

/// Unix seconds now, for decisions (entries expire at exact seconds).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The decision context for an identity, now.
pub(crate) fn context(identity: &Identity) -> Context<'_> {
    Context {
        task: identity.task.as_deref(),
        project: identity.project.as_deref(),
        now: unix_now(),
    }
}

/// The shared state of every connection: the rules in force, the dialer, the audit trail.
#[derive(Debug)]
pub(crate) struct Egress {
    /// Swapped whole on every change; a request decides against the set it started with.
    pub rules: Arc<RwLock<Arc<Ruleset>>>,
    /// What `rules` is built from (file and flags; approved exceptions).
    pub layers: Arc<Mutex<Layers>>,
    /// Connections granted under revocable rules (exceptions) or expiring entries.
    pub cuts: Arc<Cuts>,
    pub dialer: Arc<Dialer>,
    /// Shared with every request in flight, whose `Drop` records what it still owes.
    pub audit: Arc<Audit>,
    pub limits: Limits,
    /// How refusals word their hints, and the audit log they name.
    pub remedies: Remedies,
    ids: RequestIds,
    /// Cancelled when in-flight work must end (grace period over).
    pub hard_stop: CancellationToken,
    /// Cancelled when shutdown begins (stop accepting; long-lived streams end).
    pub stopping: CancellationToken,
    /// Cancelled when the wait after the hard stop is over: what still runs is dropped
    /// ([`Egress::droppable`]) while the audit writer still takes its records.
    pub dropped: CancellationToken,
    /// Asks a person before the allowlist refuses (`sandgate run --ask`).
    pub asker: std::sync::OnceLock<Arc<dyn Asker>>,
    /// TLS interception, when the proxy has a CA for it: a CONNECT that only entries with
    /// methods or paths allow is then served request by request (`http1/intercept/`)
    /// rather than refused.
    pub interceptor: std::sync::OnceLock<Arc<crate::inspect::Interceptor>>,
    /// Report-only (learn) mode: a request the policy denies passes and is recorded as
    /// `report_only` with what the policy would have said; the address guard, address deny
    /// entries and tunnel checks still refuse.
    pub report_only: std::sync::atomic::AtomicBool,
    /// A request's `path` is recorded with its query string (`--audit-query`); without it,
    /// the query (which may carry tokens) is left out of the audit.
    pub record_query: std::sync::atomic::AtomicBool,
    pub metrics: Arc<Metrics>,
}

impl Egress {
    pub fn new(
        rules: Ruleset,
        dialer: Dialer,
        audit: Audit,
        limits: Limits,
        remedies: Remedies,
        metrics: Arc<Metrics>,
    ) -> Egress {
        Egress {
            layers: Arc::new(Mutex::new(Layers::new(rules.clone()))),
            cuts: Arc::new(Cuts::default()),
            rules: Arc::new(RwLock::new(Arc::new(rules))),
            dialer: Arc::new(dialer),
            audit: Arc::new(audit),
            limits,
            remedies,
            ids: RequestIds::new(),
            hard_stop: CancellationToken::new(),
            stopping: CancellationToken::new(),
            dropped: CancellationToken::new(),
            asker: std::sync::OnceLock::new(),
            interceptor: std::sync::OnceLock::new(),
            report_only: std::sync::atomic::AtomicBool::new(false),
            record_query: std::sync::atomic::AtomicBool::new(false),
            metrics,
        }
    }

    /// `work`, ended by dropping it once [`Egress::dropped`] is cancelled: each request state
    /// it holds then records what it still owes from its `Drop` (`states.rs`), into the
    /// audit log, since the writer drains only after. A combinator, not an async block: a
    /// block that awaits a future it captured would hold it twice.
    ///
    /// A tunnel's front end wraps only its set-up in this, and [`Egress::carry`] the work
    /// around the tunnel's two long waits (the check of its first bytes, its close record):
    /// those waits end by themselves when the grant's stop token is cancelled, at the hard
    /// stop at the latest, so an idle tunnel holds no token of its own (issue 32).
    pub(crate) fn droppable<F: std::future::Future>(
        &self,
        work: F,
    ) -> impl std::future::Future<Output = Option<F::Output>> + use<F> {
        // A child token of its own: polling one shared token from every connection task
        // would take that token's one lock on every wake-up (tokio's Notify locks its
        // waiter list to update the waker); a child locks the parent only when made and
        // dropped.
        work.with_cancellation_token_owned(self.dropped.child_token())
    }

    /// The rules in force now.
    pub fn rules(&self) -> Arc<Ruleset> {
        match self.rules.read() {
            Ok(r) => r.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Starts a request from `peer` on behalf of `identity`.
    /// `method` is `None` when no request line was read (a malformed head, a connection
    /// refused at a limit).
    pub fn begin(
        &self,
        peer: SocketAddr,
        identity: Arc<Identity>,
        method: Option<Cow<'static, str>>,
    ) -> Pending {
        self.begin_via(peer, identity, method, None)
    }

    /// As [`Egress::begin`], for a request a node-local proxy forwarded (`node`: its name).
    pub fn begin_via(
        &self,
        peer: SocketAddr,
        identity: Arc<Identity>,
        method: Option<Cow<'static, str>>,
        node: Option<Arc<str>>,
    ) -> Pending {
        let party = Party {
            request_id: self.ids.next(),
            client_addr: peer,
            identity,
            method,
            path: None,
            node,
        };
        Pending::new(party, self.audit.clone())
    }

    /// Refuses a request before any destination was decided (a bad head, missing
    /// credentials, a full limit, a broken audit trail) or with a policy deny, and records
    /// the decision. While the audit log cannot be written the record never waits for room
    /// in the queue (which cannot drain then): the client is answered anyway.
    pub async fn refuse(
        &self,
        pending: Pending,
        dest: Option<(&Target, Access)>,
        refusal: Refusal,
    ) -> Refused {
        let method = pending.party.method.as_deref().unwrap_or("-");
        let mut classified = refusal.classify(method, &self.remedies);
        if let Some(hint) = self.how_to_ask(&pending, &refusal) {
            classified.hints.push(hint);
        }
        let (resolved_ip, rule) = match &refusal {
            Refusal::Dial {
                error: DialError::Prohibited(p),
                ..
            } => (Some(p.ip), None),
            Refusal::AddressDenied { ip, rule, .. } => (Some(*ip), Some(rule.clone())),
            Refusal::Policy { rule, .. } => (None, rule.clone()),
            Refusal::CredentialLeak(leak) => (None, Some(Arc::from(format!("credential:{}", leak.origin)))),
            _ => (None, None),
        };
        let tls_server_name = match &refusal {
            Refusal::Tunnel { refusal, .. } => refusal.seen().map(str::to_owned),
            _ => None,
        };
        let (party, _) = pending.settle();
        let request_id = party.request_id.clone();
        let e = Event::Decision(Decision {
            dest: dest.map(|(t, a)| dest_of(t, a)),
            verdict: Verdict::Deny,
            reason_code: classified.reason_code.clone(),
            resolved_ip,
            rule,
            status: Some(classified.status),
            tls_server_name,
            party,
            would_deny: None,
            // A refused node: which certificate problem or which claim, for the operator.
            detail: matches!(refusal, Refusal::Node(_)).then(|| classified.text.clone()),
        });
        if matches!(refusal, Refusal::AuditUnavailable(_)) || self.audit.available().is_err() {
            // Must not wait behind a queue that cannot drain; the client is answered anyway.
            self.audit.record_now_or_log(e);
        } else {
            self.audit.record(e).await;
        }
        Refused {
            id: request_id,
            classified,
        }
    }

    /// Decides `target` for `access` with the rules in force. A deny is recorded here.
    ///
    /// Fails closed first: while the audit log cannot be written the request is refused
    /// (503, `audit_unavailable`) whatever the rules say. This is the one fail-closed check
    /// for every front end: a request passes only as a [`Decided`], made only here.
    pub async fn decide(
        &self,
        pending: Pending,
        target: &Target,
        access: Access,
    ) -> Result<Decided, Refused> {
        if let Err(cause) = self.audit.available() {
            let refusal = Refusal::AuditUnavailable(cause);
            return Err(self.refuse(pending, Some((target, access)), refusal).await);
        }
        let mut pending = pending;
        // A plain-HTTP request is decided with its method and path too.
        let line = match (access, &pending.party.method, &pending.party.path) {
            (Access::Http | Access::Https, Some(method), Some(path)) => {
                Some(sandgate_policy::RequestLine { method, target: path })
            }
            _ => None,
        };
        let decision = self
            .rules()
            .decide_request(target, access, &context(&pending.party.identity), line);
        if decision.verdict == Verdict::Allow || self.report_only.load(Ordering::Relaxed) {
            // Owed from here on with its destination, should it be dropped undecided.
            pending.dest = Some(dest_of(target, access));
        }
        if decision.verdict == Verdict::Deny
            && decision.reason == sandgate_policy::PolicyReason::NotAllowlisted
            && let Some((rule, expires)) = self.ask(&pending, target, access).await
        {
            return Ok(Decided {
                pending,
                target: target.clone(),
                access,
                rule: Some(rule),
                expires,
                would_deny: None,
                inspect: false,
                judged: false,
            });
        }
        // A CONNECT that only entries with methods or paths allow: served request by
        // request when the proxy can intercept, each request decided on its own (in
        // report-only mode too, so that learning sees the requests).
        // (Not a node's stream on a central: its front end relays, and cannot intercept.)
        if decision.reason == sandgate_policy::PolicyReason::InspectionRequired
            && access == Access::Connect
            && pending.party.node.is_none()
            && self.interceptor.get().is_some()
        {
            pending.dest = Some(dest_of(target, access));
            return Ok(Decided {
                pending,
                target: target.clone(),
                access,
                rule: decision.rule_label(),
                expires: decision.rule.as_ref().and_then(|r| r.expires_at),
                would_deny: None,
                inspect: true,
                judged: false,
            });
        }
        if decision.verdict == Verdict::Deny && self.report_only.load(Ordering::Relaxed) {
            return Ok(Decided {
                pending,
                target: target.clone(),
                access,
                rule: decision.rule_label(),
                // The policy is waived, its expiries with it.
                expires: None,
                would_deny: Some(decision.reason),
                inspect: false,
                judged: false,
            });
        }
        if decision.verdict == Verdict::Deny {
            let refusal = Refusal::Policy {
                target: target.clone(),
                reason: decision.reason,
                rule: decision.rule_label(),
            };
            return Err(self.refuse(pending, Some((target, access)), refusal).await);
        }
        Ok(Decided {
            pending,
            target: target.clone(),
            access,
            rule: decision.rule_label(),
            // In report-only mode the policy is waived, its expiries with it.
            expires: match self.report_only.load(Ordering::Relaxed) {
                true => None,
                false => decision.rule.as_ref().and_then(|r| r.expires_at),
            },
            would_deny: None,
            inspect: false,
            judged: decision.rule.as_ref().is_some_and(|r| r.request.is_some()),
        })
    }

    /// Records the close of a granted request. (The event is made before the future
    /// starts, so a caller's future holds the record's small future, never the grant.)
    pub fn close(&self, grant: Grant, end: End) -> impl Future<Output = ()> + Send + '_ {
        let e = grant.settle(end.sent, end.received, end.status, end.outcome);
        self.audit.record(e)
    }

    /// Records a granted request that failed upstream before a response (DNS, connect, a
    /// broken or missing response head): a close whose outcome is the refusal's reason.
    pub async fn fail(&self, grant: Grant, refusal: Refusal, sent: u64, received: u64) -> Refused {
        let method = grant.party.method.as_deref().unwrap_or("-");
        // A leak found in a body already on its way is the close's outcome.
        let own = matches!(refusal, Refusal::CredentialLeak(_)).then_some(Outcome::CredentialLeak);
        let classified = refusal.classify(method, &self.remedies);
        let id = grant.party.request_id.clone();
        let end = End {
            sent,
            received,
            // An upstream proxy's refusal records its own status (a 407 the client got as 403).
            status: classified.upstream_status.or(Some(classified.status)),
            // Only upstream failures reach here; anything else is recorded as the client's.
            outcome: classified.outcome.or(own).unwrap_or(Outcome::ClientFailure),
        };
        self.close(grant, end).await;
        Refused { id, classified }
    }

    /// The token that ends a grant under `rule` expiring at `expires`, and its registration
    /// where a revocation (only exceptions can be revoked) or the expiry can cut it; any
    /// other grant shares the shutdown token.
    fn stop_for(
        &self,
        rule: Option<&Arc<str>>,
        expires: Option<i64>,
    ) -> (CancellationToken, Option<CutGuard>) {
        let label = rule.filter(|label| label.starts_with("exception:")).cloned();
        if label.is_none() && expires.is_none() {
            return (self.hard_stop.clone(), None);
        }
        let token = self.hard_stop.child_token();
        let guard = Cuts::register(&self.cuts, label, expires, &token);
        (token, Some(guard))
    }

    /// What a grant its stop token ended was cut by: the end of the shutdown grace; the
    /// expiry of the entry that allowed it, once its second has come; else a revocation.
    pub(crate) fn cut_outcome(&self, grant: &Grant) -> Outcome {
        self.cut_by(grant.expires)
    }

    fn cut_by(&self, expires: Option<i64>) -> Outcome {
        if self.hard_stop.is_cancelled() {
            Outcome::Shutdown
        } else if expires.is_some_and(|at| unix_now() >= at) {
            Outcome::Expired
        } else {
            Outcome::Revoked
        }
    }

    /// Records the allow. `stop`: the grant's stop token and cut registration, when they
    /// were taken before (a dialled tunnel's); otherwise they are taken now.
    ///
    /// Fails closed again: a request decided while the audit log could be written may wait
    /// before it is let through (a person's answer to `--ask`, a tunnel's first bytes, an
    /// intercepted request's turn on an upstream connection). If the log has failed
    /// meanwhile, it is refused here (503, `audit_unavailable`: the request's one decision)
    /// and nothing passes.
    async fn allow(
        &self,
        mut d: Decided,
        resolved: Option<IpAddr>,
        tls_server_name: Option<String>,
        stop: Option<(CancellationToken, Option<CutGuard>)>,
    ) -> Result<Grant, Refused> {
        if let Err(cause) = self.audit.available() {
            let refusal = Refusal::AuditUnavailable(cause);
            return Err(self.refuse(d.pending, Some((&d.target, d.access)), refusal).await);
        }
        // Readers take the verdict from `would_deny`; `detail` keeps the words docs/audit.md
        // promises people (`would deny: not_allowlisted`).
        let (reason_code, detail) = match d.would_deny {
            None if d.inspect => ("inspected", None),
            None => ("allowlisted", None),
            Some(reason) => ("report_only", Some(format!("would deny: {}", reason.code()))),
        };
        // The destination `decide` noted for a drop's record, if it did: made once.
        let dest = d
            .pending
            .dest
            .take()
            .unwrap_or_else(|| dest_of(&d.target, d.access));
        let (party, started) = d.pending.settle();
        let e = Event::Decision(Decision {
            party: party.clone(),
            dest: Some(dest),
            verdict: Verdict::Allow,
            reason_code: reason_code.into(),
            resolved_ip: resolved,
            rule: d.rule.clone(),
            status: None,
            tls_server_name,
            would_deny: d.would_deny,
            detail,
        });
        self.audit.record(e).await;
        let (stop, cut) = stop.unwrap_or_else(|| self.stop_for(d.rule.as_ref(), d.expires));
        Ok(Grant {
            party,
            stop,
            cuttable: cut.is_some(),
            cut: cut.map(Box::new),
            expires: d.expires,
            target: d.target,
            access: d.access,
            resolved,
            started,
            owed: Some(self.audit.clone()),
        })
    }
}
