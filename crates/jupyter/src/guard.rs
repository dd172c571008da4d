//! `sandgate jupyter guard --parent PID -- CMD...` (internal): the step between the
//! launcher and each of its children (Jupyter Server, jupyter-mcp-server).
//!
//! It asks the kernel for SIGTERM when its parent dies (`PR_SET_PDEATHSIG`, kept across
//! execve), checks that the parent is still the launcher (it may have died before the
//! request), then executes the command in place. So even a `kill -9` of the launcher
//! leaves no server behind: Jupyter Server gets SIGTERM and shuts its kernels down.
//!
//! The signal follows the thread that forked, not the process: the launcher forks its
//! children from its main thread, which lives as long as it does.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

/// Exit status when the launcher is already gone or the command cannot run.
pub const EXIT_GONE: i32 = 70;

/// Runs the command (returns only when it could not be executed).
pub fn run(parent: u32, command: &[OsString]) -> i32 {
    let Some((program, args)) = command.split_first() else {
        eprintln!("sandgate: jupyter guard: no command");
        return EXIT_GONE;
    };
    if let Err(e) = death_signal() {
        eprintln!("sandgate: cannot ask for the parent-death signal: {e}");
        return EXIT_GONE;
    }
    let parent_now = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
    if parent_now.and_then(|p| u32::try_from(p).ok()) != Some(parent) {
        eprintln!(
            "sandgate: the launcher ({parent}) is gone; not starting {}",
            program.to_string_lossy()
        );
        return EXIT_GONE;
    }
    let error = std::process::Command::new(program).args(args).exec();
    eprintln!("sandgate: cannot run {}: {error}", program.to_string_lossy());
    EXIT_GONE
}

/// SIGTERM when the parent dies (`PR_SET_PDEATHSIG`).
#[cfg(target_os = "linux")]
fn death_signal() -> Result<(), String> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .map_err(|e| e.to_string())
}

/// Only Linux has a parent-death signal: elsewhere the guard refuses, rather than start a
/// server that would outlive a killed launcher.
#[cfg(not(target_os = "linux"))]
fn death_signal() -> Result<(), String> {
    Err("the parent-death signal (PR_SET_PDEATHSIG) exists on Linux only".to_owned())
}
