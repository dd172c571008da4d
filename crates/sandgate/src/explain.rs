//! `sandgate explain`: how the policy would decide one destination, by which rule (file and
//! line, scope, expiry), and what the address guard will still check. No network access,
//! except with `--resolve`: then the name is resolved through the proxy's own dialer (the
//! same nameservers and parsing as `sandgate proxy`) and every answer is classified, and
//! checked against address deny entries, as the proxy would.

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

/// Reads TARGET: a URL (`http://` is plain HTTP; `https://` is CONNECT to 443 or its port),
/// `host:port` (CONNECT) or a bare host (CONNECT to 443).
fn parse_target(text: &str) -> Result<(Target, Access), String> {
    if let Some(rest) = text.strip_prefix("https://") {
        let authority = rest.split(['/', '?']).next().unwrap_or(rest);
        let with_port = if authority.ends_with(']') || !authority.contains(':') {
            format!("{authority}:443")
        } else {
            authority.to_owned()
        };
        return parse_connect_target(&with_port)
            .map(|t| (t, Access::Connect))
            .map_err(|e| e.to_string());
    }
    if text.contains("://") {
        return parse_http_target(text)
            .map(|t| (t.target, Access::Http))
            .map_err(|e| e.to_string());
    }
    let with_port = if text.ends_with(']') || !text.contains(':') {
        format!("{text}:443")
    } else {
        text.to_owned()
    };
    parse_connect_target(&with_port)
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
    let mut exempt = ranges(&args.allow_range).map_err(|e| e.to_string())?;
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
    let guard_note = match &target.host {
        Host::Ip(ip) => match guard.check(*ip) {
            Ok(()) => format!("{ip} is {} and may be dialled", classify(*ip).as_str()),
            Err(p) => format!("{ip} is {}: the address guard will refuse it", p.class.as_str()),
        },
        Host::Name(_) => {
            "applies: every address the name resolves to must be public (or in an allow range)".to_owned()
        }
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
    let rule = decision.rule.as_deref();
    if args.json {
        let value = json!({
            "target": target.to_string(),
            "scheme": access.scheme(),
            "decision": verdict,
            "reason_code": decision.reason.code(),
            "rule": rule.map(|r| r.label.to_string()),
            "origin": rule.map(|r| r.origin.to_string()),
            "scope": rule.map(|r| r.scope.to_string()),
            "expires_at": rule.and_then(|r| r.expires_at).and_then(|s| jiff::Timestamp::from_second(s).ok()).map(|t| t.to_string()),
            "address_guard": guard_note,
            "resolved": resolved.as_ref().map(|list| list.iter().map(|(ip, class, ok)| json!({"ip": ip.to_string(), "class": class, "allowed": ok})).collect::<Vec<_>>()),
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
            if let Some(at) = r.expires_at.and_then(|s| jiff::Timestamp::from_second(s).ok()) {
                println!("  expires: {at}");
            }
        }
        println!("  address guard: {guard_note}");
        for (ip, class, ok) in resolved.iter().flatten() {
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
    Ok(ExitCode::SUCCESS)
}

/// Resolves `target` through the proxy's own dialer and classifies every address.
fn resolve(
    args: &ExplainArgs,
    file: Option<&sandgate_policy::PolicyFile>,
    (guard, rules, ctx): (&AddressGuard, &Ruleset, &Context<'_>),
    target: &Target,
) -> Result<Vec<(std::net::IpAddr, &'static str, bool)>, String> {
    let nameservers = match crate::settings::nameservers(&args.dns_server).map_err(|e| e.to_string())? {
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
        upstream_proxy: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let dialer = Dialer::new(&config, Vec::new()).map_err(|e| format!("cannot set up DNS: {e}"))?;
        let ips = dialer
            .lookup(target)
            .await
            .map_err(|e| format!("cannot resolve {target}: {e}"))?;
        Ok(ips
            .into_iter()
            .map(|ip| {
                let dialable = guard.check(ip).is_ok() && rules.deny_address(ip, target.port, ctx).is_none();
                (ip, classify(ip).as_str(), dialable)
            })
            .collect())
    })
}
