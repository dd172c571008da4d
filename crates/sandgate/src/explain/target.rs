//! `sandgate explain TARGET`: the proxy's answer for one destination as the headline, then
//! how the policy decided it, by which rule (file and line, scope, expiry), what the address
//! guard will still check (for what the policy allows), and which expired rules would have
//! matched; with `--resolve`, every address an allowed name resolves to, through the proxy's
//! own dialer. `--request-id` shows the same for a recorded request's
//! destination ([`Explanation`]), under "now".

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;

use sandgate_policy::addr::classify;
use sandgate_policy::{
    Access, AddressGuard, Context, Decision, Host, PolicyFile, Rule, Ruleset, Target, Verdict,
    parse_connect_target, parse_http_target,
};
use serde_json::{Value, json};

use sandgate_proxy::Nameservers;
use sandgate_proxy::dial::{DialConfig, Dialer};

use crate::cli::ExplainArgs;
use crate::settings::{patterns, ranges};

/// Exit status: the proxy would refuse the destination.
const EXIT_DENIED: u8 = 1;
/// Exit status: allowed by the policy, but the name does not resolve (`--resolve`).
const EXIT_UNRESOLVED: u8 = 2;

/// A request as explain decides it: where it goes, how, and for plain HTTP its method and
/// origin-form target (`/path?query`).
pub(super) type Asked = (Target, Access, Option<(String, String)>);

/// Reads TARGET: a URL (`http://` is plain HTTP, its path the request's; `https://` is
/// CONNECT to 443 or its port, its path the request's should the tunnel be intercepted;
/// schemes in any case), `host:port` (CONNECT) or a bare host (CONNECT to 443). `method` is
/// the request's.
pub(super) fn parse_target(text: &str, method: &str) -> Result<Asked, String> {
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
                let tail = rest.get(authority.len()..).unwrap_or("");
                let tail = tail.split('#').next().unwrap_or("");
                let origin_form = match tail.chars().next() {
                    Some('/') => tail.to_owned(),
                    _ => format!("/{tail}"),
                };
                parse_connect_target(&with_default_port(authority, 443))
                    .map(|t| (t, Access::Connect, Some((method.to_owned(), origin_form))))
                    .map_err(|e| e.to_string())
            }
            "http" => parse_http_target(&format!("http://{rest}"))
                .map(|t| (t.target, Access::Http, Some((method.to_owned(), t.origin_form))))
                .map_err(|e| e.to_string()),
            other => Err(format!(
                "scheme {other:?}: use http://, https://, host or host:port"
            )),
        };
    }
    parse_connect_target(&with_default_port(text, 443))
        .map(|t| (t, Access::Connect, None))
        .map_err(|e| e.to_string())
}

/// `sandgate explain TARGET`: prints the explanation; exits with the proxy's answer.
pub(super) fn explain(args: &ExplainArgs, text: &str) -> Result<ExitCode, String> {
    let method = args.method.as_deref().unwrap_or("GET");
    let asked = parse_target(text, method).map_err(|e| format!("invalid target {text:?}: {e}"))?;
    if args.method.is_some() && asked.2.is_none() {
        return Err(format!(
            "--method is for a request (an http:// or https:// URL); {text:?} names a tunnel only"
        ));
    }
    let setup = Setup::from_args(args)?;
    let who = (args.task.as_deref(), args.project.as_deref());
    let explained = Explanation::of(args, &setup, &asked, who)?;
    if args.json {
        println!("{}", explained.json());
    } else {
        for line in explained.lines() {
            println!("{line}");
        }
    }
    Ok(ExitCode::from(explained.exit))
}

/// The rules and address guard explain decides with: the policy file and the flags given
/// here (the environment belongs to `proxy`).
pub(super) struct Setup {
    file: Option<PolicyFile>,
    rules: Ruleset,
    guard: AddressGuard,
}

impl Setup {
    pub(super) fn from_args(args: &ExplainArgs) -> Result<Setup, String> {
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
        Ok(Setup {
            file,
            rules,
            guard: AddressGuard::new(exempt),
        })
    }

    /// Whether a policy was given at all (a file, or an allow or deny flag).
    pub(super) fn given(args: &ExplainArgs) -> bool {
        args.policy.is_some() || !args.allow.is_empty() || !args.deny.is_empty()
    }
}

/// What `--resolve` found.
enum Resolved {
    /// Every address, its class, and whether the proxy would dial it.
    Addrs(Vec<(IpAddr, &'static str, bool)>),
    /// The name did not resolve (NXDOMAIN, no records, a timeout): why.
    Failed(String),
}

/// What the address guard will do: a note, and whether it refuses the target already (an
/// IP literal it refuses).
struct GuardNote {
    text: String,
    refuses: bool,
}

fn guard_note(guard: &AddressGuard, target: &Target) -> GuardNote {
    let (text, refuses) = match &target.host {
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
    GuardNote { text, refuses }
}

/// How the proxy would decide one destination, and why.
pub(super) struct Explanation {
    target: Target,
    access: Access,
    /// A request's method and path (without the query), when it was decided with them.
    line: Option<(String, String)>,
    /// The request is one inside a tunnel the proxy intercepts (its host is allowed only
    /// by entries with methods or paths).
    intercepted: bool,
    decision: Decision,
    expired: Vec<Arc<Rule>>,
    guard: GuardNote,
    resolved: Option<Resolved>,
    /// `allow`, `deny` or `unresolved`: the proxy's answer, the guard and addresses included.
    outcome: &'static str,
    pub(super) exit: u8,
}

impl Explanation {
    /// Decides `dest` for the task and project `who` with `setup`, and resolves the name
    /// when `--resolve` asks for it.
    pub(super) fn of(
        args: &ExplainArgs,
        setup: &Setup,
        (target, access, line): &Asked,
        who: (Option<&str>, Option<&str>),
    ) -> Result<Explanation, String> {
        let (target, access) = (target, *access);
        let ctx = Context {
            task: who.0,
            project: who.1,
            now: sandgate_proxy::unix_now(),
        };
        let request = line
            .as_ref()
            .map(|(method, path)| sandgate_policy::RequestLine { method, target: path });
        // A tunnel is decided blind; one that only entries with methods or paths allow is
        // intercepted, and the request inside is decided as the proxy would.
        let (decision, intercepted) = match access {
            Access::Connect => {
                let tunnel = setup.rules.decide(target, access, &ctx);
                match (tunnel.reason, request) {
                    (sandgate_policy::PolicyReason::InspectionRequired, Some(_)) => (
                        setup.rules.decide_request(target, Access::Https, &ctx, request),
                        true,
                    ),
                    _ => (tunnel, false),
                }
            }
            Access::Https => (setup.rules.decide_request(target, access, &ctx, request), true),
            _ => (setup.rules.decide_request(target, access, &ctx, request), false),
        };
        let line = line.as_ref().filter(|_| access != Access::Connect || intercepted);
        let line = line.map(|(m, p)| {
            (
                m.clone(),
                p.split_once('?').map_or(p.as_str(), |(p, _)| p).to_owned(),
            )
        });
        let expired = setup.rules.expired_matches(target, access, &ctx);
        let guard = guard_note(&setup.guard, target);
        // The proxy resolves only what the policy allows; so does explain.
        let resolved = match args.resolve && decision.verdict == Verdict::Allow {
            true => Some(resolve(args, setup, &ctx, target)?),
            false => None,
        };
        // The proxy's answer: the policy first, then what the guard and deny entries say of
        // the addresses; one refused address refuses the name, as in the proxy.
        let (outcome, exit) = match (&decision.verdict, &resolved) {
            (Verdict::Deny, _) => ("deny", EXIT_DENIED),
            (Verdict::Allow, _) if guard.refuses => ("deny", EXIT_DENIED),
            (Verdict::Allow, Some(Resolved::Failed(_))) => ("unresolved", EXIT_UNRESOLVED),
            (Verdict::Allow, Some(Resolved::Addrs(list))) if list.iter().any(|(_, _, ok)| !ok) => {
                ("deny", EXIT_DENIED)
            }
            (Verdict::Allow, _) => ("allow", 0),
        };
        Ok(Explanation {
            target: target.clone(),
            access,
            line,
            intercepted,
            decision,
            expired,
            guard,
            resolved,
            outcome,
            exit,
        })
    }

    fn verdict(&self) -> &'static str {
        match self.decision.verdict {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
        }
    }

    /// The explanation as one JSON object.
    pub(super) fn json(&self) -> Value {
        let rule = self.decision.rule.as_deref();
        let resolved = match &self.resolved {
            Some(Resolved::Addrs(list)) => Some(
                list.iter()
                    .map(|(ip, class, ok)| json!({"ip": ip.to_string(), "class": class, "allowed": ok}))
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        };
        json!({
            "target": self.target.to_string(),
            "scheme": self.access.scheme(),
            "method": self.line.as_ref().map(|l| &l.0),
            "path": self.line.as_ref().map(|l| &l.1),
            "intercepted": self.intercepted,
            "decision": self.verdict(),
            "outcome": self.outcome,
            "exit_status": self.exit,
            "reason_code": self.decision.reason.code(),
            "rule": rule.map(|r| r.label.to_string()),
            "origin": rule.map(|r| r.origin.to_string()),
            "scope": rule.map(|r| r.scope.to_string()),
            "expires_at": stamp(rule.and_then(|r| r.expires_at)),
            "expired_rules": self.expired.iter().map(|r| json!({"rule": r.label.to_string(), "expired_at": stamp(r.expires_at)})).collect::<Vec<_>>(),
            "address_guard": self.guard.text,
            "resolved": resolved,
            "resolve_error": match &self.resolved {
                Some(Resolved::Failed(why)) => Some(why.clone()),
                _ => None,
            },
        })
    }

    /// The first line: the proxy's answer (the policy's, unless the address guard, an
    /// address deny entry or the resolver overrules it) and why.
    fn headline(&self) -> String {
        let why = match (self.outcome, &self.resolved) {
            (outcome, _) if outcome == self.verdict() => self.decision.reason.describe().to_owned(),
            ("unresolved", _) => {
                "allowed by the policy, but the name does not resolve (the proxy would answer 502)".to_owned()
            }
            (_, Some(Resolved::Addrs(list))) if !self.guard.refuses => {
                let refused: Vec<String> = list
                    .iter()
                    .filter(|(_, _, ok)| !ok)
                    .map(|(ip, class, _)| format!("{ip} ({class})"))
                    .collect();
                format!(
                    "allowed by the policy, but the name resolves to an address the proxy refuses: {}",
                    refused.join(", ")
                )
            }
            _ => format!("allowed by the policy, but {}", self.guard.text),
        };
        match &self.line {
            Some((method, path)) if self.intercepted => format!(
                "{} {method} https://{}{path}: {why} (inside a tunnel the proxy intercepts: a run does by itself, a proxy with --intercept-ca-cert)",
                self.outcome, self.target
            ),
            Some((method, path)) => format!("{} {method} http://{}{path}: {why}", self.outcome, self.target),
            None => format!("{} {} {}: {why}", self.outcome, self.access.scheme(), self.target),
        }
    }

    /// The explanation as text, one line each: the answer first, then how it was reached.
    pub(super) fn lines(&self) -> Vec<String> {
        let mut out = vec![self.headline()];
        if self.outcome != self.verdict() {
            out.push(format!(
                "  policy:  {}: {}",
                self.verdict(),
                self.decision.reason.describe()
            ));
        }
        if let Some(r) = self.decision.rule.as_deref() {
            out.push(format!("  rule:    {}", r.label));
            out.push(format!("  from:    {}", r.origin));
            out.push(format!("  scope:   {}", r.scope));
            out.extend(stamp(r.expires_at).map(|at| format!("  expires: {at}")));
        }
        for r in &self.expired {
            out.push(format!(
                "  expired: {} (since {}) would have matched",
                r.label,
                stamp(r.expires_at).unwrap_or_default()
            ));
        }
        // A name the policy denies is never resolved nor dialled: the guard has no say.
        if self.decision.verdict == Verdict::Allow {
            out.push(format!("  address guard: {}", self.guard.text));
        }
        out.extend(self.resolved_lines());
        out
    }

    fn resolved_lines(&self) -> Vec<String> {
        match &self.resolved {
            Some(Resolved::Addrs(list)) => list
                .iter()
                .map(|(ip, class, ok)| {
                    let verdict = match ok {
                        true => "may be dialled",
                        false => "refused by the address guard or a deny entry",
                    };
                    format!("  resolved: {ip} ({class}) {verdict}")
                })
                .collect(),
            Some(Resolved::Failed(why)) => {
                vec![format!("  resolved: nothing: {why} (the proxy would answer 502)")]
            }
            None => Vec::new(),
        }
    }
}

/// Unix seconds as RFC 3339.
fn stamp(at: Option<i64>) -> Option<String> {
    at.and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map(|t| t.to_string())
}

/// Resolves `target` through the proxy's own dialer and classifies every address. A name
/// that does not resolve is an answer, not an error; a resolver that cannot be set up is.
fn resolve(
    args: &ExplainArgs,
    setup: &Setup,
    ctx: &Context<'_>,
    target: &Target,
) -> Result<Resolved, String> {
    let nameservers =
        match crate::settings::nameservers("--dns-server", &args.dns_server).map_err(|e| e.to_string())? {
            Nameservers::System => match setup.file.as_ref().and_then(|f| f.resolver.as_ref()) {
                Some(r) if !r.servers.is_empty() => Nameservers::Explicit(r.servers.clone()),
                _ => Nameservers::System,
            },
            explicit => explicit,
        };
    let config = DialConfig {
        nameservers,
        dns_timeout: std::time::Duration::from_secs(5),
        connect_timeout: std::time::Duration::from_secs(5),
        guard: setup.guard.clone(),
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
                    let dialable = setup.guard.check(ip).is_ok()
                        && setup.rules.deny_address(ip, target.port, ctx).is_none();
                    (ip, classify(ip).as_str(), dialable)
                })
                .collect(),
        ))
    })
}
