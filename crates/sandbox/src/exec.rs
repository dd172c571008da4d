//! `sandgate sandbox-exec [--allow-unix-sockets] [--rlimit NAME=N]... -- CMD...`: the last
//! step before the command in a sandbox without the init (no PID namespace: `net.mode: all`
//! with `pid: false`). It marks every descriptor from 3 up close-on-exec ([`crate::fds`]),
//! sets the run's rlimits ([`crate::limits`]), loads the seccomp filter ([`crate::seccomp`])
//! into itself and then replaces itself with the command (execve), so all of it holds for the
//! command and everything it starts, and nothing else runs in between. The init
//! ([`crate::init`]) does the same three steps in the child it forks for the command
//! ([`Confinement::command`]), which saves executing the sandgate binary once more on every
//! run (and where the init's filter is the command's, the child inherits it rather than
//! loading it again). In a run with a cgroup of its own, the runner's child that becomes
//! bwrap joins the cgroup between its fork and its execve ([`CgroupJoin`]).
//!
//! Fail closed: if the filter cannot be built or loaded, the command does not run (exit
//! [`EXIT_FILTER`]). When the command cannot be executed, the exit status is a shell's: 127
//! when it is not found, 126 when it is found but cannot be executed.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use crate::limits::Rlimit;
use crate::seccomp::{Filter, FilterOptions};

/// The filter could not be loaded; the command did not run (EX_SOFTWARE, as the bridge).
pub const EXIT_FILTER: i32 = 70;
/// The command was not found (as a shell says it).
pub const EXIT_NOT_FOUND: i32 = 127;
/// The command was found but could not be executed.
pub const EXIT_NOT_EXECUTABLE: i32 = 126;

/// What the command starts under, made ready beforehand (the rlimits read, the filter
/// compiled), so that [`Confinement::apply`] allocates nothing and can run in the child of a
/// fork, between the fork and the execve of the command.
#[derive(Debug)]
pub struct Confinement {
    rlimits: Vec<Rlimit>,
    filter: Filter,
    /// The filter is loaded in the calling process already ([`Confinement::load_here`]): the
    /// child inherits it from the fork and does not load it again.
    inherited: bool,
}

impl Confinement {
    /// Reads `--rlimit` values and compiles the command's filter.
    pub fn new(options: FilterOptions, rlimits: &[String]) -> Result<Confinement, String> {
        Ok(Confinement {
            rlimits: crate::limits::parse_rlimits(rlimits)?,
            filter: Filter::compile(options)?,
            inherited: false,
        })
    }

    /// Loads the command's filter into the calling process (the init, when its filter and
    /// the command's are the same), so the command inherits it from the fork and its child
    /// loads nothing more. Fail closed: an error means the caller must not go on.
    pub(crate) fn load_here(&mut self) -> Result<(), nix::errno::Errno> {
        self.filter.load()?;
        self.inherited = true;
        Ok(())
    }

    /// In the calling process, in this order: every descriptor from 3 up close-on-exec, the
    /// rlimits, the filter. On failure, which step failed and why (both static: nothing is
    /// allocated here on Linux 5.11 and later).
    fn apply(&self) -> Result<(), (&'static str, &'static str)> {
        crate::fds::cloexec_from_3().map_err(|_| {
            (
                "cannot mark inherited descriptors close-on-exec",
                "no close_range",
            )
        })?;
        crate::limits::set_rlimits(&self.rlimits).map_err(|e| ("cannot set the run's limits", e.desc()))?;
        self.filter
            .load()
            .map_err(|e| ("cannot load the seccomp filter", e.desc()))
    }

    /// In the child of a fork, between it and the execve: only system calls, nothing
    /// allocated. Descriptors: `close_range` where the kernel has it; the caller has marked
    /// every inherited one close-on-exec already ([`crate::fds::cloexec_from_3`], with its
    /// fallback that lists them, which allocates and so cannot run here), and what it opened
    /// since is close-on-exec as Rust opens everything. The signals the caller handles
    /// (its runtime's SIGINT, SIGTERM, SIGHUP) go back to their defaults, so a Ctrl-C
    /// forwarded while the command starts ends it rather than running a handler copied
    /// from the parent.
    fn apply_in_child(&self) -> Result<(), (&'static str, &'static str)> {
        #[cfg(target_os = "linux")]
        let _ = crate::fds::close_range_cloexec();
        for signal in [
            nix::sys::signal::Signal::SIGINT,
            nix::sys::signal::Signal::SIGTERM,
            nix::sys::signal::Signal::SIGHUP,
        ] {
            default_action(signal).map_err(|e| ("cannot reset a signal's handler", e.desc()))?;
        }
        crate::limits::set_rlimits(&self.rlimits).map_err(|e| ("cannot set the run's limits", e.desc()))?;
        if self.inherited {
            return Ok(());
        }
        self.filter
            .load()
            .map_err(|e| ("cannot load the seccomp filter", e.desc()))
    }

    /// `program` with `args`, confined in its own process after the fork
    /// ([`Self::apply_in_child`]), then the execve. Where a step fails, the child says so on
    /// stderr and exits [`EXIT_FILTER`] without executing anything (fail closed). For the
    /// init only, whose process is single-threaded when it starts the command (its runtime
    /// is the current thread's, its blocking pool not yet started) and has marked its
    /// inherited descriptors close-on-exec.
    pub(crate) fn command(self, program: &OsString, args: &[OsString]) -> std::process::Command {
        let mut command = std::process::Command::new(program);
        command.args(args);
        let confine = move || {
            if let Err((step, why)) = self.apply_in_child() {
                for part in ["sandgate: ", step, ": ", why, "; the command was not run\n"] {
                    let _ = nix::unistd::write(std::io::stderr(), part.as_bytes());
                }
                exit_child(EXIT_FILTER);
            }
            Ok(())
        };
        before_exec(&mut command, confine);
        command
    }
}

/// `pre_exec`: between fork and execve, `confine` only makes system calls on what was made
/// before the fork (no allocation, no lock), as `pre_exec` requires.
#[expect(unsafe_code, reason = "pre_exec with an async-signal-safe closure; see above")]
fn before_exec(
    command: &mut std::process::Command,
    confine: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
) {
    unsafe {
        command.pre_exec(confine);
    }
}

/// sigaction(2) back to the default action: async-signal-safe, as `pre_exec` needs.
#[expect(unsafe_code, reason = "signal(2) with SIG_DFL installs no handler of ours")]
fn default_action(signal: nix::sys::signal::Signal) -> nix::Result<()> {
    unsafe { nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl) }.map(|_| ())
}

/// SIGINT, SIGTERM and SIGHUP ignored (the init without a runtime: the runner signals the
/// command, and the init stays until the command is gone). The command's child sets them
/// back to their defaults before its execve ([`Confinement::apply_in_child`]).
pub(crate) fn ignore_stop_signals() -> nix::Result<()> {
    use nix::sys::signal::Signal;
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        ignore(signal)?;
    }
    Ok(())
}

/// sigaction(2) to ignore `signal`.
#[expect(unsafe_code, reason = "signal(2) with SIG_IGN installs no handler of ours")]
fn ignore(signal: nix::sys::signal::Signal) -> nix::Result<()> {
    unsafe { nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigIgn) }.map(|_| ())
}

/// _exit(2): the child of a fork ends here, without the exit handlers or the buffers it
/// shares with its parent.
#[expect(
    unsafe_code,
    reason = "_exit(2) in the child of a fork, which takes no pointer"
)]
fn exit_child(code: i32) -> ! {
    unsafe { libc::_exit(code) }
}

/// Loads the filter and executes `command`; returns only when that failed, with the exit
/// status to use.
pub fn run(options: FilterOptions, rlimits: &[String], command: &[OsString]) -> i32 {
    let Some((program, args)) = command.split_first() else {
        eprintln!("sandgate: sandbox-exec: no command");
        return EXIT_NOT_FOUND;
    };
    let prepared = Confinement::new(options, rlimits)
        .and_then(|c| c.apply().map_err(|(step, why)| format!("{step}: {why}")));
    if let Err(e) = prepared {
        eprintln!("sandgate: {e}; the command was not run");
        return EXIT_FILTER;
    }
    // Searches PATH like execvp(3), including the shell fallback for scripts without `#!`.
    let error = std::process::Command::new(program).args(args).exec();
    eprintln!("sandgate: cannot run {}: {error}", program.to_string_lossy());
    exit_status_for(&error)
}

/// The run's cgroups, each one's file opened for writing before bwrap is started, and
/// joined in the child of the fork that starts it, before its execve ([`CgroupJoin::before_exec`]):
/// every process of the sandbox is counted from its first fork, and no program runs in
/// between (this was `sandgate sandbox-enter`, one more execution of the sandgate binary).
/// The child writes `0`, "the caller": in a cgroup v1 hierarchy (a `tasks` file beside
/// `cgroup.procs`) into `tasks`, which moves the calling thread without taking the lock that
/// moving a whole process takes, whose write side waits out an RCU grace period (13 ms on
/// the project's VM, against 0.4; docs/benchmarks.md); the child of a fork has one thread,
/// and the execve of bwrap keeps it. In cgroup v2, into `cgroup.procs`.
#[derive(Debug, Default)]
pub struct CgroupJoin {
    files: Vec<std::fs::File>,
}

impl CgroupJoin {
    /// Opens the file to write for each `cgroup.procs` in `procs` (close-on-exec, as Rust
    /// opens every file).
    pub fn open(procs: &[std::path::PathBuf]) -> std::io::Result<CgroupJoin> {
        let files = procs
            .iter()
            .map(|file| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(join_file(file))
                    .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", file.display())))
            })
            .collect::<std::io::Result<_>>()?;
        Ok(CgroupJoin { files })
    }

    /// Has `command` join every cgroup in its child, before its execve. Where a write fails
    /// the spawn fails with its error and nothing is executed (fail closed: no cgroup, no
    /// sandbox). Only system calls on descriptors opened before the fork, as `pre_exec`
    /// requires. Nothing to join, nothing is added (the spawn may then take the faster
    /// `posix_spawn`).
    pub fn before_exec(self, command: &mut std::process::Command) {
        if self.files.is_empty() {
            return;
        }
        before_exec(command, move || {
            for file in &self.files {
                nix::unistd::write(file, b"0")?;
            }
            Ok(())
        });
    }
}

/// The file a process writes `0` into to join the cgroup whose `cgroup.procs` is `procs`:
/// `tasks` beside it in cgroup v1 (this thread), else `cgroup.procs` (this process).
fn join_file(procs: &std::path::Path) -> std::path::PathBuf {
    let tasks = procs.with_file_name("tasks");
    if tasks.is_file() {
        tasks
    } else {
        procs.to_path_buf()
    }
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
    fn a_v1_cgroup_is_joined_by_its_tasks_and_a_v2_one_by_its_procs() {
        let v1 = tempfile::tempdir().unwrap();
        for file in ["cgroup.procs", "tasks"] {
            std::fs::write(v1.path().join(file), "").unwrap();
        }
        let procs = v1.path().join("cgroup.procs");
        assert_eq!(join_file(&procs), v1.path().join("tasks"));
        let v2 = tempfile::tempdir().unwrap();
        let procs = v2.path().join("cgroup.procs");
        std::fs::write(&procs, "").unwrap();
        assert_eq!(join_file(&procs), procs);
    }

    /// The child writes `0` into each file before its execve, and a write that fails stops
    /// the spawn: the program never runs (its marker file is not made).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_child_joins_before_it_executes_and_a_failed_join_runs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let procs = dir.path().join("cgroup.procs");
        std::fs::write(&procs, "").unwrap();
        let join = CgroupJoin::open(std::slice::from_ref(&procs)).unwrap();
        let mut command = std::process::Command::new("true");
        join.before_exec(&mut command);
        assert!(command.status().unwrap().success());
        assert_eq!(std::fs::read_to_string(&procs).unwrap(), "0");
        // /dev/full refuses every write (ENOSPC), as a cgroup refuses a process it cannot take.
        let marker = dir.path().join("ran");
        let mut join = CgroupJoin::open(&[]).unwrap();
        join.files
            .push(std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap());
        let mut command = std::process::Command::new("touch");
        command.arg(&marker);
        join.before_exec(&mut command);
        let error = command.status().unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
        assert!(!marker.exists(), "the program ran");
    }

    /// The init's way: the child of the fork sets the rlimits and loads the filter, then the
    /// command runs under both (and the test process under neither).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_confined_command_runs_under_its_limits_and_the_filter() {
        let confinement = Confinement::new(FilterOptions::default(), &["nofile=64".to_owned()]).unwrap();
        let script = "ulimit -n; grep '^Seccomp:' /proc/self/status";
        let out = confinement
            .command(&"sh".into(), &["-c".into(), script.into()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.starts_with("64\n"), "{text}");
        assert!(text.contains("Seccomp:\t2"), "{text}");
        // Counted in filters, so an outer filter (a container's) does not blur it.
        let filters = |status: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Seccomp_filters:"))
                .and_then(|n| n.trim().parse::<u32>().ok())
                .unwrap_or(0)
        };
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        let script = "grep '^Seccomp_filters:' /proc/self/status";
        let confinement = Confinement::new(FilterOptions::default(), &[]).unwrap();
        let out = confinement
            .command(&"sh".into(), &["-c".into(), script.into()])
            .output()
            .unwrap();
        let child = String::from_utf8_lossy(&out.stdout);
        assert!(
            filters(&child) > filters(&own),
            "the command added no filter: {child} against {own}"
        );
    }

    /// A filter the kernel refuses: the child says so and exits 70, and the command never
    /// runs (its marker file is not made).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_filter_that_cannot_load_stops_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let confinement = Confinement {
            rlimits: Vec::new(),
            filter: Filter::refused_by_the_kernel(),
            inherited: false,
        };
        let script = format!("touch {}", marker.display());
        let out = confinement
            .command(&"sh".into(), &["-c".into(), script.into()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(EXIT_FILTER));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("cannot load the seccomp filter") && err.contains("not run"),
            "{err}"
        );
        assert!(!marker.exists(), "the command ran");
    }

    #[test]
    fn exit_statuses_follow_the_shell() {
        let code = |e: i32| exit_status_for(&std::io::Error::from_raw_os_error(e));
        assert_eq!(code(libc::ENOENT), 127);
        assert_eq!(code(libc::ENOTDIR), 127);
        assert_eq!(code(libc::EACCES), 126);
        assert_eq!(code(libc::ENOEXEC), 126);
    }
}
