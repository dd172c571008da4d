//! The sandbox policy (YAML, see docs/sandbox.md): parsed with `${NAME}` parameters filled
//! in, then validated into a [`SandboxPolicy`] that cannot hold an invalid value.
//!
//! Pure apart from one injected question, "does this path exist?", so tests need no files.
//! Everything the platform cannot enforce is an error, never silently ignored.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use sandgate_policy::{Pattern, preset};
use serde::Deserialize;

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

    /// Modes whose only way out is the proxy.
    pub fn proxied(self) -> bool {
        matches!(self, NetMode::Allowlist | NetMode::Proxy)
    }
}

/// A validated sandbox policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPolicy {
    pub env_set: BTreeMap<String, String>,
    pub env_passthrough: Vec<String>,
    pub allow_read_all: bool,
    pub allow_write_all: bool,
    pub read_paths: Vec<PathBuf>,
    pub write_paths: Vec<PathBuf>,
    pub private_tmp: bool,
    pub net: NetMode,
    pub allow: Vec<Pattern>,
    /// `proxy` mode: the HTTP proxy that allowed traffic is chained through.
    pub upstream_proxy: Option<SocketAddr>,
    /// Host loopback ports bridged into the sandbox's loopback, same port number.
    pub loopback_ports: Vec<u16>,
    /// Port the proxy listens on inside the sandbox.
    pub proxy_port: u16,
    pub allow_ranges: Vec<String>,
    pub resolver_servers: Vec<String>,
    pub unshare_pid: bool,
    pub unshare_ipc: bool,
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
    upstream: Option<String>,
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

/// Fills `${NAME}` from `params`; an unknown name is an error.
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
        out.push_str(value);
        rest = after.get(end + 1..).unwrap_or_default();
    }
    out.push_str(rest);
    Ok(out)
}

fn absolute(field: &str, value: &str, exists: &dyn Fn(&Path) -> bool) -> Result<PathBuf, PolicyError> {
    let path = PathBuf::from(value);
    if !path.is_absolute() {
        return Err(PolicyError(format!("{field}: {value:?} is not an absolute path")));
    }
    if !exists(&path) {
        return Err(PolicyError(format!("{field}: {value:?} does not exist")));
    }
    Ok(path)
}

/// Parses and validates a policy. `exists` answers whether a host path exists.
pub fn parse(
    text: &str,
    params: &BTreeMap<String, String>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<SandboxPolicy, PolicyError> {
    let text = substitute(text, params)?;
    let raw: Raw = serde_saphyr::from_str(&text).map_err(|e| {
        let line = e.location().map_or(0, |l| l.line());
        PolicyError(format!(
            "line {line}: {}",
            e.to_string().lines().next().unwrap_or("invalid YAML")
        ))
    })?;
    let paths = |field: &str, list: &[String]| -> Result<Vec<PathBuf>, PolicyError> {
        list.iter().map(|p| absolute(field, p, exists)).collect()
    };
    let net = NetMode::parse(raw.net.mode.as_deref().unwrap_or("none"))?;
    let mut allow = Vec::new();
    for d in &raw.net.allow_domains {
        allow.push(Pattern::parse(d).map_err(|e| PolicyError(format!("net.allow_domains: {d:?}: {e}")))?);
    }
    for name in &raw.net.presets {
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
    if !raw.net.loopback_ports.is_empty() && !matches!(net, NetMode::Loopback | NetMode::Allowlist) {
        return Err(PolicyError(
            "net.loopback_ports needs net.mode loopback or allowlist".to_owned(),
        ));
    }
    if raw.net.loopback_ports.contains(&0) {
        return Err(PolicyError("net.loopback_ports: port 0".to_owned()));
    }
    let proxy = raw.net.proxy.unwrap_or_default();
    let upstream_proxy = match (net, proxy.upstream.as_deref()) {
        (NetMode::Proxy, Some(u)) => Some(
            u.parse::<SocketAddr>()
                .map_err(|_| PolicyError(format!("net.proxy.upstream: {u:?} is not IP:PORT")))?,
        ),
        (NetMode::Proxy, None) => {
            return Err(PolicyError(
                "net.mode proxy needs net.proxy.upstream (IP:PORT of an HTTP proxy)".to_owned(),
            ));
        }
        (_, Some(_)) => return Err(PolicyError("net.proxy.upstream needs net.mode proxy".to_owned())),
        (_, None) => None,
    };
    let proxy_port = match proxy.listen.as_deref() {
        None => 3128,
        Some(l) => {
            let addr: SocketAddr = l
                .parse()
                .map_err(|_| PolicyError(format!("net.proxy.listen: {l:?} is not IP:PORT")))?;
            if !addr.ip().is_loopback() {
                return Err(PolicyError(format!(
                    "net.proxy.listen: {l:?} must be a loopback address"
                )));
            }
            if addr.port() == 0 { 3128 } else { addr.port() }
        }
    };
    if net.proxied() && raw.net.loopback_ports.contains(&proxy_port) {
        return Err(PolicyError(format!(
            "net.loopback_ports: {proxy_port} is the proxy's port"
        )));
    }
    if !net.proxied() && (!allow.is_empty() || !raw.net.allow_ranges.is_empty()) {
        return Err(PolicyError(
            "net.allow_domains/presets/allow_ranges need net.mode allowlist".to_owned(),
        ));
    }
    // Host Unix sockets (docker.sock, an SSH agent, D-Bus) would be a way out of any
    // restricted network mode, and sandgate installs no seccomp filter against AF_UNIX yet,
    // so paths that hold them are refused unless the network is unrestricted anyway.
    if net != NetMode::All {
        if raw.fs.allow_read_all || raw.fs.allow_write_all {
            return Err(PolicyError(format!(
                "fs.allow_read_all/allow_write_all with net.mode {:?} would expose host Unix sockets (docker.sock, ssh-agent, D-Bus); list read_paths instead",
                raw.net.mode.as_deref().unwrap_or("none")
            )));
        }
        let socket_dirs = ["/", "/run", "/var", "/var/run", "/tmp", "/tmp/.X11-unix"];
        for p in raw
            .fs
            .read_paths
            .iter()
            .chain(&raw.fs.write_paths)
            .chain(&raw.platform.bwrap.ro_bind)
            .chain(&raw.platform.bwrap.rw_bind)
        {
            let trimmed = p.trim_end_matches('/');
            let trimmed = if trimmed.is_empty() { "/" } else { trimmed };
            if socket_dirs.contains(&trimmed)
                || trimmed.starts_with("/run/")
                || trimmed.starts_with("/var/run/")
            {
                return Err(PolicyError(format!(
                    "{p:?} may hold host Unix sockets (a way around a restricted network); bind something narrower"
                )));
            }
        }
    }
    if raw.platform.seatbelt.is_some_and(|v| {
        !v.is_null() && v != serde_json::json!({}) && v != serde_json::json!({"extra_allow": {}})
    }) {
        return Err(PolicyError(
            "platform.seatbelt: seatbelt settings cannot be enforced on Linux".to_owned(),
        ));
    }
    if let Some(devices) = &raw.platform.bwrap.devices {
        for d in devices.iter().flatten() {
            if !["null", "zero", "full", "random", "urandom", "tty"].contains(&d.as_str()) {
                return Err(PolicyError(format!(
                    "platform.bwrap.devices: {d:?} is not in the minimal /dev"
                )));
            }
        }
    }
    let private_tmp = match raw.fs.tmp.as_deref() {
        None | Some("private") => true,
        Some("none") => false,
        Some(other) => return Err(PolicyError(format!("fs.tmp: {other:?}: use private or none"))),
    };
    let unshare = raw.platform.bwrap.unshare.unwrap_or_default();
    Ok(SandboxPolicy {
        env_set: raw.env.set,
        env_passthrough: raw.env.passthrough,
        allow_read_all: raw.fs.allow_read_all,
        allow_write_all: raw.fs.allow_write_all,
        read_paths: paths("fs.read_paths", &raw.fs.read_paths)?,
        write_paths: paths("fs.write_paths", &raw.fs.write_paths)?,
        private_tmp,
        net,
        allow,
        loopback_ports: raw.net.loopback_ports,
        upstream_proxy,
        proxy_port,
        allow_ranges: raw.net.allow_ranges,
        resolver_servers: raw.net.resolver.map(|r| r.servers).unwrap_or_default(),
        unshare_pid: unshare.pid.unwrap_or(true),
        unshare_ipc: unshare.ipc.unwrap_or(true),
        extra_ro_binds: paths("platform.bwrap.ro_bind", &raw.platform.bwrap.ro_bind)?,
        extra_rw_binds: paths("platform.bwrap.rw_bind", &raw.platform.bwrap.rw_bind)?,
        extra_tmpfs: raw.platform.bwrap.tmpfs.iter().map(PathBuf::from).collect(),
    })
}

/// Does an environment variable name look like it holds a secret?
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL"]
        .iter()
        .any(|w| upper.contains(w))
}

/// The environment the command gets: `set`, then `passthrough` from `host`. Entries ending in
/// `*` are prefixes; a secret-looking name passes only when listed exactly.
pub fn environment(
    policy: &SandboxPolicy,
    host: &[(String, String)],
) -> (Vec<(String, String)>, Vec<String>) {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut withheld = Vec::new();
    for (name, value) in host {
        let exact = policy.env_passthrough.iter().any(|p| p == name);
        let by_prefix = policy
            .env_passthrough
            .iter()
            .any(|p| p.strip_suffix('*').is_some_and(|prefix| name.starts_with(prefix)));
        if exact || (by_prefix && !looks_secret(name)) {
            out.insert(name.clone(), value.clone());
        } else if by_prefix {
            withheld.push(name.clone());
        }
    }
    for (k, v) in &policy.env_set {
        out.insert(k.clone(), v.clone());
    }
    (out.into_iter().collect(), withheld)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(list: &[(&str, &str)]) -> BTreeMap<String, String> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const ALL_EXIST: &dyn Fn(&Path) -> bool = &|_| true;

    #[test]
    fn parameters_fill_and_unknown_ones_fail() {
        assert_eq!(substitute("a ${X} b", &params(&[("X", "1")])).unwrap(), "a 1 b");
        assert!(
            substitute("${Y}", &params(&[]))
                .unwrap_err()
                .0
                .contains("--param Y=VALUE")
        );
        assert!(substitute("${Y", &params(&[])).is_err());
    }

    #[test]
    fn a_full_policy_parses() {
        let text = "env:\n  set: { HOME: /work }\n  passthrough: [ LANG, OPENAI_API_KEY, LC_* ]\n\
                    fs:\n  read_paths: [ /usr, \"${PROJECT}\" ]\n  write_paths: [ \"${PROJECT}/out\" ]\n  tmp: private\n\
                    net:\n  mode: allowlist\n  allow_domains: [ api.openai.com, \"*.pythonhosted.org\" ]\n  presets: [ python-packages ]\n\
                    platform:\n  bwrap: { unshare: { pid: true, ipc: false }, devices: [ null, urandom ] }\n  seatbelt: { extra_allow: {} }\n";
        let p = parse(text, &params(&[("PROJECT", "/srv/p")]), ALL_EXIST).unwrap();
        assert_eq!(p.net, NetMode::Allowlist);
        assert_eq!(p.allow.len(), 4);
        assert_eq!(p.read_paths, [PathBuf::from("/usr"), PathBuf::from("/srv/p")]);
        assert_eq!(p.write_paths, [PathBuf::from("/srv/p/out")]);
        assert!(p.unshare_pid && !p.unshare_ipc);
        assert_eq!(p.proxy_port, 3128);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                "fs:\n  read_paths: [ usr ]\n",
                "fs.read_paths: \"usr\" is not an absolute path",
            ),
            ("net:\n  mode: sideways\n", "net mode \"sideways\""),
            (
                "net:\n  mode: allowlist\n  allow_domains: [ \"*.com\" ]\n",
                "net.allow_domains: \"*.com\"",
            ),
            (
                "net:\n  mode: none\n  allow_domains: [ a.example ]\n",
                "need net.mode allowlist",
            ),
            (
                "net:\n  mode: none\n  loopback_ports: [ 5432 ]\n",
                "needs net.mode loopback or allowlist",
            ),
            (
                "fs:\n  allow_read_all: true\nnet:\n  mode: allowlist\n",
                "Unix sockets",
            ),
            (
                "fs:\n  allow_read_all: true\nnet:\n  mode: none\n",
                "Unix sockets",
            ),
            ("fs:\n  read_paths: [ /run/user ]\n", "Unix sockets"),
            ("fs:\n  bogus: 1\n", "bogus"),
            (
                "platform:\n  seatbelt: { extra_allow: { network: true } }\n",
                "seatbelt",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text, &params(&[]), ALL_EXIST).unwrap_err().0;
            assert!(err.contains(want), "{text:?}: {err}");
        }
        let missing = parse("fs:\n  read_paths: [ /nope ]\n", &params(&[]), &|p| {
            p != Path::new("/nope")
        });
        assert!(missing.unwrap_err().0.contains("\"/nope\" does not exist"));
    }

    #[test]
    fn environment_is_explicit_and_guards_secrets() {
        let p = parse(
            "env:\n  set: { HOME: /work }\n  passthrough: [ LANG, OPENAI_API_KEY, APP_* ]\n",
            &params(&[]),
            ALL_EXIST,
        )
        .unwrap();
        let host: Vec<(String, String)> = [
            ("LANG", "C"),
            ("OPENAI_API_KEY", "k"),
            ("APP_MODE", "x"),
            ("APP_TOKEN", "t"),
            ("PATH", "/bin"),
            ("HOME", "/root"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (env, withheld) = environment(&p, &host);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["APP_MODE", "HOME", "LANG", "OPENAI_API_KEY"]);
        assert!(env.contains(&("HOME".to_owned(), "/work".to_owned())));
        assert_eq!(withheld, ["APP_TOKEN"]);
    }
}
