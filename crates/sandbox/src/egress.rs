//! `net.egress_policy`: a sandbox policy's network section may name an `EgressPolicy` file,
//! so one allowlist (the one `sandgate policy suggest` writes, or a team's) serves both
//! `sandgate proxy` and `sandgate run`. The run's proxy enforces the file's entries (with
//! their ports, scopes, expiry and reasons), deny entries, presets, tunnel rules, allow
//! ranges and resolver, beside the sandbox policy's own `allow_domains` and `presets`.
//!
//! What only a shared proxy has (listeners, task credentials, the admin API, exceptions) has
//! no meaning for a run, so a file that sets it is refused rather than half applied.

use std::path::Path;

use sandgate_policy::PolicyFile;

use crate::error::RunError;

/// Reads and checks the `EgressPolicy` at `path` for a run.
pub fn load(path: &Path) -> Result<PolicyFile, RunError> {
    let (file, _) = sandgate_proxy::reload::load_file(path)
        .map_err(|e| RunError::Usage(format!("net.egress_policy: {e}")))?;
    for warning in &file.warnings {
        eprintln!("{}", warning.as_warning());
    }
    let shared_only = [
        ("spec.listeners", !file.listeners.is_empty()),
        ("spec.auth", !file.task_secrets.is_empty()),
        ("spec.admin", file.admin != Default::default()),
        ("spec.exceptions", file.exceptions != Default::default()),
    ];
    if let Some((field, _)) = shared_only.iter().find(|(_, set)| *set) {
        return Err(RunError::Usage(format!(
            "net.egress_policy: {}: {field} configures a shared proxy and means nothing to a run's own proxy; use a file with spec.network (and spec.resolver) only",
            path.display()
        )));
    }
    Ok(file)
}
