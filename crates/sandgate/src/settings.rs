//! Turns command-line flags and environment variables into a [`ProxyConfig`].
//!
//! Flags win over environment. Which variable stands for which flag, and the design's names
//! accepted as aliases, are in [`environment`]; it comes in through the [`Env`] trait so
//! tests can hand in a map instead of mutating the process environment. Every bad value is
//! an error naming the flag or variable and the value. The limits are read in [`limits`],
//! the links to other proxies in [`upstream`], and what would start but cannot work as meant
//! is said by [`warnings`].

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use sandgate_policy::{AddressGuard, Pattern, PolicyFile, Ruleset, binds_overlap};
use sandgate_proxy::reload::{LoadError, PolicySource};
use sandgate_proxy::{
    AuditDestination, AuditOptions, FrontEnd, Identity, Listener, Nameservers, ProxyConfig,
};

use crate::cli::ProxyArgs;

pub mod discovery;
mod environment;
mod limits;
mod upstream;
pub(crate) mod warnings;

pub use environment::{ADMIN_LISTEN_VAR, Env, ProcessEnv};
use environment::{
    ALLOW_RANGE_VAR, ALLOW_VARS, AUDIT_LOG_VAR, DENY_VAR, DNS_SERVER_VAR, POLICY_VAR, flag_or_env, items,
    list, single,
};
pub use limits::fit_to_fd_limit;
use limits::{limits, seconds};
pub(crate) use upstream::node_tls_files;
use upstream::{connector, node_listener};

/// Default listen address when neither flags nor environment name one.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3128";

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
    /// What starts but cannot work as meant, and the design's names read as sandgate's
    /// (logged at start): the policy file's warnings, allowed addresses the guard refuses, a
    /// listener open to every interface, an allowlist variable of the design's.
    pub warnings: Vec<String>,
}

fn invalid(source_name: &str, value: &str, reason: impl ToString) -> SettingsError {
    SettingsError::Invalid {
        source_name: source_name.to_owned(),
        value: value.to_owned(),
        reason: reason.to_string(),
    }
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

/// The resolvers named by `values` (from `source`, a flag or variable), or the system's.
pub fn nameservers(source: &str, values: &[String]) -> Result<Nameservers, SettingsError> {
    if values.is_empty() {
        return Ok(Nameservers::System);
    }
    items(values)
        .map(|v| {
            v.parse::<SocketAddr>()
                .or_else(|_| v.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                .map_err(|_| invalid(source, v, "expected IP or IP:PORT"))
        })
        .collect::<Result<_, _>>()
        .map(Nameservers::Explicit)
}

/// The ranges exempt from the address guard named by `values` (from `source`).
pub fn ranges(source: &str, values: &[String]) -> Result<Vec<IpNet>, SettingsError> {
    items(values)
        .map(|v| {
            v.parse::<IpNet>()
                .map(|net| net.trunc())
                .or_else(|_| v.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| invalid(source, v, "expected a CIDR like 10.20.0.0/16"))
        })
        .collect()
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
                    front_end: FrontEnd::Socks5 { require_auth: false },
                    ..Listener::system(addr)
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let aliases = environment::alias_notes(!args.allow.is_empty(), env);
    let policy_path = args
        .policy
        .clone()
        .or_else(|| single("--policy", None, env, POLICY_VAR).map(|(_, path)| PathBuf::from(path)))
        .or_else(|| {
            let found = discovery::proxy_policy(env)?;
            tracing::info!("{}", discovery::found(&found));
            Some(found)
        });
    let Some(path) = &policy_path else {
        if config.listen.is_empty() {
            config.listen.push(default_listen()?);
        }
        config.listen.extend(socks);
        if config.metrics_listen.is_none() {
            config.metrics_listen = admin_from_env(env)?;
        }
        config.connector = connector(args, &config)?;
        check_binds(&config)?;
        let mut warnings = aliases;
        warnings.extend(warnings::at_start(
            &config,
            None,
            env,
            args.admin_guarded_by.as_deref(),
        ));
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
            agent: None,
        };
        let require_auth = l.require_auth;
        let front_end = match &l.node_tls {
            Some(tls) => FrontEnd::Node(node_listener(path, tls, &file)?),
            None if l.socks5 => FrontEnd::Socks5 { require_auth },
            None => FrontEnd::Http1 { require_auth },
        };
        config.listen.push(Listener {
            addr: l.listen,
            identity,
            peers: None,
            front_end,
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
        config.metrics_listen = match file.admin.listen {
            Some(addr) => Some(addr),
            None => admin_from_env(env)?,
        };
    }
    if let Some(resolver) = &file.resolver {
        let resolvers_named = !list("--dns-server", &args.dns_server, env, DNS_SERVER_VAR)
            .1
            .is_empty();
        if !resolvers_named && !resolver.servers.is_empty() {
            config.nameservers = Nameservers::Explicit(resolver.servers.clone());
        }
        if let (None, Some(ms)) = (args.dns_timeout, resolver.timeout_ms) {
            config.limits.dns_timeout = Duration::from_millis(ms);
        }
    }
    config.connector = connector(args, &config)?;
    check_binds(&config)?;
    let mut warnings = aliases;
    warnings.extend(warnings::at_start(
        &config,
        Some(&file),
        env,
        args.admin_guarded_by.as_deref(),
    ));
    Ok(ProxySetup {
        config,
        policy: Some((source, file)),
        warnings,
    })
}

/// The admin listener `SANDGATE_ADMIN_LISTEN` names, if set and not empty: the last
/// choice, after `--admin-listen` and `spec.admin.listen` (see [`environment`]).
fn admin_from_env(env: &dyn Env) -> Result<Option<SocketAddr>, SettingsError> {
    single("--admin-listen", None, env, ADMIN_LISTEN_VAR)
        .map(|(source, v)| {
            v.parse::<SocketAddr>()
                .map_err(|_| invalid(source, &v, "expected IP:PORT, e.g. 127.0.0.1:9090"))
        })
        .transpose()
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
        patterns("--allow", &args.allow, env, ALLOW_VARS)?,
        patterns("--deny", &args.deny, env, &[DENY_VAR])?,
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
    let limits = limits(args)?;
    let audit = match single("--audit-log", args.audit_log.as_deref(), env, AUDIT_LOG_VAR) {
        None => AuditDestination::Stdout,
        Some((_, path)) if path == "-" => AuditDestination::Stdout,
        Some((source, path)) if path.is_empty() => return Err(invalid(source, "", "expected a path or -")),
        Some((_, path)) => AuditDestination::File(PathBuf::from(path)),
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
        guard: {
            let (source, values) = list("--allow-range", &args.allow_range, env, ALLOW_RANGE_VAR);
            AddressGuard::new(ranges(source, &values)?)
        },
        nameservers: {
            let (source, values) = list("--dns-server", &args.dns_server, env, DNS_SERVER_VAR);
            nameservers(source, &values)?
        },
        audit,
        limits,
        audit_options,
        metrics_listen,
        // A name is resolved in `proxy_setup`, once the resolver is known.
        connector: Default::default(),
        // The EgressPolicy's words; the audit log is not named to the proxy's clients (it
        // is the operator's file, on the operator's machine).
        remedies: Default::default(),
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

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
