//! Request targets: turns the request-target of a proxy request into a typed [`Target`].
//!
//! Implements the two forms a forward proxy accepts (RFC 9112 section 3.2):
//! - authority-form for CONNECT (section 3.2.3): `host:port`, port required;
//! - absolute-form for everything else (section 3.2.2), `http://` only: an `https://` URL
//!   belongs in a CONNECT tunnel, and other schemes are not proxied.
//!
//! Origin-form and asterisk-form are refused: a proxy that honoured them would pick the
//! destination from the Host header, which the client controls separately from the target.
//! The request-target alone decides where a request goes. No I/O happens here.

use std::fmt;

use serde::Serialize;

use crate::host::{Host, HostError};

/// How the client wants to reach the destination. Decides the default ports of a plain
/// `host` allowlist entry (443 for tunnels, 80 for plain HTTP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// A CONNECT tunnel (blind bytes, normally TLS).
    Connect,
    /// A plain `http://` request forwarded by the proxy.
    Http,
    /// A SOCKS5 CONNECT (RFC 1928): blind bytes, any protocol.
    Socks5,
    /// A request inside a CONNECT tunnel the proxy terminated (TLS interception, for allow
    /// entries with methods or paths): seen, decided and forwarded one by one.
    Https,
}

impl Access {
    /// The port an allowlist entry without a port permits for this kind of access (the
    /// first of [`Access::default_ports`]).
    pub fn default_port(self) -> u16 {
        match self {
            Access::Connect | Access::Socks5 | Access::Https => 443,
            Access::Http => 80,
        }
    }

    /// Every port an allowlist entry without a port permits: 443 for tunnels (CONNECT and
    /// SOCKS5), 80 for plain HTTP; anything else must be listed. Not 80 for SOCKS5: the
    /// proxy forwards plain HTTP itself and sets its `Host`, but a SOCKS5 stream is blind,
    /// and a front end shared by many sites (a CDN) picks the site by the `Host` the client
    /// writes, so port 80 of an allowed name would reach any site behind the same front end.
    pub fn default_ports(self) -> &'static [u16] {
        match self {
            Access::Connect | Access::Socks5 | Access::Https => &[443],
            Access::Http => &[80],
        }
    }

    /// Whether the connection out is a tunnel (CONNECT and SOCKS5, and an intercepted
    /// request's TLS to its origin), as opposed to one the proxy writes plain HTTP requests
    /// on. Through an upstream proxy, a tunnel must be asked for as one: the connection to
    /// the upstream is never handed to the client raw.
    pub fn is_tunnel(self) -> bool {
        match self {
            Access::Connect | Access::Socks5 | Access::Https => true,
            Access::Http => false,
        }
    }

    /// The audit log's `scheme` value.
    pub fn scheme(self) -> &'static str {
        match self {
            Access::Connect => "connect",
            Access::Http => "http",
            Access::Socks5 => "socks5",
            Access::Https => "https",
        }
    }
}

/// A destination: a host and a port, both always present.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub host: Host,
    pub port: u16,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// An `http://` request-target split into where it goes and what to ask for there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTarget {
    pub target: Target,
    /// The value for the Host header upstream: the authority as the client wrote it
    /// (normalised host, port only when not 80).
    pub authority: String,
    /// The origin-form (`/path?query`) to send upstream; `/` when the URL had no path.
    pub origin_form: String,
}

/// Why a request-target was refused. Each is answered with 400 before any DNS query.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("origin-form request sent to a proxy (use an absolute http:// URL or CONNECT)")]
    OriginForm,
    #[error("https:// URLs must be tunnelled with CONNECT")]
    HttpsAbsoluteForm,
    #[error("unsupported scheme (only http:// is forwarded)")]
    UnsupportedScheme,
    #[error("CONNECT target must be host:port")]
    ConnectNeedsPort,
    #[error("invalid port")]
    BadPort,
    #[error("fragment in request-target")]
    Fragment,
    #[error("invalid character in request-target")]
    BadCharacter,
    /// Inside an intercepted tunnel: a request whose `Host` or absolute URI names another
    /// host or port than the tunnel's.
    #[error("the request names another host than the tunnel it came through")]
    OtherHost,
    /// Inside an intercepted tunnel: a request its method and path cannot judge (a CONNECT,
    /// TRACE or TRACK, or a body on GET, HEAD or OPTIONS).
    #[error(
        "a CONNECT, TRACE or TRACK, or a GET, HEAD or OPTIONS with a body, is not forwarded from an intercepted tunnel"
    )]
    NotJudgeable,
    #[error("invalid host: {0}")]
    Host(#[from] HostError),
}

impl TargetError {
    /// A stable snake_case name for the audit log's `reason_code`.
    pub fn code(&self) -> &'static str {
        match self {
            TargetError::OriginForm => "origin_form",
            TargetError::HttpsAbsoluteForm => "https_absolute_form",
            TargetError::UnsupportedScheme => "unsupported_scheme",
            TargetError::ConnectNeedsPort | TargetError::BadPort => "bad_port",
            TargetError::Fragment | TargetError::BadCharacter => "bad_target",
            TargetError::Host(_) => "bad_host",
            TargetError::OtherHost => "host_mismatch",
            TargetError::NotJudgeable => "request_not_judgeable",
        }
    }
}

/// Parses a CONNECT request-target (authority-form, port required).
pub fn parse_connect_target(text: &str) -> Result<Target, TargetError> {
    check_characters(text)?;
    let (host, port) = split_authority(text)?;
    let port = port.ok_or(TargetError::ConnectNeedsPort)?;
    Ok(Target {
        host: Host::parse(host)?,
        port: parse_port(port)?,
    })
}

/// Parses a Host field value (RFC 9112 section 3.2, RFC 9110 section 7.2): exactly one
/// authority, `uri-host [":" port]`, with the host grammar of request-targets. A list, a
/// userinfo, a path or an empty value is refused.
pub fn parse_host_field(text: &str) -> Result<(Host, Option<u16>), TargetError> {
    check_characters(text)?;
    let (host, port) = split_authority(text)?;
    Ok((Host::parse(host)?, port.map(parse_port).transpose()?))
}

/// Parses an absolute-form `http://` request-target.
pub fn parse_http_target(text: &str) -> Result<HttpTarget, TargetError> {
    check_characters(text)?;
    if text.starts_with('/') || text == "*" {
        return Err(TargetError::OriginForm);
    }
    let (scheme, rest) = text.split_once("://").ok_or(TargetError::UnsupportedScheme)?;
    if scheme.eq_ignore_ascii_case("https") {
        return Err(TargetError::HttpsAbsoluteForm);
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(TargetError::UnsupportedScheme);
    }
    if rest.contains('#') {
        return Err(TargetError::Fragment);
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (host_text, port_text) = split_authority(authority)?;
    let host = Host::parse(host_text)?;
    let port = match port_text {
        Some(p) => parse_port(p)?,
        None => 80,
    };
    let authority = if port == 80 {
        host.text()
    } else {
        host.authority(port)
    };
    let origin_form = match tail.chars().next() {
        None => "/".to_owned(),
        Some('?') => format!("/{tail}"),
        Some(_) => tail.to_owned(),
    };
    Ok(HttpTarget {
        target: Target { host, port },
        authority,
        origin_form,
    })
}

/// Request-targets are visible ASCII only (RFC 3986 section 2; RFC 9112 section 3.2).
fn check_characters(text: &str) -> Result<(), TargetError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(TargetError::BadCharacter);
    }
    Ok(())
}

/// Splits `host[:port]`, keeping IPv6 brackets with the host. Userinfo is refused here so that
/// `user@host` can never be read as a host.
fn split_authority(authority: &str) -> Result<(&str, Option<&str>), TargetError> {
    if authority.contains('@') {
        return Err(HostError::Userinfo.into());
    }
    if authority.starts_with('[') {
        let close = authority.find(']').ok_or(HostError::Bracket)?;
        let (host, rest) = authority.split_at(close + 1);
        return match rest.strip_prefix(':') {
            Some(port) => Ok((host, Some(port))),
            None if rest.is_empty() => Ok((host, None)),
            None => Err(HostError::Bracket.into()),
        };
    }
    match authority.rsplit_once(':') {
        Some((host, _)) if host.contains(':') => Err(HostError::UnbracketedIpv6.into()),
        Some((host, port)) => Ok((host, Some(port))),
        None => Ok((authority, None)),
    }
}

/// A port: 1 to 5 decimal digits, 1..=65535. No sign, no empty port, no port 0.
pub(crate) fn parse_port(text: &str) -> Result<u16, TargetError> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TargetError::BadPort);
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(TargetError::BadPort),
        Ok(port) => Ok(port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_fields_are_one_authority() {
        for ok in [
            "a.test",
            "a.test:8080",
            "192.0.2.1",
            "[2001:db8::1]:443",
            "A.Test.",
        ] {
            assert!(parse_host_field(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            " ",
            "a.test, b.test",
            "a.test b.test",
            "user@a.test",
            "a.test/x",
            "a.test:",
            "a.test:99999",
            "a.test:80:80",
            "::1",
            "[::1",
            "a..test",
            "127.1",
            "a.test\t",
        ] {
            assert!(parse_host_field(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn connect_targets() {
        let ok: &[(&str, &str)] = &[
            ("example.com:443", "example.com:443"),
            ("EXAMPLE.com.:8443", "example.com:8443"),
            ("[::1]:443", "[::1]:443"),
            ("10.0.0.1:22", "10.0.0.1:22"),
        ];
        for (input, shown) in ok {
            assert_eq!(
                parse_connect_target(input).map(|t| t.to_string()).as_deref(),
                Ok(*shown)
            );
        }
        let bad: &[(&str, TargetError)] = &[
            ("example.com", TargetError::ConnectNeedsPort),
            ("example.com:", TargetError::BadPort),
            ("example.com:0", TargetError::BadPort),
            ("example.com:65536", TargetError::BadPort),
            ("example.com:+443", TargetError::BadPort),
            ("example.com:0443x", TargetError::BadPort),
            ("example.com:000443", TargetError::BadPort),
            ("::1:443", TargetError::Host(HostError::UnbracketedIpv6)),
            ("[::1]x:443", TargetError::Host(HostError::Bracket)),
            ("u@example.com:443", TargetError::Host(HostError::Userinfo)),
            ("127.1:443", TargetError::Host(HostError::NonCanonicalIpv4)),
            ("[fe80::1%25lo]:443", TargetError::Host(HostError::PercentEncoded)),
            ("exa mple.com:443", TargetError::BadCharacter),
        ];
        for (input, want) in bad {
            assert_eq!(parse_connect_target(input).as_ref(), Err(want), "{input}");
        }
    }

    #[test]
    fn http_targets() {
        let t = parse_http_target("http://Example.com/a/b?c=d").unwrap();
        assert_eq!(t.target.to_string(), "example.com:80");
        assert_eq!(t.authority, "example.com");
        assert_eq!(t.origin_form, "/a/b?c=d");
        let t = parse_http_target("HTTP://example.com:8080").unwrap();
        assert_eq!(t.authority, "example.com:8080");
        assert_eq!(t.origin_form, "/");
        let t = parse_http_target("http://example.com?x").unwrap();
        assert_eq!(t.origin_form, "/?x");
        let t = parse_http_target("http://[::1]:8080/").unwrap();
        assert_eq!(t.authority, "[::1]:8080");

        let bad: &[(&str, TargetError)] = &[
            ("/index.html", TargetError::OriginForm),
            ("*", TargetError::OriginForm),
            ("https://example.com/", TargetError::HttpsAbsoluteForm),
            ("ftp://example.com/", TargetError::UnsupportedScheme),
            ("example.com/", TargetError::UnsupportedScheme),
            (
                "http://user:pw@example.com/",
                TargetError::Host(HostError::Userinfo),
            ),
            ("http://example.com:80x/", TargetError::BadPort),
            ("http://example.com:/", TargetError::BadPort),
            ("http://0x7f.1/", TargetError::Host(HostError::NonCanonicalIpv4)),
            (
                "http://%65xample.com/",
                TargetError::Host(HostError::PercentEncoded),
            ),
            ("http:///path", TargetError::Host(HostError::Empty)),
            ("http://example.com/#frag", TargetError::Fragment),
        ];
        for (input, want) in bad {
            assert_eq!(parse_http_target(input).as_ref().err(), Some(want), "{input}");
        }
    }
}
