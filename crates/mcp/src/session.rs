//! `sandgate mcp-session -- CMD...` (internal): the step between the MCP server and each
//! run's `sandgate run`. It makes itself the leader of a new session (setsid(2)), then
//! executes the command in place, keeping its process id.
//!
//! The server shares the agent client's session, and so its controlling terminal when the
//! client was started from one. A run left in that session could open `/dev/tty`: write
//! over the agent's screen, take the terminal's foreground, read what the person types. In
//! a session of its own the run has no controlling terminal at all, and can never get the
//! client's (a terminal is acquired only by a session leader opening one that no session
//! has). A session leader also leads its own process group, whose id is its process id:
//! the runner's time limit signals that group.
//!
//! A step rather than a `pre_exec` hook: the workspace forbids `unsafe` code, and this is
//! the one system call it needs.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

/// The hidden subcommand's name, as the runner spawns it.
pub const SUBCOMMAND: &str = "mcp-session";

/// Exit status when the session cannot be made or the command cannot run (the sandbox
/// could not be set up, as `sandgate run` says it).
pub const EXIT_FAILED: i32 = 70;

/// Runs the command in a new session (returns only when it could not).
pub fn run(command: &[OsString]) -> i32 {
    let Some((program, args)) = command.split_first() else {
        eprintln!("sandgate: {SUBCOMMAND}: no command");
        return EXIT_FAILED;
    };
    // Fails only for a process group leader: the runner never makes this one a leader, so
    // a failure means a caller other than the runner, and the command must not start in a
    // session that may hold a terminal.
    if let Err(e) = rustix::process::setsid() {
        eprintln!("sandgate: {SUBCOMMAND}: cannot start a session of its own: {e}; not running the command");
        return EXIT_FAILED;
    }
    let error = std::process::Command::new(program).args(args).exec();
    eprintln!("sandgate: cannot run {}: {error}", program.to_string_lossy());
    EXIT_FAILED
}
