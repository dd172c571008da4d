//! What would start but cannot work as meant, one line each: a policy file's own warnings,
//! allowed IP literals the address guard refuses, admin tokens with no admin listener,
//! listeners on every interface, and an admin listener off loopback that nothing is said to
//! guard. `sandgate proxy` logs them at start; `check-config` prints a file's. Nothing here
//! refuses a configuration (that is [`super::SettingsError`]).

use sandgate_policy::{AddressGuard, PolicyFile, Ruleset};
use sandgate_proxy::ProxyConfig;

use super::Env;

/// The file's warnings and the allowed IP literals `guard` refuses, one line each as
/// `file:line: warning: field: message`. The proxy prints the same at start, with the
/// guard of its flags and file together.
pub fn for_file(policy: &PolicyFile, guard: &AddressGuard) -> Vec<String> {
    let mut out: Vec<String> = policy.warnings.iter().map(|w| w.as_warning()).collect();
    let rules = Ruleset::from_parts(&[], &[], Some(policy));
    for (rule, class) in rules.guarded_literals(guard) {
        out.push(format!(
            "{}: warning: spec.network.allowlist: {} is a {} address, which the address guard refuses: this entry allows nothing unless an allow range covers it (spec.network.allow_ranges, or --allow-range)",
            rule.origin,
            rule.pattern,
            class.as_str()
        ));
    }
    if let (Some(token), None) = (policy.admin.tokens.first(), policy.admin.listen) {
        out.push(format!(
            "{}: warning: spec.admin: tokens but no listen address: the proxy needs --admin-listen ADDR (or spec.admin.listen) to start",
            token.origin
        ));
    }
    out
}

/// What would start but cannot work as meant: the file's warnings; allowed IP literals the
/// guard refuses (flags and file together, against every allow range); listeners on every
/// interface (but node listeners); and an admin listener off loopback, unless
/// `admin_guarded_by` says what keeps others off it (`--admin-guarded-by`).
pub(super) fn at_start(
    config: &ProxyConfig,
    file: Option<&PolicyFile>,
    env: &dyn Env,
    admin_guarded_by: Option<&str>,
) -> Vec<String> {
    let mut out = match file {
        Some(f) => for_file(f, &config.guard),
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
        .filter(|l| l.addr.ip().is_unspecified() && !matches!(l.front_end, sandgate_proxy::FrontEnd::Node(_)))
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
    out.extend(admin_off_loopback(config.metrics_listen, admin_guarded_by));
    out
}

/// An admin listener anyone on the network may reach serves them /metrics (destinations,
/// tasks) and the probes. Meant so behind a firewall or a Kubernetes NetworkPolicy, it is
/// said with `--admin-guarded-by`, and nothing is logged: a warning every start that the
/// operator can do nothing about teaches them to skip warnings.
fn admin_off_loopback(addr: Option<std::net::SocketAddr>, guarded_by: Option<&str>) -> Option<String> {
    let addr = addr.filter(|a| !a.ip().is_loopback())?;
    if guarded_by.is_some_and(|g| !g.trim().is_empty()) {
        return None;
    }
    Some(format!(
        "the admin listener {addr} is not on loopback: whoever reaches it reads /metrics and the probes (and may try the API); \
         listen on 127.0.0.1:{port}, or, where a firewall or a NetworkPolicy keeps others off it, name that with --admin-guarded-by WHAT",
        port = addr.port()
    ))
}
