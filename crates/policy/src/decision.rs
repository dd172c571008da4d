//! The policy decision: given the allow and deny rules, is this destination permitted?
//!
//! Default deny; a matching deny rule always wins over any allow rule. Rules are indexed by
//! exact host and by wildcard suffix, so a decision costs a few hash lookups per label of the
//! target name whatever the number of rules (10,000 entries decide in well under a
//! microsecond; see `benches/`). Pure: no I/O, no clock; the address guard comes later, in the
//! proxy, and always applies to an allowed name.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::host::Host;
use crate::pattern::{HostPattern, Pattern};
use crate::target::{Access, Target};

/// Where a rule came from, for the audit log's `rule` field and for `explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub pattern: Pattern,
    /// Human label, e.g. `allow:*.example.com`; shared, so a decision copies no string.
    pub label: Arc<str>,
}

impl Rule {
    fn new(pattern: Pattern, kind: &str) -> Rule {
        let label = Arc::from(format!("{kind}:{pattern}"));
        Rule { pattern, label }
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
}

impl PolicyReason {
    pub fn code(self) -> &'static str {
        match self {
            PolicyReason::Allowlisted => "allowlisted",
            PolicyReason::Denylisted => "denylisted",
            PolicyReason::NotAllowlisted => "not_allowlisted",
        }
    }

    /// Short text for the 403 body.
    pub fn describe(self) -> &'static str {
        match self {
            PolicyReason::Allowlisted => "allowed",
            PolicyReason::Denylisted => "matches a deny rule",
            PolicyReason::NotAllowlisted => "not in allowlist",
        }
    }
}

/// The outcome of [`Ruleset::decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub reason: PolicyReason,
    /// The rule that decided; `None` for the default deny.
    pub rule: Option<Arc<str>>,
}

/// Rule maps hash with foldhash: keys are operator-written rules, so a client cannot flood
/// them with colliding keys, and lookups are on the per-request path.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One side (allow or deny) of the policy, indexed for lookup.
#[derive(Debug, Default, Clone)]
struct RuleIndex {
    exact: FastMap<Host, Vec<Rule>>,
    subdomains: FastMap<String, Vec<Rule>>,
    any_name: Vec<Rule>,
}

impl RuleIndex {
    fn insert(&mut self, rule: Rule) {
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
    fn candidates<'a>(&'a self, host: &'a Host) -> impl Iterator<Item = &'a Rule> + 'a {
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
}

impl Ruleset {
    pub fn new() -> Ruleset {
        Ruleset::default()
    }

    /// Adds an allow rule.
    pub fn allow(&mut self, pattern: Pattern) {
        self.allow.insert(Rule::new(pattern, "allow"));
    }

    /// Adds a deny rule; deny rules always win.
    pub fn deny(&mut self, pattern: Pattern) {
        self.deny.insert(Rule::new(pattern, "deny"));
    }

    /// Number of allow and deny rules.
    pub fn len(&self) -> (usize, usize) {
        (self.allow.len(), self.deny.len())
    }

    /// True when nothing is allowed at all (every request will be denied).
    pub fn allows_nothing(&self) -> bool {
        self.allow.is_empty()
    }

    /// Decides `target` for `access`. Deny rules are consulted first and always win.
    pub fn decide(&self, target: &Target, access: Access) -> Decision {
        if let Some(rule) = self
            .deny
            .candidates(&target.host)
            .find(|r| r.pattern.denies(target))
        {
            return Decision {
                verdict: Verdict::Deny,
                reason: PolicyReason::Denylisted,
                rule: Some(rule.label.clone()),
            };
        }
        match self
            .allow
            .candidates(&target.host)
            .find(|r| r.pattern.allows(target, access))
        {
            Some(rule) => Decision {
                verdict: Verdict::Allow,
                reason: PolicyReason::Allowlisted,
                rule: Some(rule.label.clone()),
            },
            None => Decision {
                verdict: Verdict::Deny,
                reason: PolicyReason::NotAllowlisted,
                rule: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::parse_connect_target;

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
        r.decide(&parse_connect_target(target).unwrap(), access)
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
        assert_eq!(d.rule.as_deref(), Some("deny:bad.example.com"));
        let d = decide(&r, "good.example.com:443", Access::Connect);
        assert_eq!(d.verdict, Verdict::Allow);
        assert_eq!(d.rule.as_deref(), Some("allow:*.example.com"));
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
        assert_eq!(d.rule.as_deref(), Some("allow:api.example.com"));
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
    fn suffixes() {
        let v: Vec<_> = proper_suffixes("a.b.c").collect();
        assert_eq!(v, ["b.c", "c"]);
        assert_eq!(proper_suffixes("c").count(), 0);
    }
}
