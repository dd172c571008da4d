//! Why a request is not served, classified in one place for every front end.
//!
//! A [`Refusal`] says what went wrong and whose fault it is (the client's request, the
//! policy, the address guard, the proxy, or the upstream); [`Refusal::classify`] is the
//! single exhaustive `match` that turns it into a [`Classified`]: an HTTP status (the
//! canonical severity every front end maps from), an RFC 9209 `Proxy-Status` error type, a
//! `reason_code` for the audit log, whether it is a denial, and one line of text naming the
//! destination. Front ends render it in their own terms (`http1::render` writes HTTP/1
//! bytes); the egress core records it. Nothing here writes to a socket. [`refused_upstream`]
//! tells an upstream proxy's refusal of a plain request from an origin's answer, which the
//! front end relays as it came.

use std::borrow::Cow;

use sandgate_policy::{PolicyReason, Target, TargetError};

use crate::audit::event::{Outcome, UpstreamFailure};
use crate::config::Remedies;
use crate::dial::DialError;
use crate::h1::head::HeadError;

mod hints;

/// Failures reading the response on an outbound connection.
#[derive(Debug, thiserror::Error)]
pub enum ResponseError {
    #[error("no response before the timeout")]
    Timeout,
    #[error("upstream closed the connection before responding")]
    Closed,
    #[error("malformed response: {0}")]
    Malformed(HeadError),
    #[error("response head too large")]
    HeadTooLarge,
    #[error("upstream I/O error: {0}")]
    Io(std::io::Error),
    /// An intercepted request's upstream failed TLS (its certificate did not verify).
    #[error("upstream TLS failed: {0}")]
    Tls(String),
}

/// Why the proxy answers a request itself instead of relaying it.
#[derive(Debug)]
pub enum Refusal {
    /// The request head broke HTTP/1.1 syntax or framing rules.
    Head(HeadError),
    /// The request head exceeded the size limit.
    HeadTooLarge,
    /// The request head did not arrive in time.
    HeadTimeout,
    /// The request-target is not something a forward proxy accepts.
    Target(TargetError),
    /// The listener requires task credentials and they were missing or wrong.
    ProxyAuth(sandgate_policy::AuthError),
    /// The policy denied the destination (or, for plain HTTP, the method or path), by
    /// `rule` when one decided: a deny entry, or the allow entry that names the host but
    /// not this request.
    Policy {
        target: Target,
        reason: PolicyReason,
        rule: Option<std::sync::Arc<str>>,
    },
    /// The name resolved to an address that a deny entry names.
    AddressDenied {
        target: Target,
        ip: std::net::IpAddr,
        rule: std::sync::Arc<str>,
    },
    /// Vetting or connecting failed (address guard refusals included).
    Dial { target: Target, error: DialError },
    /// The response (from the origin, or the upstream proxy when chained) failed after the
    /// outbound connection was made.
    Response { target: Target, error: ResponseError },
    /// The audit log cannot be written (its cause), so nothing new may pass (fail closed).
    AuditUnavailable(String),
    /// A credential's placeholder where it does not belong (another host, another header,
    /// the path or query, plain HTTP): an attempted leak.
    CredentialLeak(sandgate_policy::Leak),
    /// A connection limit is full: the listener's, the client address's, or the proxy's.
    ConnectionLimit(LimitKind),
    /// The tunnel's first bytes broke `spec.network.tunnels` (a TLS server name that is not
    /// the requested host, no TLS where TLS is required).
    Tunnel {
        target: Target,
        refusal: sandgate_policy::TunnelRefusal,
    },
    /// A node-local proxy (on a `role: node` listener) was refused: its certificate, its
    /// name, or what it claimed about a stream.
    Node(NodeRefusal),
}

/// Why a central proxy refused a node or one of its streams.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeRefusal {
    /// The TLS handshake failed: no client certificate, one from another CA, an expired
    /// one, or no HTTP/2.
    #[error("node TLS handshake failed: {0}")]
    Handshake(String),
    /// The certificate is valid but its first name is no node of `spec.nodes`.
    #[error("the certificate's first name is no listed node (its names: {0})")]
    Unknown(String),
    #[error("bad attribution: {0}")]
    Attribution(#[from] crate::transport::attribution::AttributionError),
    #[error(transparent)]
    NotVouched(#[from] sandgate_policy::VouchError),
    /// A stream that is not a CONNECT.
    #[error("a node stream must be a CONNECT, not {0}")]
    NotConnect(String),
    /// A request a node's stream of plain HTTP requests may not carry: a CONNECT, or one
    /// for another destination than the stream's.
    #[error("a node's request stream carries plain HTTP for its own destination only, not {0}")]
    StreamRequest(String),
}

impl NodeRefusal {
    fn code(&self) -> &'static str {
        match self {
            NodeRefusal::Handshake(_) => "node_tls_refused",
            NodeRefusal::Unknown(_) => "node_unknown",
            NodeRefusal::Attribution(_) => "node_attribution_invalid",
            NodeRefusal::NotVouched(_) => "node_not_vouched",
            NodeRefusal::NotConnect(_) => "node_stream_not_connect",
            NodeRefusal::StreamRequest(_) => "node_stream_request_invalid",
        }
    }
}

/// Which connection limit was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    Proxy,
    Listener,
    Client,
    /// An intercepted tunnel's upstream connections: each of its requests in flight has one,
    /// at most eight at once (`http1/intercept/`).
    Tunnel,
}

impl LimitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Proxy => "proxy",
            LimitKind::Listener => "listener",
            LimitKind::Client => "client",
            LimitKind::Tunnel => "tunnel",
        }
    }
}

/// A deny's reason code, or what failed upstream of an allowed request.
enum Code {
    Reason(Cow<'static, str>),
    Failed(UpstreamFailure),
}

impl Classified {
    /// The SOCKS5 reply code (RFC 1928 section 6) for this refusal: the same failure kinds
    /// as the HTTP statuses, mapped here in the one place refusals are classified.
    pub fn socks5_reply(&self) -> u8 {
        match self.error_type {
            // Not allowed by the ruleset: policy, guard, loop, credentials.
            "http_request_denied" | "destination_ip_prohibited" => 0x02,
            "dns_error" | "dns_timeout" | "connection_timeout" => 0x04,
            "connection_refused" => 0x05,
            // Bad input, limits, a broken audit trail, upstream trouble: general failure.
            _ => 0x01,
        }
    }
}

/// A refusal as every front end sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified {
    pub status: u16,
    /// RFC 9209 error type for `Proxy-Status`.
    pub error_type: &'static str,
    pub reason_code: Cow<'static, str>,
    /// Whether the audit records this as a deny (client or policy) rather than an allowed
    /// request that failed upstream.
    pub is_denial: bool,
    /// For an allowed request that failed upstream: the close event's outcome.
    pub outcome: Option<Outcome>,
    /// One line naming the destination, for the client.
    pub text: String,
    /// The same, shorter, for a status line's reason phrase (`example.org:443 not in
    /// allowlist`): where clients such as pip print it. Renderers bound and sanitise it.
    pub phrase: String,
    /// What to do next, one line each (empty: nothing beyond the text).
    pub hints: Vec<String>,
    /// An upstream proxy's own answer when it refused the request in its own name (403,
    /// 407, 503): what the close records as its status, whatever the client was answered.
    pub upstream_status: Option<u16>,
    /// The audit log the request is recorded in, when the configuration names it
    /// ([`Remedies::audit_log`]): said beside the request id.
    pub audit_log: Option<std::path::PathBuf>,
}

/// The statuses an upstream proxy refuses a request with in its own name: 403 (its policy),
/// 407 (it wants credentials this proxy does not send), 503 (it cannot take the request
/// now: its connection limits, its audit log). Each is recorded as the allowed request's
/// close with `upstream_failure:upstream_denied`: allowed here, refused further up.
const UPSTREAM_REFUSALS: [u16; 3] = [403, 407, 503];

/// Whether a response the upstream proxy sent back for a plain request is that proxy's own
/// refusal rather than the origin's answer: a 407, which only a proxy sends (RFC 9110
/// section 15.5.8), or a 403 or 503 whose `Proxy-Status` (RFC 9209 section 2.1.1: the
/// proxy that generated an error names it in an `error` parameter) names an error of a
/// proxy refusing: its policy (`http_request_denied`, `destination_ip_prohibited`), its
/// connection limits (`connection_limit_reached`) or its audit log (`proxy_internal_error`),
/// as sandgate's own refusals do. `proxy_status`: the values of every `Proxy-Status` field.
pub(crate) fn refused_upstream<'a>(status: u16, proxy_status: impl IntoIterator<Item = &'a [u8]>) -> bool {
    const REFUSING: [&str; 4] = [
        "error=http_request_denied",
        "error=destination_ip_prohibited",
        "error=connection_limit_reached",
        "error=proxy_internal_error",
    ];
    match status {
        407 => true,
        403 | 503 => proxy_status.into_iter().any(|value| {
            let value = String::from_utf8_lossy(value);
            REFUSING.iter().any(|error| value.contains(error))
        }),
        _ => false,
    }
}

impl Refusal {
    /// Classifies the refusal. `method` names the request kind in the text ("CONNECT", "GET");
    /// `remedies` words the hints in the terms of whoever configured the proxy.
    pub fn classify(&self, method: &str, remedies: &Remedies) -> Classified {
        use DialError as D;
        use ResponseError as U;
        use UpstreamFailure as F;
        // (status, Proxy-Status error type, the reason (a deny) or the failure, the text)
        let (status, error_type, code, text): (u16, &str, Code, Text<'_>) = match self {
            Refusal::Head(e) => (
                400,
                "http_request_error",
                Code::Reason(e.code().into()),
                Text::Plain(format!("bad request: {e}")),
            ),
            Refusal::HeadTooLarge => (
                431,
                "http_request_error",
                Code::Reason("head_too_large".into()),
                Text::Plain("request head too large".into()),
            ),
            Refusal::HeadTimeout => (
                408,
                "http_request_error",
                Code::Reason("head_timeout".into()),
                Text::Plain("request head timed out".into()),
            ),
            Refusal::ProxyAuth(e) => (
                407,
                "http_request_denied",
                Code::Reason(e.code().into()),
                Text::Plain(format!("proxy authentication required: {e}")),
            ),
            Refusal::Target(e) => (
                400,
                "http_request_error",
                Code::Reason(e.code().into()),
                Text::Plain(format!("bad request: {e}")),
            ),
            Refusal::CredentialLeak(leak) => (
                403,
                "http_request_denied",
                Code::Reason("credential_leak".into()),
                Text::Plain(format!("refused: {leak}")),
            ),
            Refusal::Policy { target, reason, .. } => (
                403,
                "http_request_denied",
                Code::Reason(reason.code().into()),
                Text::Denied(target, reason.describe().into()),
            ),
            Refusal::AddressDenied { target, ip, .. } => (
                403,
                "http_request_denied",
                Code::Reason(PolicyReason::Denylisted.code().into()),
                Text::Denied(
                    target,
                    format!("resolves to {ip}, which a deny rule names").into(),
                ),
            ),
            Refusal::Dial { target, error } => match error {
                D::Prohibited(p) => (
                    403,
                    "destination_ip_prohibited",
                    Code::Reason("destination_ip_prohibited".into()),
                    Text::Denied(
                        target,
                        format!("resolves to a {} address", p.class.as_str()).into(),
                    ),
                ),
                D::SelfConnect(_) => (
                    403,
                    "destination_ip_prohibited",
                    Code::Reason("proxy_loop".into()),
                    Text::Denied(target, "is this proxy".into()),
                ),
                D::Dns(_) => (
                    502,
                    "dns_error",
                    Code::Failed(F::Dns),
                    Text::Plain(format!("cannot resolve {target}")),
                ),
                D::DnsTimeout => (
                    504,
                    "dns_timeout",
                    Code::Failed(F::DnsTimeout),
                    Text::Plain(format!("DNS timeout for {target}")),
                ),
                D::Refused => (
                    502,
                    "connection_refused",
                    Code::Failed(F::ConnectionRefused),
                    Text::Plain(format!("connection to {target} refused")),
                ),
                D::ConnectTimeout => (
                    504,
                    "connection_timeout",
                    Code::Failed(F::ConnectionTimeout),
                    Text::Plain(format!("connection to {target} timed out")),
                ),
                // Allowed here and refused further up: an allow followed by a close, so each
                // request still has exactly one decision event; the close names the
                // upstream's status (`upstream_status`).
                D::UpstreamRefused(403) => (
                    403,
                    "http_request_denied",
                    Code::Failed(F::UpstreamDenied),
                    Text::Denied(target, "refused by the upstream proxy".into()),
                ),
                // Its credentials are the upstream's business: a 407 passed on would ask the
                // client for credentials of this proxy, which has none to check.
                D::UpstreamRefused(407) => (
                    403,
                    "http_request_denied",
                    Code::Failed(F::UpstreamDenied),
                    Text::Denied(
                        target,
                        "refused by the upstream proxy (it asks for credentials, 407)".into(),
                    ),
                ),
                D::CentralUnavailable(hop) => (
                    502,
                    "destination_unavailable",
                    Code::Failed(F::UpstreamProxy),
                    Text::Plain(format!(
                        "no central proxy is reachable for {target} (next hop {hop})"
                    )),
                ),
                // Unable for now (a central at its connection limits, or whose audit log
                // cannot be written): passed on as such (RFC 9110 section 15.6.4), so the
                // client sees a temporary refusal, not a broken hop.
                D::UpstreamRefused(503) => (
                    503,
                    "destination_unavailable",
                    Code::Failed(F::UpstreamDenied),
                    Text::Plain(format!(
                        "the upstream proxy cannot take {target} now (it answered 503); retry later"
                    )),
                ),
                D::UpstreamRefused(_) | D::UpstreamBroken => (
                    502,
                    "destination_unavailable",
                    Code::Failed(F::UpstreamProxy),
                    Text::Plain(format!("the upstream proxy could not reach {target}")),
                ),
                D::Connect(_) => (
                    502,
                    "destination_unavailable",
                    Code::Failed(F::Connect),
                    Text::Plain(format!("cannot connect to {target}")),
                ),
            },
            Refusal::AuditUnavailable(cause) => (
                503,
                "proxy_internal_error",
                Code::Reason("audit_unavailable".into()),
                Text::Plain(format!(
                    "the audit log cannot be written ({cause}); no request passes unrecorded"
                )),
            ),
            Refusal::Tunnel { target, refusal } => (
                403,
                "http_request_denied",
                Code::Reason(refusal.reason_code().into()),
                Text::Denied(target, refusal.to_string().into()),
            ),
            Refusal::Node(n) => (
                match n {
                    NodeRefusal::Attribution(_) | NodeRefusal::StreamRequest(_) => 400,
                    NodeRefusal::NotConnect(_) => 405,
                    _ => 403,
                },
                "http_request_denied",
                Code::Reason(n.code().into()),
                Text::Plain(n.to_string()),
            ),
            Refusal::ConnectionLimit(kind) => (
                503,
                "connection_limit_reached",
                Code::Reason(format!("connection_limit:{}", kind.as_str()).into()),
                Text::Plain(format!(
                    "too many connections ({} limit); retry later",
                    kind.as_str()
                )),
            ),
            Refusal::Response { target, error } => match error {
                U::Timeout => (
                    504,
                    "connection_read_timeout",
                    Code::Failed(F::ResponseTimeout),
                    Text::Plain(format!("{target} did not respond in time")),
                ),
                U::Tls(why) => (
                    502,
                    "tls_certificate_error",
                    Code::Failed(F::Tls),
                    Text::Plain(format!("{target}: TLS failed ({why})")),
                ),
                U::Closed | U::Io(_) => (
                    502,
                    "connection_terminated",
                    Code::Failed(F::Closed),
                    Text::Plain(format!("{target} closed the connection")),
                ),
                U::Malformed(_) => (
                    502,
                    "http_protocol_error",
                    Code::Failed(F::MalformedResponse),
                    Text::Plain(format!("{target} sent a malformed response")),
                ),
                U::HeadTooLarge => (
                    502,
                    "http_response_header_section_size",
                    Code::Failed(F::ResponseHeadTooLarge),
                    Text::Plain(format!("{target} sent a response head too large")),
                ),
            },
        };
        let (reason_code, outcome) = match code {
            Code::Reason(r) => (r, None),
            Code::Failed(f) => (
                Cow::Borrowed(Outcome::Upstream(f).as_str()),
                Some(Outcome::Upstream(f)),
            ),
        };
        let upstream_status = match self {
            Refusal::Dial {
                error: D::UpstreamRefused(status),
                ..
            } if UPSTREAM_REFUSALS.contains(status) => Some(*status),
            _ => None,
        };
        let (text, phrase) = match text {
            Text::Denied(target, why) => (
                format!("denied {method} {target}: {why}"),
                format!("{target} {why}"),
            ),
            Text::Plain(text) => (text.clone(), text),
        };
        Classified {
            status,
            error_type,
            reason_code,
            is_denial: outcome.is_none(),
            outcome,
            text,
            phrase,
            hints: self.next_steps(method, remedies),
            upstream_status,
            audit_log: remedies.audit_log.clone(),
        }
    }
}

/// What a refusal says: a denial of a destination (rendered as "denied METHOD TARGET: WHY"
/// in bodies and "TARGET WHY" in the status line), or one plain line.
enum Text<'a> {
    Denied(&'a Target, Cow<'static, str>),
    Plain(String),
}

#[cfg(test)]
#[path = "refusal_tests.rs"]
mod tests;
