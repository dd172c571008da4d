//! `sandgate explain`: how the policy would decide one destination, by which rule (file and
//! line, scope, expiry), what the address guard will still check, and which expired rules
//! would have matched. No network access, except with `--resolve`: then the name is resolved
//! through the proxy's own dialer (the same nameservers and parsing as `sandgate proxy`) and
//! every answer is classified, and checked against address deny entries, as the proxy would.
//!
//! The exit status is the proxy's answer, for scripts: 0 allowed, 1 refused (by the policy,
//! the address guard or an address deny entry), 2 allowed by the policy but unreachable
//! (`--resolve` found no address: the proxy would answer 502), 64 a usage error.

use std::process::ExitCode;

use sandgate_policy::addr::classify;
use sandgate_policy::{
    Access, AddressGuard, Context, Host, Ruleset, Target, Verdict, parse_connect_target, parse_http_target,
};
use serde_json::json;

use sandgate_proxy::Nameservers;
use sandgate_proxy::dial::{DialConfig, Dialer};

use crate::EX_USAGE;
use crate::cli::ExplainArgs;
use crate::settings::{patterns, ranges};

/// Exit status: the proxy would refuse the destination.
const EXIT_DENIED: u8 = 1;
/// Exit status: allowed by the policy, but the name does not resolve (`--resolve`).
const EXIT_UNRESOLVED: u8 = 2;

/// Reads TARGET: a URL (`http://` is plain HTTP; `https://` is CONNECT to 443 or its port;
/// schemes in any case), `host:port` (CONNECT) or a bare host (CONNECT to 443).
fn parse_target(text: &str) -> Result<(Target, Access), String> {
    let with_default_port = |authority: &str, port: u16| {
        if authority.ends_with(']') || !authority.contains(':') {
            format!("{authority}:{port}")
        } else {
            authority.to_owned()
        }
    };
    if let Some((scheme, rest)) = text.split_once("://") {
        // RFC 3986 section 3.1: schemes are case-insensitive.
        return match scheme.to_ascii_lowercase().as_str() {
            "https" => {
                let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
                parse_connect_target(&with_default_port(authority, 443))
                    .map(|t| (t, Access::Connect))
                    .map_err(|e| e.to_string())
            }
            "http" => parse_http_target(&format!("http://{rest}"))
                .map(|t| (t.target, Access::Http))
                .map_err(|e| e.to_string()),
            other => Err(format!(
                "scheme {other:?}: use http://, https://, host or host:port"
            )),
        };
    }
    parse_connect_target(&with_default_port(text, 443))
        .map(|t| (t, Access::Connect))
        .map_err(|e| e.to_string())
}

pub fn run(args: &ExplainArgs) -> ExitCode {
    match explain(args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("sandgate: {message}");
            ExitCode::from(EX_USAGE)
        }
    }
}

/// What `--resolve` found.
enum Resolved {
    /// Every address, its class, and whether the proxy would dial it.
    Addrs(Vec<(std::net::IpAddr, &'static str, bool)>),
    /// The name did not resolve (NXDOMAIN, no records, a timeout): why.
    Failed(String),
}

fn explain(args: &ExplainArgs) -> Result<ExitCode, String> {
    let (target, access) =
        parse_target(&args.target).map_err(|e| format!("invalid target {:?}: {e}", args.target))?;
    // Only the flags given here count; the environment belongs to `proxy`.
    let env = std::collections::HashMap::<String, String>::new();
    let allow = patterns("--allow", &args.allow, &env, &[]).map_err(|e| e.to_string())?;
    let deny = patterns("--deny", &args.deny, &env, &[]).map_err(|e| e.to_string())?;
    let file = match &args.policy {
        Some(path) => Some(
            sandgate_proxy::reload::load_file(path)
                .map_err(|e| e.to_string())?
                .0,
        ),
        None => None,
    };
    let rules = Ruleset::from_parts(&allow, &deny, file.as_ref());
    let mut exempt = ranges("--allow-range", &args.allow_range).map_err(|e| e.to_string())?;
    if let Some(f) = &file {
        exempt.extend(f.allow_ranges.iter().copied());
    }
    let guard = AddressGuard::new(exempt);
    let now = sandgate_proxy::unix_now();
    let ctx = Context {
        task: args.task.as_deref(),
        project: args.project.as_deref(),
        now,
    };
    let decision = rules.decide(&target, access, &ctx);
    let expired = rules.expired_matches(&target, access, &ctx);
    let (guard_note, guard_refuses) = match &target.host {
        Host::Ip(ip) => match guard.check(*ip) {
            Ok(()) => (
                format!("{ip} is {} and may be dialled", classify(*ip).as_str()),
                false,
            ),
            Err(p) => (
                format!(
                    "{ip} is {}: the address guard will refuse it (an internal service needs --allow-range or spec.network.allow_ranges)",
                    p.class.as_str()
                ),
                true,
            ),
        },
        Host::Name(_) => (
            "applies: every address the name resolves to must be public (or in an allow range)".to_owned(),
            false,
        ),
    };
    let resolved = if args.resolve {
        Some(resolve(args, file.as_ref(), (&guard, &rules, &ctx), &target)?)
    } else {
        None
    };
    let verdict = match decision.verdict {
        Verdict::Allow => "allow",
        Verdict::Deny => "deny",
    };
    // The proxy's answer: the policy first, then what the guard and deny entries say of
    // the addresses; one refused address refuses the name, as in the proxy.
    let (outcome, exit) = match (&decision.verdict, &resolved) {
        (Verdict::Deny, _) => ("deny", EXIT_DENIED),
        (Verdict::Allow, _) if guard_refuses => ("deny", EXIT_DENIED),
        (Verdict::Allow, Some(Resolved::Failed(_))) => ("unresolved", EXIT_UNRESOLVED),
        (Verdict::Allow, Some(Resolved::Addrs(list))) if list.iter().any(|(_, _, ok)| !ok) => {
            ("deny", EXIT_DENIED)
        }
        (Verdict::Allow, _) => ("allow", 0),
    };
    let rule = decision.rule.as_deref();
    let stamp = |at: Option<i64>| {
        at.and_then(|s| jiff::Timestamp::from_second(s).ok())
            .map(|t| t.to_string())
    };
    if args.json {
        let value = json!({
            "target": target.to_string(),
            "scheme": access.scheme(),
            "decision": verdict,
            "outcome": outcome,
            "exit_status": exit,
            "reason_code": decision.reason.code(),
            "rule": rule.map(|r| r.label.to_string()),
            "origin": rule.map(|r| r.origin.to_string()),
            "scope": rule.map(|r| r.scope.to_string()),
            "expires_at": stamp(rule.and_then(|r| r.expires_at)),
            "expired_rules": expired.iter().map(|r| json!({"rule": r.label.to_string(), "expired_at": stamp(r.expires_at)})).collect::<Vec<_>>(),
            "address_guard": guard_note,
            "resolved": match &resolved {
                Some(Resolved::Addrs(list)) => Some(list.iter().map(|(ip, class, ok)| json!({"ip": ip.to_string(), "class": class, "allowed": ok})).collect::<Vec<_>>()),
                _ => None,
            },
            "resolve_error": match &resolved {
                Some(Resolved::Failed(why)) => Some(why.clone()),
                _ => None,
            },
        });
        println!("{value}");
    } else {
        println!(
            "{verdict} {} {target}: {}",
            access.scheme(),
            decision.reason.describe()
        );
        if let Some(r) = rule {
            println!("  rule:    {}", r.label);
            println!("  from:    {}", r.origin);
            println!("  scope:   {}", r.scope);
            if let Some(at) = stamp(r.expires_at) {
                println!("  expires: {at}");
            }
        }
        for r in &expired {
            println!(
                "  expired: {} (since {}) would have matched",
                r.label,
                stamp(r.expires_at).unwrap_or_default()
            );
        }
        println!("  address guard: {guard_note}");
        match &resolved {
            Some(Resolved::Addrs(list)) => {
                for (ip, class, ok) in list {
                    println!(
                        "  resolved: {ip} ({class}) {}",
                        if *ok {
                            "may be dialled"
                        } else {
                            "refused by the address guard or a deny entry"
                        }
                    );
                }
            }
            Some(Resolved::Failed(why)) => {
                println!("  resolved: nothing: {why} (the proxy would answer 502)");
            }
            None => {}
        }
        if outcome != verdict {
            println!("  result:  {outcome}");
        }
    }
    Ok(ExitCode::from(exit))
}

/// Resolves `target` through the proxy's own dialer and classifies every address. A name
/// that does not resolve is an answer, not an error; a resolver that cannot be set up is.
fn resolve(
    args: &ExplainArgs,
    file: Option<&sandgate_policy::PolicyFile>,
    (guard, rules, ctx): (&AddressGuard, &Ruleset, &Context<'_>),
    target: &Target,
) -> Result<Resolved, String> {
    let nameservers =
        match crate::settings::nameservers("--dns-server", &args.dns_server).map_err(|e| e.to_string())? {
            Nameservers::System => match file.and_then(|f| f.resolver.as_ref()) {
                Some(r) if !r.servers.is_empty() => Nameservers::Explicit(r.servers.clone()),
                _ => Nameservers::System,
            },
            explicit => explicit,
        };
    let config = DialConfig {
        nameservers,
        dns_timeout: std::time::Duration::from_secs(5),
        connect_timeout: std::time::Duration::from_secs(5),
        guard: guard.clone(),
        connector: Default::default(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let dialer = Dialer::new(&config, Vec::new()).map_err(|e| format!("cannot set up DNS: {e}"))?;
        let ips = match dialer.lookup(target).await {
            Ok(ips) => ips,
            Err(e) => return Ok(Resolved::Failed(format!("cannot resolve {}: {e}", target.host))),
        };
        Ok(Resolved::Addrs(
            ips.into_iter()
                .map(|ip| {
                    let dialable =
                        guard.check(ip).is_ok() && rules.deny_address(ip, target.port, ctx).is_none();
                    (ip, classify(ip).as_str(), dialable)
                })
                .collect(),
        ))
    })
}
