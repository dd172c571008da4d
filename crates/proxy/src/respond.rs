//! Every response the proxy writes itself, decided in one place.
//!
//! A [`Refusal`] says what went wrong and whose fault it is (the client's request, the
//! policy, the address guard, or the upstream); [`Refusal::reply`] is the single exhaustive
//! `match` that turns it into a status, an RFC 9209 `Proxy-Status` error type, a
//! `reason_code` for the audit log and a one-line body naming the destination. Bodies stay
//! short; details go to the audit log under the request id printed in the body.

use std::borrow::Cow;
use std::fmt::Write as _;

use sandgate_policy::{PolicyReason, Target, TargetError};

use crate::dial::DialError;
use crate::head::HeadError;

/// Failures talking to the upstream after the connection was made.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
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
    /// The policy denied the destination.
    Policy { target: Target, reason: PolicyReason },
    /// The name resolved to an address that a deny entry names.
    AddressDenied {
        target: Target,
        ip: std::net::IpAddr,
        rule: std::sync::Arc<str>,
    },
    /// Vetting or connecting failed (address guard refusals included).
    Dial { target: Target, error: DialError },
    /// The upstream misbehaved after the connection was made.
    Upstream { target: Target, error: UpstreamError },
    /// The audit log cannot be written (its cause), so nothing new may pass (fail closed).
    AuditUnavailable(String),
    /// A connection limit is full: the listener's, the client address's, or the proxy's.
    ConnectionLimit(LimitKind),
}

/// Which connection limit was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    Proxy,
    Listener,
    Client,
}

impl LimitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Proxy => "proxy",
            LimitKind::Listener => "listener",
            LimitKind::Client => "client",
        }
    }
}

/// The rendered reply.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub reason_code: Cow<'static, str>,
    /// Whether the audit records this as a deny (client or policy) rather than an allowed
    /// request that failed upstream.
    pub is_denial: bool,
    bytes: Vec<u8>,
}

impl Reply {
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

fn status_text(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

impl Refusal {
    /// Renders the response. `method` names the request kind in the body ("CONNECT", "GET").
    pub fn reply(&self, request_id: &str, method: &str) -> Reply {
        use DialError as D;
        use UpstreamError as U;
        // (status, Proxy-Status error type, reason_code, denial?, body text)
        let (status, error_type, code, denial, text): (u16, &str, Cow<'static, str>, bool, String) =
            match self {
                Refusal::Head(e) => (
                    400,
                    "http_request_error",
                    e.code().into(),
                    true,
                    format!("bad request: {e}"),
                ),
                Refusal::HeadTooLarge => (
                    431,
                    "http_request_error",
                    "head_too_large".into(),
                    true,
                    "request head too large".into(),
                ),
                Refusal::HeadTimeout => (
                    408,
                    "http_request_error",
                    "head_timeout".into(),
                    true,
                    "request head timed out".into(),
                ),
                Refusal::ProxyAuth(e) => (
                    407,
                    "http_request_denied",
                    e.code().into(),
                    true,
                    format!("proxy authentication required: {e}"),
                ),
                Refusal::Target(e) => (
                    400,
                    "http_request_error",
                    e.code().into(),
                    true,
                    format!("bad request: {e}"),
                ),
                Refusal::Policy { target, reason } => (
                    403,
                    "http_request_denied",
                    reason.code().into(),
                    true,
                    format!("denied {method} {target}: {}", reason.describe()),
                ),
                Refusal::AddressDenied { target, ip, .. } => (
                    403,
                    "http_request_denied",
                    PolicyReason::Denylisted.code().into(),
                    true,
                    format!("denied {method} {target}: resolves to {ip}, which a deny rule names"),
                ),
                Refusal::Dial { target, error } => match error {
                    D::Prohibited(p) => (
                        403,
                        "destination_ip_prohibited",
                        "destination_ip_prohibited".into(),
                        true,
                        format!(
                            "denied {method} {target}: resolves to a {} address",
                            p.class.as_str()
                        ),
                    ),
                    D::SelfConnect(_) => (
                        403,
                        "destination_ip_prohibited",
                        "proxy_loop".into(),
                        true,
                        format!("denied {method} {target}: that is this proxy"),
                    ),
                    D::Dns(_) => (
                        502,
                        "dns_error",
                        "upstream_failure:dns".into(),
                        false,
                        format!("cannot resolve {target}"),
                    ),
                    D::DnsTimeout => (
                        504,
                        "dns_timeout",
                        "upstream_failure:dns_timeout".into(),
                        false,
                        format!("DNS timeout for {target}"),
                    ),
                    D::Refused => (
                        502,
                        "connection_refused",
                        "upstream_failure:connection_refused".into(),
                        false,
                        format!("connection to {target} refused"),
                    ),
                    D::ConnectTimeout => (
                        504,
                        "connection_timeout",
                        "upstream_failure:connection_timeout".into(),
                        false,
                        format!("connection to {target} timed out"),
                    ),
                    // Allowed here and refused further up: an allow followed by a close, so each
                    // request still has exactly one decision event.
                    D::UpstreamRefused(403) => (
                        403,
                        "http_request_denied",
                        "upstream_failure:upstream_denied".into(),
                        false,
                        format!("denied {method} {target}: the upstream proxy refused it"),
                    ),
                    D::UpstreamRefused(_) | D::UpstreamBroken => (
                        502,
                        "destination_unavailable",
                        "upstream_failure:upstream_proxy".into(),
                        false,
                        format!("the upstream proxy could not reach {target}"),
                    ),
                    D::Connect(_) => (
                        502,
                        "destination_unavailable",
                        "upstream_failure:connect".into(),
                        false,
                        format!("cannot connect to {target}"),
                    ),
                },
                Refusal::AuditUnavailable(cause) => (
                    503,
                    "proxy_internal_error",
                    "audit_unavailable".into(),
                    true,
                    format!("the audit log cannot be written ({cause}); no request passes unrecorded"),
                ),
                Refusal::ConnectionLimit(kind) => (
                    503,
                    "connection_limit_reached",
                    format!("connection_limit:{}", kind.as_str()).into(),
                    true,
                    format!("too many connections ({} limit); retry later", kind.as_str()),
                ),
                Refusal::Upstream { target, error } => match error {
                    U::Timeout => (
                        504,
                        "connection_read_timeout",
                        "upstream_failure:response_timeout".into(),
                        false,
                        format!("{target} did not respond in time"),
                    ),
                    U::Closed | U::Io(_) => (
                        502,
                        "connection_terminated",
                        "upstream_failure:closed".into(),
                        false,
                        format!("{target} closed the connection"),
                    ),
                    U::Malformed(_) => (
                        502,
                        "http_protocol_error",
                        "upstream_failure:malformed_response".into(),
                        false,
                        format!("{target} sent a malformed response"),
                    ),
                    U::HeadTooLarge => (
                        502,
                        "http_response_header_section_size",
                        "upstream_failure:response_head_too_large".into(),
                        false,
                        format!("{target} sent a response head too large"),
                    ),
                },
            };
        let body = format!("sandgate: {text} (request {request_id})\n");
        let details = sf_string(&text);
        // RFC 9110 section 11.7.1: a 407 says how to authenticate.
        let challenge = if status == 407 {
            "Proxy-Authenticate: Basic realm=\"sandgate\"\r\n"
        } else {
            ""
        };
        let mut head = String::with_capacity(160 + body.len());
        let _ = write!(
            head,
            "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
             Proxy-Status: sandgate; error={error_type}; details={details}\r\n{challenge}Connection: close\r\n\r\n{body}",
            status_text(status),
            body.len(),
        );
        Reply {
            status,
            reason_code: code,
            is_denial: denial,
            bytes: head.into_bytes(),
        }
    }
}

/// An RFC 8941 sf-string: printable ASCII in quotes, with `"` and `\` escaped.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandgate_policy::parse_connect_target;

    #[test]
    fn deny_names_destination_and_sets_proxy_status() {
        let target = parse_connect_target("evil.test:443").unwrap();
        let r = Refusal::Policy {
            target,
            reason: PolicyReason::NotAllowlisted,
        }
        .reply("abc", "CONNECT");
        let text = String::from_utf8(r.bytes().to_vec()).unwrap();
        assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        assert!(text.contains("Proxy-Status: sandgate; error=http_request_denied; details=\"denied CONNECT evil.test:443: not in allowlist\"\r\n"));
        assert!(text.ends_with("sandgate: denied CONNECT evil.test:443: not in allowlist (request abc)\n"));
        assert!(r.is_denial);
    }

    #[test]
    fn sf_string_escapes() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("ü"), "\"?\"");
    }
}
