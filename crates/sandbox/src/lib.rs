//! sandgate's sandbox runner on bubblewrap: the policy ([`policy`], with host paths resolved
//! in [`paths`] and the environment built in [`env`]), the bwrap command line as a pure
//! function of it ([`argv`]), the seccomp filter ([`seccomp`]) and the step that loads it
//! before the command ([`exec`]), the run's limits ([`limits`]) and the descriptors it never
//! passes on ([`fds`]), the init that runs first (PID 1) in every sandbox with a PID namespace ([`init`]) and the
//! bridges it talks to ([`bridge`]), the command lines of those internal steps ([`steps`]), and the supervisor that starts the
//! proxy, the bridges and bwrap ([`run`], with [`state`], [`processes`] and [`summary`]),
//! and the question asked at the terminal for `--ask` ([`ask`]); what a run says while it
//! runs ([`live`]) and where its audit log is kept ([`runlog`]); the `EgressPolicy` a
//! sandbox policy may name for its network ([`egress`]); what a command needs to read, for
//! `sandgate init --for` ([`needs`]); what this host offers the sandbox, for `sandgate doctor`
//! and for a run's setup failures ([`host`]); the two error types, below all of these
//! ([`error`]); where a policy error inside a one-line YAML flow mapping points (`flow`).
//!
//! It compiles for macOS too: the seatbelt backend is ordinary code, and what is Linux's
//! own (seccomp, pidfds, `prctl`, Landlock, `close_range`) sits behind
//! `#[cfg(target_os = "linux")]` with an error elsewhere (scripts/test checks the
//! x86_64-apple-darwin build where that target is installed).

pub mod argv;
pub mod ask;
pub mod bridge;
pub mod egress;
pub mod env;
pub mod error;
pub mod exec;
pub mod fds;
mod flow;
pub mod host;
pub mod init;
pub mod limits;
pub mod live;
pub mod needs;
pub mod paths;
pub mod policy;
pub mod processes;
pub mod run;
pub mod runlog;
pub mod seatbelt;
pub mod seccomp;
pub mod state;
pub mod steps;
pub mod summary;
#[cfg(test)]
mod test_support;
