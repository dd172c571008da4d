//! Where a run's audit log is kept: `$XDG_STATE_HOME/sandgate/runs/RUN.jsonl`
//! (`~/.local/state/sandgate/runs/` by default), so what a run did can be read after it
//! ended (`sandgate audit tail --file`, `sandgate policy suggest --from`). The directory is
//! private to the user (0700); the newest [`KEEP`] logs are kept, older ones removed when a
//! new run starts. `--audit-log PATH` puts it elsewhere, `--no-audit-log` keeps none (the
//! proxy still writes one, in the run's state directory, removed with it).

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
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
    {
        eprintln!(
            "sandgate: the run's audit log is not kept: cannot create {}: {e} (pass --audit-log PATH)",
            dir.display()
        );
        return None;
    }
    prune(&dir, KEEP.saturating_sub(1));
    Some(dir.join(format!("{run}.jsonl")))
}

/// The newest kept run log, if there is one (for readers that were given no file).
pub fn latest() -> Option<PathBuf> {
    let env = |name| std::env::var(name).ok();
    let dir = runs_dir(env("XDG_STATE_HOME").as_deref(), env("HOME").as_deref())?;
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("run-"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p)
}

/// Removes all but the newest `keep` run logs (`run-*.jsonl`) in `dir`.
pub fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut logs: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("run-") && name.ends_with(".jsonl")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    logs.sort_by_key(|l| std::cmp::Reverse(l.0));
    for (_, path) in logs.iter().skip(keep) {
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
    fn pruning_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5 {
            let p = dir.path().join(format!("run-{i}.jsonl"));
            std::fs::write(&p, "").unwrap();
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i);
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        std::fs::write(dir.path().join("other.txt"), "").unwrap();
        prune(dir.path(), 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["other.txt", "run-3.jsonl", "run-4.jsonl"]);
    }
}
