//! A tweak: an exception that asks for more than egress, for one sandbox of `sandgate mcp`
//! (a longer time limit, more output, network, a workspace). The control plane files,
//! decides and records it as it does hosts; it contributes no network entry. What a run
//! then gets is the MCP server's to decide, never beyond the bounds its operator set for
//! the sandbox ([`Tweak::within`] those bounds).
//!
//! Pure: a value, its check, and the order "asks no more than" ([`Tweak::within`], with
//! [`Tweak::beyond`] naming the field that asks more), which an approval that narrows a
//! tweak, the store's "covered" and the MCP server's caps all use.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a tweak asks for one sandbox; absent fields (and `network: false`) ask nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tweak {
    /// The sandbox's name (an id: 1 to 128 of `A-Z a-z 0-9 . _ - :`).
    pub sandbox: String,
    /// A run's time limit, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seconds: Option<u64>,
    /// Bytes kept of each of a run's output streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// The sandbox's network (its policy's `net`), where the gates alone keep it off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub network: bool,
    /// A directory (absolute, plain) a run may name as its workspace, or one under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Why a tweak is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TweakError {
    #[error("sandbox {0:?}: use 1 to 128 of A-Z a-z 0-9 . _ : -")]
    Sandbox(String),
    #[error("it asks for nothing: give max_seconds, max_output_bytes, network or workspace")]
    Empty,
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("workspace {0:?}: an absolute path of letters, digits and / . _ - + = ~, no . or .. part")]
    Workspace(String),
}

impl Tweak {
    /// Checks the tweak's form: a sandbox id, at least one thing asked, no zero, a plain
    /// absolute workspace path.
    pub fn check(&self) -> Result<(), TweakError> {
        if !crate::ids::valid(&self.sandbox) {
            return Err(TweakError::Sandbox(self.sandbox.clone()));
        }
        if self.max_seconds.is_none()
            && self.max_output_bytes.is_none()
            && !self.network
            && self.workspace.is_none()
        {
            return Err(TweakError::Empty);
        }
        if self.max_seconds == Some(0) {
            return Err(TweakError::Zero("max_seconds"));
        }
        if self.max_output_bytes == Some(0) {
            return Err(TweakError::Zero("max_output_bytes"));
        }
        if let Some(w) = &self.workspace
            && !plain_absolute(w)
        {
            return Err(TweakError::Workspace(w.clone()));
        }
        Ok(())
    }

    /// Whether this tweak asks no more than `outer`: the same sandbox, each value asked at
    /// most `outer`'s (and only where `outer` gives one), network only where `outer` has
    /// it, and the same workspace or one under it (a run may name a granted workspace or a
    /// directory under it, so one under it grants less).
    pub fn within(&self, outer: &Tweak) -> bool {
        self.beyond(outer).is_none()
    }

    /// Where this tweak asks more than `outer`, in words naming the field (`tweak.max_seconds`
    /// and so on), for an approval that would widen what was asked; `None` when it is
    /// [`within`](Tweak::within) it. The one definition of the order.
    pub fn beyond(&self, outer: &Tweak) -> Option<String> {
        if self.sandbox != outer.sandbox {
            return Some(format!(
                "tweak.sandbox {:?} is not the sandbox asked for ({:?})",
                self.sandbox, outer.sandbox
            ));
        }
        let more = |field: &str, asked: Option<u64>, bound: Option<u64>| match (asked, bound) {
            (Some(a), Some(b)) if a > b => Some(format!("tweak.{field} {a} is more than the {b} asked")),
            (Some(a), None) => Some(format!("tweak.{field} {a}: none was asked")),
            _ => None,
        };
        if let Some(why) = more("max_seconds", self.max_seconds, outer.max_seconds)
            .or_else(|| more("max_output_bytes", self.max_output_bytes, outer.max_output_bytes))
        {
            return Some(why);
        }
        if self.network && !outer.network {
            return Some("tweak.network: the network was not asked".to_owned());
        }
        match (&self.workspace, &outer.workspace) {
            (Some(w), Some(o)) if !under(w, o) => {
                Some(format!("tweak.workspace {w} is not {o} or a directory under it"))
            }
            (Some(w), None) => Some(format!("tweak.workspace {w}: no workspace was asked")),
            _ => None,
        }
    }
}

/// Whether `path` is `dir` or a directory under it, component by component (`/srv/xy` is
/// not under `/srv/x`). Both are plain ([`Tweak::check`]), so text comparison is exact.
fn under(path: &str, dir: &str) -> bool {
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| dir == "/" || rest.starts_with('/'))
}

/// The one-line spelling (the audit log's `tweak` field, the CLI's column):
/// `sandbox=web max_seconds=600 max_output_bytes=1048576 network workspace=/srv/x`, the
/// fields asked for only, in this order. A workspace is plain ([`Tweak::check`]), so the
/// line splits on spaces.
impl fmt::Display for Tweak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sandbox={}", self.sandbox)?;
        if let Some(s) = self.max_seconds {
            write!(f, " max_seconds={s}")?;
        }
        if let Some(b) = self.max_output_bytes {
            write!(f, " max_output_bytes={b}")?;
        }
        if self.network {
            f.write_str(" network")?;
        }
        if let Some(w) = &self.workspace {
            write!(f, " workspace={w}")?;
        }
        Ok(())
    }
}

/// An absolute path of the characters a policy parameter may hold, with no empty, `.` or
/// `..` component and none starting with `-` (the MCP server's workspace gate says the
/// same of the directories it binds).
fn plain_absolute(path: &str) -> bool {
    path.len() <= 4096
        && path.starts_with('/')
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-' | b'+' | b'=' | b'~'))
        && (path == "/"
            || path[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && !c.starts_with('-')))
}

#[cfg(test)]
#[path = "../tweak_tests.rs"]
mod tests;
