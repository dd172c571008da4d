//! What an exception allows below its hosts: the `methods`, `paths` and `read_only` of an
//! allow entry, in the same grammar ([`crate::request`]), so that a person can grant `GET`
//! on one path for 15 minutes rather than the whole host. An exception without them allows
//! every request to its hosts, as an entry without them does.
//!
//! An approval may narrow them and never widen them: the methods it keeps are among those
//! asked for, and each path pattern lies within one asked for ([`PathPattern::within`]). The
//! same test says whether an active exception already covers a new request.

use serde::{Deserialize, Serialize};

use crate::request::{PathPattern, READ_ONLY_METHODS, RequestRules, RulesError};

/// Methods and paths an exception allows on its hosts; all `None` and `false`: everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BelowHost {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

impl BelowHost {
    /// The fields as a request or a narrowing gives them.
    pub fn new(methods: Option<Vec<String>>, paths: Option<Vec<String>>, read_only: bool) -> BelowHost {
        BelowHost {
            methods,
            paths,
            read_only,
        }
    }

    /// No limit below the host.
    pub fn is_everything(&self) -> bool {
        self.methods.is_none() && self.paths.is_none() && !self.read_only
    }

    /// Checked against the grammar, methods and paths each listed once in order.
    pub fn checked(self) -> Result<BelowHost, RulesError> {
        self.rules()?;
        let dedup = |list: Option<Vec<String>>| {
            list.map(|mut l| {
                l.sort();
                l.dedup();
                l
            })
        };
        Ok(BelowHost {
            methods: dedup(self.methods),
            paths: dedup(self.paths),
            read_only: self.read_only,
        })
    }

    /// The rules an entry carries; `None` for everything.
    pub fn rules(&self) -> Result<Option<RequestRules>, RulesError> {
        RequestRules::new(self.methods.as_deref(), self.paths.as_deref(), self.read_only)
    }

    /// Does `outer` allow every request this allows? Unreadable rules are within nothing.
    pub fn within(&self, outer: &BelowHost) -> bool {
        // Rules that do not read (`read_only` with `methods`, a bad pattern) allow nothing.
        if outer.rules().is_err() {
            return false;
        }
        let (Ok(inner_paths), Ok(outer_paths)) = (self.patterns(), outer.patterns()) else {
            return false;
        };
        let methods = match (self.method_set(), outer.method_set()) {
            (_, None) => true,
            (None, Some(_)) => false,
            (Some(i), Some(o)) => i.iter().all(|m| o.contains(m)),
        };
        let paths = match (inner_paths, outer_paths) {
            (_, None) => true,
            (None, Some(_)) => false,
            (Some(i), Some(o)) => i.iter().all(|p| o.iter().any(|q| p.within(q))),
        };
        methods && paths
    }

    /// The methods allowed; `None`: any.
    fn method_set(&self) -> Option<Vec<&str>> {
        match (&self.methods, self.read_only) {
            (Some(m), _) => Some(m.iter().map(String::as_str).collect()),
            (None, true) => Some(READ_ONLY_METHODS.to_vec()),
            (None, false) => None,
        }
    }

    fn patterns(&self) -> Result<Option<Vec<PathPattern>>, RulesError> {
        self.paths
            .as_ref()
            .map(|l| l.iter().map(|p| PathPattern::parse(p)).collect())
            .transpose()
    }
}

impl std::fmt::Display for BelowHost {
    /// As an entry's label shows it (`read-only`, `GET /a/**`), or `every request`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rules() {
            Ok(Some(rules)) => write!(f, "{rules}"),
            Ok(None) => f.write_str("every request"),
            Err(e) => write!(f, "unreadable ({e})"),
        }
    }
}
