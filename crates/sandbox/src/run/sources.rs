//! Bind sources opened once, so that what bwrap binds is exactly the path that was checked.
//!
//! `sandgate run` resolves every host path of its policy to its canonical form when it reads
//! the policy ([`crate::paths`]), and checks that form; given the path again, bwrap would
//! resolve it once more when it mounts it. In between, whoever can write one of its parent
//! directories (another run of the same `sandgate mcp`, say) could swap a component for a
//! symlink and have a directory outside the policy bound, writable. So [`open`] opens the
//! source of each `--bind` and `--ro-bind` on the built command line once (`O_PATH`,
//! close-on-exec), compares the descriptor's real path (readlink of `/proc/self/fd/N`) with
//! the canonical path the command line names, refuses the run where they differ, and hands
//! bwrap the descriptor instead of the path (`--bind-fd FD DEST`, `--ro-bind-fd FD DEST`):
//! the descriptor names the opened file or directory whatever happens to its path later.
//! bwrap checks that the mount it made is the descriptor's, and closes it before the
//! command starts; only the child that becomes bwrap inherits it
//! ([`crate::fds::inherit_in_child`]).
//!
//! A path someone checked before the run started is held to the form they checked:
//! [`check_workspace`] refuses a run whose `WORKSPACE` parameter (what `sandgate mcp` checks
//! against a sandbox's allowed workspaces, then passes in its canonical form) no longer names
//! itself where the policy binds it, because a component of it became a symlink since.
//!
//! `--print-argv` prints the command line as built, with paths: the descriptors exist only
//! for the run that opens them.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::RunError;
use crate::policy::SandboxPolicy;

/// The parameter that names a run's workspace: what `sandgate mcp` checks against a
/// sandbox's allowed workspaces, and what `SANDGATE_WORKSPACE` tells the command.
pub const WORKSPACE_PARAM: &str = "WORKSPACE";

/// `O_PATH`: a descriptor that names a file or directory without opening it for reading or
/// writing. The bwrap backend runs on Linux alone; elsewhere this module is compiled (the
/// crate builds for macOS) but never reached.
#[cfg(target_os = "linux")]
const O_PATH: libc::c_int = libc::O_PATH;
#[cfg(not(target_os = "linux"))]
const O_PATH: libc::c_int = 0;

/// The bind sources of one run, open until bwrap has started (it inherits them); none where
/// bwrap takes paths.
#[derive(Debug, Default)]
pub(super) struct Sources {
    fds: Vec<OwnedFd>,
}

impl Sources {
    /// The descriptors bwrap must inherit.
    pub(super) fn raw(&self) -> Vec<RawFd> {
        self.fds.iter().map(AsRawFd::as_raw_fd).collect()
    }
}

/// Each (name, text) in a memory file of its own (`memfd`, close-on-exec), read from its
/// start: what bwrap copies into the sandbox with `--ro-bind-data`, never a file on the host.
pub(super) fn data(files: &[(&'static str, String)]) -> Result<Vec<(&'static str, OwnedFd)>, RunError> {
    use std::io::{Seek as _, Write as _};
    files
        .iter()
        .map(|(name, text)| {
            let made = rustix::fs::memfd_create(*name, rustix::fs::MemfdFlags::CLOEXEC)
                .map_err(std::io::Error::from)
                .and_then(|fd| {
                    let mut file = std::fs::File::from(fd);
                    file.write_all(text.as_bytes())?;
                    file.rewind()?;
                    Ok(OwnedFd::from(file))
                });
            made.map(|fd| (*name, fd))
                .map_err(|e| RunError::Unavailable(format!("cannot hand {name} to the sandbox: {e}")))
        })
        .collect()
}

/// `argv` (bwrap's, as [`crate::argv::bwrap_argv`] built it) with each `--bind SRC DEST` and
/// `--ro-bind SRC DEST` before the first `--` replaced by `--bind-fd FD DEST` and
/// `--ro-bind-fd FD DEST`, and the descriptors opened. Refused when a source cannot be
/// opened or is no longer at its canonical path. A source in `bridges` (the run's bridge
/// directory) is a socket this runner made: it must be one this process listens on, and
/// its absence is the run's failure, not the policy's.
pub(super) fn open(
    argv: Vec<OsString>,
    bridges: Option<&Path>,
) -> Result<(Vec<OsString>, Sources), RunError> {
    let mut out = Vec::with_capacity(argv.len());
    let mut fds = Vec::new();
    let mut words = argv.into_iter();
    while let Some(word) = words.next() {
        let flag = match word.to_str() {
            Some("--bind") => "--bind-fd",
            Some("--ro-bind") => "--ro-bind-fd",
            Some("--") => {
                out.push(word);
                out.extend(words.by_ref());
                break;
            }
            _ => {
                out.push(word);
                continue;
            }
        };
        let (Some(source), Some(dest)) = (words.next(), words.next()) else {
            return Err(RunError::Unavailable(format!(
                "internal: {} without its source and destination",
                word.to_string_lossy()
            )));
        };
        let bridge = bridges.is_some_and(|dir| Path::new(&source).starts_with(dir));
        let fd = open_source(Path::new(&source)).map_err(|e| match (bridge, e) {
            // The runner made it a moment ago: gone or moved is not the policy's mistake
            // (exit 64) but the run's own state failing it (69).
            (true, RunError::Usage(why)) => RunError::Unavailable(why),
            (_, e) => e,
        })?;
        if bridge && is_socket(&fd) {
            listened_here(&fd, Path::new(&source))?;
        }
        out.push(flag.into());
        out.push(fd.as_raw_fd().to_string().into());
        out.push(dest);
        fds.push(fd);
    }
    Ok((out, Sources { fds }))
}

fn is_socket(fd: &OwnedFd) -> bool {
    use std::os::unix::fs::FileTypeExt as _;
    std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).is_ok_and(|m| m.file_type().is_socket())
}

/// Checks that the socket `fd` names (a bridge socket, opened for bwrap) is listened on by
/// this process: between its creation and this open, a process that may write the run's
/// state directory could have renamed another socket onto its name. A connection through
/// the descriptor (`/proc/self/fd/N`) gets the listener's credentials (`SO_PEERCRED`, set at
/// `listen()`); the bridge closes that probe at once ([`crate::bridge`]: its peer is this
/// process).
pub(super) fn listened_here(fd: &OwnedFd, path: &Path) -> Result<(), RunError> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let refuse = |why: String| {
        RunError::Unavailable(format!(
            "the bridge socket {} {why}; the command was not run",
            path.display()
        ))
    };
    let probe = std::os::unix::net::UnixStream::connect(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| refuse(format!("cannot be reached: {e}")))?;
    let listener = getsockopt(&probe, PeerCredentials)
        .map_err(|e| refuse(format!("has no listener that can be told: {e}")))?
        .pid();
    if u32::try_from(listener).ok() == Some(std::process::id()) {
        Ok(())
    } else {
        Err(refuse(format!(
            "is not this run's: process {listener} listens on it"
        )))
    }
}

/// Opens `path` (canonical) as an `O_PATH` descriptor, close-on-exec, and checks that the
/// descriptor's real path is `path` itself: no component was swapped for a symlink, and
/// nothing was renamed onto it, since the policy resolved it.
fn open_source(path: &Path) -> Result<OwnedFd, RunError> {
    let fd: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_PATH)
        .open(path)
        .map_err(|e| {
            RunError::Usage(format!(
                "cannot open the bind source {}: {e}; the command was not run",
                path.display()
            ))
        })?
        .into();
    let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|e| {
        RunError::Unavailable(format!(
            "cannot read where the bind source {} is (/proc/self/fd): {e}; the command was not run",
            path.display()
        ))
    })?;
    if real != path {
        return Err(RunError::Usage(format!(
            "the bind source {} is now {}: its path changed since it was resolved (a component replaced by a symlink, or renamed); refused, the command was not run",
            path.display(),
            real.display()
        )));
    }
    Ok(fd)
}

/// Refuses a run whose `WORKSPACE` parameter is bound where it does not name itself: the
/// policy resolved a path at or under it to somewhere else (an alias: the written path is
/// not its canonical form). A caller that checked the workspace (`sandgate mcp`) passes the
/// canonical path it checked, so a component swapped for a symlink since makes it differ.
pub(super) fn check_workspace(
    policy: &SandboxPolicy,
    params: &BTreeMap<String, String>,
) -> Result<(), RunError> {
    let Some(value) = params.get(WORKSPACE_PARAM) else {
        return Ok(());
    };
    let named = crate::paths::lexical(Path::new(value));
    if !named.is_absolute() {
        return Ok(());
    }
    match policy.aliases.iter().find(|a| a.at.starts_with(&named)) {
        None => Ok(()),
        Some(alias) => Err(RunError::Usage(format!(
            "the workspace {value} ({WORKSPACE_PARAM}) is not canonical: {} resolves to {}. A workspace must be named by its canonical path, which it must still be when the run starts (a component may have been replaced by a symlink since it was checked); pass the canonical path, or --path-param {WORKSPACE_PARAM}=PATH to have sandgate resolve it. The command was not run",
            alias.at.display(),
            alias.target.display()
        ))),
    }
}

#[cfg(test)]
#[path = "sources_tests.rs"]
mod tests;
