//! One `spec.sandboxes[i]` entry checked: its gates (programs, time and output limits,
//! workspaces, the ceilings on its runs' limits) and its policy, read at start
//! ([`super::policy`]), which must not have a network its gates do not allow. The name's
//! form and uniqueness, and whether approvals reach its runs, are checked by the caller,
//! which sees every sandbox.

use std::path::Path;

use sandgate_sandbox::policy::{Limits, NetMode, RawLimits};
use serde::Deserialize;

use super::policy::{PolicyFacts, read_policy};
use super::{Gates, Problems, Sandbox, TweakBounds, not_literal};
use crate::approvals::Approvals;
use crate::limits::RunLimits;
use crate::own_files::OwnFile;

/// Defaults and ceilings of the gates.
pub const DEFAULT_MAX_SECONDS: u64 = 60;
pub const MAX_MAX_SECONDS: u64 = 3600;
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;
pub const MAX_MAX_OUTPUT_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSandbox {
    pub(super) name: String,
    #[serde(default)]
    description: String,
    policy: String,
    #[serde(default)]
    gates: RawGates,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGates {
    #[serde(default)]
    commands: Vec<String>,
    #[serde(default)]
    max_seconds: Option<u64>,
    #[serde(default)]
    max_output_bytes: Option<u64>,
    #[serde(default)]
    network: bool,
    #[serde(default)]
    workspaces: Vec<String>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    tweaks: Option<RawTweaks>,
}

/// `gates.tweaks`: the most a person may grant beyond the gates.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTweaks {
    #[serde(default)]
    max_seconds: Option<u64>,
    #[serde(default)]
    max_output_bytes: Option<u64>,
    #[serde(default)]
    network: bool,
    #[serde(default)]
    workspaces: Vec<String>,
}

/// A sandbox, and its files the server must keep from every run (its policy, what that
/// names). `task` is the server's.
pub(super) fn sandbox(
    s: RawSandbox,
    field: &str,
    base: &Path,
    task: &str,
) -> Result<(Sandbox, Vec<OwnFile>), Problems> {
    let mut errors = Vec::new();
    let g = s.gates;
    let limits = match RunLimits::parse(&g.limits) {
        Ok(l) => l,
        Err((key, message)) => {
            errors.push((format!("{field}.gates.limits.{key}"), message));
            RunLimits::default()
        }
    };
    let max_seconds = g.max_seconds.unwrap_or(DEFAULT_MAX_SECONDS);
    if !(1..=MAX_MAX_SECONDS).contains(&max_seconds) {
        errors.push((
            format!("{field}.gates.max_seconds"),
            format!("{max_seconds}: give 1 to {MAX_MAX_SECONDS}"),
        ));
    }
    let max_output = g.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES as u64);
    if !(1..=MAX_MAX_OUTPUT_BYTES as u64).contains(&max_output) {
        errors.push((
            format!("{field}.gates.max_output_bytes"),
            format!("{max_output}: give 1 to {MAX_MAX_OUTPUT_BYTES}"),
        ));
    }
    if g.commands.is_empty() {
        errors.push((
            format!("{field}.gates.commands"),
            "list the programs an agent may run (a bare name or an absolute path each)".to_owned(),
        ));
    }
    for c in &g.commands {
        if c.is_empty() || (c.contains('/') && !c.starts_with('/')) {
            errors.push((
                format!("{field}.gates.commands"),
                format!("{c:?}: a bare program name or an absolute path"),
            ));
        }
    }
    let workspaces = directories(
        &g.workspaces,
        &format!("{field}.gates.workspaces"),
        base,
        &mut errors,
    );
    let tweaks = g
        .tweaks
        .map(|t| tweak_bounds(t, &format!("{field}.gates.tweaks"), base, &mut errors));
    if let Some(p) = not_literal(&s.policy) {
        errors.push((format!("{field}.policy"), p));
    }
    let policy = base.join(&s.policy);
    let any_workspace = workspaces
        .first()
        .or_else(|| tweaks.as_ref().and_then(|t| t.workspaces.first()));
    let facts = match read_policy(&policy, any_workspace, task) {
        Ok(v) => v,
        Err(e) => {
            errors.push((format!("{field}.policy"), format!("{}: {e}", policy.display())));
            PolicyFacts {
                net: NetMode::None,
                allowed_hosts: Vec::new(),
                limits: Limits::default(),
                files: Vec::new(),
                approvals: Approvals::NoNetwork { mode: NetMode::None },
                run_task: task.to_owned(),
                start_in_workspace: false,
                own_pids: true,
            }
        }
    };
    let net = facts.net;
    // A network a person may grant (`gates.tweaks.network`) is allowed here; each run
    // without that grant is refused (gate `network`).
    if net != NetMode::None && !g.network && !tweaks.as_ref().is_some_and(|t| t.network) {
        errors.push((
            format!("{field}.gates.network"),
            format!(
                "the policy's net.mode is {}; allow it with `network: true` (or `tweaks: {{ network: true }}`, for runs a person grants it to) or use a policy with net.mode none",
                net.name()
            ),
        ));
    }
    // A tweak ends by stopping the runs that hold it; without a PID namespace of their own,
    // what a run started in a session of its own would outlive the stop, and keep it.
    if tweaks.is_some() && !facts.own_pids {
        errors.push((
            format!("{field}.gates.tweaks"),
            "its policy gives runs no PID namespace of their own (platform.bwrap.unshare.pid: false), so a tweak's end could not stop what a run started; remove `tweaks` or use a policy with a PID namespace".to_owned(),
        ));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let who = format!("sandbox {:?}", s.name);
    let mut own = vec![OwnFile::new(&policy, format!("the policy of {who}"))];
    own.extend(
        facts
            .files
            .iter()
            .map(|(path, what)| OwnFile::new(path, format!("{what} of {who}"))),
    );
    let sandbox = Sandbox {
        name: s.name,
        description: s.description,
        policy,
        net,
        allowed_hosts: facts.allowed_hosts,
        policy_limits: facts.limits,
        gates: Gates {
            commands: g.commands,
            max_seconds,
            max_output_bytes: max_output as usize,
            network: g.network,
            workspaces,
            limits,
            tweaks,
        },
        approvals: facts.approvals,
        run_task: facts.run_task,
        start_in_workspace: facts.start_in_workspace,
    };
    Ok((sandbox, own))
}

/// Directories as written (relative to the configuration), canonical; each that is not one
/// is a problem of `field`.
fn directories(
    written: &[String],
    field: &str,
    base: &Path,
    errors: &mut Problems,
) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for w in written {
        if let Some(p) = not_literal(w) {
            errors.push((field.to_owned(), p));
            continue;
        }
        match std::fs::canonicalize(base.join(w)) {
            Ok(p) if p.is_dir() => out.push(p),
            Ok(p) => errors.push((field.to_owned(), format!("{} is not a directory", p.display()))),
            Err(e) => errors.push((field.to_owned(), format!("{w}: {e}"))),
        }
    }
    out
}

/// `gates.tweaks` checked: the same ceilings as the gates themselves.
fn tweak_bounds(t: RawTweaks, field: &str, base: &Path, errors: &mut Problems) -> TweakBounds {
    if let Some(s) = t.max_seconds
        && !(1..=MAX_MAX_SECONDS).contains(&s)
    {
        errors.push((
            format!("{field}.max_seconds"),
            format!("{s}: give 1 to {MAX_MAX_SECONDS}"),
        ));
    }
    if let Some(b) = t.max_output_bytes
        && !(1..=MAX_MAX_OUTPUT_BYTES as u64).contains(&b)
    {
        errors.push((
            format!("{field}.max_output_bytes"),
            format!("{b}: give 1 to {MAX_MAX_OUTPUT_BYTES}"),
        ));
    }
    TweakBounds {
        max_seconds: t.max_seconds,
        max_output_bytes: t.max_output_bytes.map(|b| b as usize),
        network: t.network,
        workspaces: directories(&t.workspaces, &format!("{field}.workspaces"), base, errors),
    }
}
