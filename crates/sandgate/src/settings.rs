//! Turns command-line flags and environment variables into a [`ProxyConfig`].
//!
//! Flags win over environment. The environment comes in through the [`Env`] trait so tests
//! can hand in a map instead of mutating the process environment (after linkerd's `Strings`).
//! Every bad value is an error naming the flag or variable and the value.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use sandgate_policy::{AddressGuard, Pattern, PolicyFile, Ruleset, binds_overlap};
use sandgate_proxy::reload::{LoadError, PolicySource};
use sandgate_proxy::{
    AuditDestination, AuditOptions, Identity, Limits, Listener, Nameservers, Protocol, ProxyConfig,
};

use crate::cli::ProxyArgs;

/// Default listen address when neither flags nor environment name one.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3128";

/// A source of environment variables.
pub trait Env {
    fn get(&self, key: &str) -> Option<String>;
}

/// The real process environment.
#[derive(Debug)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
}

impl Env for HashMap<String, String> {
    fn get(&self, key: &str) -> Option<String> {
        HashMap::get(self, key).cloned()
    }
}

/// A configuration mistake; the CLI exits 64 with this message.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("invalid {source_name} value {value:?}: {reason}")]
    Invalid {
        source_name: String,
        value: String,
        reason: String,
    },
    #[error("{0}")]
    Policy(#[from] LoadError),
}

/// A proxy configuration and, when `--policy` was given, the file to keep watching.
#[derive(Debug)]
pub struct ProxySetup {
    pub config: ProxyConfig,
    pub policy: Option<(PolicySource, PolicyFile)>,
    /// What starts but cannot work as meant (logged at start): the policy file's warnings,
    /// allowed addresses the guard refuses, a listener open to every interface.
    pub warnings: Vec<String>,
}

fn invalid(source_name: &str, value: &str, reason: impl ToString) -> SettingsError {
    SettingsError::Invalid {
        source_name: source_name.to_owned(),
        value: value.to_owned(),
        reason: reason.to_string(),
    }
}

/// Splits repeatable, comma-separated values into items, dropping empty ones.
fn items(values: &[String]) -> impl Iterator<Item = &str> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Values from flags if any were given, else from the first environment variables set.
fn flag_or_env(flags: &[String], env: &dyn Env, vars: &[&str]) -> Vec<(String, String)> {
    if !flags.is_empty() {
        return items(flags)
            .map(|v| ("--flag".to_owned(), v.to_owned()))
            .collect();
    }
    vars.iter()
        .filter_map(|var| env.get(var).map(|v| (var.to_string(), v)))
        .flat_map(|(var, v)| {
            items(std::slice::from_ref(&v))
                .map(|i| (var.clone(), i.to_owned()))
                .collect::<Vec<_>>()
        })
        .collect()
}

pub fn patterns(
    flag: &str,
    flags: &[String],
    env: &dyn Env,
    vars: &[&str],
) -> Result<Vec<Pattern>, SettingsError> {
    flag_or_env(flags, env, vars)
        .into_iter()
        .map(|(src, v)| {
            let src = if src == "--flag" { flag } else { &src };
            Pattern::parse(&v).map_err(|e| invalid(src, &v, e))
        })
        .collect()
}

/// Listen addresses from flags or environment; empty when neither names one.
fn listen_addrs(args: &ProxyArgs, env: &dyn Env) -> Result<Vec<SocketAddr>, SettingsError> {
    let parse = |src: &str, v: &str| {
        v.parse::<SocketAddr>()
            .map_err(|_| invalid(src, v, "expected IP:PORT, e.g. 127.0.0.1:3128"))
    };
    if !args.listen.is_empty() {
        return items(&args.listen).map(|v| parse("--listen", v)).collect();
    }
    if let Some(v) = env.get("SANDGATE_LISTEN") {
        return items(std::slice::from_ref(&v))
            .map(|i| parse("SANDGATE_LISTEN", i))
            .collect();
    }
    if let Some(port) = env.get("PROXY_PORT") {
        let port: u16 = port
            .trim()
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| invalid("PROXY_PORT", &port, "expected a port number 1-65535"))?;
        return Ok(vec![SocketAddr::new(IpAddr::from([0, 0, 0, 0]), port)]);
    }
    Ok(Vec::new())
}

pub fn nameservers(values: &[String]) -> Result<Nameservers, SettingsError> {
    if values.is_empty() {
        return Ok(Nameservers::System);
    }
    items(values)
        .map(|v| {
            v.parse::<SocketAddr>()
                .or_else(|_| v.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                .map_err(|_| invalid("--dns-server", v, "expected IP or IP:PORT"))
        })
        .collect::<Result<_, _>>()
        .map(Nameservers::Explicit)
}

pub fn ranges(values: &[String]) -> Result<Vec<IpNet>, SettingsError> {
    items(values)
        .map(|v| {
            v.parse::<IpNet>()
                .map(|net| net.trunc())
                .or_else(|_| v.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| invalid("--allow-range", v, "expected a CIDR like 10.20.0.0/16"))
        })
        .collect()
}

fn seconds(flag: &str, value: Option<f64>, default: Duration) -> Result<Duration, SettingsError> {
    match value {
        None => Ok(default),
        Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err(invalid(
            flag,
            &s.to_string(),
            "expected a positive number of seconds",
        )),
    }
}

/// Builds the proxy configuration: flags and environment, plus the policy file if given.
pub fn proxy_setup(args: &ProxyArgs, env: &dyn Env) -> Result<ProxySetup, SettingsError> {
    let (flag_allow, flag_deny) = flag_patterns(args, env)?;
    let mut config = proxy_config(args, env, &flag_allow, &flag_deny)?;
    let default_listen = || {
        DEFAULT_LISTEN
            .parse::<SocketAddr>()
            .map(Listener::system)
            .map_err(|_| invalid("default", DEFAULT_LISTEN, "not IP:PORT"))
    };
    let socks = items(&args.socks_listen)
        .map(|v| {
            v.parse::<SocketAddr>()
                .map_err(|_| invalid("--socks-listen", v, "expected IP:PORT, e.g. 127.0.0.1:1080"))
                .map(|addr| Listener {
                    protocol: Protocol::Socks5,
                    ..Listener::system(addr)
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let Some(path) = &args.policy else {
        if config.listen.is_empty() {
            config.listen.push(default_listen()?);
        }
        config.listen.extend(socks);
        config.upstream_proxy = upstream_proxy(args, &config)?;
        config.central = centrals(args)?;
        check_binds(&config)?;
        let warnings = start_warnings(&config, None, env);
        return Ok(ProxySetup {
            config,
            policy: None,
            warnings,
        });
    };
    let mut source = PolicySource::new(path.clone(), flag_allow, flag_deny);
    let (file, rules) = source.load_first()?;
    config.rules = rules;
    for l in &file.listeners {
        let identity = Identity {
            task: l.task.clone(),
            project: l.project.clone(),
            job: l.job.clone(),
            subject: l.subject.clone(),
        };
        config.listen.push(Listener {
            addr: l.listen,
            identity,
            require_auth: l.require_auth,
            peers: None,
            protocol: if l.socks5 {
                Protocol::Socks5
            } else {
                Protocol::Http
            },
            node: match &l.node_tls {
                Some(tls) => Some(node_listener(path, tls, &file)?),
                None => None,
            },
        });
    }
    if config.listen.is_empty() {
        config.listen.push(default_listen()?);
    }
    config.listen.extend(socks);
    let mut ranges = config.guard.allow_ranges().to_vec();
    ranges.extend(file.allow_ranges.iter().copied());
    config.guard = AddressGuard::new(ranges);
    if config.metrics_listen.is_none() {
        config.metrics_listen = file.admin.listen;
    }
    if let Some(resolver) = &file.resolver {
        if args.dns_server.is_empty() && !resolver.servers.is_empty() {
            config.nameservers = Nameservers::Explicit(resolver.servers.clone());
        }
        if let (None, Some(ms)) = (args.dns_timeout, resolver.timeout_ms) {
            config.limits.dns_timeout = Duration::from_millis(ms);
        }
    }
    config.upstream_proxy = upstream_proxy(args, &config)?;
    config.central = centrals(args)?;
    check_binds(&config)?;
    let warnings = start_warnings(&config, Some(&file), env);
    Ok(ProxySetup {
        config,
        policy: Some((source, file)),
        warnings,
    })
}

/// What would start but cannot work as meant: the file's warnings; allowed IP literals the
/// guard refuses (flags and file together, against every allow range); and listeners on
/// every interface (but node listeners).
fn start_warnings(config: &ProxyConfig, file: Option<&PolicyFile>, env: &dyn Env) -> Vec<String> {
    let mut out = match file {
        Some(f) => crate::check::warnings(f, &config.guard),
        None => Vec::new(),
    };
    for (rule, class) in config.rules.guarded_literals(&config.guard) {
        if &*rule.origin == "flag" {
            out.push(format!(
                "--allow {}: a {} address, which the address guard refuses: this allows nothing unless --allow-range covers it",
                rule.pattern,
                class.as_str()
            ));
        }
    }
    // A node listener is meant for other hosts, and admits only certificates of its CA.
    for l in config
        .listen
        .iter()
        .filter(|l| l.addr.ip().is_unspecified() && l.node.is_none())
    {
        let via_env = env.get("PROXY_PORT").is_some() && env.get("SANDGATE_LISTEN").is_none();
        out.push(format!(
            "listening on {}{}: every interface of this host can reach the proxy; unless other hosts or containers must use it, listen on 127.0.0.1:{} ({})",
            l.addr,
            if via_env { " (PROXY_PORT)" } else { "" },
            l.addr.port(),
            if via_env {
                "SANDGATE_LISTEN=127.0.0.1:PORT instead of PROXY_PORT"
            } else {
                "--listen 127.0.0.1:PORT"
            }
        ));
    }
    out
}

/// A `role: node` listener's TLS files, relative to the policy file.
pub(crate) fn node_tls_files(
    policy: &std::path::Path,
    tls: &sandgate_policy::document::TlsSpec,
) -> sandgate_proxy::node::ServerFiles {
    let dir = policy.parent().unwrap_or(std::path::Path::new("."));
    sandgate_proxy::node::ServerFiles {
        cert: dir.join(&tls.cert),
        key: dir.join(&tls.key),
        client_ca: dir.join(&tls.client_ca),
    }
}

/// A `role: node` listener: its TLS files read now, so a missing or mismatched file stops
/// the start with its name.
fn node_listener(
    policy: &std::path::Path,
    tls: &sandgate_policy::document::TlsSpec,
    file: &PolicyFile,
) -> Result<std::sync::Arc<sandgate_proxy::node::NodeListener>, SettingsError> {
    sandgate_proxy::node::NodeListener::new(node_tls_files(policy, tls), file.nodes.clone())
        .map(std::sync::Arc::new)
        .map_err(|e| invalid("spec.listeners.tls", &policy.display().to_string(), e))
}

/// `--upstream https://HOST:PORT` (repeatable) with the node's TLS files, read now.
fn centrals(
    args: &ProxyArgs,
) -> Result<Option<std::sync::Arc<sandgate_proxy::dial::Centrals>>, SettingsError> {
    if args.upstream.is_empty() {
        return Ok(None);
    }
    let (Some(ca), Some(cert), Some(key)) = (&args.upstream_ca, &args.client_cert, &args.client_key) else {
        return Err(invalid(
            "--upstream",
            &args.upstream.join(" "),
            "needs --upstream-ca, --client-cert and --client-key",
        ));
    };
    let files = sandgate_proxy::node::ClientFiles {
        ca: ca.clone(),
        cert: cert.clone(),
        key: key.clone(),
        http1: args.upstream_transport.as_deref() == Some("http1"),
    };
    use sandgate_proxy::dial::{Centrals, CentralsError};
    match Centrals::from_urls(&args.upstream, files) {
        Ok(c) => Ok(Some(std::sync::Arc::new(c))),
        Err(CentralsError::Url(u, e)) => Err(invalid("--upstream", &u, e)),
        Err(CentralsError::Tls(e)) => Err(invalid("--client-cert", &cert.display().to_string(), e)),
    }
}

/// `--upstream-proxy`: `IP:PORT`, `HOST:PORT` or `http://HOST:PORT[/]`. A name is resolved
/// once, here, through the proxy's own resolver (`config.nameservers`; never getaddrinfo),
/// and the first address is used for as long as the proxy runs.
fn upstream_proxy(args: &ProxyArgs, config: &ProxyConfig) -> Result<Option<SocketAddr>, SettingsError> {
    let Some(value) = args.upstream_proxy.as_deref() else {
        return Ok(None);
    };
    let bad = |why: &str| invalid("--upstream-proxy", value, why);
    let authority = match value.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest.strip_suffix('/').unwrap_or(rest),
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => {
            return Err(bad(
                "TLS to the upstream proxy is not supported; use http://HOST:PORT",
            ));
        }
        Some(_) => return Err(bad("expected IP:PORT, HOST:PORT or http://HOST:PORT")),
        None => value,
    };
    if let Ok(addr) = authority.parse::<SocketAddr>() {
        return Ok(Some(addr));
    }
    let target = sandgate_policy::parse_connect_target(authority)
        .map_err(|e| bad(&format!("expected IP:PORT, HOST:PORT or http://HOST:PORT ({e})")))?;
    let dial = sandgate_proxy::dial::DialConfig {
        nameservers: config.nameservers.clone(),
        dns_timeout: config.limits.dns_timeout,
        connect_timeout: config.limits.connect_timeout,
        guard: AddressGuard::new(Vec::new()),
        upstream_proxy: None,
        central: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| bad(&format!("cannot start a resolver: {e}")))?;
    let ips = runtime.block_on(async {
        let dialer = sandgate_proxy::dial::Dialer::new(&dial, Vec::new()).map_err(|e| e.to_string())?;
        dialer.lookup(&target).await.map_err(|e| e.to_string())
    });
    match ips.as_deref() {
        Ok([first, ..]) => Ok(Some(SocketAddr::new(*first, target.port))),
        Ok([]) => Err(bad("the name has no address")),
        Err(e) => Err(bad(&format!("cannot resolve {}: {e}", target.host))),
    }
}

/// Refuses two listeners (HTTP, SOCKS5, admin) that cannot both be bound, before any is:
/// a configuration that passes here does not fail later with "address already in use"
/// between its own listeners.
fn check_binds(config: &ProxyConfig) -> Result<(), SettingsError> {
    let all: Vec<SocketAddr> = config
        .listen
        .iter()
        .map(|l| l.addr)
        .chain(config.metrics_listen)
        .collect();
    for (i, addr) in all.iter().enumerate() {
        if let Some(other) = all.iter().take(i).find(|o| binds_overlap(**o, *addr)) {
            return Err(invalid(
                "listen address",
                &addr.to_string(),
                format!(
                    "overlaps {other}, also a listener of this proxy (--listen, --socks-listen, --admin-listen, spec.listeners, spec.admin.listen); give each its own address or port"
                ),
            ));
        }
    }
    Ok(())
}

/// The allow and deny patterns from flags, or else from the environment.
fn flag_patterns(args: &ProxyArgs, env: &dyn Env) -> Result<(Vec<Pattern>, Vec<Pattern>), SettingsError> {
    Ok((
        patterns(
            "--allow",
            &args.allow,
            env,
            &["SANDGATE_ALLOW", "PROXY_ALLOWLIST"],
        )?,
        patterns("--deny", &args.deny, env, &["SANDGATE_DENY"])?,
    ))
}

/// Builds the proxy configuration from flags and environment alone (no listener when none
/// is named; [`proxy_setup`] adds the default).
fn proxy_config(
    args: &ProxyArgs,
    env: &dyn Env,
    allow: &[Pattern],
    deny: &[Pattern],
) -> Result<ProxyConfig, SettingsError> {
    let rules = Ruleset::from_parts(allow, deny, None);
    let d = Limits::default();
    let limits = Limits {
        max_head_bytes: match args.max_head_bytes {
            Some(n) if (1024..=1024 * 1024).contains(&n) => n,
            Some(n) => {
                return Err(invalid(
                    "--max-head-bytes",
                    &n.to_string(),
                    "expected 1024 to 1048576",
                ));
            }
            None => d.max_head_bytes,
        },
        head_timeout: seconds("--head-timeout", args.head_timeout, d.head_timeout)?,
        connect_timeout: seconds("--connect-timeout", args.connect_timeout, d.connect_timeout)?,
        dns_timeout: seconds("--dns-timeout", args.dns_timeout, d.dns_timeout)?,
        response_timeout: seconds("--response-timeout", args.response_timeout, d.response_timeout)?,
        body_idle_timeout: seconds("--body-idle-timeout", args.body_idle_timeout, d.body_idle_timeout)?,
        tunnel_idle_timeout: seconds(
            "--tunnel-idle-timeout",
            args.tunnel_idle_timeout,
            d.tunnel_idle_timeout,
        )?,
        max_connections: match args.max_connections {
            Some(0) => return Err(invalid("--max-connections", "0", "expected at least 1")),
            Some(n) => n,
            None => d.max_connections,
        },
        max_connections_per_listener: match args.max_connections_per_listener {
            Some(0) => {
                return Err(invalid(
                    "--max-connections-per-listener",
                    "0",
                    "expected at least 1",
                ));
            }
            other => other,
        },
        max_connections_per_client: match args.max_connections_per_client {
            Some(0) => {
                return Err(invalid(
                    "--max-connections-per-client",
                    "0",
                    "expected at least 1",
                ));
            }
            other => other,
        },
        shutdown_grace: match args.shutdown_grace {
            Some(s) if s >= 0.0 && s.is_finite() && s < 1e9 => Duration::from_secs_f64(s),
            Some(s) => {
                return Err(invalid(
                    "--shutdown-grace",
                    &s.to_string(),
                    "expected seconds >= 0",
                ));
            }
            None => d.shutdown_grace,
        },
    };
    let audit = match args.audit_log.as_deref() {
        None | Some("-") => AuditDestination::Stdout,
        Some("") => return Err(invalid("--audit-log", "", "expected a path or -")),
        Some(path) => AuditDestination::File(PathBuf::from(path)),
    };
    let audit_defaults = AuditOptions::default();
    let audit_options = AuditOptions {
        max_bytes: match args.audit_max_bytes {
            Some(n) if n < 4096 => {
                return Err(invalid(
                    "--audit-max-bytes",
                    &n.to_string(),
                    "expected at least 4096",
                ));
            }
            other => other,
        },
        keep: args.audit_keep.unwrap_or(audit_defaults.keep),
        fsync_interval: match args.audit_fsync_interval {
            None => audit_defaults.fsync_interval,
            Some(0.0) => None,
            Some(s) => Some(seconds("--audit-fsync-interval", Some(s), Duration::ZERO)?),
        },
        aggregate_window: match args.audit_aggregate_window {
            None => None,
            Some(w) => Some(seconds("--audit-aggregate-window", Some(w), Duration::ZERO)?),
        },
    };
    let (admin_flag, admin_value) = match (&args.admin_listen, &args.metrics_listen) {
        (Some(v), _) => ("--admin-listen", Some(v)),
        (None, v) => ("--metrics-listen", v.as_ref()),
    };
    let metrics_listen = match admin_value {
        None => None,
        Some(v) => Some(
            v.parse::<SocketAddr>()
                .map_err(|_| invalid(admin_flag, v, "expected IP:PORT, e.g. 127.0.0.1:9090"))?,
        ),
    };
    Ok(ProxyConfig {
        listen: listen_addrs(args, env)?
            .into_iter()
            .map(Listener::system)
            .collect(),
        rules,
        guard: AddressGuard::new(ranges(&args.allow_range)?),
        nameservers: nameservers(&args.dns_server)?,
        audit,
        limits,
        audit_options,
        metrics_listen,
        // A name is resolved in `proxy_setup`, once the resolver is known.
        upstream_proxy: None,
        central: None,
    })
}

/// Opens (creating, appending) an audit log named on the command line, so that a path that
/// cannot be written is a usage error naming it before anything starts.
pub fn check_audit_log(flag: &str, path: &std::path::Path) -> Result<(), SettingsError> {
    let shown = path.display().to_string();
    if path.is_dir() {
        return Err(invalid(flag, &shown, "is a directory; name a file in it"));
    }
    match std::fs::OpenOptions::new().append(true).create(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(invalid(
            flag,
            &shown,
            format!(
                "its directory {} does not exist",
                path.parent()
                    .map_or_else(|| ".".to_owned(), |p| p.display().to_string())
            ),
        )),
        Err(e) => Err(invalid(flag, &shown, format!("cannot be written: {e}"))),
    }
}

/// Fits the connection cap to the open-file limit `nofile` (two descriptors a connection,
/// plus a reserve): a default cap shrinks to fit, an explicit one that cannot fit is an
/// error that says what to raise.
pub fn fit_to_fd_limit(limits: &mut Limits, explicit: bool, nofile: u64) -> Result<(), SettingsError> {
    use sandgate_proxy::admission::{FDS_PER_CONNECTION, RESERVED_FDS, connections_for_fd_limit};
    let fits = connections_for_fd_limit(nofile);
    if limits.max_connections <= fits {
        return Ok(());
    }
    if explicit || fits == 0 {
        let n = limits.max_connections;
        return Err(invalid(
            "--max-connections",
            &n.to_string(),
            format!(
                "needs {} open files ({FDS_PER_CONNECTION} per connection + {RESERVED_FDS}) but the limit is {nofile}; raise it (ulimit -n, LimitNOFILE=) or lower --max-connections to {fits}",
                n as u64 * FDS_PER_CONNECTION + RESERVED_FDS
            ),
        ));
    }
    tracing::info!(
        max_connections = fits,
        open_file_limit = nofile,
        "connection cap lowered to fit the open-file limit"
    );
    limits.max_connections = fits;
    Ok(())
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
