//! `sandgate sandbox-exec [--allow-unix-sockets] [--rlimit NAME=N]... -- CMD...`: the last
//! step before the command inside every sandbox. It marks every descriptor from 3 up
//! close-on-exec ([`crate::fds`]), sets the run's rlimits ([`crate::limits`]), loads the
//! seccomp filter ([`crate::seccomp`]) into itself and then replaces itself with the command
//! (execve), so all of it holds for the command and everything it starts, and nothing else
//! runs in between. `sandgate sandbox-enter` ([`enter`]) is the step before bwrap in a run
//! with a cgroup of its own: it moves itself into the cgroup, then executes bwrap.
//!
//! Fail closed: if the filter cannot be built or loaded, the command does not run (exit
//! [`EXIT_FILTER`]). When the command cannot be executed, the exit status is a shell's: 127
//! when it is not found, 126 when it is found but cannot be executed.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use crate::seccomp::{self, FilterOptions};

/// The filter could not be loaded; the command did not run (EX_SOFTWARE, as the bridge).
pub const EXIT_FILTER: i32 = 70;
/// The command was not found (as a shell says it).
pub const EXIT_NOT_FOUND: i32 = 127;
/// The command was found but could not be executed.
pub const EXIT_NOT_EXECUTABLE: i32 = 126;

/// Loads the filter and executes `command`; returns only when that failed, with the exit
/// status to use.
pub fn run(options: FilterOptions, rlimits: &[String], command: &[OsString]) -> i32 {
    let Some((program, args)) = command.split_first() else {
        eprintln!("sandgate: sandbox-exec: no command");
        return EXIT_NOT_FOUND;
    };
    let prepared = crate::fds::cloexec_from_3()
        .and_then(|()| crate::limits::apply_rlimits(rlimits))
        .and_then(|()| seccomp::load(options));
    if let Err(e) = prepared {
        eprintln!("sandgate: {e}; the command was not run");
        return EXIT_FILTER;
    }
    // Searches PATH like execvp(3), including the shell fallback for scripts without `#!`.
    let error = std::process::Command::new(program).args(args).exec();
    eprintln!("sandgate: cannot run {}: {error}", program.to_string_lossy());
    exit_status_for(&error)
}

/// `sandgate sandbox-enter --cgroup-procs FILE... -- bwrap ...`: moves itself into each of
/// the run's cgroups, then executes bwrap; returns only on failure (fail closed: no cgroup,
/// no sandbox), with the exit status.
pub fn enter(procs: &[std::path::PathBuf], command: &[std::ffi::OsString]) -> i32 {
    use std::os::unix::process::CommandExt;
    let pid = std::process::id().to_string();
    for file in procs {
        if let Err(e) = std::fs::write(file, &pid) {
            eprintln!(
                "sandgate: cannot enter the run's cgroup {}: {e}; the command was not run",
                file.display()
            );
            return EXIT_FILTER;
        }
    }
    let Some((program, args)) = command.split_first() else {
        return EXIT_NOT_FOUND;
    };
    let error = std::process::Command::new(program).args(args).exec();
    eprintln!("sandgate: cannot run {}: {error}", program.to_string_lossy());
    exit_status_for(&error)
}

/// 127 for "not found" (as POSIX shells), 126 for anything else that stopped the execve.
pub fn exit_status_for(error: &std::io::Error) -> i32 {
    match error.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => EXIT_NOT_FOUND,
        _ => EXIT_NOT_EXECUTABLE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_follow_the_shell() {
        let code = |e: i32| exit_status_for(&std::io::Error::from_raw_os_error(e));
        assert_eq!(code(libc::ENOENT), 127);
        assert_eq!(code(libc::ENOTDIR), 127);
        assert_eq!(code(libc::EACCES), 126);
        assert_eq!(code(libc::ENOEXEC), 126);
    }
}
