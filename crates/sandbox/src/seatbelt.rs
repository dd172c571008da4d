//! The macOS backend of `sandgate run`: the same policy under Seatbelt (`sandbox-exec`),
//! chosen at run time ([`sandbox_exec`]), in portable code that builds and is tested on
//! Linux too.
//!
//! - [`profile`]: the policy as an SBPL profile and the sandbox-exec argv (pure).
//! - [`front`]: the loopback ports the command reaches the run's proxy on.
//! - [`trace`]: `platform.seatbelt.trace`, the profile's denials recorded from the unified
//!   log.
//! - The run itself (state, proxy, profile file, the command, signals, teardown) is
//!   `crate::run::seatbelt`, in `seatbelt/run.rs`: a part of the runner, sharing its proxy
//!   start and the run's identity.
//!
//! What is not here: anything that needs macOS to compile. What has run on a real Mac is
//! written down in docs/sandbox.md ("macOS").

use std::ffi::OsString;
use std::path::PathBuf;

pub mod front;
pub mod profile;
pub mod trace;

pub use profile::{Facts, Profile, argv, command_line, render_with, shell_word};

use crate::policy::SandboxPolicy;

/// macOS's sandbox-exec.
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// Names the sandbox-exec to use instead of [`SANDBOX_EXEC`], and chooses the seatbelt
/// backend on any platform: a test hook (a stand-in script on Linux drives the whole
/// flow), never a sandbox on Linux.
pub const SANDBOX_EXEC_VAR: &str = "SANDGATE_SANDBOX_EXEC";

/// Which sandbox-exec runs the command, if the seatbelt backend is chosen: on macOS always,
/// elsewhere only when [`SANDBOX_EXEC_VAR`] names one (`var`: its value; `macos`: this is
/// macOS).
pub fn choose(var: Option<OsString>, macos: bool) -> Option<PathBuf> {
    match var.filter(|v| !v.is_empty()) {
        Some(stand_in) => Some(PathBuf::from(stand_in)),
        None => macos.then(|| PathBuf::from(SANDBOX_EXEC)),
    }
}

/// [`choose`] for this process.
pub fn sandbox_exec() -> Option<PathBuf> {
    choose(std::env::var_os(SANDBOX_EXEC_VAR), cfg!(target_os = "macos"))
}

/// The user's fonts and fontconfig cache, from sandgate's own `HOME` and `XDG_CACHE_HOME`.
pub fn user_facts() -> Facts {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute());
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|c| c.is_absolute())
        .or_else(|| home.as_ref().map(|h| h.join(".cache")));
    Facts {
        user_fonts: home.map(|h| h.join("Library/Fonts")),
        fontconfig_cache: cache.map(|c| c.join("fontconfig")),
        ..Facts::default()
    }
}

/// The run's facts as this host has them now, for printing a profile
/// (`--print-profile seatbelt`) rather than running it: the user's temporary directory
/// stands in for the run's own, and the trace tag is `sandgate`.
pub fn host_facts(policy: &SandboxPolicy) -> Facts {
    let tmp = std::env::temp_dir();
    let tmp = std::fs::canonicalize(&tmp).unwrap_or(tmp);
    let ca_files = ca_files_in(policy, &tmp);
    Facts {
        tmp: policy.private_tmp.then(|| tmp.clone()),
        trace_tag: policy.seatbelt.trace.then(|| "sandgate".to_owned()),
        protected: ca_files.clone(),
        ca_files,
        ..user_facts()
    }
}

/// Where a run of `policy` with its state in `dir` keeps the interception CA's files (the
/// certificate, then the bundle), when it intercepts; for printing what a run would do.
pub fn ca_files_in(policy: &SandboxPolicy, dir: &std::path::Path) -> Vec<PathBuf> {
    match policy.intercepts() {
        true => [crate::argv::CA_CERT, crate::argv::CA_BUNDLE]
            .iter()
            .map(|name| dir.join(name))
            .collect(),
        false => Vec::new(),
    }
}

/// `--print-profile seatbelt`: the profile with this host's facts ([`host_facts`]).
pub fn render(policy: &SandboxPolicy) -> Profile {
    render_with(policy, &host_facts(policy))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seatbelt_is_chosen_on_macos_or_when_a_stand_in_is_named() {
        assert_eq!(choose(None, true), Some(PathBuf::from(SANDBOX_EXEC)));
        assert_eq!(choose(None, false), None);
        assert_eq!(choose(Some("".into()), false), None);
        assert_eq!(
            choose(Some("/tmp/stand-in".into()), false),
            Some(PathBuf::from("/tmp/stand-in"))
        );
        assert_eq!(
            choose(Some("/tmp/stand-in".into()), true),
            Some(PathBuf::from("/tmp/stand-in"))
        );
    }
}
