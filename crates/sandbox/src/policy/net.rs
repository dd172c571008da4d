//! The sandbox policy's `net` section: the network mode (with the design's
//! `platform.bwrap.unshare.net`, and the command line's `--net`, which wins over the
//! section), the allowlist (`allow_domains`, `presets`, and an `EgressPolicy` named by
//! `egress_policy`), the proxy's ports inside the sandbox, the upstream proxy of `proxy`
//! mode (an address, or a name resolved at run start: [`super::upstream`]), bridged
//! loopback ports, and the control plane the run's proxy follows (`net.exceptions`). Pure.

use std::net::SocketAddr;

use sandgate_policy::document::{Entries, EntryList};
use sandgate_policy::{Host, Pattern, Target, preset};
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
    /// The design's name for the same: a proxy the runner manages; with
    /// `net.proxy.upstream`, allowed traffic is forwarded to that proxy.
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
    /// Secrets bound to a host and a header; the command holds placeholders.
    #[serde(default)]
    pub(super) credentials: sandgate_policy::document::credentials::CredentialList,
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
    #[serde(default)]
    exceptions: Option<super::exceptions::RawExceptions>,
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

/// `net.proxy.upstream` naming an HTTP proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum UpstreamProxy {
    Addr(SocketAddr),
    /// `HOST:PORT`: resolved once at run start, through the run's resolver.
    Name(Target),
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
    pub(super) upstream_proxy: Option<UpstreamProxy>,
    pub(super) central: Option<super::CentralSpec>,
    pub(super) proxy_port: u16,
    pub(super) socks_port: Option<u16>,
    pub(super) all_proxy_http: bool,
    /// `net.allowlist` and `net.denylist`, validated.
    pub(super) entries: Entries,
    /// `net.credentials`, validated (their secrets read when the run starts).
    pub(super) credentials: Vec<sandgate_policy::document::credentials::CredentialSpec>,
    pub(super) exceptions: Option<super::exceptions::ExceptionsFeed>,
}

/// The network mode from `net.mode` and the design's `platform.bwrap.unshare.net`: `false`
/// shares the host's network (`all`), `true` is a namespace of the sandbox's own (every other
/// mode). Without `net.mode`, `unshare.net` decides (`false`: all, `true`: none); with both,
/// they must agree.
pub(super) fn mode(written: Option<&str>, unshare_net: Option<bool>) -> Result<NetMode, PolicyError> {
    let mode = written.map(NetMode::parse).transpose()?;
    match (mode, unshare_net) {
        (Some(mode), None) => Ok(mode),
        (None, None | Some(true)) => Ok(NetMode::None),
        (None, Some(false)) => Ok(NetMode::All),
        (Some(NetMode::All), Some(true)) => Err(PolicyError(
            "platform.bwrap.unshare.net: true gives the sandbox a network of its own, but net.mode all is the host's network; drop one of them".to_owned(),
        )),
        (Some(NetMode::All), Some(false)) => Ok(NetMode::All),
        (Some(mode), Some(true)) => Ok(mode),
        (Some(mode), Some(false)) => Err(PolicyError(format!(
            "platform.bwrap.unshare.net: false is the host's network (net.mode all), but net.mode is {}; drop one of them",
            mode.name()
        ))),
    }
}

/// The command line's `--net MODE` wins over the policy: the fields of `raw` (and
/// `platform.bwrap.unshare.net`) that do not apply to `mode` are set aside, and their names
/// returned for the one note that says so.
pub(super) fn set_aside(raw: &mut RawNet, unshare_net: Option<bool>, mode: NetMode) -> Vec<&'static str> {
    let mut ignored = Vec::new();
    let mut note = |present: bool, name: &'static str| {
        if present {
            ignored.push(name);
        }
        present
    };
    if !mode.proxied() {
        if note(!raw.allow_domains.is_empty(), "net.allow_domains") {
            raw.allow_domains.clear();
        }
        if note(!raw.allowlist.is_empty(), "net.allowlist") {
            raw.allowlist = EntryList::default();
        }
        if note(!raw.denylist.is_empty(), "net.denylist") {
            raw.denylist = EntryList::default();
        }
        if note(!raw.presets.is_empty(), "net.presets") {
            raw.presets.clear();
        }
        if note(!raw.allow_ranges.is_empty(), "net.allow_ranges") {
            raw.allow_ranges.clear();
        }
        if note(raw.egress_policy.is_some(), "net.egress_policy") {
            raw.egress_policy = None;
        }
        if note(raw.resolver.is_some(), "net.resolver") {
            raw.resolver = None;
        }
        if note(raw.proxy.is_some(), "net.proxy") {
            raw.proxy = None;
        }
        if note(raw.exceptions.is_some(), "net.exceptions") {
            raw.exceptions = None;
        }
    }
    if mode == NetMode::Allowlist
        && let Some(proxy) = raw.proxy.as_mut()
    {
        if note(proxy.upstream.is_some(), "net.proxy.upstream") {
            proxy.upstream = None;
        }
        if note(proxy.tls.is_some(), "net.proxy.tls") {
            proxy.tls = None;
        }
    }
    let ports_apply = matches!(mode, NetMode::Loopback | NetMode::Allowlist)
        || (mode == NetMode::Proxy && raw.proxy.as_ref().is_none_or(|p| p.upstream.is_none()));
    if note(
        !ports_apply && !raw.loopback_ports.is_empty(),
        "net.loopback_ports",
    ) {
        raw.loopback_ports.clear();
    }
    let agrees = unshare_net.is_none_or(|unshared| unshared == (mode != NetMode::All));
    note(!agrees, "platform.bwrap.unshare.net");
    ignored
}

pub(super) fn network(raw: &RawNet, net: NetMode, file: &str, now: i64) -> Result<Network, PolicyError> {
    let mut entries = sandgate_policy::document::entries(&raw.allowlist, &raw.denylist, "net", file, now)
        .map_err(|e| PolicyError(e.to_string()))?;
    let mut allow = Vec::new();
    for d in &raw.allow_domains {
        allow.push(Pattern::parse(d).map_err(|e| PolicyError(format!("net.allow_domains: {d:?}: {e}")))?);
    }
    // A preset's entries (port 443 each, some read-only) join `net.allowlist`'s.
    for name in &raw.presets {
        let preset = preset::entries(name).ok_or_else(|| {
            PolicyError(format!(
                "net.presets: unknown preset {name:?} (known: {})",
                preset::NAMES.join(", ")
            ))
        })?;
        entries.allow.extend(preset);
    }
    let credentials =
        sandgate_policy::document::credentials::embedded(&raw.credentials, "net.credentials", file)
            .map_err(|e| PolicyError(e.to_string()))?;
    let proxy = raw.proxy.as_ref();
    let (upstream_proxy, central) = upstreams(proxy, net)?;
    // `proxy` without an upstream is the design's runner-managed proxy: `allowlist` exactly.
    let own_proxy =
        net == NetMode::Allowlist || (net == NetMode::Proxy && upstream_proxy.is_none() && central.is_none());
    if !(raw.loopback_ports.is_empty() || net == NetMode::Loopback || own_proxy) {
        return Err(PolicyError(
            "net.loopback_ports needs net.mode loopback, allowlist, or proxy without net.proxy.upstream"
                .to_owned(),
        ));
    }
    if raw.loopback_ports.contains(&0) {
        return Err(PolicyError("net.loopback_ports: port 0".to_owned()));
    }
    let (proxy_port, socks_port) = proxy_ports(raw, net)?;
    // httpx (and so the OpenAI and Anthropic Python SDKs) builds a transport for every proxy
    // variable and fails without `socksio` when `ALL_PROXY` names a SOCKS5 proxy: the HTTP
    // proxy unless the policy asks for SOCKS5.
    let all_proxy_http = match proxy.and_then(|p| p.all_proxy.as_deref()) {
        None | Some("http") => true,
        Some("socks5") => false,
        Some(other) => {
            return Err(PolicyError(format!(
                "net.proxy.all_proxy: {other:?}: use http (the default) or socks5"
            )));
        }
    };
    let lists =
        !allow.is_empty() || !entries.allow.is_empty() || !raw.denylist.is_empty() || !credentials.is_empty();
    if !net.proxied() && (lists || !raw.allow_ranges.is_empty() || raw.egress_policy.is_some()) {
        return Err(PolicyError(
            "net.allow_domains/allowlist/denylist/presets/allow_ranges/egress_policy need net.mode allowlist or proxy"
                .to_owned(),
        ));
    }
    let exceptions = raw
        .exceptions
        .as_ref()
        .map(|e| super::exceptions::feed(e, own_proxy))
        .transpose()?;
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
        credentials,
        exceptions,
    })
}

/// `net.proxy.upstream` (and `net.proxy.tls`): none (`null`, or no key: the run's proxy
/// dials out itself), an HTTP proxy's `IP:PORT` or `HOST:PORT`, or central sandgate proxies
/// (`https://HOST:PORT`, one or a list) with the node's TLS files.
fn upstreams(
    proxy: Option<&RawProxy>,
    net: NetMode,
) -> Result<(Option<UpstreamProxy>, Option<super::CentralSpec>), PolicyError> {
    let upstreams: Vec<&str> = match proxy.and_then(|p| p.upstream.as_ref()) {
        None => Vec::new(),
        Some(Upstreams::One(u)) => vec![u.as_str()],
        Some(Upstreams::Many(list)) => list.iter().map(String::as_str).collect(),
    };
    let tls = proxy.and_then(|p| p.tls.as_ref());
    let (upstream_proxy, central) = match (net, upstreams.as_slice()) {
        (_, []) => (None, None),
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
        (NetMode::Proxy, [u]) => (Some(upstream_proxy(u)?), None),
        (NetMode::Proxy, _) => {
            return Err(PolicyError(
                "net.proxy.upstream: a list is for central proxies, each https://HOST:PORT".to_owned(),
            ));
        }
        (_, _) => return Err(PolicyError("net.proxy.upstream needs net.mode proxy".to_owned())),
    };
    if tls.is_some() && central.is_none() {
        return Err(PolicyError(
            "net.proxy.tls is for https:// upstreams (central proxies)".to_owned(),
        ));
    }
    Ok((upstream_proxy, central))
}

/// An HTTP upstream proxy: `IP:PORT` (`[v6]:PORT`), or `HOST:PORT` with a name to resolve
/// at run start.
fn upstream_proxy(written: &str) -> Result<UpstreamProxy, PolicyError> {
    if let Ok(addr) = written.parse::<SocketAddr>() {
        return Ok(UpstreamProxy::Addr(addr));
    }
    let bad = || {
        PolicyError(format!(
            "net.proxy.upstream: {written:?} is not IP:PORT, HOST:PORT or https://HOST:PORT"
        ))
    };
    let target = sandgate_policy::parse_connect_target(written).map_err(|_| bad())?;
    match target.host {
        // An address the socket-address grammar refused (`127.1:3128`): not a name either.
        Host::Ip(_) => Err(bad()),
        Host::Name(_) => Ok(UpstreamProxy::Name(target)),
    }
}

/// The ports of the run's proxy inside the sandbox: HTTP (`net.proxy.listen`) and, in the
/// proxied modes, SOCKS5 (`net.proxy.socks_listen`), distinct from each other and from
/// `net.loopback_ports`. Chained (`net.mode: proxy` with an upstream), each SOCKS5 tunnel is
/// asked of the upstream proxy as a CONNECT, never handed the raw connection to it.
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

#[cfg(test)]
#[path = "net_tests.rs"]
mod tests;
