//! Host names and IP literals as sandgate accepts them: one strict grammar shared by the
//! allowlist patterns and by the request targets that clients send.
//!
//! What it accepts (RFC 3986 section 3.2.2 `host`, narrowed):
//! - a DNS name: ASCII letters, digits, `-` and `_`, labels of 1..=63 bytes, at most 253 bytes,
//!   no label starting or ending with `-`; compared case-insensitively (stored lowercase) and
//!   one trailing dot ignored;
//! - an IPv4 address in canonical dotted-quad form only (`127.0.0.1`, never `127.1`, `0x7f.1`,
//!   `2130706433` or `0177.0.0.1`: glibc's resolver accepts all of those as addresses);
//! - an IPv6 address in brackets (`[2001:db8::1]`), without a zone id.
//!
//! What it refuses, before anything else could look the name up: percent-encoding, non-ASCII
//! (IDNs must arrive as A-labels, `xn--...`), userinfo, empty labels, and any name whose last
//! label looks numeric (the WHATWG URL standard treats those as IPv4, so do we, and then only the
//! canonical spelling passes). It does no I/O.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;

/// Longest DNS name in presentation form without the trailing dot (RFC 1035 section 2.3.4).
const MAX_NAME_LEN: usize = 253;
/// Longest DNS label (RFC 1035 section 2.3.4).
const MAX_LABEL_LEN: usize = 63;

/// A validated, lowercased DNS name without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainName(String);

/// Appends `n` in decimal.
fn push_decimal(text: &mut String, n: u32) {
    let mut digits = [0u8; 10];
    let mut len = 0;
    let mut rest = n;
    loop {
        if let Some(d) = digits.get_mut(len) {
            *d = b'0' + (rest % 10) as u8;
        }
        len += 1;
        rest /= 10;
        if rest == 0 || len == digits.len() {
            break;
        }
    }
    for d in digits.iter().take(len).rev() {
        text.push(char::from(*d));
    }
}

impl DomainName {
    /// The name as text, lowercase, without a trailing dot.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Number of labels (`a.b.c` has three).
    pub fn label_count(&self) -> usize {
        self.0.split('.').count()
    }
}

impl fmt::Display for DomainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A destination host: a DNS name or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, to be resolved by the proxy's own resolver.
    Name(DomainName),
    /// An IP literal; it is never looked up.
    Ip(IpAddr),
}

impl Host {
    /// Parses a host as it appears in an authority: a name, a dotted quad, or a bracketed IPv6.
    pub fn parse(text: &str) -> Result<Host, HostError> {
        if text.is_empty() {
            return Err(HostError::Empty);
        }
        if !text.is_ascii() {
            return Err(HostError::NonAscii);
        }
        if text.contains('%') {
            return Err(HostError::PercentEncoded);
        }
        if text.contains('@') {
            return Err(HostError::Userinfo);
        }
        if let Some(inner) = text.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or(HostError::Bracket)?;
            return inner
                .parse::<Ipv6Addr>()
                .map(|ip| Host::Ip(IpAddr::V6(ip)))
                .map_err(|_| HostError::BadIpv6);
        }
        if text.contains(':') {
            return Err(HostError::UnbracketedIpv6);
        }
        if text.ends_with('.') && looks_numeric(last_label(text.trim_end_matches('.'))) {
            // `127.0.0.1.` is not a canonical IPv4 spelling and not a name either.
            return Err(HostError::NonCanonicalIpv4);
        }
        let trimmed = text.strip_suffix('.').unwrap_or(text);
        if looks_numeric(last_label(trimmed)) {
            return parse_canonical_ipv4(trimmed)
                .map(|ip| Host::Ip(IpAddr::V4(ip)))
                .ok_or(HostError::NonCanonicalIpv4);
        }
        DomainName::parse(trimmed).map(Host::Name)
    }

    /// The host as its `Display` writes it, made without `fmt` for a name and an IPv4
    /// address (a proxy writes a request's host several times per request).
    pub fn text(&self) -> String {
        match self {
            Host::Name(name) => name.as_str().to_owned(),
            Host::Ip(IpAddr::V4(ip)) => {
                let mut text = String::with_capacity(21);
                for (i, octet) in ip.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push('.');
                    }
                    push_decimal(&mut text, u32::from(octet));
                }
                text
            }
            other => other.to_string(),
        }
    }

    /// `host:port` as an authority is written (`Display` of the host, a colon, the port),
    /// made without `fmt`.
    pub fn authority(&self, port: u16) -> String {
        let mut text = self.text();
        text.push(':');
        push_decimal(&mut text, u32::from(port));
        text
    }

    /// The name, when this host is one.
    pub fn name(&self) -> Option<&DomainName> {
        match self {
            Host::Name(name) => Some(name),
            Host::Ip(_) => None,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name.as_str()),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

impl Serialize for Host {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl DomainName {
    /// Parses a DNS name (no trailing dot handling: callers strip one dot first).
    pub fn parse(text: &str) -> Result<DomainName, HostError> {
        if text.is_empty() {
            return Err(HostError::Empty);
        }
        if text.len() > MAX_NAME_LEN {
            return Err(HostError::TooLong);
        }
        for label in text.split('.') {
            check_label(label)?;
        }
        if looks_numeric(last_label(text)) {
            return Err(HostError::NonCanonicalIpv4);
        }
        Ok(DomainName(text.to_ascii_lowercase()))
    }
}

fn check_label(label: &str) -> Result<(), HostError> {
    if label.is_empty() {
        return Err(HostError::EmptyLabel);
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(HostError::LabelTooLong);
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Err(HostError::BadHyphen);
    }
    match label
        .bytes()
        .find(|b| !(b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_'))
    {
        Some(b'*') => Err(HostError::Wildcard),
        Some(_) => Err(HostError::BadCharacter),
        None => Ok(()),
    }
}

fn last_label(text: &str) -> &str {
    text.rsplit('.').next().unwrap_or(text)
}

/// The WHATWG URL "ends in a number" check: a last label of decimal digits or `0x` hex is an
/// IPv4 address in some spelling, never a name.
fn looks_numeric(label: &str) -> bool {
    if !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    match label.strip_prefix("0x").or_else(|| label.strip_prefix("0X")) {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// Exactly four decimal octets, 0..=255, no leading zeros, no signs: the only IPv4 spelling that
/// every parser agrees on.
pub(crate) fn parse_canonical_ipv4(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        let leading_zero = part.len() > 1 && part.starts_with('0');
        if part.is_empty() || part.len() > 3 || leading_zero {
            return None;
        }
        if !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(Ipv4Addr::from(octets))
}

/// Why a host was refused. Every variant is a client or configuration mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("empty host")]
    Empty,
    #[error("host is not ASCII (send IDNs as xn-- A-labels)")]
    NonAscii,
    #[error("percent-encoded host")]
    PercentEncoded,
    #[error("userinfo is not allowed in a host")]
    Userinfo,
    #[error("unbalanced IPv6 brackets")]
    Bracket,
    #[error("invalid IPv6 literal (zone ids are not allowed)")]
    BadIpv6,
    #[error("IPv6 literal must be in brackets")]
    UnbracketedIpv6,
    #[error("IPv4 address not in canonical dotted-quad form")]
    NonCanonicalIpv4,
    #[error("host name longer than 253 bytes")]
    TooLong,
    #[error("empty label in host name")]
    EmptyLabel,
    #[error("label longer than 63 bytes")]
    LabelTooLong,
    #[error("label starts or ends with '-'")]
    BadHyphen,
    #[error("'*' is only allowed as a whole first label ('*.example.com')")]
    Wildcard,
    #[error("invalid character in host name")]
    BadCharacter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_names_and_canonical_literals() {
        let cases: &[(&str, &str)] = &[
            ("Example.COM", "example.com"),
            ("example.com.", "example.com"),
            ("a_b.example", "a_b.example"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
            ("127.0.0.1", "127.0.0.1"),
            ("[::1]", "[::1]"),
            ("[2001:DB8::1]", "[2001:db8::1]"),
            ("1a.example", "1a.example"),
            ("localhost", "localhost"),
        ];
        for (input, shown) in cases {
            let host = Host::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(host.to_string(), *shown, "{input}");
            assert_eq!(host.text(), *shown, "{input}");
            for port in [0, 1, 9, 10, 99, 443, 8080, 65535] {
                assert_eq!(host.authority(port), format!("{host}:{port}"), "{input}");
            }
        }
        for ip in ["0.0.0.0", "255.255.255.255", "10.0.100.9", "1.20.3.199"] {
            assert_eq!(Host::parse(ip).unwrap().text(), ip);
        }
    }

    #[test]
    fn refuses_ambiguous_spellings() {
        let cases: &[(&str, HostError)] = &[
            ("", HostError::Empty),
            ("127.1", HostError::NonCanonicalIpv4),
            ("0x7f.1", HostError::NonCanonicalIpv4),
            ("0x7f000001", HostError::NonCanonicalIpv4),
            ("2130706433", HostError::NonCanonicalIpv4),
            ("0177.0.0.1", HostError::NonCanonicalIpv4),
            ("127.0.0.01", HostError::NonCanonicalIpv4),
            ("127.0.0.1.", HostError::NonCanonicalIpv4),
            ("256.0.0.1", HostError::NonCanonicalIpv4),
            ("1.2.3.4.5", HostError::NonCanonicalIpv4),
            ("foo.123", HostError::NonCanonicalIpv4),
            ("[fe80::1%25eth0]", HostError::PercentEncoded),
            ("[fe80::1%eth0]", HostError::PercentEncoded),
            ("ex%61mple.com", HostError::PercentEncoded),
            ("bücher.example", HostError::NonAscii),
            ("user@example.com", HostError::Userinfo),
            ("::1", HostError::UnbracketedIpv6),
            ("[::1", HostError::Bracket),
            ("[1.2.3.4]", HostError::BadIpv6),
            ("a..b", HostError::EmptyLabel),
            (".a", HostError::EmptyLabel),
            ("example.com..", HostError::EmptyLabel),
            ("-a.example", HostError::BadHyphen),
            ("a-.example", HostError::BadHyphen),
            ("a b.example", HostError::BadCharacter),
            ("a/b.example", HostError::BadCharacter),
            ("*.example.com", HostError::Wildcard),
        ];
        for (input, want) in cases {
            assert_eq!(Host::parse(input), Err(*want), "{input:?}");
        }
    }

    #[test]
    fn length_limits() {
        let label = "a".repeat(63);
        assert!(Host::parse(&format!("{label}.example")).is_ok());
        assert_eq!(
            Host::parse(&format!("{label}b.example")),
            Err(HostError::LabelTooLong)
        );
        let long = vec!["abcdefghi"; 26].join(".");
        assert!(long.len() > MAX_NAME_LEN);
        assert_eq!(Host::parse(&long), Err(HostError::TooLong));
    }
}
