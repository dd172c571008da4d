//! The policy decision: given the allow and deny rules, is this destination permitted?
//!
//! Default deny; a matching deny rule always wins over any allow rule. Rules are indexed by
//! exact host and by wildcard suffix, so a decision costs a few hash lookups per label of the
//! target name whatever the number of rules (10,000 entries decide in well under a
//! microsecond; see `benches/`). Pure: no I/O, no clock (the time is a [`Context`] field);
//! the address guard comes later, in the proxy, and always applies to an allowed name.
//!
//! Scopes add up: a request attributed to task T of project P is decided against the union of
//! the system entries, P's entries and T's entries. An entry at or past its expiry is absent.

use std::sync::Arc;

use serde::Serialize;

use crate::entry::Entry;
use crate::host::Host;
use crate::pattern::Pattern;
use crate::request::{CanonicalPath, PathError};
use crate::target::{Access, Target};

mod rule;

pub use rule::Rule;
use rule::RuleIndex;

/// Who traffic belongs to: the task, project and job it is attributed to (from the listener
/// it arrived on, or from a credential), the subject that started it (a person, a
/// service) and the agent acting for it (an MCP client, a coding agent), both as stated:
/// recorded, and never deciding anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub task: Option<String>,
    pub project: Option<String>,
    pub job: Option<String>,
    pub subject: Option<String>,
    pub agent: Option<String>,
}

/// Who is asking, and when: the inputs of a decision besides the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context<'a> {
    pub task: Option<&'a str>,
    pub project: Option<&'a str>,
    /// Unix seconds.
    pub now: i64,
}

impl Context<'_> {
    /// A request with no task or project (system entries only).
    pub fn system(now: i64) -> Context<'static> {
        Context {
            task: None,
            project: None,
            now,
        }
    }
}

/// Whether a request may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Deny,
}

/// Why the policy decided as it did; `reason_code` in the audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyReason {
    /// An allow rule matched and no deny rule did.
    Allowlisted,
    /// A deny rule matched.
    Denylisted,
    /// No allow rule matched (default deny).
    NotAllowlisted,
    /// Allow rules name the host, but none allows this method and path.
    RequestNotAllowed,
    /// Allow rules name the host with paths, and this path is spelt in a way that could
    /// reach another (an encoded `/`, a `..` segment): refused rather than guessed at.
    PathNotCanonical,
    /// Only allow rules with methods or paths name the host, and this tunnel's requests
    /// cannot be seen.
    InspectionRequired,
}

impl PolicyReason {
    /// Every reason, for reading one back by its code.
    pub const ALL: [PolicyReason; 6] = [
        PolicyReason::Allowlisted,
        PolicyReason::Denylisted,
        PolicyReason::NotAllowlisted,
        PolicyReason::RequestNotAllowed,
        PolicyReason::PathNotCanonical,
        PolicyReason::InspectionRequired,
    ];

    pub fn code(self) -> &'static str {
        match self {
            PolicyReason::Allowlisted => "allowlisted",
            PolicyReason::Denylisted => "denylisted",
            PolicyReason::NotAllowlisted => "not_allowlisted",
            PolicyReason::RequestNotAllowed => "request_not_allowed",
            PolicyReason::PathNotCanonical => "path_not_canonical",
            PolicyReason::InspectionRequired => "inspection_required",
        }
    }

    /// Short text for the 403 body.
    pub fn describe(self) -> &'static str {
        match self {
            PolicyReason::Allowlisted => "allowed",
            PolicyReason::Denylisted => "matches a deny rule",
            PolicyReason::NotAllowlisted => "not in allowlist",
            PolicyReason::RequestNotAllowed => "method or path not allowed",
            PolicyReason::PathNotCanonical => "path spelt in a way no rule matches",
            PolicyReason::InspectionRequired => {
                "allowed only for some methods or paths, which a tunnel hides"
            }
        }
    }
}

/// The outcome of [`Ruleset::decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub reason: PolicyReason,
    /// The rule that decided; `None` for the default deny.
    pub rule: Option<Arc<Rule>>,
}

impl Decision {
    /// The deciding rule's label, for the audit log.
    pub fn rule_label(&self) -> Option<Arc<str>> {
        self.rule.as_ref().map(|r| r.label.clone())
    }
}

/// The allow and deny rules in force.
#[derive(Debug, Default, Clone)]
pub struct Ruleset {
    allow: RuleIndex,
    deny: RuleIndex,
    /// Task credentials for listeners that require them; swapped together with the rules.
    credentials: crate::auth::Credentials,
    /// What tunnels may carry; swapped together with the rules.
    tunnels: crate::tunnel::TunnelRules,
    /// Secrets bound to a host and a header; swapped together with the rules. A tunnel to
    /// a host that has one is never let through blind.
    secrets: crate::credential::BoundSecrets,
}

impl Ruleset {
    pub fn new() -> Ruleset {
        Ruleset::default()
    }

    /// The rules of a policy file plus the system-scope patterns given on the command line.
    pub fn from_parts(
        allow: &[Pattern],
        deny: &[Pattern],
        file: Option<&crate::document::PolicyFile>,
    ) -> Ruleset {
        let mut rules = Ruleset::new();
        allow.iter().cloned().for_each(|p| rules.allow(p));
        deny.iter().cloned().for_each(|p| rules.deny(p));
        if let Some(file) = file {
            file.allow.iter().cloned().for_each(|e| rules.allow_entry(e));
            file.deny.iter().cloned().for_each(|e| rules.deny_entry(e));
            rules.tunnels = file.tunnels.clone();
        }
        rules
    }

    /// Sets the task credentials.
    pub fn set_credentials(&mut self, credentials: crate::auth::Credentials) {
        self.credentials = credentials;
    }

    /// The task credentials in force.
    pub fn credentials(&self) -> &crate::auth::Credentials {
        &self.credentials
    }

    /// The secrets bound to hosts.
    pub fn secrets(&self) -> &crate::credential::BoundSecrets {
        &self.secrets
    }

    /// Sets the secrets bound to hosts.
    pub fn set_secrets(&mut self, secrets: crate::credential::BoundSecrets) {
        self.secrets = secrets;
    }

    /// What tunnels may carry.
    pub fn tunnels(&self) -> &crate::tunnel::TunnelRules {
        &self.tunnels
    }

    /// Sets what tunnels may carry.
    pub fn set_tunnels(&mut self, tunnels: crate::tunnel::TunnelRules) {
        self.tunnels = tunnels;
    }

    /// Adds a system-scope allow rule given on the command line.
    pub fn allow(&mut self, pattern: Pattern) {
        self.allow.insert(Rule::new(Entry::from_flag(pattern), "allow"));
    }

    /// Adds a system-scope deny rule given on the command line; deny rules always win.
    pub fn deny(&mut self, pattern: Pattern) {
        self.deny.insert(Rule::new(Entry::from_flag(pattern), "deny"));
    }

    /// Adds an allow entry from a policy file.
    pub fn allow_entry(&mut self, entry: Entry) {
        self.allow.insert(Rule::new(entry, "allow"));
    }

    /// Adds a deny entry from a policy file.
    pub fn deny_entry(&mut self, entry: Entry) {
        self.deny.insert(Rule::new(entry, "deny"));
    }

    /// Number of allow and deny rules.
    pub fn len(&self) -> (usize, usize) {
        (self.allow.len(), self.deny.len())
    }

    /// True when nothing is allowed at all (every request will be denied).
    pub fn allows_nothing(&self) -> bool {
        self.allow.is_empty()
    }

    /// The deny rule, if any, that names the address `ip` (an IP-literal entry) for a
    /// connection to `port` in `ctx`. Deny entries that are addresses apply to whatever a
    /// name resolves to as well, not only to requests that spell the address; an IPv6
    /// answer that carries an IPv4 address (mapped, NAT64, 6to4, Teredo) counts as each
    /// address it may end at ([`crate::addr::reached`]).
    pub fn deny_address(&self, ip: std::net::IpAddr, port: u16, ctx: &Context<'_>) -> Option<Arc<Rule>> {
        if self.deny.exact.is_empty() {
            return None;
        }
        crate::addr::reached(ip).find_map(|reached| {
            let target = Target {
                host: Host::Ip(reached),
                port,
            };
            self.deny
                .exact
                .get(&target.host)
                .into_iter()
                .flatten()
                .find(|r| r.applies(ctx) && r.denies(&target))
                .cloned()
        })
    }

    /// Allow rules naming an IP literal that `guard` refuses (a private or loopback address
    /// outside every allow range): they can never let a connection through, which is worth
    /// a warning at start.
    pub fn guarded_literals(
        &self,
        guard: &crate::addr::AddressGuard,
    ) -> Vec<(Arc<Rule>, crate::addr::AddrClass)> {
        let mut found: Vec<_> = self
            .allow
            .exact
            .iter()
            .filter_map(|(host, rules)| match host {
                Host::Ip(ip) => guard.check(*ip).err().map(|p| (rules, p.class)),
                Host::Name(_) => None,
            })
            .flat_map(|(rules, class)| rules.iter().map(move |r| (r.clone(), class)))
            .collect();
        found.sort_by(|a, b| a.0.label.cmp(&b.0.label));
        found
    }

    /// The rules in scope for `ctx` that would match `target` but have expired, deny rules
    /// first: what `explain` points at when a destination is refused that used to pass.
    pub fn expired_matches(&self, target: &Target, access: Access, ctx: &Context<'_>) -> Vec<Arc<Rule>> {
        let deny = self
            .deny
            .candidates(&target.host)
            .filter(|r| r.in_scope(ctx) && r.expired(ctx) && r.denies(target));
        let allow = self
            .allow
            .candidates(&target.host)
            .filter(|r| r.in_scope(ctx) && r.expired(ctx) && r.allows(target, access));
        deny.chain(allow).cloned().collect()
    }

    /// Decides `target` for `access` in `ctx`, when no request inside is seen (a tunnel).
    /// Deny rules are consulted first and always win.
    pub fn decide(&self, target: &Target, access: Access, ctx: &Context<'_>) -> Decision {
        self.decide_request(target, access, ctx, None)
    }

    /// Decides `target` for `access` in `ctx`, and the request `line` when one is seen (plain
    /// HTTP): an allow rule with methods or paths allows only the requests it names, and
    /// none where no request is seen. Deny rules are consulted first and always win.
    pub fn decide_request(
        &self,
        target: &Target,
        access: Access,
        ctx: &Context<'_>,
        line: Option<RequestLine<'_>>,
    ) -> Decision {
        let denied = match self.deny.is_empty() {
            true => None,
            false => self
                .deny
                .candidates(&target.host)
                .find(|r| r.applies(ctx) && r.denies(target)),
        };
        if let Some(rule) = denied {
            return Decision {
                verdict: Verdict::Deny,
                reason: PolicyReason::Denylisted,
                rule: Some(rule.clone()),
            };
        }
        // The first rule for the host that allows the request decides; failing that, the
        // first that names the host but not this request says why it was refused.
        let mut path: Option<Result<CanonicalPath, PathError>> = None;
        let mut closest: Option<&Arc<Rule>> = None;
        // A rule with paths refused the request because its path could not be read.
        let mut unreadable = false;
        // A host with a secret bound to it is reached only where requests are seen.
        let blind_ok = line.is_some() || !self.secrets.binds(&target.host);
        for rule in self
            .allow
            .candidates(&target.host)
            .filter(|r| r.applies(ctx) && r.allows(target, access))
        {
            let passes = match (&rule.request, line) {
                (None, _) => blind_ok,
                (Some(_), None) => false,
                (Some(rules), Some(line)) => {
                    match path.get_or_insert_with(|| CanonicalPath::parse(line.target)) {
                        Ok(p) => rules.allows(line.method, p),
                        Err(_) => {
                            unreadable |= rules.has_paths();
                            rules.allows_any_path(line.method)
                        }
                    }
                }
            };
            if passes {
                return Decision {
                    verdict: Verdict::Allow,
                    reason: PolicyReason::Allowlisted,
                    rule: Some(rule.clone()),
                };
            }
            closest.get_or_insert(rule);
        }
        let reason = match (closest, line) {
            (None, _) => PolicyReason::NotAllowlisted,
            (Some(_), None) => PolicyReason::InspectionRequired,
            (Some(_), Some(_)) if unreadable => PolicyReason::PathNotCanonical,
            (Some(_), Some(_)) => PolicyReason::RequestNotAllowed,
        };
        Decision {
            verdict: Verdict::Deny,
            reason,
            rule: closest.cloned(),
        }
    }
}

/// A request as seen inside a connection: its method and its request-target in origin form
/// (`/path?query`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLine<'a> {
    pub method: &'a str,
    pub target: &'a str,
}

#[cfg(test)]
mod tests;
