//! `platform.seatbelt.trace`: what the profile denied, recorded so an operator can tighten it
//! (or widen it through `platform.seatbelt.extra_allow`).
//!
//! The profile tags every denial (`(deny default (with message "TAG"))`, [`super::profile`]);
//! while the command runs, `/usr/bin/log stream` copies the unified log's lines that end in
//! that tag into a file beside the kept run logs, `RUN.seatbelt-denials.log`, one line per
//! denial (`Sandbox: python3(4242) deny(1) file-read-data /Users/me/.ssh/id_ed25519 TAG`).
//! The old SBPL `(trace "FILE")` directive is not used: recent macOS is reported to ignore
//! it, and tagged denials in the unified log are what current sandboxing tools read.
//!
//! The tag is the run's id, so lines of other runs and other sandboxed programs are not
//! recorded. `SANDGATE_SEATBELT_LOG` names another `log` program (a test hook).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// macOS's log tool.
pub const LOG: &str = "/usr/bin/log";
/// Names the log tool to use instead of [`LOG`] (a test hook).
pub const LOG_VAR: &str = "SANDGATE_SEATBELT_LOG";
/// How long denials may take to reach the log stream after the command ends.
const SETTLE: Duration = Duration::from_millis(300);

/// The tag of run `run`'s denials.
pub fn tag(run: &str) -> String {
    format!("sandgate-{run}")
}

/// Where run `run`'s denials are written: beside its kept audit log (`dir`, the kept run
/// logs' directory, [`crate::runlog::dir`]), else in the temporary directory.
pub fn path(dir: Option<&Path>, run: &str) -> PathBuf {
    let dir = dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
    dir.join(format!("{run}.seatbelt-denials.log"))
}

/// The `log stream` arguments that print the lines ending in `tag`.
pub fn log_args(tag: &str) -> Vec<String> {
    vec![
        "stream".to_owned(),
        "--style".to_owned(),
        "compact".to_owned(),
        "--predicate".to_owned(),
        format!("eventMessage ENDSWITH \"{tag}\""),
    ]
}

/// The log stream while the command runs.
#[derive(Debug)]
pub struct Recorder {
    child: tokio::process::Child,
    pub path: PathBuf,
}

/// Starts recording denials tagged `tag` into `path` (created new, private to the user).
pub fn start(log: &Path, tag: &str, path: &Path) -> std::io::Result<Recorder> {
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?
    };
    let child = tokio::process::Command::new(log)
        .args(log_args(tag))
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .spawn()?;
    Ok(Recorder {
        child,
        path: path.to_path_buf(),
    })
}

impl Recorder {
    /// Lets the last denials arrive, then stops the stream; returns the file.
    pub async fn stop(mut self) -> PathBuf {
        tokio::time::sleep(SETTLE).await;
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        self.path
    }
}

/// The log tool for this process: [`LOG_VAR`], else [`LOG`].
pub fn log_tool() -> PathBuf {
    std::env::var_os(LOG_VAR)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(LOG), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_denials_are_picked_by_its_tag() {
        let tag = tag("run-42-0000000000000001");
        assert_eq!(tag, "sandgate-run-42-0000000000000001");
        assert_eq!(
            log_args(&tag).last().map(String::as_str),
            Some("eventMessage ENDSWITH \"sandgate-run-42-0000000000000001\"")
        );
        assert_eq!(
            path(Some(Path::new("/s/runs")), "run-42-1"),
            PathBuf::from("/s/runs/run-42-1.seatbelt-denials.log")
        );
    }
}
