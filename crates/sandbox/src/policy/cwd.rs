//! Where the command starts: `--chdir DIR`, else `fs.cwd`, else the caller's working
//! directory when the sandbox shows it (bound at the same place), else `HOME` when the
//! sandbox shows that, else `/`; in those last two cases one line says so, since a command
//! that reads `./agent.py` would otherwise fail with its own "No such file".
//!
//! Pure: the caller's directory, the command's environment and the host's canonical paths
//! come in as arguments. What the sandbox shows at a path follows the mount order of
//! [`crate::argv`]: the deepest listed mount at or above it decides, and at one path a bind
//! wins over a tmpfs.

use std::path::{Path, PathBuf};

use super::{PolicyError, SandboxPolicy};
use crate::paths::Resolve;

/// Where the command starts, and the line to print when it is not where it was called from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartDir {
    pub dir: PathBuf,
    pub note: Option<String>,
}

/// What the sandbox has at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// The host's own directory, bound.
    Host,
    /// A directory of the sandbox's own (a tmpfs's root, or `/`), empty but for mounts.
    Own,
    /// Nothing: not bound, or hidden under a tmpfs.
    Nothing,
}

/// `fs.cwd` as written: absolute, and canonical (it must exist on the host).
pub(super) fn written(value: Option<&str>, resolve: Resolve<'_>) -> Result<Option<PathBuf>, PolicyError> {
    let Some(value) = value else {
        return Ok(None);
    };
    if !Path::new(value).is_absolute() {
        return Err(PolicyError(format!("fs.cwd: {value:?} is not an absolute path")));
    }
    resolve(Path::new(value))
        .map(Some)
        .map_err(|e| PolicyError(format!("fs.cwd: {value:?}: {e}")))
}

/// Checks that `policy.cwd` (`fs.cwd`) is a directory the sandbox has.
pub(super) fn check(policy: &SandboxPolicy) -> Result<(), PolicyError> {
    match &policy.cwd {
        Some(dir) if seen(policy, dir) == Seen::Nothing => Err(PolicyError(format!(
            "fs.cwd: {} is not in the sandbox: {}",
            dir.display(),
            WHY_NOT
        ))),
        _ => Ok(()),
    }
}

const WHY_NOT: &str = "no read or write path covers it, or a tmpfs hides it";

/// Where the command starts (see the module docs). `chdir` is `--chdir` as given (relative
/// to the caller's directory), `env` the command's environment, `host_cwd` the caller's
/// directory (`None` when it cannot be read), `resolve` the host's canonical form of a path.
pub fn start_dir(
    policy: &SandboxPolicy,
    chdir: Option<&Path>,
    env: &[(String, String)],
    host_cwd: Option<&Path>,
    resolve: Resolve<'_>,
) -> Result<StartDir, PolicyError> {
    if let Some(given) = chdir {
        let dir = resolve(given).map_err(|e| PolicyError(format!("--chdir {}: {e}", given.display())))?;
        if seen(policy, &dir) == Seen::Nothing {
            return Err(PolicyError(format!(
                "--chdir {}: {} is not in the sandbox: {WHY_NOT}",
                given.display(),
                dir.display()
            )));
        }
        return Ok(StartDir { dir, note: None });
    }
    if let Some(dir) = &policy.cwd {
        return Ok(StartDir {
            dir: dir.clone(),
            note: None,
        });
    }
    if let Some(cwd) = host_cwd
        && seen(policy, cwd) == Seen::Host
    {
        return Ok(StartDir {
            dir: cwd.to_path_buf(),
            note: None,
        });
    }
    let home = env
        .iter()
        .find(|(k, _)| k == "HOME")
        .map(|(_, v)| Path::new(v.as_str()))
        .filter(|h| h.is_absolute())
        .and_then(|h| resolve(h).ok())
        .filter(|h| seen(policy, h) != Seen::Nothing);
    let (dir, which) = match home {
        Some(home) => (home, "HOME"),
        None => (PathBuf::from("/"), "the sandbox's root"),
    };
    let here = host_cwd.map_or_else(|| "(unreadable)".to_owned(), |c| c.display().to_string());
    let note = format!(
        "the working directory {here} is not in the sandbox ({WHY_NOT}); starting in {} ({which}) instead; --chdir DIR or fs.cwd chooses another",
        dir.display()
    );
    Ok(StartDir {
        dir,
        note: Some(note),
    })
}

/// What the sandbox has at `path` (canonical).
fn seen(policy: &SandboxPolicy, path: &Path) -> Seen {
    let tmp = Path::new("/tmp");
    let binds = policy
        .read_paths
        .iter()
        .chain(&policy.write_paths)
        .chain(&policy.extra_ro_binds)
        .chain(&policy.extra_rw_binds)
        .map(|p| (p.as_path(), true));
    let tmpfs = policy
        .private_tmp
        .then_some(tmp)
        .into_iter()
        .chain(policy.extra_tmpfs.iter().map(PathBuf::as_path))
        .map(|p| (p, false));
    // The deepest mount decides; at one depth a bind (true) is made after a tmpfs.
    let deciding = binds
        .chain(tmpfs)
        .filter(|(mount, _)| path.starts_with(mount))
        .max_by_key(|(mount, bind)| (mount.components().count(), *bind));
    match deciding {
        Some((_, true)) => Seen::Host,
        Some((mount, false)) if mount == path => Seen::Own,
        Some((_, false)) => Seen::Nothing,
        None if policy.allow_read_all || policy.allow_write_all => Seen::Host,
        None if path == Path::new("/") => Seen::Own,
        None => Seen::Nothing,
    }
}

#[cfg(test)]
#[path = "cwd_tests.rs"]
mod tests;
