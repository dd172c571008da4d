//! The sandbox policy's `net` section: the network mode, the allowlist (`allow_domains`,
//! `presets`, and an `EgressPolicy` named by `egress_policy`), the proxy's ports inside the
//! sandbox, the upstream proxy of `proxy` mode, and bridged loopback ports.

use std::net::SocketAddr;

use sandgate_policy::document::{Entries, EntryList};
use sandgate_policy::{Pattern, preset};
use serde::Deserialize;

use super::PolicyError;
/// How the sandbox reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetMode {
    /// A private network namespace with nothing in it.
    None,
    /// The sandbox's own loopback only.
    Loopback,
    /// The host's network, unfiltered.
    All,
    /// Only through sandgate's proxy, enforcing `allow_domains` and `presets`.
    Allowlist,
    /// As allowlist, forwarding allowed traffic to an upstream proxy.
    Proxy,
}

impl NetMode {
    pub fn parse(text: &str) -> Result<NetMode, PolicyError> {
        match text {
            "none" => Ok(NetMode::None),
            "loopback" => Ok(NetMode::Loopback),
            "all" => Ok(NetMode::All),
            "allowlist" => Ok(NetMode::Allowlist),
            "proxy" => Ok(NetMode::Proxy),
            other => Err(PolicyError(format!(
                "net mode {other:?}: use none, loopback, all, allowlist or proxy"
            ))),
        }
    }

    /// The mode as the policy spells it.
    pub fn name(self) -> &'static str {
        match self {
            NetMode::None => "none",
            NetMode::Loopback => "loopback",
            NetMode::All => "all",
            NetMode::Allowlist => "allowlist",
            NetMode::Proxy => "proxy",
        }
    }

    /// Modes whose only way out is the proxy.
    pub fn proxied(self) -> bool {
        matches!(self, NetMode::Allowlist | NetMode::Proxy)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNet {
    #[serde(default)]
    pub(super) mode: Option<String>,
    #[serde(default)]
    pub(super) allow_domains: Vec<String>,
    #[serde(default)]
    pub(super) egress_policy: Option<String>,
    #[serde(default)]
    pub(super) allowlist: EntryList,
    #[serde(default)]
    pub(super) denylist: EntryList,
    #[serde(default)]
    pub(super) presets: Vec<String>,
    #[serde(default)]
    pub(super) loopback_ports: Vec<u16>,
    #[serde(default)]
    proxy: Option<RawProxy>,
    #[serde(default)]
    pub(super) allow_ranges: Vec<String>,
    #[serde(default)]
    pub(super) resolver: Option<RawResolver>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxy {
    #[serde(default)]
    listen: Option<String>,
    #[serde(default)]
    socks_listen: Option<String>,
    #[serde(default)]
    upstream: Option<Upstreams>,
    #[serde(default)]
    all_proxy: Option<String>,
    /// For `https://` upstreams: the node's TLS files.
    #[serde(default)]
    tls: Option<RawNodeTls>,
}

/// `net.proxy.upstream`: one, or a list (central proxies tried in order).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Upstreams {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNodeTls {
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawResolver {
    #[serde(default)]
    pub(super) servers: Vec<String>,
}

/// The validated `net` section.
pub(super) struct Network {
    pub(super) allow: Vec<Pattern>,
    pub(super) upstream_proxy: Option<SocketAddr>,
    pub(super) central: Option<super::CentralSpec>,
    pub(super) proxy_port: u16,
    pub(super) socks_port: Option<u16>,
    pub(super) all_proxy_http: bool,
    /// `net.allowlist` and `net.denylist`, validated.
    pub(super) entries: Entries,
}

pub(super) fn network(raw: &RawNet, net: NetMode, file: &str, now: i64) -> Result<Network, PolicyError> {
    let entries = sandgate_policy::document::entries(&raw.allowlist, &raw.denylist, "net", file, now)
        .map_err(|e| PolicyError(e.to_string()))?;
    let mut allow = Vec::new();
    for d in &raw.allow_domains {
        allow.push(Pattern::parse(d).map_err(|e| PolicyError(format!("net.allow_domains: {d:?}: {e}")))?);
    }
    for name in &raw.presets {
        let hosts = preset::hosts(name).ok_or_else(|| {
            PolicyError(format!(
                "net.presets: unknown preset {name:?} (known: {})",
                preset::NAMES.join(", ")
            ))
        })?;
        for h in hosts {
            allow.push(
                Pattern::parse(&format!("{h}:443"))
                    .map_err(|e| PolicyError(format!("preset {name}: {e}")))?,
            );
        }
    }
    if !raw.loopback_ports.is_empty() && !matches!(net, NetMode::Loopback | NetMode::Allowlist) {
        return Err(PolicyError(
            "net.loopback_ports needs net.mode loopback or allowlist".to_owned(),
        ));
    }
    if raw.loopback_ports.contains(&0) {
        return Err(PolicyError("net.loopback_ports: port 0".to_owned()));
    }
    let proxy = raw.proxy.as_ref();
    let (upstream_proxy, central) = upstreams(proxy, net)?;
    let (proxy_port, socks_port) = proxy_ports(raw, net)?;
    let all_proxy_http = match proxy.and_then(|p| p.all_proxy.as_deref()) {
        None | Some("socks5") => false,
        Some("http") => true,
        Some(other) => {
            return Err(PolicyError(format!(
                "net.proxy.all_proxy: {other:?}: use socks5 (the default) or http"
            )));
        }
    };
    let lists = !allow.is_empty() || !raw.allowlist.is_empty() || !raw.denylist.is_empty();
    if !net.proxied() && (lists || !raw.allow_ranges.is_empty() || raw.egress_policy.is_some()) {
        return Err(PolicyError(
            "net.allow_domains/allowlist/denylist/presets/allow_ranges/egress_policy need net.mode allowlist"
                .to_owned(),
        ));
    }
    if raw.egress_policy.as_deref().is_some_and(str::is_empty) {
        return Err(PolicyError("net.egress_policy: an empty path".to_owned()));
    }
    Ok(Network {
        allow,
        upstream_proxy,
        central,
        proxy_port,
        socks_port,
        all_proxy_http,
        entries,
    })
}

/// `net.proxy.upstream` (and `net.proxy.tls`): an HTTP proxy's `IP:PORT`, or central
/// sandgate proxies (`https://HOST:PORT`, one or a list) with the node's TLS files.
fn upstreams(
    proxy: Option<&RawProxy>,
    net: NetMode,
) -> Result<(Option<SocketAddr>, Option<super::CentralSpec>), PolicyError> {
    let upstreams: Vec<&str> = match proxy.and_then(|p| p.upstream.as_ref()) {
        None => Vec::new(),
        Some(Upstreams::One(u)) => vec![u.as_str()],
        Some(Upstreams::Many(list)) => list.iter().map(String::as_str).collect(),
    };
    let tls = proxy.and_then(|p| p.tls.as_ref());
    let (upstream_proxy, central) = match (net, upstreams.as_slice()) {
        (NetMode::Proxy, []) => {
            return Err(PolicyError(
                "net.mode proxy needs net.proxy.upstream (IP:PORT of an HTTP proxy, or https://HOST:PORT of central sandgate proxies)".to_owned(),
            ));
        }
        (NetMode::Proxy, list) if list.iter().all(|u| u.starts_with("https://")) => {
            let Some(tls) = tls else {
                return Err(PolicyError(
                    "net.proxy.upstream https://...: give net.proxy.tls: { ca, cert, key } (the central proxies' CA, this node's certificate and key)".to_owned(),
                ));
            };
            let central = super::CentralSpec {
                upstreams: list.iter().map(|u| (*u).to_owned()).collect(),
                ca: tls.ca.clone(),
                cert: tls.cert.clone(),
                key: tls.key.clone(),
            };
            (None, Some(central))
        }
        (NetMode::Proxy, [u]) => {
            let addr = u.parse::<SocketAddr>().map_err(|_| {
                PolicyError(format!(
                    "net.proxy.upstream: {u:?} is not IP:PORT or https://HOST:PORT"
                ))
            })?;
            (Some(addr), None)
        }
        (NetMode::Proxy, _) => {
            return Err(PolicyError(
                "net.proxy.upstream: a list is for central proxies, each https://HOST:PORT".to_owned(),
            ));
        }
        (_, []) => (None, None),
        (_, _) => return Err(PolicyError("net.proxy.upstream needs net.mode proxy".to_owned())),
    };
    if tls.is_some() && central.is_none() {
        return Err(PolicyError(
            "net.proxy.tls is for https:// upstreams (central proxies)".to_owned(),
        ));
    }
    Ok((upstream_proxy, central))
}

/// The ports of the run's proxy inside the sandbox: HTTP (`net.proxy.listen`) and, in
/// `allowlist` mode, SOCKS5 (`net.proxy.socks_listen`), distinct from each other and from
/// `net.loopback_ports`.
///
/// `net.mode: proxy` gets no SOCKS5 port: the chained dialer asks the upstream proxy for a
/// tunnel only for HTTP CONNECT, so a SOCKS5 tunnel would reach the upstream proxy itself,
/// and through it destinations the run's allowlist refuses.
fn proxy_ports(raw: &RawNet, net: NetMode) -> Result<(u16, Option<u16>), PolicyError> {
    let proxy = raw.proxy.as_ref();
    let proxy_port = loopback_port("net.proxy.listen", proxy.and_then(|p| p.listen.as_deref()), 3128)?;
    let socks_listen = proxy.and_then(|p| p.socks_listen.as_deref());
    let socks_port = loopback_port("net.proxy.socks_listen", socks_listen, 1080)?;
    if !net.proxied() {
        return Ok((proxy_port, None));
    }
    if socks_port == proxy_port {
        return Err(PolicyError(format!(
            "net.proxy.socks_listen: port {socks_port} is also the HTTP proxy's (net.proxy.listen); give each its own port"
        )));
    }
    for (port, what) in [
        (proxy_port, "the HTTP proxy's port (net.proxy.listen)"),
        (socks_port, "the SOCKS5 port (net.proxy.socks_listen)"),
    ] {
        if raw.loopback_ports.contains(&port) {
            return Err(PolicyError(format!(
                "net.loopback_ports: {port} is {what}; move one of them"
            )));
        }
    }
    Ok((proxy_port, Some(socks_port)))
}

/// A proxy port inside the sandbox from `field` (loopback `IP:PORT`; port 0 or no value
/// means `default`). Only the port is used: the init listens on `127.0.0.1`.
fn loopback_port(field: &str, value: Option<&str>, default: u16) -> Result<u16, PolicyError> {
    let Some(l) = value else {
        return Ok(default);
    };
    let addr: SocketAddr = l
        .parse()
        .map_err(|_| PolicyError(format!("{field}: {l:?} is not IP:PORT")))?;
    if !addr.ip().is_loopback() {
        return Err(PolicyError(format!("{field}: {l:?} must be a loopback address")));
    }
    Ok(if addr.port() == 0 { default } else { addr.port() })
}
