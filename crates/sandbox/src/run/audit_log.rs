//! Where a run's audit log is written and whether it is kept after the run, for both
//! backends (bubblewrap and macOS's sandbox-exec).

use std::path::PathBuf;

use super::{RunError, RunOptions};
use crate::policy::SandboxPolicy;
use crate::state::RunState;

/// Where the run's audit log is kept (`kept`, if anywhere) and written: `--audit-log`, else
/// under the state directory for a proxied run ([`crate::runlog::keep`]), else the run's
/// own state directory (gone with it). `--learn` needs it kept. Both backends.
pub(super) fn audit_place(
    policy: &SandboxPolicy,
    opts: &RunOptions,
    state: &RunState,
    run: &str,
) -> Result<(Option<PathBuf>, PathBuf), RunError> {
    let kept = kept_log(policy, opts, run)?;
    let audit_path = kept.clone().unwrap_or_else(|| state.audit_path());
    Ok((kept, audit_path))
}

/// Where the run's audit log is kept after the run, if anywhere ([`audit_place`]); `--learn`
/// needs it kept.
pub(super) fn kept_log(
    policy: &SandboxPolicy,
    opts: &RunOptions,
    run: &str,
) -> Result<Option<PathBuf>, RunError> {
    let kept = match (&opts.audit_log, opts.no_audit_log || !policy.net.proxied()) {
        (Some(path), _) => Some(path.clone()),
        (None, true) => None,
        (None, false) => crate::runlog::keep(run),
    };
    if opts.learn && kept.is_none() {
        return Err(RunError::Usage(
            "--learn keeps what it learned in the run's audit log, and there is no state directory to keep it in: pass --audit-log PATH".into(),
        ));
    }
    Ok(kept)
}

/// What a run whose audit log is not whole says instead of its command's exit status (the
/// run then exits 69): the log is the run's record, and a caller reading only the status
/// must not take the run as recorded.
pub(crate) fn unrecorded_run(code: i32, why: &str) -> String {
    format!(
        "the run's audit log is not whole: {why}; what the proxy could not write is on stderr above (the command exited {code})"
    )
}
