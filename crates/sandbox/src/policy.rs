//! The sandbox policy (YAML, see docs/sandbox.md): parsed with `${NAME}` parameters filled
//! in, then validated into a [`SandboxPolicy`] that cannot hold an invalid value.
//!
//! Pure apart from one injected question, "what is this host path's canonical form?"
//! ([`crate::paths::Resolve`]), so tests need no files. Every check sees the final network
//! mode (the command line's `--net` included) and canonical paths. Everything the platform
//! cannot enforce is an error, never silently ignored.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use sandgate_policy::{Pattern, preset};
use serde::Deserialize;

use crate::paths::{self, Alias, Resolve};

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

/// `net.proxy.upstream: [https://HOST:PORT, ...]` with `net.proxy.tls`: the run's proxy is
/// a node-local proxy of these central proxies (docs/central.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CentralSpec {
    pub upstreams: Vec<String>,
    /// The CA of the central proxies' certificates.
    pub ca: PathBuf,
    /// The node's certificate and key.
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A validated sandbox policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPolicy {
    pub env_set: BTreeMap<String, String>,
    pub env_passthrough: Vec<String>,
    pub allow_read_all: bool,
    pub allow_write_all: bool,
    /// Canonical host paths (symlinks resolved), bound at the same place.
    pub read_paths: Vec<PathBuf>,
    pub write_paths: Vec<PathBuf>,
    /// Symlinks inside the sandbox from paths as the policy wrote them to their targets.
    pub aliases: Vec<Alias>,
    pub private_tmp: bool,
    pub net: NetMode,
    pub allow: Vec<Pattern>,
    /// `proxy` mode: the HTTP proxy that allowed traffic is chained through.
    pub upstream_proxy: Option<SocketAddr>,
    /// `proxy` mode with `https://` upstreams: the central proxies, over mutual TLS.
    pub central: Option<CentralSpec>,
    /// Host loopback ports bridged into the sandbox's loopback, same port number.
    pub loopback_ports: Vec<u16>,
    /// Port the proxy listens on inside the sandbox.
    pub proxy_port: u16,
    /// Port the proxy's SOCKS5 front end listens on inside the sandbox, in the proxied
    /// modes (see [`proxy_ports`]).
    pub socks_port: Option<u16>,
    /// `ALL_PROXY` names the HTTP proxy instead of the SOCKS5 port (`net.proxy.all_proxy:
    /// http`), for clients that cannot speak SOCKS5 yet read `ALL_PROXY` (httpx without
    /// `socksio`, and so the OpenAI and Anthropic Python SDKs).
    pub all_proxy_http: bool,
    pub allow_ranges: Vec<String>,
    pub resolver_servers: Vec<String>,
    pub unshare_pid: bool,
    pub unshare_ipc: bool,
    /// `platform.seccomp.allow_unix_sockets`: the command may create `AF_UNIX` sockets.
    pub allow_unix_sockets: bool,
    pub extra_ro_binds: Vec<PathBuf>,
    pub extra_rw_binds: Vec<PathBuf>,
    pub extra_tmpfs: Vec<PathBuf>,
}

/// What is wrong with a policy; the message names the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    env: RawEnv,
    #[serde(default)]
    fs: RawFs,
    #[serde(default)]
    net: RawNet,
    #[serde(default)]
    platform: RawPlatform,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnv {
    #[serde(default)]
    set: BTreeMap<String, String>,
    #[serde(default)]
    passthrough: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFs {
    #[serde(default)]
    allow_read_all: bool,
    #[serde(default)]
    allow_write_all: bool,
    #[serde(default)]
    read_paths: Vec<String>,
    #[serde(default)]
    write_paths: Vec<String>,
    #[serde(default)]
    tmp: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNet {
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    allow_domains: Vec<String>,
    #[serde(default)]
    presets: Vec<String>,
    #[serde(default)]
    loopback_ports: Vec<u16>,
    #[serde(default)]
    proxy: Option<RawProxy>,
    #[serde(default)]
    allow_ranges: Vec<String>,
    #[serde(default)]
    resolver: Option<RawResolver>,
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
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResolver {
    #[serde(default)]
    servers: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlatform {
    #[serde(default)]
    bwrap: RawBwrap,
    #[serde(default)]
    seatbelt: Option<serde_json::Value>,
    #[serde(default)]
    seccomp: RawSeccomp,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSeccomp {
    #[serde(default)]
    allow_unix_sockets: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBwrap {
    #[serde(default)]
    ro_bind: Vec<String>,
    #[serde(default)]
    rw_bind: Vec<String>,
    #[serde(default)]
    tmpfs: Vec<String>,
    #[serde(default)]
    unshare: Option<RawUnshare>,
    #[serde(default)]
    devices: Option<Vec<Option<String>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUnshare {
    #[serde(default)]
    pid: Option<bool>,
    #[serde(default)]
    ipc: Option<bool>,
}

/// Whether a parameter value can be pasted into the policy text as it is: letters, digits
/// and `/ . _ - + = ~`, not starting with `-`. Anything else (a quote, a comma, a bracket,
/// a newline, `#`, `:`) could end the scalar it stands in and add entries of its own, such as
/// another writable path.
pub fn safe_param(value: &str) -> bool {
    !value.is_empty()
        && !value.starts_with('-')
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-' | b'+' | b'=' | b'~'))
}

/// Fills `${NAME}` from `params`; an unknown name is an error, and so is a value that is not
/// plain (see [`safe_param`]), since it is pasted into the YAML text.
pub fn substitute(text: &str, params: &BTreeMap<String, String>) -> Result<String, PolicyError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(rest.get(..start).unwrap_or_default());
        let after = rest.get(start + 2..).unwrap_or_default();
        let end = after
            .find('}')
            .ok_or_else(|| PolicyError("unterminated ${ in policy".to_owned()))?;
        let name = after.get(..end).unwrap_or_default();
        let value = params.get(name).ok_or_else(|| {
            PolicyError(format!(
                "parameter ${{{name}}} is not set (use --param {name}=VALUE)"
            ))
        })?;
        if !safe_param(value) {
            return Err(PolicyError(format!(
                "parameter {name}: {value:?} may hold only letters, digits and / . _ - + = ~ (and not start with -)"
            )));
        }
        out.push_str(value);
        rest = after.get(end + 1..).unwrap_or_default();
    }
    out.push_str(rest);
    Ok(out)
}

/// The host paths of one field, canonical, with their aliases.
struct Bound {
    canonical: Vec<PathBuf>,
    aliases: Vec<Alias>,
}

fn bind_list(field: &str, list: &[String], resolve: Resolve<'_>) -> Result<Bound, PolicyError> {
    let mut bound = Bound {
        canonical: Vec::new(),
        aliases: Vec::new(),
    };
    for value in list {
        let (canonical, alias) = paths::resolve(field, value, resolve)?;
        bound.canonical.push(canonical);
        bound.aliases.extend(alias);
    }
    Ok(bound)
}

/// Parses and validates a policy. `resolve` answers what a host path's canonical form is;
/// `net_override` is the command line's `--net`, applied before any check.
pub fn parse(
    text: &str,
    params: &BTreeMap<String, String>,
    resolve: Resolve<'_>,
    net_override: Option<NetMode>,
) -> Result<SandboxPolicy, PolicyError> {
    let text = substitute(text, params)?;
    let raw: Raw = serde_saphyr::from_str(&text).map_err(|e| {
        let line = e.location().map_or(0, |l| l.line());
        PolicyError(format!(
            "line {line}: {}",
            e.to_string().lines().next().unwrap_or("invalid YAML")
        ))
    })?;
    let net = match net_override {
        Some(mode) => mode,
        None => NetMode::parse(raw.net.mode.as_deref().unwrap_or("none"))?,
    };
    let network = network(&raw.net, net)?;
    check_env(&raw.env)?;
    check_platform(&raw.platform, net)?;
    let fields = [
        ("fs.read_paths", &raw.fs.read_paths),
        ("fs.write_paths", &raw.fs.write_paths),
        ("platform.bwrap.ro_bind", &raw.platform.bwrap.ro_bind),
        ("platform.bwrap.rw_bind", &raw.platform.bwrap.rw_bind),
    ];
    let mut bound = Vec::with_capacity(fields.len());
    for (field, list) in fields {
        let b = bind_list(field, list, resolve)?;
        if net != NetMode::All {
            refuse_socket_dirs(field, list, &b.canonical)?;
        }
        bound.push(b);
    }
    // Host Unix sockets (docker.sock, an SSH agent, D-Bus) would be a way out of any
    // restricted network mode. The seccomp filter denies AF_UNIX sockets; refusing the paths
    // that hold them is the first layer, and stays even when a policy allows Unix sockets.
    if net != NetMode::All && (raw.fs.allow_read_all || raw.fs.allow_write_all) {
        return Err(PolicyError(format!(
            "fs.allow_read_all/allow_write_all with net.mode {} would expose host Unix sockets (docker.sock, ssh-agent, D-Bus); list read_paths instead",
            net.name()
        )));
    }
    let private_tmp = match raw.fs.tmp.as_deref() {
        None | Some("private") => true,
        Some("none") => false,
        Some(other) => return Err(PolicyError(format!("fs.tmp: {other:?}: use private or none"))),
    };
    let unshare = raw.platform.bwrap.unshare.unwrap_or_default();
    let [read, write, ro, rw] =
        <[Bound; 4]>::try_from(bound).map_err(|_| PolicyError("internal: path fields".to_owned()))?;
    let aliases = [&read, &write, &ro, &rw]
        .iter()
        .flat_map(|b| b.aliases.iter().cloned())
        .collect();
    Ok(SandboxPolicy {
        env_set: raw.env.set,
        env_passthrough: raw.env.passthrough,
        allow_read_all: raw.fs.allow_read_all,
        allow_write_all: raw.fs.allow_write_all,
        read_paths: read.canonical,
        write_paths: write.canonical,
        aliases,
        private_tmp,
        net,
        allow: network.allow,
        loopback_ports: raw.net.loopback_ports,
        upstream_proxy: network.upstream_proxy,
        central: network.central,
        proxy_port: network.proxy_port,
        socks_port: network.socks_port,
        all_proxy_http: network.all_proxy_http,
        allow_ranges: raw.net.allow_ranges,
        resolver_servers: raw.net.resolver.map(|r| r.servers).unwrap_or_default(),
        unshare_pid: unshare.pid.unwrap_or(true),
        unshare_ipc: unshare.ipc.unwrap_or(true),
        allow_unix_sockets: raw.platform.seccomp.allow_unix_sockets,
        extra_ro_binds: ro.canonical,
        extra_rw_binds: rw.canonical,
        extra_tmpfs: raw.platform.bwrap.tmpfs.iter().map(PathBuf::from).collect(),
    })
}

fn refuse_socket_dirs(field: &str, written: &[String], canonical: &[PathBuf]) -> Result<(), PolicyError> {
    for (value, path) in written.iter().zip(canonical) {
        if paths::may_hold_host_sockets(path) {
            return Err(PolicyError(format!(
                "{field}: {value:?} ({}) may hold host Unix sockets (a way around a restricted network); bind something narrower",
                path.display()
            )));
        }
    }
    Ok(())
}

/// The validated `net` section.
struct Network {
    allow: Vec<Pattern>,
    upstream_proxy: Option<SocketAddr>,
    central: Option<CentralSpec>,
    proxy_port: u16,
    socks_port: Option<u16>,
    all_proxy_http: bool,
}

fn network(raw: &RawNet, net: NetMode) -> Result<Network, PolicyError> {
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
            let central = CentralSpec {
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
    if !net.proxied() && (!allow.is_empty() || !raw.allow_ranges.is_empty()) {
        return Err(PolicyError(
            "net.allow_domains/presets/allow_ranges need net.mode allowlist".to_owned(),
        ));
    }
    Ok(Network {
        allow,
        upstream_proxy,
        central,
        proxy_port,
        socks_port,
        all_proxy_http,
    })
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

fn check_env(raw: &RawEnv) -> Result<(), PolicyError> {
    for p in &raw.passthrough {
        if p.trim_end_matches('*').is_empty() {
            return Err(PolicyError(format!(
                "env.passthrough: {p:?} would pass the whole host environment; list names, or prefixes such as LC_*"
            )));
        }
    }
    Ok(())
}

fn check_platform(raw: &RawPlatform, net: NetMode) -> Result<(), PolicyError> {
    if raw.seatbelt.as_ref().is_some_and(|v| {
        !v.is_null() && *v != serde_json::json!({}) && *v != serde_json::json!({"extra_allow": {}})
    }) {
        return Err(PolicyError(
            "platform.seatbelt: seatbelt settings cannot be enforced on Linux".to_owned(),
        ));
    }
    if let Some(devices) = &raw.bwrap.devices {
        for d in devices.iter().flatten() {
            if !["null", "zero", "full", "random", "urandom", "tty"].contains(&d.as_str()) {
                return Err(PolicyError(format!(
                    "platform.bwrap.devices: {d:?} is not in the minimal /dev"
                )));
            }
        }
    }
    // Without a PID namespace the command sees every host process, may signal the caller's,
    // and its double-forked children would outlive the run: only where nothing is
    // restricted anyway.
    let pid = raw.bwrap.unshare.as_ref().and_then(|u| u.pid);
    if pid == Some(false) && net != NetMode::All {
        return Err(PolicyError(format!(
            "platform.bwrap.unshare.pid: false needs net.mode all (here {}): without a PID namespace the command sees and can signal every process of this user",
            net.name()
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
