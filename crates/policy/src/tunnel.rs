//! What a tunnel (CONNECT, SOCKS5) may carry, decided from its first bytes: the policy's
//! `spec.network.tunnels`. The proxy reads the client's first TLS record (bounded), a parser
//! turns it into [`FirstBytes`], and [`TunnelRules::check`] says whether the tunnel goes on.
//! Nothing is decrypted: a ClientHello is plaintext, and only its server name and the fact
//! that it is one are looked at.
//!
//! - `sni: must_match` (the default): a ClientHello's server name must be the requested host
//!   (ASCII case-insensitive, a trailing dot ignored). A tunnel to an IP literal may carry no
//!   name at all, since a name there would pick some other site at that address.
//! - `missing_sni: refuse` (the default): a ClientHello without a server name, in a tunnel
//!   requested by name, is refused (it cannot be checked).
//! - `tls_only` (default: port 443): on these ports the first bytes must be a TLS handshake;
//!   plain bytes, a server that speaks first, or silence past the time limit are refused.
//!   On other ports non-TLS bytes pass, and a ClientHello, when there is one, is checked.
//! - A first record that looks like TLS but is not a readable ClientHello never passes a
//!   name check: a hello crafted to confuse the parser but not the server could carry any
//!   name.

use std::fmt;

use crate::target::Target;

/// How the server name of a ClientHello is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SniMode {
    /// The server name must be the requested host.
    #[default]
    MustMatch,
    /// Not checked.
    Off,
}

/// Which tunnels must carry TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsOnly {
    /// Every tunnel.
    All,
    /// None.
    Never,
    /// Tunnels to these ports.
    Ports(Vec<u16>),
}

impl Default for TlsOnly {
    fn default() -> Self {
        TlsOnly::Ports(vec![443])
    }
}

/// `spec.network.tunnels`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelRules {
    pub sni: SniMode,
    /// A ClientHello without a server name passes (in a tunnel requested by name).
    pub allow_missing_sni: bool,
    pub tls_only: TlsOnly,
    /// How long the proxy waits for the client's first record, in milliseconds.
    pub first_bytes_timeout_ms: u64,
}

/// The default wait for a client's first bytes.
pub const DEFAULT_FIRST_BYTES_TIMEOUT_MS: u64 = 10_000;

impl Default for TunnelRules {
    fn default() -> Self {
        TunnelRules {
            sni: SniMode::MustMatch,
            allow_missing_sni: false,
            tls_only: TlsOnly::default(),
            first_bytes_timeout_ms: DEFAULT_FIRST_BYTES_TIMEOUT_MS,
        }
    }
}

/// What the client's first bytes turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstBytes<'a> {
    /// A complete TLS ClientHello, with its server name (a DNS name) if it has one.
    ClientHello { server_name: Option<&'a str> },
    /// Bytes that are not a TLS record.
    NotTls,
    /// A TLS handshake record that is not a readable ClientHello (malformed, cut short,
    /// oversized). Its name cannot be checked, so it never passes a name check.
    UnreadableHello,
    /// The server spoke first.
    ServerFirst,
    /// Nothing arrived within the time limit.
    Silent,
    /// The client closed its side of the tunnel without sending a byte.
    Closed,
}

/// Why a tunnel was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelRefusal {
    /// The ClientHello names another host (`seen`).
    SniMismatch { seen: String },
    /// The ClientHello names no host, in a tunnel requested by name.
    SniMissing,
    /// The tunnel must carry TLS and its first bytes are not a ClientHello.
    NotTls { what: NotTlsKind },
}

/// What a `tls_only` tunnel carried instead of a ClientHello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotTlsKind {
    Bytes,
    Unreadable,
    ServerFirst,
    Silent,
}

impl TunnelRefusal {
    /// The audit reason code.
    pub fn reason_code(&self) -> &'static str {
        match self {
            TunnelRefusal::SniMismatch { .. } => "sni_mismatch",
            TunnelRefusal::SniMissing => "sni_missing",
            TunnelRefusal::NotTls { .. } => "not_tls",
        }
    }

    /// The server name seen, if any.
    pub fn seen(&self) -> Option<&str> {
        match self {
            TunnelRefusal::SniMismatch { seen } => Some(seen),
            _ => None,
        }
    }
}

impl fmt::Display for TunnelRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TunnelRefusal::SniMismatch { seen } => {
                write!(f, "the TLS server name {seen:?} is not the requested host")
            }
            TunnelRefusal::SniMissing => f.write_str("the TLS ClientHello names no server"),
            TunnelRefusal::NotTls { what } => f.write_str(match what {
                NotTlsKind::Bytes => {
                    "the tunnel must carry TLS and its first bytes are not a TLS ClientHello"
                }
                NotTlsKind::Unreadable => "the first bytes are a TLS record but not a readable ClientHello",
                NotTlsKind::ServerFirst => "the tunnel must carry TLS and the server spoke first",
                NotTlsKind::Silent => "the tunnel must carry TLS and no ClientHello arrived in time",
            }),
        }
    }
}

impl TunnelRules {
    /// Whether a tunnel to `port` must carry TLS.
    pub fn tls_only(&self, port: u16) -> bool {
        match &self.tls_only {
            TlsOnly::All => true,
            TlsOnly::Never => false,
            TlsOnly::Ports(ports) => ports.contains(&port),
        }
    }

    /// Whether the proxy reads a tunnel's first bytes at all (when neither check applies,
    /// the tunnel is relayed from its first byte, as before).
    pub fn inspects(&self, port: u16) -> bool {
        self.sni == SniMode::MustMatch || self.tls_only(port)
    }

    /// Whether a tunnel to `target` that began with `seen` may go on.
    pub fn check(&self, target: &Target, seen: &FirstBytes<'_>) -> Result<(), TunnelRefusal> {
        let not_tls = |what| {
            if self.tls_only(target.port) {
                Err(TunnelRefusal::NotTls { what })
            } else {
                Ok(())
            }
        };
        match seen {
            // Nothing sent, but the server's answer (a banner) could still come back.
            FirstBytes::Closed => not_tls(NotTlsKind::Silent),
            FirstBytes::NotTls => not_tls(NotTlsKind::Bytes),
            // What cannot be read cannot be checked: refused wherever a name is checked.
            FirstBytes::UnreadableHello if self.sni == SniMode::MustMatch => Err(TunnelRefusal::NotTls {
                what: NotTlsKind::Unreadable,
            }),
            FirstBytes::UnreadableHello => not_tls(NotTlsKind::Unreadable),
            FirstBytes::ServerFirst => not_tls(NotTlsKind::ServerFirst),
            FirstBytes::Silent => not_tls(NotTlsKind::Silent),
            FirstBytes::ClientHello { server_name } => {
                if self.sni == SniMode::Off {
                    return Ok(());
                }
                match (target.host.name(), server_name) {
                    (Some(wanted), Some(seen)) if same_name(wanted.as_str(), seen) => Ok(()),
                    (Some(_), None) if self.allow_missing_sni => Ok(()),
                    (Some(_), None) => Err(TunnelRefusal::SniMissing),
                    (None, None) => Ok(()),
                    (_, Some(seen)) => Err(TunnelRefusal::SniMismatch {
                        seen: printable(seen),
                    }),
                }
            }
        }
    }
}

/// ASCII case-insensitive, one trailing dot ignored on either side.
fn same_name(wanted: &str, seen: &str) -> bool {
    let strip = |s: &'_ str| s.strip_suffix('.').unwrap_or(s).to_owned();
    strip(wanted).eq_ignore_ascii_case(&strip(seen))
}

/// A name from the wire, safe to log: at most 255 bytes, control characters escaped.
fn printable(seen: &str) -> String {
    seen.chars().take(255).flat_map(char::escape_debug).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::parse_connect_target;

    fn t(s: &str) -> Target {
        parse_connect_target(s).unwrap_or_else(|e| unreachable!("{s}: {e}"))
    }

    fn hello(name: Option<&str>) -> FirstBytes<'_> {
        FirstBytes::ClientHello { server_name: name }
    }

    #[test]
    fn the_server_name_must_be_the_requested_host() {
        let r = TunnelRules::default();
        let target = t("api.example.com:443");
        assert_eq!(r.check(&target, &hello(Some("api.example.com"))), Ok(()));
        assert_eq!(r.check(&target, &hello(Some("API.Example.COM."))), Ok(()));
        assert_eq!(
            r.check(&target, &hello(Some("front.example.net"))),
            Err(TunnelRefusal::SniMismatch {
                seen: "front.example.net".into()
            })
        );
        // A subdomain or a parent is another name.
        assert!(r.check(&target, &hello(Some("x.api.example.com"))).is_err());
        assert!(r.check(&target, &hello(Some("example.com"))).is_err());
        assert_eq!(r.check(&target, &hello(None)), Err(TunnelRefusal::SniMissing));
        let lenient = TunnelRules {
            allow_missing_sni: true,
            ..TunnelRules::default()
        };
        assert_eq!(lenient.check(&target, &hello(None)), Ok(()));
        assert!(lenient.check(&target, &hello(Some("other.example"))).is_err());
    }

    #[test]
    fn an_ip_literal_tunnel_may_carry_no_name() {
        let r = TunnelRules::default();
        let target = t("192.0.2.7:443");
        assert_eq!(r.check(&target, &hello(None)), Ok(()));
        assert!(r.check(&target, &hello(Some("bank.example"))).is_err());
    }

    #[test]
    fn tls_only_ports_refuse_everything_but_a_client_hello() {
        let r = TunnelRules::default();
        let https = t("a.example:443");
        let other = t("a.example:5432");
        for seen in [FirstBytes::NotTls, FirstBytes::ServerFirst, FirstBytes::Silent] {
            assert_eq!(
                r.check(&https, &seen).map_err(|e| e.reason_code()),
                Err("not_tls"),
                "{seen:?}"
            );
            assert_eq!(r.check(&other, &seen), Ok(()), "{seen:?}");
        }
        // A ClientHello on another port is still checked, and one that cannot be read is
        // refused (it could carry any name).
        assert!(r.check(&other, &hello(Some("b.example"))).is_err());
        assert!(r.check(&other, &FirstBytes::UnreadableHello).is_err());
        assert!(r.check(&https, &FirstBytes::Closed).is_err());
        assert_eq!(r.check(&other, &FirstBytes::Closed), Ok(()));
        let all = TunnelRules {
            tls_only: TlsOnly::All,
            ..TunnelRules::default()
        };
        assert!(all.check(&other, &FirstBytes::NotTls).is_err());
    }

    #[test]
    fn off_checks_nothing_but_tls_only() {
        let r = TunnelRules {
            sni: SniMode::Off,
            tls_only: TlsOnly::Never,
            ..TunnelRules::default()
        };
        assert!(!r.inspects(443));
        let target = t("a.example:443");
        assert_eq!(r.check(&target, &hello(Some("z.example"))), Ok(()));
        assert_eq!(r.check(&target, &FirstBytes::NotTls), Ok(()));
        assert_eq!(r.check(&target, &FirstBytes::UnreadableHello), Ok(()));
    }

    #[test]
    fn names_from_the_wire_are_logged_escaped_and_bounded() {
        let r = TunnelRules::default();
        let long = "a\n".repeat(400);
        let Err(TunnelRefusal::SniMismatch { seen }) = r.check(&t("a.example:443"), &hello(Some(&long)))
        else {
            unreachable!()
        };
        assert!(!seen.contains('\n') && seen.len() <= 510, "{seen}");
    }
}
