//! The conversion's bookkeeping: every error found, with its file, line and field, and the
//! conversion of one allow or deny entry (pattern, ports, scope, TTL, expiry).

use std::sync::Arc;

use serde_saphyr::Spanned;

use super::DocError;
use super::first_loaded::{FirstLoaded, entry_text};
use super::raw::{RawEntry, RawEntryFull, RawScope, RawTlsOnly, RawTunnels};
use crate::entry::{Entry, Scope};
use crate::pattern::HostPattern;
use crate::pattern::Pattern;
use crate::request::{RequestRules, RulesError};
use crate::tunnel::{SniMode, TlsOnly, TunnelRules};

/// Which side of the policy an entry is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Allow,
    Deny,
}

pub(super) struct Checker<'a> {
    pub(super) file: &'a str,
    pub(super) errors: Vec<DocError>,
    /// What is valid but cannot be what was meant (an entry already expired, a CIDR with
    /// host bits, a host both allowed and denied).
    pub(super) warnings: Vec<DocError>,
    /// When the TTL entries of the version in force were first loaded (empty at start).
    pub(super) earlier: &'a FirstLoaded,
    /// The same for this document's TTL entries, filled as they are checked.
    pub(super) loaded: FirstLoaded,
}

impl Checker<'_> {
    pub(super) fn warn(&mut self, line: u64, field: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(DocError {
            file: self.file.to_owned(),
            line,
            field: field.into(),
            message: message.into(),
        });
    }

    pub(super) fn error(&mut self, line: u64, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(DocError {
            file: self.file.to_owned(),
            line,
            field: field.into(),
            message: message.into(),
        });
    }

    /// One allow or deny entry, or `None` after reporting every error in it.
    pub(super) fn entry(
        &mut self,
        raw: &Spanned<RawEntry>,
        field: &str,
        kind: Kind,
        now: i64,
    ) -> Option<Entry> {
        let line = raw.referenced.line();
        let e = &raw.value.0;
        let pattern = match Pattern::parse(&e.host) {
            Ok(p) => Some(p),
            Err(err) => {
                self.error(line, format!("{field}.host"), format!("{:?}: {err}", e.host));
                None
            }
        };
        // Each part is checked (and its errors reported) before any is given up on.
        let ports = self.ports(line, field, e.ports.as_deref(), pattern.as_ref());
        let scope = self.scope(line, field, e.scope.as_ref());
        let expires_at = self.expiry(line, field, e, now);
        let request = self.request_rules(line, field, kind, e);
        Some(Entry {
            pattern: pattern?,
            ports: ports?,
            scope: scope?,
            expires_at: expires_at?,
            created_by: e.created_by.clone(),
            reason: e.reason.clone(),
            origin: Arc::from(format!("{}:{line}", self.file)),
            request: request?,
        })
    }

    /// An allow entry's `methods`, `paths` and `read_only`: `Some(None)` when it has none,
    /// `None` when they are invalid. A deny entry has none: it refuses the whole host, and
    /// what a host allows is listed on the allow side.
    fn request_rules(
        &mut self,
        line: u64,
        field: &str,
        kind: Kind,
        e: &RawEntryFull,
    ) -> Option<Option<Arc<RequestRules>>> {
        let given = e.methods.is_some() || e.paths.is_some() || e.read_only;
        if kind == Kind::Deny && given {
            let which = match (&e.methods, &e.paths) {
                (Some(_), _) => "methods",
                (None, Some(_)) => "paths",
                (None, None) => "read_only",
            };
            self.error(
                line,
                format!("{field}.{which}"),
                "a deny entry refuses its whole host; list the methods and paths a host allows on its allow entry instead",
            );
            return None;
        }
        match RequestRules::new(e.methods.as_deref(), e.paths.as_deref(), e.read_only) {
            Ok(rules) => Some(rules.map(Arc::new)),
            Err(err) => {
                let which = match err {
                    RulesError::Path { .. } => "paths",
                    RulesError::ReadOnlyAndMethods => "read_only",
                    RulesError::Method(_) => "methods",
                    RulesError::Empty if e.methods.as_ref().is_some_and(Vec::is_empty) => "methods",
                    RulesError::Empty => "paths",
                };
                self.error(line, format!("{field}.{which}"), err.to_string());
                None
            }
        }
    }

    /// An entry's `ports`: `Some(None)` when there are none (the pattern's default ports
    /// apply), `None` when they are invalid.
    fn ports(
        &mut self,
        line: u64,
        field: &str,
        list: Option<&[i64]>,
        pattern: Option<&Pattern>,
    ) -> Option<Option<Vec<u16>>> {
        let Some(list) = list else {
            return Some(None);
        };
        let mut ok = true;
        let mut ports = Vec::with_capacity(list.len());
        for p in list {
            match u16::try_from(*p) {
                Ok(port) if port > 0 => ports.push(port),
                _ => {
                    self.error(
                        line,
                        format!("{field}.ports"),
                        format!("port {p} out of range 1-65535"),
                    );
                    ok = false;
                }
            }
        }
        if ports.is_empty() && ok {
            self.error(line, format!("{field}.ports"), "empty port list");
            ok = false;
        }
        if pattern.is_some_and(|p| p.port.is_some()) {
            self.error(
                line,
                format!("{field}.ports"),
                "give the port in `host` or in `ports`, not both",
            );
            ok = false;
        }
        ok.then_some(Some(ports))
    }

    /// An entry's `scope` (the system scope when it has none), or `None` when it is invalid.
    fn scope(&mut self, line: u64, field: &str, raw: Option<&RawScope>) -> Option<Scope> {
        match raw {
            None => Some(Scope::System),
            // An entry is for one task or project, named exactly: a pattern there would be
            // a literal that no request can carry (ids have no `*`), so it is refused.
            Some(RawScope(Ok(Scope::Task(id) | Scope::Project(id)))) if id.contains('*') => {
                self.error(
                    line,
                    format!("{field}.scope"),
                    format!("{id:?}: an entry's scope names one task or project exactly (patterns are for spec.nodes, spec.exceptions and requester tokens)"),
                );
                None
            }
            Some(RawScope(Ok(s))) => Some(s.clone()),
            Some(RawScope(Err(msg))) => {
                self.error(line, format!("{field}.scope"), msg.clone());
                None
            }
        }
    }

    /// An entry's expiry from `ttl_seconds` (counted from when this entry, by its text, was
    /// first loaded: `now` unless the version in force already had it) or `expires_at`:
    /// `Some(None)` when it has neither, `None` when it is invalid. A time already past is a
    /// warning.
    fn expiry(&mut self, line: u64, field: &str, e: &RawEntryFull, now: i64) -> Option<Option<i64>> {
        match (e.ttl_seconds, &e.expires_at) {
            (Some(_), Some(_)) => {
                self.error(
                    line,
                    format!("{field}.ttl_seconds"),
                    "give ttl_seconds or expires_at, not both",
                );
                None
            }
            (Some(ttl), None) if ttl <= 0 => {
                self.error(
                    line,
                    format!("{field}.ttl_seconds"),
                    format!("must be positive, got {ttl}"),
                );
                None
            }
            (Some(ttl), None) => {
                let since = self.loaded.note(self.earlier, entry_text(field, e), now);
                let at = since.saturating_add(ttl);
                if at <= now {
                    self.warn(
                        line,
                        format!("{field}.ttl_seconds"),
                        format!("{ttl} seconds from when this entry was first loaded have passed: it no longer applies (a reload does not renew it; change the entry to grant it again)"),
                    );
                }
                Some(Some(at))
            }
            (None, Some(text)) => match text.parse::<jiff::Timestamp>() {
                Ok(ts) if ts.as_second() <= now => {
                    self.warn(
                        line,
                        format!("{field}.expires_at"),
                        format!("{text} has passed: this entry never applies (remove it, or move the time)"),
                    );
                    Some(Some(ts.as_second()))
                }
                Ok(ts) => Some(Some(ts.as_second())),
                Err(err) => {
                    self.error(
                        line,
                        format!("{field}.expires_at"),
                        format!("{text:?} is not an RFC 3339 time: {err}"),
                    );
                    None
                }
            },
            (None, None) => Some(None),
        }
    }
}

/// Warns about each allow entry that a deny entry of the same or a wider scope covers on
/// every port it allows: deny entries always win, so it allows nothing there.
pub(super) fn shadowed(c: &mut Checker<'_>, field: &str, allow: &[Entry], deny: &[Entry]) {
    for a in allow {
        let Some(d) = deny.iter().find(|d| covers(d, a)) else {
            continue;
        };
        let line = |e: &Entry| {
            e.origin
                .rsplit_once(':')
                .and_then(|(_, l)| l.parse().ok())
                .unwrap_or(0)
        };
        c.warn(
            line(a),
            field,
            format!(
                "{} is also denied (deny entry {}, line {}); deny entries always win, so this entry allows nothing",
                a.pattern,
                d.pattern,
                line(d)
            ),
        );
    }
}

/// Does deny entry `d` refuse everything allow entry `a` allows?
fn covers(d: &Entry, a: &Entry) -> bool {
    let scope = d.scope == Scope::System || d.scope == a.scope;
    let host = match &a.pattern.host {
        HostPattern::Exact(h) => d.pattern.host_matches(h),
        wide => d.pattern.host == *wide,
    };
    let deny_ports = d.ports.clone().or(d.pattern.port.map(|p| vec![p]));
    let allow_ports = a.ports.clone().or(a.pattern.port.map(|p| vec![p]));
    let ports = match (deny_ports, allow_ports) {
        (None, _) => true,
        (Some(denied), Some(allowed)) => allowed.iter().all(|p| denied.contains(p)),
        (Some(_), None) => false,
    };
    scope && host && ports && !a.origin.starts_with("preset:") && !d.origin.starts_with("preset:")
}

/// `spec.network.tunnels`.
pub(super) fn tunnels(c: &mut Checker<'_>, raw: &Spanned<RawTunnels>) -> TunnelRules {
    let t = &raw.value;
    let mut rules = TunnelRules::default();
    if let Some(sni) = &t.sni {
        match sni.value.as_str() {
            "must_match" => {}
            "off" => rules.sni = SniMode::Off,
            other => c.error(
                sni.referenced.line(),
                "spec.network.tunnels.sni",
                format!("{other:?}: use must_match or off"),
            ),
        }
    }
    if let Some(missing) = &t.missing_sni {
        match missing.value.as_str() {
            "refuse" => {}
            "allow" => rules.allow_missing_sni = true,
            other => c.error(
                missing.referenced.line(),
                "spec.network.tunnels.missing_sni",
                format!("{other:?}: use refuse or allow"),
            ),
        }
    }
    if let Some(tls_only) = &t.tls_only {
        rules.tls_only = match &tls_only.value {
            RawTlsOnly::All => TlsOnly::All,
            RawTlsOnly::Never => TlsOnly::Never,
            RawTlsOnly::Ports(list) => {
                let mut ports = Vec::new();
                for p in list {
                    match u16::try_from(*p) {
                        Ok(port) if port > 0 => ports.push(port),
                        _ => c.error(
                            tls_only.referenced.line(),
                            "spec.network.tunnels.tls_only",
                            format!("{p} is not a port (1-65535)"),
                        ),
                    }
                }
                TlsOnly::Ports(ports)
            }
        };
    }
    if let Some(ms) = &t.first_bytes_timeout_ms {
        match ms.value {
            v if (1..=120_000).contains(&v) => rules.first_bytes_timeout_ms = v as u64,
            v => c.error(
                ms.referenced.line(),
                "spec.network.tunnels.first_bytes_timeout_ms",
                format!("{v}: give 1 to 120000 milliseconds"),
            ),
        }
    }
    rules
}
