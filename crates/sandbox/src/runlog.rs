//! Where a run's audit log is kept: `$XDG_STATE_HOME/sandgate/runs/RUN.jsonl`
//! (`~/.local/state/sandgate/runs/` by default), so what a run did can be read after it
//! ended (`sandgate audit tail --file`, `sandgate policy suggest --from`). The directory is
//! private to the user (0700), made by every run (kept log or not: [`protected_dir`]) and
//! read-only inside every sandbox whose write paths cover it, never a link;
//! the newest [`KEEP`] logs by run id (which carries the start time) are kept, older ones
//! removed when a new run starts. Files whose names are not run ids, or whose time lies in
//! the future, are neither counted nor removed: planted files cannot push real logs out.
//! `--audit-log PATH` puts it elsewhere, `--no-audit-log` keeps none (the proxy still writes
//! one, in the run's state directory, removed with it).
//!
//! A log's name is the run's own id, `run-PID-T`, never the task it is recorded under (a
//! node's run's task is `node-a:run-PID-T`): no `:` in it, since scp and rsync read
//! `host:path` as a remote path ([`file_name`] keeps it so).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Run logs kept in the state directory.
pub const KEEP: usize = 100;

/// The directory of kept run logs for this environment, if it names a home.
pub fn runs_dir(xdg_state_home: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    let absolute = |v: &str| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    let base = xdg_state_home
        .and_then(absolute)
        .or_else(|| home.and_then(absolute).map(|h| h.join(".local/state")))?;
    Some(base.join("sandgate/runs"))
}

/// The directory of kept run logs for this process's environment.
pub fn dir() -> Option<PathBuf> {
    let env = |name| std::env::var(name).ok();
    runs_dir(env("XDG_STATE_HOME").as_deref(), env("HOME").as_deref())
}

/// The file name run `run`'s log is kept under: `RUN.jsonl`, any `:` as `_` (a run id has
/// none; a `:` would make scp and rsync read the path as `host:path`).
pub fn file_name(run: &str) -> String {
    format!("{}.jsonl", run.replace(':', "_"))
}

/// The start time a kept log's name carries (`run-PID-T.jsonl`, T 16 hex digits of
/// nanoseconds since the epoch), if it is a run log's name and not in the future.
fn started(name: &str, now: u128) -> Option<u128> {
    let id = name.strip_prefix("run-")?.strip_suffix(".jsonl")?;
    let (pid, time) = id.split_once('-')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) || time.len() != 16 {
        return None;
    }
    u128::from_str_radix(time, 16).ok().filter(|&t| t <= now)
}

/// The kept logs in `dir`, newest first, by the time their ids carry.
fn by_start(dir: &Path) -> Vec<PathBuf> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut logs: Vec<(u128, PathBuf)> = entries
        .flatten()
        .filter_map(|e| Some((started(e.file_name().to_str()?, now)?, e.path())))
        .collect();
    logs.sort_by_key(|l| std::cmp::Reverse(l.0));
    logs.into_iter().map(|(_, p)| p).collect()
}

/// The path where run `run`'s audit log is kept, its directory created; `None` (with a
/// message saying why) when there is no usable state directory: the log then goes with the
/// run's state.
pub fn keep(run: &str) -> Option<PathBuf> {
    let env = |name| std::env::var(name).ok();
    let Some(dir) = runs_dir(env("XDG_STATE_HOME").as_deref(), env("HOME").as_deref()) else {
        eprintln!(
            "sandgate: the run's audit log is not kept: neither XDG_STATE_HOME nor HOME names a directory (pass --audit-log PATH)"
        );
        return None;
    };
    if let Err(why) = ensure(&dir) {
        eprintln!("sandgate: the run's audit log is not kept: {why} (pass --audit-log PATH)");
        return None;
    }
    prune(&dir, KEEP.saturating_sub(1));
    Some(dir.join(file_name(run)))
}

/// The kept logs' directory for this environment, made if it is not there and checked
/// ([`ensure`]): every run protects it (read-only inside the sandbox), kept log or not, so
/// that a command with a writable home cannot make it first and plant logs there for later
/// runs. `None` where there is none to protect (no home, or it cannot be made or used).
pub fn protected_dir() -> Option<PathBuf> {
    let dir = dir()?;
    // Protected wherever it resolves to, even where it is not used for keeping (a link,
    // another user's): no command changes what is there.
    let _ = ensure(&dir);
    Some(dir)
}

/// Makes `dir` (private: 0700) if it is not there, and checks it is a directory of this
/// user's, not a symbolic link (nor its parent), that no one else may use: logs kept in a
/// directory a link leads elsewhere would land where another user reads or removes them.
fn ensure(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let plain_dir = |path: &Path, what: &str| {
        let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if meta.file_type().is_dir() {
            Ok(meta)
        } else {
            Err(format!(
                "{} ({what}) is a symbolic link or not a directory",
                path.display()
            ))
        }
    };
    let meta = plain_dir(dir, "it")?;
    plain_dir(dir.parent().unwrap_or(dir), "its parent")?;
    if meta.uid() != rustix::process::geteuid().as_raw() {
        return Err(format!("{} belongs to another user", dir.display()));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make {} private: {e}", dir.display()))?;
    }
    Ok(())
}

/// The newest kept run log, if there is one (for readers that were given no file).
pub fn latest() -> Option<PathBuf> {
    newest_first().into_iter().next()
}

/// Every kept run log, newest first by the time its run id carries.
pub fn newest_first() -> Vec<PathBuf> {
    dir().map(|d| by_start(&d)).unwrap_or_default()
}

/// Removes all but the newest `keep` run logs in `dir` (by run id; see [`started`]).
pub fn prune(dir: &Path, keep: usize) {
    for path in by_start(dir).iter().skip(keep) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runs_directory_follows_xdg_then_home() {
        assert_eq!(
            runs_dir(Some("/s"), Some("/h")),
            Some(PathBuf::from("/s/sandgate/runs"))
        );
        assert_eq!(
            runs_dir(None, Some("/h")),
            Some(PathBuf::from("/h/.local/state/sandgate/runs"))
        );
        assert_eq!(
            runs_dir(Some("relative"), Some("/h")),
            Some(PathBuf::from("/h/.local/state/sandgate/runs"))
        );
        assert_eq!(runs_dir(Some(""), Some("")), None);
    }

    #[test]
    fn a_run_logs_name_has_no_colon_and_is_read_back() {
        let now = 1u128 << 60;
        let time = format!("{:016x}", now - 5);
        let name = file_name(&format!("run-7-{time}"));
        assert_eq!(name, format!("run-7-{time}.jsonl"));
        assert_eq!(started(&name, now), Some(now - 5));
        assert!(!file_name("node-a:run-7-x").contains(':'), "scp reads host:path");
    }

    #[test]
    fn pruning_keeps_the_newest_by_run_id_and_ignores_planted_files() {
        let dir = tempfile::tempdir().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        for i in 0..5u128 {
            let p = dir
                .path()
                .join(format!("run-7-{:016x}.jsonl", now - 1_000_000 + i));
            std::fs::write(&p, "").unwrap();
            // Modification times reversed: the id decides, not the clock of the file.
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(2000 - i as u64);
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        // Planted: not a run id, or a time in the future; each with the newest mtime.
        for planted in [
            "run-x.jsonl",
            "run-1-zzzz.jsonl",
            &format!("run-1-{:016x}.jsonl", now + (1 << 40)),
            "other.txt",
        ] {
            std::fs::write(dir.path().join(planted), "").unwrap();
        }
        prune(dir.path(), 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let kept: Vec<&String> = left.iter().filter(|n| n.starts_with("run-7-")).collect();
        assert_eq!(
            kept,
            [
                &format!("run-7-{:016x}.jsonl", now - 1_000_000 + 3),
                &format!("run-7-{:016x}.jsonl", now - 1_000_000 + 4)
            ]
        );
        assert_eq!(
            left.len(),
            6,
            "planted files are neither counted nor removed: {left:?}"
        );
    }
}
