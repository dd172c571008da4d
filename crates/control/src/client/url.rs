//! Admin URLs: `http://HOST:PORT` where HOST is an IP literal or `localhost`, parsed into a
//! value that cannot hold a name to resolve (RFC 3986 section 3.2.2 for the literal forms;
//! the standard library's parsers, which take the canonical forms only). Also the one rule
//! the agent's resolver applies to a URI ([`literal_addrs`]) and the path-segment encoding.
//! No I/O.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// Where a local HTTP API listens: `http://HOST:PORT` (or `https://`, for an admin listener
/// that serves TLS), HOST an IP literal or `localhost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminUrl {
    host: Host,
    port: u16,
    tls: bool,
}

/// A host the client may connect to without asking anyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Host {
    Ip(IpAddr),
    /// 127.0.0.1 then ::1 (what every hosts file says), never looked up.
    Localhost,
}

impl Host {
    /// An IP literal (an IPv6 one without its brackets) or `localhost`; anything else is
    /// a name, refused.
    fn parse(text: &str) -> Result<Host, UrlProblem> {
        if text.is_empty() {
            return Err(UrlProblem::Syntax);
        }
        if text.eq_ignore_ascii_case("localhost") {
            return Ok(Host::Localhost);
        }
        // The standard library takes the canonical forms only: no `127.1`, no octal or
        // hexadecimal parts, no zone index (glibc's inet_aton would take the first two).
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Host::Ip(ip));
        }
        Err(UrlProblem::HostName(clip(text, 100)))
    }

    fn addrs(self, port: u16) -> Vec<SocketAddr> {
        match self {
            Host::Ip(ip) => vec![SocketAddr::new(ip, port)],
            Host::Localhost => vec![
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port),
                SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port),
            ],
        }
    }
}

impl AdminUrl {
    /// Parses `http://HOST:PORT` with an optional trailing `/`. HOST is an IPv4 literal,
    /// a bracketed IPv6 literal or `localhost`; the port is required (there is no default
    /// admin port to guess); no path, query or user information.
    pub fn parse(input: &str) -> Result<AdminUrl, UrlError> {
        parse_url(input).map_err(|problem| UrlError {
            input: clip(input, 200),
            problem,
        })
    }

    /// The addresses a connection tries, in order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.host.addrs(self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `https://`: the client must verify the server against a CA it is given.
    pub fn is_tls(&self) -> bool {
        self.tls
    }
}

fn parse_url(input: &str) -> Result<AdminUrl, UrlProblem> {
    let (scheme, rest) = input.split_once("://").ok_or(UrlProblem::Syntax)?;
    let tls = if scheme.eq_ignore_ascii_case("http") {
        false
    } else if scheme.eq_ignore_ascii_case("https") {
        true
    } else {
        return Err(UrlProblem::Scheme(clip(scheme, 20)));
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if !tail.bytes().all(|b| b == b'/') {
        return Err(UrlProblem::Path);
    }
    if authority.contains('@') {
        return Err(UrlProblem::UserInfo);
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (v6, after) = bracketed.split_once(']').ok_or(UrlProblem::Syntax)?;
        let ip = v6.parse::<Ipv6Addr>().map_err(|_| UrlProblem::Syntax)?;
        let port = match after.strip_prefix(':') {
            Some(port) => port,
            None if after.is_empty() => return Err(UrlProblem::MissingPort),
            None => return Err(UrlProblem::Syntax),
        };
        (Host::Ip(ip.into()), port)
    } else {
        let (host, port) = authority.rsplit_once(':').ok_or(UrlProblem::MissingPort)?;
        if host.contains(':') {
            return Err(UrlProblem::BareIpv6);
        }
        (Host::parse(host)?, port)
    };
    if port.is_empty() {
        return Err(UrlProblem::MissingPort);
    }
    let port = match port.parse::<u16>() {
        Ok(p) if p != 0 && port.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => return Err(UrlProblem::Port(clip(port, 20))),
    };
    Ok(AdminUrl { host, port, tls })
}

impl FromStr for AdminUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<AdminUrl, UrlError> {
        AdminUrl::parse(s)
    }
}

impl From<SocketAddr> for AdminUrl {
    fn from(addr: SocketAddr) -> AdminUrl {
        AdminUrl {
            host: Host::Ip(addr.ip()),
            port: addr.port(),
            tls: false,
        }
    }
}

/// The canonical form, `http://HOST:PORT` (IPv6 in brackets, no trailing `/`).
impl fmt::Display for AdminUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        match self.host {
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{scheme}://{ip}:{}", self.port),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "{scheme}://[{ip}]:{}", self.port),
            Host::Localhost => write!(f, "{scheme}://localhost:{}", self.port),
        }
    }
}

/// What is wrong with an admin URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlProblem {
    /// Not of the form `http://HOST:PORT`.
    Syntax,
    /// Another scheme than `http`.
    Scheme(String),
    /// A host name: it would have to be resolved.
    HostName(String),
    /// An IPv6 address without brackets.
    BareIpv6,
    /// No port.
    MissingPort,
    /// A port that is not 1 to 65535.
    Port(String),
    /// A path, query or fragment.
    Path,
    /// `user:password@`: the token goes in a file or the environment, never in the URL.
    UserInfo,
}

impl fmt::Display for UrlProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlProblem::Syntax => f.write_str("expected http://HOST:PORT"),
            UrlProblem::Scheme(s) => write!(
                f,
                "scheme {s:?}: only http://, or https:// for an admin listener that serves TLS"
            ),
            UrlProblem::HostName(h) => write!(
                f,
                "{h:?} is a host name; name the API by an IP address (http://127.0.0.1:9090, \
                 http://[::1]:9090) or localhost: sandgate does not look names up for it"
            ),
            UrlProblem::BareIpv6 => f.write_str("an IPv6 address goes in brackets: http://[::1]:9090"),
            UrlProblem::MissingPort => f.write_str("no port: expected http://HOST:PORT"),
            UrlProblem::Port(p) => write!(f, "port {p:?}: expected 1 to 65535"),
            UrlProblem::Path => f.write_str("no path, query or fragment: expected http://HOST:PORT"),
            UrlProblem::UserInfo => {
                f.write_str("no user or password in the URL: the token goes in a file or the environment")
            }
        }
    }
}

/// A refused admin URL: the input (left out when it holds user information) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct UrlError {
    input: String,
    problem: UrlProblem,
}

impl UrlError {
    pub fn problem(&self) -> &UrlProblem {
        &self.problem
    }
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problem {
            // It may carry a password: never echoed.
            UrlProblem::UserInfo => write!(f, "{}", self.problem),
            _ => write!(f, "{:?}: {}", self.input, self.problem),
        }
    }
}

/// The addresses of a URI's host as ureq gives it (an IPv6 literal in brackets): the rule
/// [`AdminUrl::parse`] applies, for the agent's resolver.
pub(super) fn literal_addrs(host: &str, port: u16) -> Result<Vec<SocketAddr>, UrlProblem> {
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(ip.into()))
            .map_err(|_| UrlProblem::Syntax)?,
        None => Host::parse(host)?,
    };
    Ok(host.addrs(port))
}

/// `id` as one path segment: ASCII letters, digits, `-` and `_` kept, every other byte
/// percent-encoded (RFC 3986 section 2.1), so an id can never add a segment, a dot segment
/// or a query.
pub fn path_segment(id: &str) -> String {
    id.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// At most `max` characters of `text`, marked when cut.
pub(super) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", text.get(..at).unwrap_or_default()),
        None => text.to_owned(),
    }
}
