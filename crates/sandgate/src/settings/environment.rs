//! The environment `sandgate proxy` reads beside its flags, for a sidecar configured by
//! environment alone: which variable stands for which flag, and the design's names accepted
//! as aliases of sandgate's own, each with a note at start naming sandgate's.
//!
//! | variable | flag |
//! |---|---|
//! | `SANDGATE_LISTEN` (or `PROXY_PORT=N`, `0.0.0.0:N`) | `--listen` |
//! | `SANDGATE_ALLOW`, `PROXY_ALLOWLIST`, `AA_PROXY_NETWORK_ALLOWLIST` | `--allow` |
//! | `SANDGATE_DENY` | `--deny` |
//! | `SANDGATE_ALLOW_RANGE` | `--allow-range` |
//! | `SANDGATE_DNS_SERVER` | `--dns-server` |
//! | `SANDGATE_POLICY` | `--policy` |
//! | `SANDGATE_AUDIT_LOG` | `--audit-log` |
//! | `SANDGATE_ADMIN_LISTEN` | `--admin-listen`, below `spec.admin.listen` |
//!
//! A flag wins over its variable; lists are comma-separated; a variable set but empty is
//! taken as unset (a compose file's `${VAR:-}`), but for `SANDGATE_LISTEN` (see
//! `listen_addrs`). `SANDGATE_ADMIN_LISTEN` alone ranks below the policy file: the image sets
//! it (a loopback admin listener for its health check), and an image's default must not move
//! the listener a mounted policy names. The environment, and which default files exist
//! ([`super::discovery`]), come in through [`Env`], so tests hand in a map (after linkerd's
//! `Strings`).

use std::collections::HashMap;

/// A source of environment variables, and of whether a default file is there.
pub trait Env {
    fn get(&self, key: &str) -> Option<String>;
    /// Whether anything stands at `path` (a file, a directory, a link); none by default,
    /// so a map of variables finds no file.
    fn exists(&self, _path: &std::path::Path) -> bool {
        false
    }
}

/// The real process environment.
#[derive(Debug)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
    fn exists(&self, path: &std::path::Path) -> bool {
        std::fs::symlink_metadata(path).is_ok()
    }
}

impl Env for HashMap<String, String> {
    fn get(&self, key: &str) -> Option<String> {
        HashMap::get(self, key).cloned()
    }
}

/// sandgate's own allowlist variable.
pub const ALLOW_VAR: &str = "SANDGATE_ALLOW";
/// The design's sidecar's name for it (design file 000).
const PROXY_ALLOWLIST: &str = "PROXY_ALLOWLIST";
/// aa-proxy's name for it (design file 001).
const AA_PROXY_ALLOWLIST: &str = "AA_PROXY_NETWORK_ALLOWLIST";
/// The design's names for the allowlist.
const ALLOW_ALIASES: &[&str] = &[PROXY_ALLOWLIST, AA_PROXY_ALLOWLIST];
/// The allowlist's variables, read together (every one set adds its patterns).
pub const ALLOW_VARS: &[&str] = &[ALLOW_VAR, PROXY_ALLOWLIST, AA_PROXY_ALLOWLIST];
/// `--deny`.
pub const DENY_VAR: &str = "SANDGATE_DENY";
/// `--allow-range`: CIDRs exempt from the address guard (an internal service).
pub const ALLOW_RANGE_VAR: &str = "SANDGATE_ALLOW_RANGE";
/// `--dns-server`: the only resolvers asked.
pub const DNS_SERVER_VAR: &str = "SANDGATE_DNS_SERVER";
/// `--policy`: the EgressPolicy file.
pub const POLICY_VAR: &str = "SANDGATE_POLICY";
/// `--audit-log`: also what `sandgate audit` reads by default.
pub const AUDIT_LOG_VAR: &str = "SANDGATE_AUDIT_LOG";
/// `--admin-listen` when neither the flag nor `spec.admin.listen` names one; also where
/// `sandgate health` looks when not told.
pub const ADMIN_LISTEN_VAR: &str = "SANDGATE_ADMIN_LISTEN";

/// Splits repeatable, comma-separated values into items, dropping empty ones.
pub fn items(values: &[String]) -> impl Iterator<Item = &str> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Values from flags if any were given, else from every one of `vars` that is set, each
/// with the name to blame for it (`--flag` for a flag).
pub fn flag_or_env(flags: &[String], env: &dyn Env, vars: &[&str]) -> Vec<(String, String)> {
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

/// A repeatable flag's values, or else its variable's: the name to blame for a bad value,
/// and the values.
pub fn list<'a>(flag: &'a str, flags: &[String], env: &dyn Env, var: &'a str) -> (&'a str, Vec<String>) {
    if !flags.is_empty() {
        return (flag, flags.to_vec());
    }
    match env.get(var) {
        Some(v) if !v.trim().is_empty() => (var, vec![v]),
        _ => (flag, Vec::new()),
    }
}

/// A flag's value, or else its variable's when set and not empty, with the name to blame.
pub fn single<'a>(
    flag: &'a str,
    value: Option<&str>,
    env: &dyn Env,
    var: &'a str,
) -> Option<(&'a str, String)> {
    match value {
        Some(v) => Some((flag, v.to_owned())),
        None => env
            .get(var)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (var, v.trim().to_owned())),
    }
}

/// One line for each of the design's allowlist names that is set, naming sandgate's own
/// (and saying it is ignored when `--allow` is given). Where aa-proxy read an empty or unset
/// list as "no filter", sandgate denies whatever no entry allows; the empty case says so.
pub fn alias_notes(allow_flags_given: bool, env: &dyn Env) -> Vec<String> {
    let own = ALLOW_VAR;
    ALLOW_ALIASES
        .iter()
        .filter_map(|var| env.get(var).map(|v| (*var, v)))
        .map(|(var, value)| {
            if allow_flags_given {
                format!("{var} is ignored: --allow is given (a flag wins over {own}, sandgate's own name, and its aliases)")
            } else if items(std::slice::from_ref(&value)).next().is_none() {
                let was = if var == AA_PROXY_ALLOWLIST {
                    ", where aa-proxy's empty list meant no filter"
                } else {
                    ""
                };
                format!(
                    "{var} is set but empty: it allows nothing, and what no entry allows is denied (default deny{was}); {own} is sandgate's own name"
                )
            } else {
                format!("{var} is read as {own}, sandgate's own name for the allowlist (same grammar; unset or empty, the proxy denies everything)")
            }
        })
        .collect()
}
