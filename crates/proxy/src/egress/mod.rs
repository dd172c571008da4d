//! The egress core: every front end (HTTP/1, SOCKS5, a central's node streams) hands it a
//! typed request and gets back an open upstream connection or a classified refusal. The
//! core decides (the pure policy), vets (the dialer's resolution and address guard, and
//! address deny entries), records the decision, and dials; it writes no byte to a client.
//!
//! It fails closed on the audit trail in one place: [`Egress::decide`] refuses every request
//! with 503 (`audit_unavailable`) while the audit log cannot be written, before the policy
//! is asked. Nothing passes without a [`Decided`], so no front end can skip the check.
//!
//! Exactly one decision event per request holds by construction: a request starts as a
//! [`Pending`] (from [`Egress::begin`]), which only [`Egress::refuse`] (a deny) or
//! [`Egress::decide`] consumes; an allowed [`Decided`] is consumed by [`Decided::open`] or
//! [`Decided::reuse`], each of which records the allow (or the deny the guard found). What
//! they return, a [`Grant`], is consumed by [`Egress::close`] or [`Egress::fail`], which
//! record the close. A tunnel is dialled first ([`Decided::dial`]) and decided by its first
//! bytes: the [`Dialed`] connection is admitted (the allow) or refused (the deny) by
//! [`Egress::carry`] (`tunnel.rs`). None of these types can be cloned, and each is
//! `#[must_use]`.
//!
//! A grant lasts no longer than the rule that allowed it: one under an exception registers
//! where a revocation cuts it, one under an entry with an expiry where that second does
//! ([`crate::cuts`]), and its close says `revoked` or `expired`.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use sandgate_policy::{Access, Context, Ruleset, Target, Verdict};
use tokio_util::sync::CancellationToken;

use crate::ask::Asker;
use crate::audit::Audit;
use crate::audit::event::{Close, Decision, Dest, Event, Outcome, Party};
use crate::config::{Identity, Limits};
use crate::cuts::{CutGuard, Cuts};
use crate::dial::{DialError, Dialer};
use crate::metrics::Metrics;
use crate::refusal::{Classified, Refusal};
use crate::relay::Upstream;
use crate::rules::Layers;

mod ask;
mod open;
mod tunnel;

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
    pub audit: Audit,
    pub limits: Limits,
    ids: RequestIds,
    /// Cancelled when in-flight work must end (grace period over).
    pub hard_stop: CancellationToken,
    /// Cancelled when shutdown begins (stop accepting; long-lived streams end).
    pub stopping: CancellationToken,
    /// Asks a person before the allowlist refuses (`sandgate run --ask`).
    pub asker: std::sync::OnceLock<Arc<dyn Asker>>,
    /// Report-only (learn) mode: a request the policy denies passes and is recorded as
    /// `report_only` with what the policy would have said; the address guard, address deny
    /// entries and tunnel checks still refuse.
    pub report_only: std::sync::atomic::AtomicBool,
    pub metrics: Arc<Metrics>,
}

/// A request that has not been decided yet.
#[must_use = "a request must end in exactly one decision event: refuse it or decide it"]
#[derive(Debug)]
pub(crate) struct Pending {
    party: Party,
    started: Instant,
}

impl Pending {
    /// Gives up a request that is not one after all, with no record: a node's stream of
    /// plain HTTP requests (refused as a stream, or else each request on it begun, decided
    /// and recorded on its own).
    pub(crate) fn forgo(self) {}
}

/// An allowed request, before the guard has seen its addresses.
#[must_use = "an allowed request must be opened or reused, which records its decision"]
#[derive(Debug)]
pub(crate) struct Decided {
    pending: Pending,
    target: Target,
    access: Access,
    rule: Option<Arc<str>>,
    /// The second the deciding entry expires: what it let through ends then.
    expires: Option<i64>,
    /// Let through in report-only mode: what the policy said instead.
    would_deny: Option<sandgate_policy::PolicyReason>,
}

/// A request whose allow is on record; its close must be recorded too.
#[must_use = "an allowed request must end in a close event: close or fail it"]
#[derive(Debug)]
pub(crate) struct Grant {
    party: Party,
    /// Cancelled at the end of the shutdown grace, or when the granting rule is revoked or
    /// expires.
    stop: CancellationToken,
    /// Registered where a revocation or the expiry can cut it; removed when the grant ends.
    _cut: Option<CutGuard>,
    /// A revocation or the expiry can end it early (whoever holds the registration now).
    cuttable: bool,
    /// The second the deciding entry expires.
    expires: Option<i64>,
    pub target: Target,
    access: Access,
    resolved: Option<IpAddr>,
    started: Instant,
}

/// An upstream connection the core opened for a granted request.
#[derive(Debug)]
pub(crate) struct Opened {
    pub stream: Upstream,
    pub addr: SocketAddr,
    /// The connection goes to an upstream proxy (which needs absolute-form HTTP requests).
    pub chained: bool,
    pub grant: Grant,
}

/// A connection the core opened for an allowed tunnel whose allow is not on record yet: the
/// tunnel's first bytes decide it ([`Egress::carry`]).
#[must_use = "a dialled tunnel must be carried or abandoned, which records its decision"]
#[derive(Debug)]
pub(crate) struct Dialed {
    decided: Decided,
    pub stream: Upstream,
    pub addr: SocketAddr,
    vetted_ip: Option<IpAddr>,
    /// Cancelled at the end of the shutdown grace, or when the granting rule is revoked or
    /// expires.
    stop: (CancellationToken, Option<CutGuard>),
}

/// A refusal already on record; the front end renders it.
#[derive(Debug)]
pub(crate) struct Refused {
    pub id: String,
    pub classified: Classified,
}

/// How an allowed exchange or tunnel ended.
#[derive(Debug)]
pub(crate) struct End {
    pub sent: u64,
    pub received: u64,
    pub status: Option<u16>,
    pub outcome: Outcome,
}

impl Egress {
    pub fn new(
        rules: Ruleset,
        dialer: Dialer,
        audit: Audit,
        limits: Limits,
        metrics: Arc<Metrics>,
    ) -> Egress {
        Egress {
            layers: Arc::new(Mutex::new(Layers::new(rules.clone()))),
            cuts: Arc::new(Cuts::default()),
            rules: Arc::new(RwLock::new(Arc::new(rules))),
            dialer: Arc::new(dialer),
            audit,
            limits,
            ids: RequestIds::new(),
            hard_stop: CancellationToken::new(),
            stopping: CancellationToken::new(),
            asker: std::sync::OnceLock::new(),
            report_only: std::sync::atomic::AtomicBool::new(false),
            metrics,
        }
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
        Pending {
            party: Party {
                request_id: self.ids.next(),
                client_addr: peer,
                identity,
                method,
                node,
            },
            started: Instant::now(),
        }
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
        let mut classified = refusal.classify(pending.party.method.as_deref().unwrap_or("-"));
        if let Some(hint) = self.how_to_ask(&pending, &refusal) {
            classified.hints.push(hint);
        }
        let (resolved_ip, rule) = match &refusal {
            Refusal::Dial {
                error: DialError::Prohibited(p),
                ..
            } => (Some(p.ip), None),
            Refusal::AddressDenied { ip, rule, .. } => (Some(*ip), Some(rule.clone())),
            _ => (None, None),
        };
        let tls_server_name = match &refusal {
            Refusal::Tunnel { refusal, .. } => refusal.seen().map(str::to_owned),
            _ => None,
        };
        let e = Event::Decision(Decision {
            dest: dest.map(|(t, a)| dest_of(t, a)),
            verdict: Verdict::Deny,
            reason_code: classified.reason_code.clone(),
            resolved_ip,
            rule,
            status: Some(classified.status),
            tls_server_name,
            party: pending.party.clone(),
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
            id: pending.party.request_id,
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
        let decision = self
            .rules()
            .decide(target, access, &context(&pending.party.identity));
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
            });
        }
        if decision.verdict == Verdict::Deny {
            let refusal = Refusal::Policy {
                target: target.clone(),
                reason: decision.reason,
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
        })
    }

    /// Records the close of a granted request.
    pub async fn close(&self, grant: Grant, end: End) {
        let e = Event::Close(Close {
            dest: dest_of(&grant.target, grant.access),
            resolved_ip: grant.resolved,
            status: end.status,
            bytes_sent: end.sent,
            bytes_received: end.received,
            duration_ms: grant.started.elapsed().as_millis() as u64,
            outcome: end.outcome,
            party: grant.party,
        });
        self.audit.record(e).await;
    }

    /// Records a granted request that failed upstream before a response (DNS, connect, a
    /// broken or missing response head): a close whose outcome is the refusal's reason.
    pub async fn fail(&self, grant: Grant, refusal: Refusal, sent: u64, received: u64) -> Refused {
        let classified = refusal.classify(grant.party.method.as_deref().unwrap_or("-"));
        let id = grant.party.request_id.clone();
        let end = End {
            sent,
            received,
            status: Some(classified.status),
            // Only upstream failures reach here; anything else is recorded as the client's.
            outcome: classified.outcome.unwrap_or(Outcome::ClientFailure),
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
    async fn allow(
        &self,
        d: Decided,
        resolved: Option<IpAddr>,
        tls_server_name: Option<String>,
        stop: Option<(CancellationToken, Option<CutGuard>)>,
    ) -> Grant {
        let (reason_code, detail) = match d.would_deny {
            None => ("allowlisted", None),
            Some(reason) => ("report_only", Some(format!("would deny: {}", reason.code()))),
        };
        let e = Event::Decision(Decision {
            party: d.pending.party.clone(),
            dest: Some(dest_of(&d.target, d.access)),
            verdict: Verdict::Allow,
            reason_code: reason_code.into(),
            resolved_ip: resolved,
            rule: d.rule.clone(),
            status: None,
            tls_server_name,
            detail,
        });
        self.audit.record(e).await;
        let (stop, cut) = stop.unwrap_or_else(|| self.stop_for(d.rule.as_ref(), d.expires));
        Grant {
            party: d.pending.party,
            stop,
            cuttable: cut.is_some(),
            _cut: cut,
            expires: d.expires,
            target: d.target,
            access: d.access,
            resolved,
            started: d.pending.started,
        }
    }
}

impl Grant {
    /// Cancelled when in-flight work under this grant must end (shutdown, revocation,
    /// expiry).
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// Whether a revocation or an expiry can end this grant early (also once its
    /// registration was handed on by [`Grant::keep_cut`]).
    pub fn cuttable(&self) -> bool {
        self.cuttable
    }

    /// Hands the registration to whatever outlives this grant (a kept-alive client
    /// connection): the token it cancels and the guard that keeps it registered.
    pub fn keep_cut(&mut self) -> Option<(CancellationToken, CutGuard)> {
        let guard = self._cut.take()?;
        Some((self.stop.clone(), guard))
    }
}

fn dest_of(target: &Target, access: Access) -> Dest {
    Dest {
        scheme: access.scheme(),
        host: target.host.to_string(),
        port: target.port,
    }
}

/// Request ids: a per-process prefix and a counter, unique within a run and unlikely to
/// repeat across restarts.
#[derive(Debug)]
struct RequestIds {
    prefix: u32,
    next: AtomicU64,
}

impl RequestIds {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        RequestIds {
            prefix: nanos ^ std::process::id().rotate_left(16),
            next: AtomicU64::new(1),
        }
    }

    fn next(&self) -> String {
        format!(
            "{:08x}{:08x}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}
