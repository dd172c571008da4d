//! A run's state on the host: one private directory, `sandgate-run-XXXXXXXXXX` in the
//! temporary directory, holding the run's audit log and `bridge/`, the only part bound into
//! the sandbox (its files each bound read-only on their own: the bridge sockets; the
//! interception CA's certificate and bundle go to bwrap as data, never files here). Under
//! Seatbelt it also holds the profile, `tmp/` and the CA's two files (`seatbelt/run.rs`).
//!
//! The directory is locked (`flock`, exclusive) for the whole run. A run that ends removes
//! its directory; one that cannot (killed with `kill -9`) leaves it, unlocked, and the next
//! `sandgate run` of the same user removes every such directory whose lock it can take.
//! The lock, not a process id, says whether a run is alive: a pid that does not exist in
//! this PID namespace may be a live run in another one, and pids are reused.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

const PREFIX: &str = "sandgate-run-";

/// One run's state directory, locked while this value lives and removed when it is dropped.
#[derive(Debug)]
pub struct RunState {
    // Dropped first: the directory is removed while the lock is still held.
    dir: tempfile::TempDir,
    _lock: File,
}

impl RunState {
    /// Creates and locks a new state directory under `tmp`, with its `bridge/` inside.
    pub fn create(tmp: &Path) -> std::io::Result<RunState> {
        let mut last = None;
        // A sweeper may take the lock of a directory in the instant between its creation
        // and our lock, and remove it; then we try again with a new one.
        for _ in 0..8 {
            let dir = tempfile::Builder::new()
                .prefix(PREFIX)
                .rand_bytes(10)
                .tempdir_in(tmp)?;
            // A sweeper may also remove it before we open it.
            let lock = match File::open(dir.path()) {
                Ok(lock) => lock,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Err(e) = lock.try_lock() {
                last = Some(std::io::Error::other(e.to_string()));
                continue;
            }
            let ours = std::fs::metadata(dir.path()).is_ok_and(|m| {
                lock.metadata()
                    .is_ok_and(|l| l.ino() == m.ino() && l.dev() == m.dev())
            });
            if !ours {
                continue;
            }
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir.path().join("bridge"))?;
            return Ok(RunState { dir, _lock: lock });
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("the state directory kept disappearing")))
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The directory of the bridge sockets, each bound into the sandbox on its own.
    pub fn bridge_dir(&self) -> PathBuf {
        self.dir.path().join("bridge")
    }

    /// The run's audit log, unless `--audit-log` names another place.
    pub fn audit_path(&self) -> PathBuf {
        self.dir.path().join("audit.jsonl")
    }
}

/// Removes the state directories of runs that are gone: those whose lock can be taken.
/// Directories of other users are left alone (their lock cannot even be opened).
pub fn sweep_stale_state(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        // The lock is held while removing. A run that created this directory an instant
        // ago and has not locked it yet notices it is gone and makes another.
        if let Ok(lock) = File::open(&path)
            && lock.try_lock().is_ok()
            && std::fs::remove_dir_all(&path).is_ok()
        {
            tracing::info!(path = %path.display(), "removed the state of a run that is gone");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_runs_state_survives_the_sweep_and_a_dead_ones_does_not() {
        let tmp = tempfile::tempdir().unwrap();
        let live = RunState::create(tmp.path()).unwrap();
        assert!(live.bridge_dir().is_dir());
        let dead = RunState::create(tmp.path()).unwrap();
        let dead_path = dead.path().to_path_buf();
        // What kill -9 leaves: the directory, unlocked.
        let dead_dir = dead.dir.keep();
        drop(dead._lock);
        assert_eq!(dead_dir, dead_path);
        sweep_stale_state(tmp.path());
        assert!(live.path().is_dir(), "a live run's state was removed");
        assert!(!dead_path.exists(), "a dead run's state was left");
        let live_path = live.path().to_path_buf();
        drop(live);
        assert!(!live_path.exists(), "a run removes its own state");
    }
}
