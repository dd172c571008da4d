//! The sandbox policy (YAML, see docs/sandbox.md): parsed with `${NAME}` parameters filled
//! in, then validated into a [`SandboxPolicy`] that cannot hold an invalid value.
//!
//! Pure apart from one injected question, "what is this host path's canonical form?"
//! ([`crate::paths::Resolve`]), so tests need no files. Every check sees the final network
//! mode (the command line's `--net` included, which sets aside the policy's network fields
//! with a note) and canonical paths. Everything the platform cannot enforce is an error, never
//! silently ignored; the other platform's section (`platform.seatbelt` on Linux,
//! `platform.bwrap` under macOS's Seatbelt) is checked all the same and left to its backend.
//! Two steps are done at run start, not here: an upstream proxy's name is
//! resolved ([`upstream`], the one function of this module that does I/O), and the directory
//! the command starts in is chosen ([`start_dir`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use sandgate_policy::Pattern;
use serde::Deserialize;

pub use crate::error::PolicyError;
use crate::paths::{Alias, Resolve};

mod cwd;
mod exceptions;
mod fs;
mod header;
mod limits;
mod net;
mod seatbelt;
pub mod upstream;

pub use cwd::{StartDir, start_dir};
pub use exceptions::ExceptionsFeed;
use fs::{RawFs, host_paths};
pub use header::{API_VERSION, DEPRECATED_FORM, KIND, document_kind};
use header::{EGRESS_KIND, Peek, deprecated, header};
use limits::limits;
pub use limits::{Limits, RawLimits};
pub use net::NetMode;
use net::{RawNet, UpstreamProxy, network};
pub use seatbelt::{MachService, SeatbeltSettings};

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
    /// `metadata.name`, when the policy has one.
    pub name: Option<String>,
    /// What parses but should change, one line each as `file[:line]: warning: ...` (the
    /// deprecated form without `apiVersion`/`kind`, an entry already expired).
    pub warnings: Vec<String>,
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
    /// `fs.cwd`, canonical; `sandgate run` then puts here where the command starts
    /// ([`start_dir`]: `--chdir`, `fs.cwd`, or the caller's directory when it is bound),
    /// given to bwrap as `--chdir`. `None`: bwrap's own choice.
    pub cwd: Option<PathBuf>,
    pub net: NetMode,
    pub allow: Vec<Pattern>,
    /// `net.allowlist` and `net.denylist`: entries of the same model as an EgressPolicy's.
    /// An allow entry with methods or paths makes the run's proxy intercept TLS for its
    /// host ([`SandboxPolicy::intercepts`]).
    pub allow_entries: Vec<sandgate_policy::Entry>,
    pub deny_entries: Vec<sandgate_policy::Entry>,
    /// `net.credentials`: secrets bound to a host and a header, read from `sandgate run`'s
    /// environment when the run starts; the command gets only their placeholders.
    pub credentials: Vec<sandgate_policy::document::credentials::CredentialSpec>,
    /// `net.egress_policy`: an `EgressPolicy` file whose network section the run's proxy
    /// enforces too, as written (relative to the sandbox policy's directory).
    pub egress_policy: Option<PathBuf>,
    /// That file, parsed (filled in by [`crate::run::load_policy`], which reads files).
    pub egress: Option<Box<sandgate_policy::PolicyFile>>,
    /// `proxy` mode: the HTTP proxy that allowed traffic is chained through (`IP:PORT`, or
    /// the address [`upstream::resolve`] found for [`Self::upstream_proxy_name`]).
    pub upstream_proxy: Option<SocketAddr>,
    /// `proxy` mode with `upstream: HOST:PORT`: the name, resolved once at run start through
    /// the run's resolver ([`upstream::resolve`]), never by the system resolver.
    pub upstream_proxy_name: Option<sandgate_policy::Target>,
    /// `proxy` mode with `https://` upstreams: the central proxies, over mutual TLS.
    pub central: Option<CentralSpec>,
    /// `net.exceptions`: the control plane whose approved exceptions for the run's task the
    /// run's own proxy follows, within the bounds given there.
    pub exceptions: Option<ExceptionsFeed>,
    /// Host loopback ports bridged into the sandbox's loopback, same port number.
    pub loopback_ports: Vec<u16>,
    /// Port the proxy listens on inside the sandbox.
    pub proxy_port: u16,
    /// Port the proxy's SOCKS5 front end listens on inside the sandbox, in the proxied
    /// modes (see [`proxy_ports`]).
    pub socks_port: Option<u16>,
    /// `ALL_PROXY` names the HTTP proxy (the default, `net.proxy.all_proxy: http`), not the
    /// SOCKS5 port (`all_proxy: socks5`): clients that read `ALL_PROXY` but cannot speak
    /// SOCKS5 (httpx without `socksio`, and so the OpenAI and Anthropic Python SDKs) fail
    /// on a SOCKS5 URL.
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
    /// `limits:`, over the defaults.
    pub limits: Limits,
    /// `platform.seatbelt`, for the macOS backend (the bwrap backend ignores it).
    pub seatbelt: SeatbeltSettings,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default, rename = "apiVersion")]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<RawMetadata>,
    #[serde(default)]
    env: RawEnv,
    #[serde(default)]
    fs: RawFs,
    #[serde(default)]
    net: RawNet,
    #[serde(default)]
    platform: RawPlatform,
    #[serde(default)]
    limits: RawLimits,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
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
struct RawPlatform {
    #[serde(default)]
    bwrap: RawBwrap,
    #[serde(default)]
    seatbelt: Option<seatbelt::RawSeatbelt>,
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
    /// The design's spelling of the network mode: `false` is `net.mode: all`
    /// ([`net::mode`]).
    #[serde(default)]
    net: Option<bool>,
    #[serde(default)]
    pid: Option<bool>,
    #[serde(default)]
    ipc: Option<bool>,
}

impl SandboxPolicy {
    /// Whether the run's proxy intercepts TLS: the run is proxied and an allow entry (in
    /// `net.allowlist` or `net.egress_policy`) names methods or paths, or a secret is bound,
    /// or it follows a control plane (`net.exceptions`), whose exceptions may name methods
    /// and paths once the command runs. The sandbox then trusts the run's interception CA
    /// ([`crate::env`]); tunnels to hosts allowed without rules stay undecrypted.
    pub fn intercepts(&self) -> bool {
        let file = self.egress.iter().flat_map(|f| f.allow.iter());
        let secrets = self.all_credentials().next().is_some();
        let rules = self.allow_entries.iter().chain(file).any(|e| e.request.is_some());
        self.net.proxied() && (secrets || rules || self.exceptions.is_some())
    }

    /// Every bound secret of the run: `net.credentials`, then those of `net.egress_policy`.
    pub fn all_credentials(
        &self,
    ) -> impl Iterator<Item = &sandgate_policy::document::credentials::CredentialSpec> {
        let file = self.egress.iter().flat_map(|f| f.credentials.iter());
        self.credentials.iter().chain(file)
    }
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
        // `${env:NAME}` is a credential's secret (net.credentials), read by the run's proxy
        // from its own environment: kept as written, never a parameter.
        if name.starts_with("env:") {
            out.push_str(rest.get(start..start + 2 + end + 1).unwrap_or_default());
            rest = after.get(end + 1..).unwrap_or_default();
            continue;
        }
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

/// Parses and validates a policy. `resolve` answers what a host path's canonical form is;
/// `net_override` is the command line's `--net`, applied before any check. Entries with
/// `ttl_seconds` are anchored at the current time; [`parse_at`] takes the time and the
/// file's name for messages.
pub fn parse(
    text: &str,
    params: &BTreeMap<String, String>,
    resolve: Resolve<'_>,
    net_override: Option<NetMode>,
) -> Result<SandboxPolicy, PolicyError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    parse_at(text, params, resolve, net_override, "policy", now)
}

/// As [`parse`], with `file` naming the policy in messages (`file:line: field: message`)
/// and entries' origins, and `now` (Unix seconds) anchoring `ttl_seconds`.
pub fn parse_at(
    text: &str,
    params: &BTreeMap<String, String>,
    resolve: Resolve<'_>,
    net_override: Option<NetMode>,
    file: &str,
    now: i64,
) -> Result<SandboxPolicy, PolicyError> {
    let text = substitute(text, params)?;
    if serde_saphyr::from_str::<Peek>(&text).is_ok_and(|p| p.kind.as_deref() == Some("EgressPolicy")) {
        return Err(PolicyError(EGRESS_KIND.to_owned()));
    }
    let mut raw: Raw = serde_saphyr::from_str(&text)
        .map_err(|e| PolicyError(crate::flow::yaml_error(&e, &text, file).to_string()))?;
    let mut warnings: Vec<String> = header(&raw)?.into_iter().map(|_| deprecated(file)).collect();
    let unshare_net = raw.platform.bwrap.unshare.as_ref().and_then(|u| u.net);
    let net = match net_override {
        Some(mode) => {
            let ignored = net::set_aside(&mut raw.net, unshare_net, mode);
            if !ignored.is_empty() {
                warnings.push(format!(
                    "{file}: note: --net {} wins over the policy's network fields; ignoring {}",
                    mode.name(),
                    ignored.join(", ")
                ));
            }
            mode
        }
        None => net::mode(raw.net.mode.as_deref(), unshare_net)?,
    };
    let network = network(&raw.net, net, file, now)?;
    warnings.extend(network.entries.warnings.iter().map(|w| w.as_warning()));
    check_env(&raw.env)?;
    check_platform(&raw.platform, net)?;
    let host = host_paths(
        &raw.fs,
        &raw.platform.bwrap,
        net,
        network.central.as_ref(),
        resolve,
    )?;
    let unshare = raw.platform.bwrap.unshare.unwrap_or_default();
    let (upstream_proxy, upstream_proxy_name) = match network.upstream_proxy {
        None => (None, None),
        Some(UpstreamProxy::Addr(addr)) => (Some(addr), None),
        Some(UpstreamProxy::Name(target)) => (None, Some(target)),
    };
    let policy = SandboxPolicy {
        name: raw.metadata.and_then(|m| m.name),
        warnings,
        env_set: raw.env.set,
        env_passthrough: raw.env.passthrough,
        allow_read_all: raw.fs.allow_read_all,
        allow_write_all: raw.fs.allow_write_all,
        read_paths: host.read,
        write_paths: host.write,
        aliases: host.aliases,
        private_tmp: host.private_tmp,
        cwd: cwd::written(raw.fs.cwd.as_deref(), resolve)?,
        net,
        allow: network.allow,
        allow_entries: network.entries.allow,
        deny_entries: network.entries.deny,
        credentials: network.credentials,
        egress_policy: raw.net.egress_policy.as_ref().map(PathBuf::from),
        egress: None,
        // A port listed twice is bridged once (its bridge socket could not be made twice).
        loopback_ports: {
            let mut seen = std::collections::BTreeSet::new();
            let mut ports = raw.net.loopback_ports;
            ports.retain(|port| seen.insert(*port));
            ports
        },
        upstream_proxy,
        upstream_proxy_name,
        central: network.central,
        exceptions: network.exceptions,
        proxy_port: network.proxy_port,
        socks_port: network.socks_port,
        all_proxy_http: network.all_proxy_http,
        allow_ranges: raw.net.allow_ranges,
        resolver_servers: raw.net.resolver.map(|r| r.servers).unwrap_or_default(),
        unshare_pid: unshare.pid.unwrap_or(true),
        unshare_ipc: unshare.ipc.unwrap_or(true),
        allow_unix_sockets: raw.platform.seccomp.allow_unix_sockets,
        extra_ro_binds: host.ro,
        extra_rw_binds: host.rw,
        extra_tmpfs: host.extra_tmpfs,
        limits: limits(&raw.limits)?,
        seatbelt: seatbelt::settings(raw.platform.seatbelt.as_ref(), resolve)?,
    };
    cwd::check(&policy)?;
    Ok(policy)
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
