//! A rule as the decision uses it (where it came from, its label, whether it applies to a
//! request), and one side of the policy (allow or deny) indexed for lookup: by exact host,
//! by wildcard suffix, and the rules for any name.

use std::collections::HashMap;
use std::sync::Arc;

use crate::entry::{Entry, Scope};
use crate::host::Host;
use crate::pattern::{HostPattern, Pattern};
use crate::request::RequestRules;
use crate::target::{Access, Target};

use super::Context;

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
    pub(super) fn new(entry: Entry, kind: &str) -> Rule {
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
    pub(super) fn applies(&self, ctx: &Context<'_>) -> bool {
        self.in_scope(ctx) && !self.expired(ctx)
    }

    pub(super) fn in_scope(&self, ctx: &Context<'_>) -> bool {
        match &self.scope {
            Scope::System => true,
            Scope::Project(p) => ctx.project == Some(p.as_str()),
            Scope::Task(t) => ctx.task == Some(t.as_str()),
        }
    }

    pub(super) fn expired(&self, ctx: &Context<'_>) -> bool {
        self.expires_at.is_some_and(|at| ctx.now >= at)
    }

    pub(super) fn allows(&self, target: &Target, access: Access) -> bool {
        match &self.ports {
            Some(ports) => ports.contains(&target.port) && self.pattern.host_matches(&target.host),
            None => self.pattern.allows(target, access),
        }
    }

    pub(super) fn denies(&self, target: &Target) -> bool {
        match &self.ports {
            Some(ports) => ports.contains(&target.port) && self.pattern.host_matches(&target.host),
            None => self.pattern.denies(target),
        }
    }
}

/// Rule maps hash with foldhash: keys are operator-written rules, so a client cannot flood
/// them with colliding keys, and lookups are on the per-request path.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One side (allow or deny) of the policy, indexed for lookup.
#[derive(Debug, Default, Clone)]
pub(super) struct RuleIndex {
    pub(super) exact: FastMap<Host, Vec<Arc<Rule>>>,
    pub(super) subdomains: FastMap<String, Vec<Arc<Rule>>>,
    pub(super) any_name: Vec<Arc<Rule>>,
}

impl RuleIndex {
    pub(super) fn insert(&mut self, rule: Rule) {
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
    pub(super) fn candidates<'a>(&'a self, host: &'a Host) -> impl Iterator<Item = &'a Arc<Rule>> + 'a {
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

    pub(super) fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.subdomains.is_empty() && self.any_name.is_empty()
    }

    pub(super) fn len(&self) -> usize {
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

#[cfg(test)]
mod tests {
    use super::proper_suffixes;

    #[test]
    fn suffixes() {
        let v: Vec<_> = proper_suffixes("a.b.c").collect();
        assert_eq!(v, ["b.c", "c"]);
        assert_eq!(proper_suffixes("c").count(), 0);
    }
}
