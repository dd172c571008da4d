//! The audit events, one type per kind, and the one flat JSON line every kind is written as.
//!
//! The types hold only what their kind records: a [`Decision`] has a verdict and a reason, a
//! [`Close`] has byte counts, a duration and an [`Outcome`], a [`Reload`] has a generation.
//! [`Line`] is the serialised form (`docs/audit.md`): every line carries every field, absent
//! ones as `null`, so readers and CSV exports see one schema. Nothing here writes or counts.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use sandgate_policy::{Exception, Identity, Verdict};
use serde::{Serialize, Serializer};

/// Version of the line schema; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// Who made a request: common to decision and close events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Party {
    pub request_id: String,
    pub client_addr: SocketAddr,
    /// Shared with the connection: cloning a party copies no string.
    pub identity: Arc<Identity>,
    /// `None` when no request line was read.
    pub method: Option<Cow<'static, str>>,
    /// On a central proxy: the node-local proxy that forwarded the request (its name in
    /// `spec.nodes`), which vouched for the identity.
    pub node: Option<Arc<str>>,
}

/// Where a request asked to go.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dest {
    /// `http` or `connect`.
    pub scheme: &'static str,
    pub host: String,
    pub port: u16,
}

/// A request was decided (exactly one per request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub party: Party,
    /// `None` when the request named no valid destination.
    pub dest: Option<Dest>,
    pub verdict: Verdict,
    pub reason_code: Cow<'static, str>,
    pub resolved_ip: Option<IpAddr>,
    pub rule: Option<Arc<str>>,
    /// The status the client was answered with, for a deny.
    pub status: Option<u16>,
    /// The server name a tunnel's TLS ClientHello carried, when it was read.
    pub tls_server_name: Option<String>,
    /// What the policy would have said of a request let through in report-only mode
    /// (`would deny: not_allowlisted`).
    pub detail: Option<String>,
}

/// An allowed request or tunnel ended (exactly one per allowed request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    pub party: Party,
    pub dest: Dest,
    pub resolved_ip: Option<IpAddr>,
    pub status: Option<u16>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub duration_ms: u64,
    pub outcome: Outcome,
}

/// A policy file was reloaded, or a reload was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reload {
    /// The generation in force after this event: the new one when applied, the one that
    /// stays when rejected (a rejected file never gets a generation of its own).
    pub generation: u64,
    pub applied: bool,
    /// For a rejection: how many reloads have been rejected since `generation` came into
    /// force (1, 2, ...), so each rejection's request id is its own.
    pub rejection: u64,
    pub detail: String,
}

/// Allowed traffic to one destination over one window (when aggregation is on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate {
    pub id: u64,
    pub dest: Option<Dest>,
    pub task_id: Option<String>,
    pub project_id: Option<String>,
    pub count: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub window_start: String,
}

/// A step in a temporary exception's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Requested,
    Approved,
    Denied,
    Revoked,
    Expired,
}

/// An exception changed state; `exception` is how it stands after the change, `by` who
/// made the change (the requester, the decider; `None` for expiry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionChange {
    pub change: Change,
    pub exception: Exception,
    pub by: Option<String>,
}

/// A call to the admin API that was refused (no token, a wrong token, the wrong role).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminRefusal {
    /// The token's name, when the token was valid.
    pub who: Option<String>,
    /// `METHOD /path`.
    pub action: String,
    pub status: u16,
    pub reason: String,
    pub client_addr: Option<SocketAddr>,
}

/// Any audit event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Decision(Decision),
    Close(Close),
    PolicyReload(Reload),
    Aggregate(Aggregate),
    Exception(Box<ExceptionChange>),
    AdminRefused(AdminRefusal),
}

/// An event with the time it was made.
#[derive(Debug, Clone)]
pub struct Stamped {
    pub event: Event,
    pub created_at: String,
    /// For the audit lag metric; not written.
    pub made_at: Instant,
}

impl Event {
    /// Stamps the event with the time now.
    pub fn stamp(self) -> Stamped {
        Stamped {
            event: self,
            created_at: jiff::Timestamp::now().to_string(),
            made_at: Instant::now(),
        }
    }

    pub fn request_id(&self) -> Cow<'_, str> {
        match self {
            Event::Decision(d) => Cow::Borrowed(&d.party.request_id),
            Event::Close(c) => Cow::Borrowed(&c.party.request_id),
            Event::PolicyReload(r) if r.applied => Cow::Owned(format!("reload-{}", r.generation)),
            Event::PolicyReload(r) => Cow::Owned(format!("reload-{}-rejected-{}", r.generation, r.rejection)),
            Event::Aggregate(a) => Cow::Owned(format!("aggregate-{}", a.id)),
            Event::Exception(x) => Cow::Borrowed(&x.exception.id),
            Event::AdminRefused(_) => Cow::Borrowed("-"),
        }
    }
}

/// How an allowed request or tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Completed normally.
    Ok,
    /// A tunnel side failed; only that tunnel ended.
    ClientReset,
    UpstreamReset,
    /// The client went away or sent a broken body mid-exchange.
    ClientFailure,
    /// The tunnel moved no byte for the idle timeout.
    IdleTimeout,
    /// Cut at the end of the shutdown grace period.
    Shutdown,
    /// Cut because the exception that allowed it was revoked.
    Revoked,
    /// Cut at the second the entry that allowed it expired (a policy file's `expires_at` or
    /// `ttl_seconds`, an exception's expiry).
    Expired,
    /// No pipe could be made for the tunnel.
    OutOfDescriptors,
    /// Cut because the second ClientHello (after a HelloRetryRequest) broke the tunnel
    /// rules the first one passed.
    RetryRefused,
    /// Cut because a tunnel relayed after a silent start then began with a ClientHello
    /// that broke the tunnel rules.
    LateHelloRefused,
    /// The upstream side failed (DNS, connect, response).
    Upstream(UpstreamFailure),
}

/// What failed upstream of an allowed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpstreamFailure {
    Dns,
    DnsTimeout,
    ConnectionRefused,
    ConnectionTimeout,
    Connect,
    ResponseTimeout,
    Closed,
    MalformedResponse,
    ResponseHeadTooLarge,
    ResponseBody,
    IdleTimeout,
    /// The upstream proxy refused the tunnel (403).
    UpstreamDenied,
    /// The upstream proxy gave no usable answer.
    UpstreamProxy,
}

impl UpstreamFailure {
    /// The kind, as in `sandgate_upstream_errors_total{kind}`.
    pub fn kind(self) -> &'static str {
        match self {
            UpstreamFailure::Dns => "dns",
            UpstreamFailure::DnsTimeout => "dns_timeout",
            UpstreamFailure::ConnectionRefused => "connection_refused",
            UpstreamFailure::ConnectionTimeout => "connection_timeout",
            UpstreamFailure::Connect => "connect",
            UpstreamFailure::ResponseTimeout => "response_timeout",
            UpstreamFailure::Closed => "closed",
            UpstreamFailure::MalformedResponse => "malformed_response",
            UpstreamFailure::ResponseHeadTooLarge => "response_head_too_large",
            UpstreamFailure::ResponseBody => "response_body",
            UpstreamFailure::IdleTimeout => "idle_timeout",
            UpstreamFailure::UpstreamDenied => "upstream_denied",
            UpstreamFailure::UpstreamProxy => "upstream_proxy",
        }
    }
}

impl Outcome {
    /// The `outcome` value in the audit log (`upstream_failure:dns` and so on).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientReset => "client_reset",
            Outcome::UpstreamReset => "upstream_reset",
            Outcome::ClientFailure => "client_failure",
            Outcome::IdleTimeout => "idle_timeout",
            Outcome::Shutdown => "shutdown",
            Outcome::Revoked => "revoked",
            Outcome::Expired => "expired",
            Outcome::OutOfDescriptors => "proxy_out_of_descriptors",
            Outcome::RetryRefused => "retry_refused",
            Outcome::LateHelloRefused => "late_hello_refused",
            Outcome::Upstream(f) => match f {
                UpstreamFailure::Dns => "upstream_failure:dns",
                UpstreamFailure::DnsTimeout => "upstream_failure:dns_timeout",
                UpstreamFailure::ConnectionRefused => "upstream_failure:connection_refused",
                UpstreamFailure::ConnectionTimeout => "upstream_failure:connection_timeout",
                UpstreamFailure::Connect => "upstream_failure:connect",
                UpstreamFailure::ResponseTimeout => "upstream_failure:response_timeout",
                UpstreamFailure::Closed => "upstream_failure:closed",
                UpstreamFailure::MalformedResponse => "upstream_failure:malformed_response",
                UpstreamFailure::ResponseHeadTooLarge => "upstream_failure:response_head_too_large",
                UpstreamFailure::ResponseBody => "upstream_failure:response_body",
                UpstreamFailure::IdleTimeout => "upstream_failure:idle_timeout",
                UpstreamFailure::UpstreamDenied => "upstream_failure:upstream_denied",
                UpstreamFailure::UpstreamProxy => "upstream_failure:upstream_proxy",
            },
        }
    }
}

impl Serialize for Outcome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The kind of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Decision,
    Close,
    PolicyReload,
    Aggregate,
    ExceptionRequested,
    ExceptionApproved,
    ExceptionDenied,
    ExceptionRevoked,
    ExceptionExpired,
    AdminRefused,
}

/// One written line: every field of every kind, absent ones `null` (the schema readers and
/// exports rely on; field order as in `docs/audit.md`).
#[derive(Debug, Serialize)]
pub struct Line<'a> {
    pub schema_version: u32,
    pub event: EventKind,
    pub created_at: &'a str,
    pub request_id: Cow<'a, str>,
    pub client_addr: Option<SocketAddr>,
    pub task_id: Option<&'a str>,
    pub project_id: Option<&'a str>,
    pub job_id: Option<&'a str>,
    pub decision: Option<Verdict>,
    pub reason_code: Option<&'a str>,
    pub scheme: Option<&'static str>,
    pub method: Option<&'a str>,
    pub destination_host: Option<&'a str>,
    pub destination_port: Option<u16>,
    pub resolved_ip: Option<IpAddr>,
    pub rule: Option<&'a str>,
    pub status: Option<u16>,
    pub bytes_sent: Option<u64>,
    pub bytes_received: Option<u64>,
    pub duration_ms: Option<u64>,
    pub outcome: Option<&'a str>,
    pub detail: Option<&'a str>,
    pub count: Option<u64>,
    pub window_start: Option<&'a str>,
    /// Exception events: the exception and its terms.
    pub exception_id: Option<&'a str>,
    pub hosts: Option<&'a [String]>,
    pub ports: Option<&'a [u16]>,
    pub ttl_seconds: Option<u32>,
    pub reason: Option<&'a str>,
    pub requested_by: Option<&'a str>,
    pub decided_by: Option<&'a str>,
    pub expires_at: Option<String>,
    /// Who acted: the requester or decider of an exception change; on traffic, who started
    /// what made the request (a listener's or a sandboxed run's `subject`), as stated.
    pub subject: Option<&'a str>,
    /// Decisions on tunnels: the server name of the TLS ClientHello, when it was read.
    pub tls_server_name: Option<&'a str>,
    /// On a central proxy: the node-local proxy that forwarded the request.
    pub node: Option<&'a str>,
}

impl<'a> Line<'a> {
    /// The line for `s`.
    pub fn of(s: &'a Stamped) -> Line<'a> {
        let mut line = Line {
            schema_version: SCHEMA_VERSION,
            event: EventKind::Decision,
            created_at: &s.created_at,
            request_id: s.event.request_id(),
            client_addr: None,
            task_id: None,
            project_id: None,
            job_id: None,
            decision: None,
            reason_code: None,
            scheme: None,
            method: None,
            destination_host: None,
            destination_port: None,
            resolved_ip: None,
            rule: None,
            status: None,
            bytes_sent: None,
            bytes_received: None,
            duration_ms: None,
            outcome: None,
            detail: None,
            count: None,
            window_start: None,
            exception_id: None,
            hosts: None,
            ports: None,
            ttl_seconds: None,
            reason: None,
            requested_by: None,
            decided_by: None,
            expires_at: None,
            subject: None,
            tls_server_name: None,
            node: None,
        };
        match &s.event {
            Event::Decision(d) => {
                line.party(&d.party);
                line.dest(d.dest.as_ref());
                line.decision = Some(d.verdict);
                line.reason_code = Some(&d.reason_code);
                line.resolved_ip = d.resolved_ip;
                line.rule = d.rule.as_deref();
                line.status = d.status;
                line.tls_server_name = d.tls_server_name.as_deref();
                line.detail = d.detail.as_deref();
            }
            Event::Close(c) => {
                line.event = EventKind::Close;
                line.party(&c.party);
                line.dest(Some(&c.dest));
                line.resolved_ip = c.resolved_ip;
                line.status = c.status;
                line.bytes_sent = Some(c.bytes_sent);
                line.bytes_received = Some(c.bytes_received);
                line.duration_ms = Some(c.duration_ms);
                line.outcome = Some(c.outcome.as_str());
                // A failed upstream's close says why in reason_code too.
                if let Outcome::Upstream(_) = c.outcome {
                    line.reason_code = Some(c.outcome.as_str());
                }
            }
            Event::PolicyReload(r) => {
                line.event = EventKind::PolicyReload;
                line.outcome = Some(if r.applied { "applied" } else { "rejected" });
                line.detail = Some(&r.detail);
            }
            Event::Aggregate(a) => {
                line.event = EventKind::Aggregate;
                line.dest(a.dest.as_ref());
                line.task_id = a.task_id.as_deref();
                line.project_id = a.project_id.as_deref();
                line.decision = Some(Verdict::Allow);
                line.count = Some(a.count);
                line.bytes_sent = Some(a.bytes_sent);
                line.bytes_received = Some(a.bytes_received);
                line.window_start = Some(&a.window_start);
            }
            Event::Exception(x) => line.exception(x),
            Event::AdminRefused(r) => {
                line.event = EventKind::AdminRefused;
                line.client_addr = r.client_addr;
                line.subject = r.who.as_deref();
                line.method = Some(&r.action);
                line.status = Some(r.status);
                line.detail = Some(&r.reason);
            }
        }
        line
    }

    fn exception(&mut self, x: &'a ExceptionChange) {
        let e = &x.exception;
        self.event = match x.change {
            Change::Requested => EventKind::ExceptionRequested,
            Change::Approved => EventKind::ExceptionApproved,
            Change::Denied => EventKind::ExceptionDenied,
            Change::Revoked => EventKind::ExceptionRevoked,
            Change::Expired => EventKind::ExceptionExpired,
        };
        self.task_id = Some(&e.task_id);
        self.project_id = e.project_id.as_deref();
        self.exception_id = Some(&e.id);
        self.hosts = Some(&e.hosts);
        self.ports = Some(&e.ports);
        self.ttl_seconds = Some(e.ttl_seconds);
        self.reason = Some(&e.reason);
        self.requested_by = Some(&e.requested_by);
        self.decided_by = e.decided_by.as_deref();
        self.expires_at = e
            .expires_at
            .and_then(|at| jiff::Timestamp::from_second(at).ok())
            .map(|t| t.to_string());
        self.detail = e.note.as_deref();
        self.subject = x.by.as_deref();
    }

    fn party(&mut self, p: &'a Party) {
        self.client_addr = Some(p.client_addr);
        self.task_id = p.identity.task.as_deref();
        self.project_id = p.identity.project.as_deref();
        self.job_id = p.identity.job.as_deref();
        self.subject = p.identity.subject.as_deref();
        self.method = p.method.as_deref();
        self.node = p.node.as_deref();
    }

    fn dest(&mut self, d: Option<&'a Dest>) {
        if let Some(d) = d {
            self.scheme = Some(d.scheme);
            self.destination_host = Some(&d.host);
            self.destination_port = Some(d.port);
        }
    }
}
