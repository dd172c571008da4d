//! The allowlist grammar: one pattern per `--allow`/`--deny` value or policy entry.
//!
//! | pattern            | matches                                                            |
//! |--------------------|--------------------------------------------------------------------|
//! | `example.com`      | that name; allow: CONNECT to 443 and HTTP to 80; deny: every port  |
//! | `example.com:8443` | that name on exactly that port, CONNECT or HTTP                    |
//! | `*.example.com`    | every subdomain at any depth, never the apex (ports as above)      |
//! | `*`, `*:8443`      | every name (never an IP literal), ports as above; the address guard applies |
//! | `192.0.2.7`, `[2001:db8::7]:443` | that IP literal, canonical spelling only              |
//!
//! Names compare case-insensitively with one trailing dot ignored. A wildcard must stand for a
//! whole first label and sit above a registrable domain: `*.com`, `*.co.uk`, `*.`, `**`,
//! `a*.example.com` and `*.*.example.com` are refused at start-up, since they match far more
//! than they look. The ICANN section of the Public Suffix List decides what is a public
//! suffix. This module is pure: no I/O, no clock.

use std::fmt;

use crate::host::{DomainName, Host, HostError};
use crate::target::{Access, Target, parse_port};

/// The host half of a pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// `*`: every DNS name.
    AnyName,
    /// `*.suffix`: names strictly below `suffix`.
    Subdomains(DomainName),
    /// One name or one IP literal.
    Exact(Host),
}

/// A parsed allowlist or denylist pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pattern {
    pub host: HostPattern,
    /// `None`: the default ports (allow) or every port (deny).
    pub port: Option<u16>,
}

/// Why a pattern was refused at start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("empty pattern")]
    Empty,
    /// A URL or a path where a host was expected; carries the pattern that was probably
    /// meant.
    #[error("a host, not a URL: write '{0}'")]
    Url(String),
    #[error("invalid port")]
    BadPort,
    #[error("'{0}' would match a whole public suffix; name a registrable domain, like '*.example.com'")]
    PublicSuffixWildcard(String),
    #[error("'*' must be a whole first label followed by a domain ('*.example.com')")]
    BadWildcard,
    #[error("IPv6 literal must be in canonical form ('[{0}]')")]
    NonCanonicalIpv6(String),
    #[error("{0}")]
    Host(#[from] HostError),
}

impl Pattern {
    /// Parses one pattern. Surrounding whitespace is ignored; everything else is strict.
    pub fn parse(text: &str) -> Result<Pattern, PatternError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(PatternError::Empty);
        }
        if let Some(meant) = url_to_pattern(text) {
            return Err(PatternError::Url(meant));
        }
        let (host_text, port) = split_port(text)?;
        let host = parse_host_pattern(host_text)?;
        Ok(Pattern { host, port })
    }

    /// Does this pattern, used as an allow entry, permit `target` accessed by `access`?
    pub fn allows(&self, target: &Target, access: Access) -> bool {
        // Without a port, every entry (`*` included) means the scheme's usual port only: `*`
        // is "every name", never "every port" (SMTP on 25, a database on 5432), so another
        // port is always named (`*:8443`, or `ports:`).
        let port_ok = match self.port {
            Some(port) => port == target.port,
            None => access.default_ports().contains(&target.port),
        };
        port_ok && self.host_matches(&target.host)
    }

    /// Does this pattern, used as a deny entry, cover `target`? Without a port, every port.
    pub fn denies(&self, target: &Target) -> bool {
        self.port.is_none_or(|p| p == target.port) && self.host_matches(&target.host)
    }

    /// Does the host half match (ports aside)?
    pub fn host_matches(&self, host: &Host) -> bool {
        match (&self.host, host) {
            (HostPattern::AnyName, Host::Name(_)) => true,
            (HostPattern::Subdomains(suffix), Host::Name(name)) => is_strict_subdomain(name, suffix),
            (HostPattern::Exact(want), have) => want == have,
            (HostPattern::AnyName | HostPattern::Subdomains(_), Host::Ip(_)) => false,
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::AnyName => f.write_str("*")?,
            HostPattern::Subdomains(suffix) => write!(f, "*.{suffix}")?,
            HostPattern::Exact(host) => write!(f, "{host}")?,
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// `name` ends with `.suffix` (a label boundary), so `xexample.com` is not under `example.com`.
pub(crate) fn is_strict_subdomain(name: &DomainName, suffix: &DomainName) -> bool {
    name.as_str()
        .strip_suffix(suffix.as_str())
        .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
}

/// For a pattern written as a URL (`https://example.com/simple/`) or with a path
/// (`example.com/api`): the pattern that was probably meant (`example.com`, with the port
/// when the URL named one other than its scheme's usual). `None` for anything else.
fn url_to_pattern(text: &str) -> Option<String> {
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
        None if text.contains('/') => (None, text),
        None => return None,
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let usual = match scheme.as_deref() {
        Some("http") => Some(80),
        Some("https") => Some(443),
        _ => None,
    };
    let meant = match split_port(authority) {
        Ok((host, Some(port))) if Some(port) == usual => host.to_owned(),
        Ok(_) => authority.to_owned(),
        Err(_) => authority.to_owned(),
    };
    Some(if meant.is_empty() {
        "example.com".to_owned()
    } else {
        meant
    })
}

fn split_port(text: &str) -> Result<(&str, Option<u16>), PatternError> {
    let port_sep = if text.starts_with('[') {
        // `[v6]` or `[v6]:port`: the port separator, if any, follows the bracket.
        text.find("]:").map(|i| i + 1)
    } else if text.bytes().filter(|b| *b == b':').count() == 1 {
        text.find(':')
    } else {
        None
    };
    match port_sep {
        Some(i) => {
            let (host, port) = text.split_at(i);
            let port = port.strip_prefix(':').unwrap_or(port);
            let port = parse_port(port).map_err(|_| PatternError::BadPort)?;
            Ok((host, Some(port)))
        }
        None => Ok((text, None)),
    }
}

fn parse_host_pattern(text: &str) -> Result<HostPattern, PatternError> {
    if text == "*" {
        return Ok(HostPattern::AnyName);
    }
    if let Some(suffix) = text.strip_prefix("*.") {
        let suffix_text = suffix.strip_suffix('.').unwrap_or(suffix);
        if suffix_text.is_empty() {
            return Err(PatternError::BadWildcard);
        }
        let name = match Host::parse(suffix_text) {
            Ok(Host::Name(name)) => name,
            Ok(Host::Ip(_)) => return Err(PatternError::BadWildcard),
            Err(HostError::Wildcard) => return Err(PatternError::BadWildcard),
            Err(e) => return Err(e.into()),
        };
        if name.label_count() < 2 || is_icann_public_suffix(&name) {
            return Err(PatternError::PublicSuffixWildcard(text.to_owned()));
        }
        return Ok(HostPattern::Subdomains(name));
    }
    if text.contains('*') {
        return Err(PatternError::BadWildcard);
    }
    let host = Host::parse(text)?;
    if let (Host::Ip(std::net::IpAddr::V6(ip)), Some(inner)) = (&host, text.strip_prefix('[')) {
        let canonical = ip.to_string();
        if inner.strip_suffix(']') != Some(canonical.as_str()) {
            return Err(PatternError::NonCanonicalIpv6(canonical));
        }
    }
    Ok(HostPattern::Exact(host))
}

/// True when `name` itself is a public suffix in the ICANN section of the PSL (`com`, `co.uk`).
/// Private-section suffixes (`github.io`) are allowed: they are registrable by one operator.
fn is_icann_public_suffix(name: &DomainName) -> bool {
    psl::suffix(name.as_str().as_bytes()).is_some_and(|s| {
        s.is_known() && s.typ() == Some(psl::Type::Icann) && s.as_bytes() == name.as_str().as_bytes()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::parse_connect_target;

    fn t(text: &str) -> Target {
        parse_connect_target(text).unwrap()
    }

    #[test]
    fn parses_and_prints() {
        for (input, shown) in [
            ("Example.com", "example.com"),
            ("example.com.", "example.com"),
            ("example.com:8443", "example.com:8443"),
            ("*.Example.com", "*.example.com"),
            ("*", "*"),
            ("*:443", "*:443"),
            ("192.0.2.7", "192.0.2.7"),
            ("[2001:db8::7]:443", "[2001:db8::7]:443"),
            ("[::1]", "[::1]"),
            (" api.openai.com ", "api.openai.com"),
            ("*.user.github.io", "*.user.github.io"),
            ("*.github.io", "*.github.io"),
        ] {
            assert_eq!(Pattern::parse(input).unwrap().to_string(), shown, "{input}");
        }
    }

    #[test]
    fn a_url_is_refused_with_the_host_it_meant() {
        for (input, meant) in [
            ("https://example.com", "example.com"),
            ("HTTPS://example.com/simple/", "example.com"),
            ("http://example.com:80/x", "example.com"),
            ("https://example.com:8443", "example.com:8443"),
            ("http://user@example.com/", "example.com"),
            ("example.com/api", "example.com"),
            ("https://[2001:db8::7]:443/", "[2001:db8::7]"),
        ] {
            assert_eq!(
                Pattern::parse(input),
                Err(PatternError::Url(meant.to_owned())),
                "{input}"
            );
        }
        assert_eq!(
            PatternError::Url("example.com".into()).to_string(),
            "a host, not a URL: write 'example.com'"
        );
    }

    #[test]
    fn refuses_broad_or_malformed() {
        for input in [
            "",
            "*.com",
            "*.co.uk",
            "*.",
            "**",
            "*.*.example.com",
            "a*.example.com",
            "*example.com",
            "ex*mple.com",
            "*.127.0.0.1",
            "example.com:0",
            "example.com:99999",
            "example.com:",
            "2001:db8::1",
            "[2001:0db8::1]",
            "[2001:DB8::1]",
            "127.1",
            "0x7f.1",
            "2130706433",
            "[fe80::1%eth0]",
            "exa mple.com",
            "http://example.com",
            "example.com/path",
            "*.com:443",
            "*.",
        ] {
            assert!(Pattern::parse(input).is_err(), "{input:?} should be refused");
        }
    }

    #[test]
    fn allow_table() {
        let cases: &[(&str, &str, Access, bool)] = &[
            ("example.com", "example.com:443", Access::Connect, true),
            ("example.com", "example.com:80", Access::Http, true),
            ("example.com", "example.com:80", Access::Connect, false),
            // A blind stream to port 80 lets the client's own Host pick the site.
            ("example.com", "example.com:80", Access::Socks5, false),
            ("example.com", "example.com:443", Access::Socks5, true),
            ("example.com:80", "example.com:80", Access::Socks5, true),
            ("example.com", "example.com:443", Access::Http, false),
            ("example.com", "example.com:8443", Access::Connect, false),
            ("example.com", "www.example.com:443", Access::Connect, false),
            ("example.com:8443", "example.com:8443", Access::Connect, true),
            ("example.com:8443", "example.com:8443", Access::Http, true),
            ("example.com:8443", "example.com:443", Access::Connect, false),
            ("*.example.com", "a.example.com:443", Access::Connect, true),
            ("*.example.com", "a.b.c.example.com:443", Access::Connect, true),
            ("*.example.com", "example.com:443", Access::Connect, false),
            ("*.example.com", "xexample.com:443", Access::Connect, false),
            (
                "*.example.com",
                "evil.example.com.attacker.net:443",
                Access::Connect,
                false,
            ),
            ("*.example.com", "a.example.com:22", Access::Connect, false),
            ("*.example.com:22", "a.example.com:22", Access::Connect, true),
            ("*", "anything.test:443", Access::Connect, true),
            ("*", "anything.test:80", Access::Http, true),
            // `*` is every name on the usual ports, like any entry without a port.
            ("*", "anything.test:22", Access::Connect, false),
            ("*", "anything.test:25", Access::Connect, false),
            ("*", "anything.test:80", Access::Connect, false),
            ("*", "anything.test:8080", Access::Http, false),
            ("*", "anything.test:80", Access::Socks5, false),
            ("*:8443", "anything.test:8443", Access::Connect, true),
            ("*:8443", "anything.test:443", Access::Connect, false),
            ("*", "192.0.2.1:443", Access::Connect, false),
            ("*:443", "anything.test:22", Access::Connect, false),
            ("192.0.2.7", "192.0.2.7:443", Access::Connect, true),
            ("192.0.2.7", "192.0.2.8:443", Access::Connect, false),
            ("[2001:db8::7]:443", "[2001:db8::7]:443", Access::Connect, true),
            ("example.com", "192.0.2.7:443", Access::Connect, false),
        ];
        for (pattern, target, access, want) in cases {
            let p = Pattern::parse(pattern).unwrap();
            assert_eq!(
                p.allows(&t(target), *access),
                *want,
                "{pattern} vs {target} {access:?}"
            );
        }
    }

    #[test]
    fn deny_without_port_covers_every_port() {
        let p = Pattern::parse("evil.example").unwrap();
        assert!(p.denies(&t("evil.example:443")));
        assert!(p.denies(&t("evil.example:22")));
        assert!(!p.denies(&t("good.example:22")));
        let p = Pattern::parse("evil.example:22").unwrap();
        assert!(!p.denies(&t("evil.example:443")));
    }
}
