//! The server's own files: its configuration, each sandbox's policy and the files that policy
//! names (its `net.egress_policy`, its central TLS files), the requester token, the tool
//! audit log, and the sandgate binary every run starts. A run must change none of them: a
//! rewritten policy is the next run's sandbox (host network, the host file system
//! writable), an emptied audit log is a record lost, a replaced binary runs outside any
//! sandbox.
//!
//! Two layers. At start, no workspace (a directory an agent may name as writable) may hold
//! one of these files or lie inside one ([`workspace_conflicts`], pure: canonical paths in).
//! And every run gets each file as `sandgate run --protect`, so it is read-only inside the
//! sandbox wherever a policy's own write path covers it.

use std::path::{Path, PathBuf};

/// A file of the server's that no run may change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnFile {
    /// Canonical ([`canonical`]).
    pub path: PathBuf,
    /// What it is, for messages ("the server's configuration").
    pub what: String,
}

impl OwnFile {
    /// `path` in its canonical form, and what it is.
    pub fn new(path: &Path, what: impl Into<String>) -> OwnFile {
        OwnFile {
            path: canonical(path),
            what: what.into(),
        }
    }
}

/// The canonical form of `path` (symlinks resolved); for a file not made yet (an audit log
/// before its first start), its directory's canonical form and its name; else `path` made
/// absolute as written.
pub fn canonical(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    if let (Some(dir), Some(name)) = (path.parent(), path.file_name())
        && let Ok(d) = std::fs::canonicalize(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        })
    {
        return d.join(name);
    }
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Each allowed workspace (`workspaces[i]`: those of `spec.sandboxes[i]`) that holds one of
/// `own`, or lies inside one, as a message naming the field and both paths. Workspaces and
/// files are canonical, so a symlink on either side is seen through.
pub fn workspace_conflicts(workspaces: &[&[PathBuf]], own: &[OwnFile]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, listed) in workspaces.iter().enumerate() {
        for ws in *listed {
            for file in own {
                let relation = if file.path.starts_with(ws) {
                    "holds"
                } else if ws.starts_with(&file.path) {
                    "lies inside"
                } else {
                    continue;
                };
                out.push(format!(
                    "spec.sandboxes[{i}].gates.workspaces: {} {relation} {} ({}): a run could rewrite it; keep the server's own files outside every workspace",
                    ws.display(),
                    file.path.display(),
                    file.what
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(workspaces: &[&str]) -> Vec<PathBuf> {
        workspaces.iter().map(PathBuf::from).collect()
    }

    fn own(path: &str) -> OwnFile {
        OwnFile {
            path: path.into(),
            what: "the server's configuration".into(),
        }
    }

    #[test]
    fn a_workspace_holding_or_inside_a_server_file_is_named_with_both_paths() {
        let files = [own("/srv/agent/mcp.yaml"), own("/var/lib/sandgate/state")];
        let found = workspace_conflicts(
            &[&paths(&["/srv"]), &paths(&["/var/lib/sandgate/state/w"])],
            &files,
        );
        assert_eq!(
            found,
            [
                "spec.sandboxes[0].gates.workspaces: /srv holds /srv/agent/mcp.yaml (the server's configuration): a run could rewrite it; keep the server's own files outside every workspace",
                "spec.sandboxes[1].gates.workspaces: /var/lib/sandgate/state/w lies inside /var/lib/sandgate/state (the server's configuration): a run could rewrite it; keep the server's own files outside every workspace",
            ]
        );
    }

    #[test]
    fn a_workspace_beside_the_server_files_is_fine() {
        // The usual layout: the configuration, the policies and the work directory side by
        // side; and a name that only shares a prefix.
        let files = [own("/srv/agent/mcp.yaml"), own("/srv/agent/policies/p.yaml")];
        assert!(workspace_conflicts(&[&paths(&["/srv/agent/work", "/srv/agent/mcp"])], &files).is_empty());
    }

    #[test]
    fn a_file_not_made_yet_is_named_in_its_canonical_directory() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap_or_else(|e| unreachable!("{e}"));
        let real = std::fs::canonicalize(dir.path()).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(canonical(&link.join("audit.jsonl")), real.join("audit.jsonl"));
    }
}
