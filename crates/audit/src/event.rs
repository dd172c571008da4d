//! The audit events as the proxy records them, one type per kind.
//!
//! The types hold only what their kind records: a [`Decision`] has a verdict and a reason, a
//! [`Close`] has byte counts, a duration and an [`Outcome`], a [`Reload`] has a generation.
//! Their written form is [`crate::Line`]; what a reader gets back is [`crate::record`].
//! Nothing here writes, reads or counts.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use sandgate_policy::{Exception, Identity, PolicyReason, Verdict};
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
    /// A plain-HTTP request's path, without its query string, as the client wrote it.
    pub path: Option<Arc<str>>,
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
    /// A request let through in report-only mode (`reason_code: report_only`): why the
    /// policy would have denied it. `None` for every other decision.
    pub would_deny: Option<PolicyReason>,
    /// Words for a person: what the policy would have said of a report-only pass (`would
    /// deny: not_allowlisted`, the same as `would_deny`), why a node was refused. Code reads
    /// the typed fields, not these words.
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
            created_at: crate::stamp::now(),
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
    /// Cut because the request's body carried the placeholder of a credential bound to
    /// another host (one that asks for `inspect_body`); the rest of the body never went on.
    CredentialLeak,
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
    /// An intercepted request's upstream failed TLS: a certificate the system's roots do not
    /// verify, or no handshake.
    Tls,
}

impl UpstreamFailure {
    /// Every failure, for reading `outcome` back ([`Outcome::parse`]).
    pub const ALL: [UpstreamFailure; 14] = [
        UpstreamFailure::Tls,
        UpstreamFailure::Dns,
        UpstreamFailure::DnsTimeout,
        UpstreamFailure::ConnectionRefused,
        UpstreamFailure::ConnectionTimeout,
        UpstreamFailure::Connect,
        UpstreamFailure::ResponseTimeout,
        UpstreamFailure::Closed,
        UpstreamFailure::MalformedResponse,
        UpstreamFailure::ResponseHeadTooLarge,
        UpstreamFailure::ResponseBody,
        UpstreamFailure::IdleTimeout,
        UpstreamFailure::UpstreamDenied,
        UpstreamFailure::UpstreamProxy,
    ];

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
            UpstreamFailure::Tls => "tls",
        }
    }
}

impl Outcome {
    /// Every outcome that is not an upstream failure.
    const PLAIN: [Outcome; 12] = [
        Outcome::Ok,
        Outcome::ClientReset,
        Outcome::UpstreamReset,
        Outcome::ClientFailure,
        Outcome::IdleTimeout,
        Outcome::Shutdown,
        Outcome::Revoked,
        Outcome::Expired,
        Outcome::OutOfDescriptors,
        Outcome::RetryRefused,
        Outcome::LateHelloRefused,
        Outcome::CredentialLeak,
    ];

    /// Every outcome (a new variant must be listed here, or it cannot be read back; a test
    /// with an exhaustive match says so).
    pub fn all() -> impl Iterator<Item = Outcome> {
        Outcome::PLAIN
            .into_iter()
            .chain(UpstreamFailure::ALL.into_iter().map(Outcome::Upstream))
    }

    /// The outcome [`Outcome::as_str`] writes as `text`; `None` for a value no writer writes.
    pub fn parse(text: &str) -> Option<Outcome> {
        Outcome::all().find(|o| o.as_str() == text)
    }

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
            Outcome::CredentialLeak => "credential_leak",
            Outcome::Upstream(f) => match f {
                UpstreamFailure::Dns => "upstream_failure:dns",
                UpstreamFailure::DnsTimeout => "upstream_failure:dns_timeout",
                UpstreamFailure::ConnectionRefused => "upstream_failure:connection_refused",
                UpstreamFailure::ConnectionTimeout => "upstream_failure:connection_timeout",
                UpstreamFailure::Connect => "upstream_failure:connect",
                UpstreamFailure::ResponseTimeout => "upstream_failure:response_timeout",
                UpstreamFailure::Closed => "upstream_failure:closed",
                UpstreamFailure::Tls => "upstream_failure:tls",
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

/// The kind of a line (its `event` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

impl EventKind {
    pub const ALL: [EventKind; 10] = [
        EventKind::Decision,
        EventKind::Close,
        EventKind::PolicyReload,
        EventKind::Aggregate,
        EventKind::ExceptionRequested,
        EventKind::ExceptionApproved,
        EventKind::ExceptionDenied,
        EventKind::ExceptionRevoked,
        EventKind::ExceptionExpired,
        EventKind::AdminRefused,
    ];

    /// The `event` value.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Decision => "decision",
            EventKind::Close => "close",
            EventKind::PolicyReload => "policy_reload",
            EventKind::Aggregate => "aggregate",
            EventKind::ExceptionRequested => "exception_requested",
            EventKind::ExceptionApproved => "exception_approved",
            EventKind::ExceptionDenied => "exception_denied",
            EventKind::ExceptionRevoked => "exception_revoked",
            EventKind::ExceptionExpired => "exception_expired",
            EventKind::AdminRefused => "admin_refused",
        }
    }

    /// The kind written as `text`; `None` for a value no writer writes.
    pub fn parse(text: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// The change an exception kind records.
    pub fn change(self) -> Option<Change> {
        match self {
            EventKind::ExceptionRequested => Some(Change::Requested),
            EventKind::ExceptionApproved => Some(Change::Approved),
            EventKind::ExceptionDenied => Some(Change::Denied),
            EventKind::ExceptionRevoked => Some(Change::Revoked),
            EventKind::ExceptionExpired => Some(Change::Expired),
            _ => None,
        }
    }
}

impl Change {
    /// The kind of line that records this change.
    pub fn kind(self) -> EventKind {
        match self {
            Change::Requested => EventKind::ExceptionRequested,
            Change::Approved => EventKind::ExceptionApproved,
            Change::Denied => EventKind::ExceptionDenied,
            Change::Revoked => EventKind::ExceptionRevoked,
            Change::Expired => EventKind::ExceptionExpired,
        }
    }
}

impl Serialize for EventKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}
