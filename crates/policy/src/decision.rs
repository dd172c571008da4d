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

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::entry::{Entry, Scope};
use crate::host::Host;
use crate::pattern::{HostPattern, Pattern};
use crate::request::{CanonicalPath, PathError, RequestRules};
use crate::target::{Access, Target};

/// A rule and where it came from, for the audit log's `rule` field and for `explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub pattern: Pattern,
    /// Exactly these ports, when the entry listed them.
    pub ports: Option<Vec<u16>>,
    pub scope: Scope,
    /// Unix seconds from which the rule is absent.
    pub expires_at: Option<i64>,
    /// `file:line`, `preset:NAME` or `flag`.
    pub origin: Arc<str>,
    /// Human label, e.g. `allow:*.example.com`; shared, so a decision copies no string.
    pub label: Arc<str>,
    /// The methods and paths it allows; `None`: every request to the host.
    pub request: Option<Arc<RequestRules>>,
}

impl Rule {
    fn new(entry: Entry, kind: &str) -> Rule {
        let ports = match &entry.ports {
            Some(p) => format!(":{}", p.iter().map(u16::to_string).collect::<Vec<_>>().join(",")),
            None => String::new(),
        };
        let request = match &entry.request {
            Some(r) => format!("[{r}]"),
            None => String::new(),
        };
        let scope = match &entry.scope {
            Scope::System => String::new(),
            other => format!(" [{other}]"),
        };
        let origin = if &*entry.origin == "flag" {
            String::new()
        } else {
            format!(" ({})", entry.origin)
        };
        // An exception's entries are labelled by the exception (`exception:ID`).
        let label = if entry.origin.starts_with("exception:") {
            entry.origin.clone()
        } else {
            Arc::from(format!("{kind}:{}{ports}{request}{scope}{origin}", entry.pattern))
        };
        Rule {
            pattern: entry.pattern,
            ports: entry.ports,
            scope: entry.scope,
            expires_at: entry.expires_at,
            origin: entry.origin,
            label,
            request: entry.request,
        }
    }

    /// Does the rule exist for this request (scope and expiry)?
    fn applies(&self, ctx: &Context<'_>) -> bool {
        self.in_scope(ctx) && !self.expired(ctx)
    }

    fn in_scope(&self, ctx: &Context<'_>) -> bool {
        match &self.scope {
            Scope::System => true,
            Scope::Project(p) => ctx.project == Some(p.as_str()),
            Scope::Task(t) => ctx.task == Some(t.as_str()),
        }
    }

    fn expired(&self, ctx: &Context<'_>) -> bool {
        self.expires_at.is_some_and(|at| ctx.now >= at)
    }

    fn allows(&self, target: &Target, access: Access) -> bool {
        match &self.ports {
            Some(ports) => ports.contains(&target.port) && self.pattern.host_matches(&target.host),
            None => self.pattern.allows(target, access),
        }
    }

    fn denies(&self, target: &Target) -> bool {
        match &self.ports {
            Some(ports) => ports.contains(&target.port) && self.pattern.host_matches(&target.host),
            None => self.pattern.denies(target),
        }
    }
}

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

/// Rule maps hash with foldhash: keys are operator-written rules, so a client cannot flood
/// them with colliding keys, and lookups are on the per-request path.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One side (allow or deny) of the policy, indexed for lookup.
#[derive(Debug, Default, Clone)]
struct RuleIndex {
    exact: FastMap<Host, Vec<Arc<Rule>>>,
    subdomains: FastMap<String, Vec<Arc<Rule>>>,
    any_name: Vec<Arc<Rule>>,
}

impl RuleIndex {
    fn insert(&mut self, rule: Rule) {
        let rule = Arc::new(rule);
        match &rule.pattern.host {
            HostPattern::AnyName => self.any_name.push(rule),
            HostPattern::Subdomains(suffix) => self
                .subdomains
                .entry(suffix.as_str().to_owned())
                .or_default()
                .push(rule),
            HostPattern::Exact(host) => self.exact.entry(host.clone()).or_default().push(rule),
        }
    }

    /// Every rule whose host part could match `host`, most specific first.
    fn candidates<'a>(&'a self, host: &'a Host) -> impl Iterator<Item = &'a Arc<Rule>> + 'a {
        let exact = self.exact.get(host).into_iter().flatten();
        let suffixes = host
            .name()
            .into_iter()
            .filter(|_| !self.subdomains.is_empty())
            .flat_map(|name| proper_suffixes(name.as_str()))
            .filter_map(|suffix| self.subdomains.get(suffix))
            .flatten();
        exact.chain(suffixes).chain(self.any_name.iter())
    }

    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.subdomains.is_empty() && self.any_name.is_empty()
    }

    fn len(&self) -> usize {
        self.exact.values().map(Vec::len).sum::<usize>()
            + self.subdomains.values().map(Vec::len).sum::<usize>()
            + self.any_name.len()
    }
}

/// The suffixes of `name` that start after a dot: `a.b.c` gives `b.c`, then `c`.
fn proper_suffixes(name: &str) -> impl Iterator<Item = &str> {
    name.match_indices('.')
        .filter_map(move |(i, _)| name.get(i + 1..))
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
mod tests {
    use super::*;
    use crate::target::parse_connect_target;

    #[test]
    fn address_deny_entries_apply_to_resolved_addresses() {
        let r = rules(&["*"], &["192.0.2.7", "[2001:db8::7]:443", "198.51.100.1"]);
        let ctx = Context::system(0);
        let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
        assert!(r.deny_address(ip("192.0.2.7"), 443, &ctx).is_some());
        assert!(r.deny_address(ip("::ffff:192.0.2.7"), 80, &ctx).is_some());
        assert!(r.deny_address(ip("2001:db8::7"), 443, &ctx).is_some());
        assert!(
            r.deny_address(ip("2001:db8::7"), 80, &ctx).is_none(),
            "that entry names port 443"
        );
        assert!(r.deny_address(ip("192.0.2.8"), 443, &ctx).is_none());
        assert!(
            rules(&["*"], &["*.example.com"])
                .deny_address(ip("192.0.2.7"), 443, &ctx)
                .is_none()
        );
    }

    /// The attacker's name answers with an IPv6 address that a NAT64, 6to4 or Teredo
    /// gateway delivers to the denied IPv4 address.
    #[test]
    fn address_deny_entries_hold_for_the_ipv4_an_ipv6_answer_carries() {
        let r = rules(&["*"], &["8.8.8.8"]);
        let ctx = Context::system(0);
        let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
        for carrier in [
            "64:ff9b::808:808",
            "64:ff9b:1::808:808",
            "::8.8.8.8",
            "2002:808:808::1",
            "2001:0:808:808::f7f7:f7f7",
        ] {
            assert!(r.deny_address(ip(carrier), 443, &ctx).is_some(), "{carrier}");
        }
        assert!(r.deny_address(ip("64:ff9b::808:809"), 443, &ctx).is_none());
    }

    fn rules(allow: &[&str], deny: &[&str]) -> Ruleset {
        let mut r = Ruleset::new();
        for a in allow {
            r.allow(Pattern::parse(a).unwrap());
        }
        for d in deny {
            r.deny(Pattern::parse(d).unwrap());
        }
        r
    }

    fn decide(r: &Ruleset, target: &str, access: Access) -> Decision {
        r.decide(
            &parse_connect_target(target).unwrap(),
            access,
            &Context::system(0),
        )
    }

    fn label(d: &Decision) -> Option<String> {
        d.rule_label().map(|l| l.to_string())
    }

    #[test]
    fn default_deny() {
        let r = rules(&[], &[]);
        let d = decide(&r, "example.com:443", Access::Connect);
        assert_eq!(
            (d.verdict, d.reason, d.rule),
            (Verdict::Deny, PolicyReason::NotAllowlisted, None)
        );
    }

    #[test]
    fn deny_wins_over_allow() {
        let r = rules(&["*.example.com", "*"], &["bad.example.com"]);
        let d = decide(&r, "bad.example.com:443", Access::Connect);
        assert_eq!(d.verdict, Verdict::Deny);
        assert_eq!(label(&d).as_deref(), Some("deny:bad.example.com"));
        let d = decide(&r, "good.example.com:443", Access::Connect);
        assert_eq!(d.verdict, Verdict::Allow);
        assert_eq!(label(&d).as_deref(), Some("allow:*.example.com"));
    }

    #[test]
    fn wildcard_deny_covers_subdomains_only() {
        let r = rules(&["*"], &["*.evil.example"]);
        assert_eq!(
            decide(&r, "x.evil.example:443", Access::Connect).verdict,
            Verdict::Deny
        );
        assert_eq!(
            decide(&r, "evil.example:443", Access::Connect).verdict,
            Verdict::Allow
        );
    }

    #[test]
    fn most_specific_rule_is_reported() {
        let r = rules(&["*", "*.example.com", "api.example.com"], &[]);
        let d = decide(&r, "api.example.com:443", Access::Connect);
        assert_eq!(label(&d).as_deref(), Some("allow:api.example.com"));
    }

    #[test]
    fn ip_literals_only_when_listed() {
        let r = rules(&["*", "192.0.2.7"], &[]);
        assert_eq!(
            decide(&r, "192.0.2.7:443", Access::Connect).verdict,
            Verdict::Allow
        );
        assert_eq!(
            decide(&r, "192.0.2.8:443", Access::Connect).verdict,
            Verdict::Deny
        );
    }

    #[test]
    fn expired_rules_that_would_match_are_found_in_scope_only() {
        let entry = |host: &str, scope: Scope, expires_at: Option<i64>| Entry {
            expires_at,
            scope,
            ..Entry::from_flag(Pattern::parse(host).unwrap())
        };
        let mut r = Ruleset::new();
        r.allow_entry(entry("a.example", Scope::System, Some(100)));
        r.allow_entry(entry("a.example", Scope::Task("t-2".into()), Some(100)));
        r.allow_entry(entry("*.b.example", Scope::System, None));
        let target = parse_connect_target("a.example:443").unwrap();
        let at = |now| Context {
            task: Some("t-1"),
            project: None,
            now,
        };
        assert!(r.expired_matches(&target, Access::Connect, &at(99)).is_empty());
        let found = r.expired_matches(&target, Access::Connect, &at(100));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].scope, Scope::System);
        let other = parse_connect_target("b.example:443").unwrap();
        assert!(r.expired_matches(&other, Access::Connect, &at(100)).is_empty());
    }

    #[test]
    fn suffixes() {
        let v: Vec<_> = proper_suffixes("a.b.c").collect();
        assert_eq!(v, ["b.c", "c"]);
        assert_eq!(proper_suffixes("c").count(), 0);
    }
}
