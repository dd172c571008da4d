//! The rule model: one allow or deny entry ([`Entry`]: a pattern, its ports, who it applies
//! to, its expiry, where it came from and, for an allow, the methods and paths it allows) and who an entry applies to ([`Scope`]).
//!
//! Plain data shared by everything that makes or reads entries: the policy file's parser
//! (`document`), the SandboxPolicy's embedded lists, exceptions (`exception.rs`) and the
//! decision (`decision.rs`). It knows no file format; parsing and checking an entry is
//! `document`'s.

use std::fmt;
use std::sync::Arc;

use crate::pattern::Pattern;
use crate::request::RequestRules;

/// Who an entry applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every request.
    System,
    /// Requests attributed to this project.
    Project(String),
    /// Requests attributed to this task.
    Task(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::System => f.write_str("system"),
            Scope::Project(p) => write!(f, "project:{p}"),
            Scope::Task(t) => write!(f, "task:{t}"),
        }
    }
}

/// One allow or deny entry, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub pattern: Pattern,
    /// Exactly these ports (replaces the pattern's default ports).
    pub ports: Option<Vec<u16>>,
    pub scope: Scope,
    /// Unix seconds; the entry is absent from this second on (`now >= expires_at`).
    pub expires_at: Option<i64>,
    pub created_by: Option<String>,
    pub reason: Option<String>,
    /// Where it came from: `file:line`, `preset:NAME` or `flag`.
    pub origin: Arc<str>,
    /// The methods and paths it allows (an allow entry only); `None`: every request to the host.
    pub request: Option<Arc<RequestRules>>,
}

impl Entry {
    /// A system-scope entry given on the command line.
    pub fn from_flag(pattern: Pattern) -> Entry {
        Entry {
            pattern,
            ports: None,
            scope: Scope::System,
            expires_at: None,
            created_by: None,
            reason: None,
            origin: Arc::from("flag"),
            request: None,
        }
    }
}
