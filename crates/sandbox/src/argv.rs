//! The bubblewrap command line, built by a pure function from the policy and the facts of
//! one run (where the sandgate binary and the bridge sockets are). Unit-tested without
//! bwrap; `sandgate run --print-argv` prints it.
//!
//! Layout inside the sandbox: nothing of the host but the listed paths (bound at their
//! canonical place, with a symlink where the policy spelled them differently); a fresh
//! /proc, a minimal /dev, a private /tmp; the root itself read-only; the sandgate binary at
//! [`INIT_PATH`]; in the proxied modes the bridge directory's files at [`BRIDGE_DIR`] (one
//! socket for the HTTP proxy, one for its SOCKS5 listener, one per loopback port, the
//! interception CA's two files), each bound read-only on its own ([`bridge_files`]).
//!
//! The command starts in `policy.cwd` (`--chdir`; see [`crate::policy::start_dir`]).
//!
//! With a PID namespace (always, but for `pid: false` in `net.mode: all`) the init
//! `INIT_PATH sandbox-init` is PID 1 (`--as-pid-1`: bubblewrap's own reaper, which loads no
//! filter, never runs) and starts the command, setting the run's rlimits and loading the
//! seccomp filter in the child it forks for it; in the proxied modes and with
//! `net.loopback_ports` it also holds the bridges. Without the init, the command starts
//! through `INIT_PATH sandbox-exec`, which does the same and then executes it.
//!
//! The environment is not on this command line: bwrap is spawned with exactly the command's
//! environment (see [`crate::env`]), because `/proc/PID/cmdline` is readable by every local
//! user and `--setenv NAME VALUE` would publish every value.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::policy::{NetMode, SandboxPolicy};

/// Where the bridge directory (holding the bridge sockets) appears inside the sandbox.
pub const BRIDGE_DIR: &str = "/run/sandgate";
/// The bridge socket of the run's HTTP proxy, in the bridge directory.
pub const PROXY_SOCKET: &str = "proxy.sock";
/// The bridge socket of the run's SOCKS5 listener, in the bridge directory.
pub const SOCKS_SOCKET: &str = "socks.sock";
/// The run's interception CA certificate, in the bridge directory.
pub const CA_CERT: &str = "ca.pem";
/// The system's roots and that CA, in the bridge directory.
pub const CA_BUNDLE: &str = "ca-bundle.pem";
/// Where the sandgate binary appears inside the sandbox.
pub const INIT_PATH: &str = "/run/sandgate-init";

/// Files name resolution needs, bound read-only in `net.mode: all` when the host has them
/// (the other modes have no DNS inside; the proxy resolves).
pub const DNS_FILES: [&str; 5] = [
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
];

/// The facts of one run that the policy does not hold.
#[derive(Debug, Clone)]
pub struct RunFacts {
    /// The program bound read-only at [`INIT_PATH`] and executed first inside:
    /// `sandgate-init`, or `sandgate` where that is not installed ([`crate::run::init_binary`]).
    pub init_exe: PathBuf,
    /// The host directory holding the bridge sockets (proxied modes, loopback ports).
    pub bridge_dir: Option<PathBuf>,
    /// Files of the bridge directory given to bwrap as data (`--ro-bind-data`), not bound from
    /// the host: (name, a descriptor to read them from, inherited by bwrap). The interception
    /// CA's certificate and bundle, which so never exist on the host, where a run that may
    /// write there could plant a link for the runner to write through or change their text.
    pub bridge_data: Vec<(&'static str, std::os::fd::RawFd)>,
    /// `net.mode: all`: the host's DNS files that exist, as (canonical source, place inside).
    pub dns_files: Vec<(PathBuf, PathBuf)>,
    /// The run's own files (its policy files, its audit log, `--protect`), canonical: bound
    /// read-only over themselves where a write path covers them ([`mounts`]).
    pub protected: Vec<PathBuf>,
    /// This bwrap has `--disable-userns` (0.8.0 and later; the filter refuses new user
    /// namespaces either way).
    pub disable_userns: bool,
    /// `--no-terminal`: the sandbox starts in a session of its own (`--new-session`).
    pub new_session: bool,
    /// `NAME=VALUE` rlimits set just before the command ([`crate::limits`]).
    pub rlimits: Vec<String>,
    pub command: Vec<OsString>,
}

fn push(argv: &mut Vec<OsString>, items: &[&str]) {
    argv.extend(items.iter().map(OsString::from));
}

fn bind(argv: &mut Vec<OsString>, flag: &str, source: &Path, dest: &Path) {
    argv.push(flag.into());
    argv.push(source.into());
    argv.push(dest.into());
}

/// Does the sandbox hold bridge sockets (kept by the init)?
pub fn needs_bridges(policy: &SandboxPolicy) -> bool {
    policy.net.proxied() || !policy.loopback_ports.is_empty()
}

/// The bridge socket of a `net.loopback_ports` port, in the bridge directory.
pub fn loopback_socket(port: u16) -> String {
    format!("port-{port}.sock")
}

/// The bridge sockets of a run, each with the loopback port the init listens on inside for
/// it: the HTTP proxy's and the SOCKS5 listener's (proxied modes), one per
/// `net.loopback_ports` port. What the runner makes, bwrap binds and the init forwards.
fn bridge_sockets(policy: &SandboxPolicy) -> Vec<(u16, String)> {
    let mut sockets = Vec::new();
    if policy.net.proxied() {
        sockets.push((policy.proxy_port, PROXY_SOCKET.to_owned()));
        if let Some(port) = policy.socks_port {
            sockets.push((port, SOCKS_SOCKET.to_owned()));
        }
    }
    sockets.extend(
        policy
            .loopback_ports
            .iter()
            .map(|&port| (port, loopback_socket(port))),
    );
    sockets
}

/// The files of the bridge directory the sandbox gets, as the runner makes them before bwrap
/// starts: the bridge sockets ([`bridge_sockets`]), then, where the run intercepts, the
/// interception CA's certificate and bundle.
pub fn bridge_files(policy: &SandboxPolicy) -> Vec<String> {
    let mut files: Vec<String> = bridge_sockets(policy).into_iter().map(|(_, name)| name).collect();
    if policy.intercepts() {
        files.push(CA_CERT.to_owned());
        files.push(CA_BUNDLE.to_owned());
    }
    files
}

/// Does the command start behind the in-sandbox init? Always as PID 1 of a PID namespace,
/// and without one where it holds bridges.
pub fn needs_init(policy: &SandboxPolicy) -> bool {
    policy.unshare_pid || needs_bridges(policy)
}

/// The complete argv, starting with `bwrap`.
pub fn bwrap_argv(policy: &SandboxPolicy, facts: &RunFacts) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec!["bwrap".into()];
    // No capabilities inside, even when sandgate runs as root: the sandbox is the same for
    // root and for an ordinary user.
    push(
        &mut argv,
        &[
            "--die-with-parent",
            "--unshare-user",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--cap-drop",
            "ALL",
        ],
    );
    if facts.disable_userns {
        // No user namespace inside this one (the filter also refuses them).
        push(&mut argv, &["--disable-userns"]);
    }
    if facts.new_session {
        push(&mut argv, &["--new-session"]);
    }
    if policy.unshare_pid {
        push(&mut argv, &["--unshare-pid"]);
    }
    if policy.unshare_ipc {
        push(&mut argv, &["--unshare-ipc"]);
    }
    if policy.net != NetMode::All {
        // A private network namespace: bwrap brings its loopback up, nothing else exists.
        push(&mut argv, &["--unshare-net"]);
    }
    mounts(&mut argv, policy, facts);
    if let Some(dir) = &policy.cwd {
        // Chosen by `policy::start_dir`, which checked the sandbox has it: never bwrap's
        // silent fallback to HOME or `/`.
        argv.push("--chdir".into());
        argv.push(dir.into());
    }
    let init = needs_init(policy);
    if init && policy.unshare_pid {
        // Our init is PID 1: bwrap's own reaper would be a process inside without the
        // filter, dumpable, that the command could take over through /proc/1/mem.
        push(&mut argv, &["--as-pid-1"]);
    }
    argv.push("--".into());
    // The init starts the command itself, confined as `sandbox-exec` would ([`crate::init`]).
    push(
        &mut argv,
        &[
            INIT_PATH,
            if init { "sandbox-init" } else { "sandbox-exec" },
            "--build",
            crate::steps::BUILD,
        ],
    );
    if policy.allow_unix_sockets {
        push(&mut argv, &["--allow-unix-sockets"]);
    }
    for rlimit in &facts.rlimits {
        push(&mut argv, &["--rlimit", rlimit]);
    }
    if init {
        for (port, socket) in bridge_sockets(policy) {
            let forward = format!("127.0.0.1:{port}={BRIDGE_DIR}/{socket}");
            push(&mut argv, &["--forward", &forward]);
        }
    }
    argv.push("--".into());
    argv.extend(facts.command.iter().cloned());
    argv
}

/// The mount operations, in bwrap's order: the root, then the listed mounts from the
/// outermost path in (see [`mount_plan`]), then symlinks, then the root made read-only.
fn mounts(argv: &mut Vec<OsString>, policy: &SandboxPolicy, facts: &RunFacts) {
    let root = Path::new("/");
    if policy.allow_write_all {
        bind(argv, "--bind", root, root);
    } else if policy.allow_read_all {
        bind(argv, "--ro-bind", root, root);
    }
    push(argv, &["--proc", "/proc", "--dev", "/dev"]);
    // bwrap's /dev is a tmpfs of no set size; /dev/shm (POSIX shared memory) gets one of
    // its own, sized like every tmpfs, and /dev itself is made read-only below (writes to
    // its device nodes still work), so nothing can fill memory through it.
    if let Some(bytes) = policy.limits.tmpfs {
        push(argv, &["--size", &bytes.to_string()]);
    }
    push(argv, &["--tmpfs", "/dev/shm"]);
    for (kind, path) in with_protected(mount_plan(policy), policy, &facts.protected) {
        match kind {
            MountKind::Tmpfs => {
                if let Some(bytes) = policy.limits.tmpfs {
                    push(argv, &["--size", &bytes.to_string()]);
                }
                argv.push("--tmpfs".into());
                argv.push(path.into());
            }
            MountKind::ReadOnly => bind(argv, "--ro-bind", path, path),
            MountKind::ReadWrite | MountKind::Pinned => bind(argv, "--bind", path, path),
        }
    }
    if policy.net == NetMode::All && !policy.allow_read_all && !policy.allow_write_all {
        for (source, dest) in &facts.dns_files {
            bind(argv, "--ro-bind", source, dest);
        }
    }
    // Read-only (a socket accepts connect() on a read-only mount: it needs write permission
    // on the socket inode, not a writable file system), and each file on its own: a mount
    // stays on the file it was made of, so a process outside that renames the host's socket
    // and puts another in its place (a run that may write where this run's state is) does not
    // redirect the init, which connects by path.
    if let (true, Some(dir)) = (needs_bridges(policy), &facts.bridge_dir) {
        for name in bridge_files(policy) {
            let dest = Path::new(BRIDGE_DIR).join(&name);
            let data = name == CA_CERT || name == CA_BUNDLE;
            match facts.bridge_data.iter().find(|(n, _)| *n == name) {
                Some((_, fd)) => {
                    push(argv, &["--ro-bind-data", &fd.to_string()]);
                    argv.push(dest.into());
                }
                // The CA's files are only ever data: without a descriptor (`--print-argv`,
                // which opens none) the word stands where the run's would be, and a run
                // that lacked one would fail in bwrap rather than bind a host path.
                None if data => {
                    push(argv, &["--ro-bind-data", "FD"]);
                    argv.push(dest.into());
                }
                None => bind(argv, "--ro-bind", &dir.join(&name), &dest),
            }
        }
    }
    bind(argv, "--ro-bind", &facts.init_exe, Path::new(INIT_PATH));
    // An alias is needed only where the host's own symlink is not already visible through a
    // bind (under `/`, or under another bound path).
    let bound: Vec<&Path> = policy
        .read_paths
        .iter()
        .chain(&policy.write_paths)
        .chain(&policy.extra_ro_binds)
        .chain(&policy.extra_rw_binds)
        .map(PathBuf::as_path)
        .chain((policy.allow_read_all || policy.allow_write_all).then_some(root))
        .collect();
    for alias in &policy.aliases {
        let covered = bound.iter().any(|b| alias.at.starts_with(b))
            || policy
                .aliases
                .iter()
                .any(|other| other.at != alias.at && alias.at.starts_with(&other.at));
        if !covered {
            argv.push("--symlink".into());
            argv.push(alias.target.clone().into());
            argv.push(alias.at.clone().into());
        }
    }
    push(argv, &["--remount-ro", "/dev"]);
    if !policy.allow_write_all {
        // bwrap's root is a tmpfs; read-only, the command cannot fill memory through it or
        // plant files beside the binds. /tmp and the binds are mounts of their own.
        push(argv, &["--remount-ro", "/"]);
    }
}

/// What one listed path gets. At one path, the later kind wins (a path both read and
/// written is writable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum MountKind {
    Tmpfs,
    ReadOnly,
    ReadWrite,
    /// A directory bound over itself, still writable, only to be a mount point: it cannot
    /// be renamed away ([`with_protected`]).
    Pinned,
}

/// Sorts mounts into the order bwrap must make them: by depth, then kind (at one path, the
/// later kind wins).
fn in_order(plan: &mut Vec<(MountKind, &Path)>) {
    plan.sort_by_key(|&(kind, path)| (path.components().count(), kind, path));
    plan.dedup();
}

/// The mount of `plan` (in bwrap's order) that decides what is at `path`: the last one at
/// or above it.
fn deciding<'a>(plan: &[(MountKind, &'a Path)], path: &Path) -> Option<(MountKind, &'a Path)> {
    plan.iter()
        .rev()
        .find(|(_, outer)| path.starts_with(outer))
        .copied()
}

/// `plan` with the run's own files (`protected`) made read-only where a write path covers
/// them (a policy beside the project, an --audit-log inside it), or the command could
/// rewrite the policy of its next run or the record of this one. Each such file is bound
/// read-only over itself (a mount point cannot be replaced or removed either), and each
/// directory between the write path and the file is pinned, bound over itself and still
/// writable, so that it cannot be renamed away to put another file at the same path. A file
/// no write path covers is left as it is: not shown at all, or read-only already.
fn with_protected<'a>(
    mut plan: Vec<(MountKind, &'a Path)>,
    policy: &SandboxPolicy,
    protected: &'a [PathBuf],
) -> Vec<(MountKind, &'a Path)> {
    let root = Path::new("/");
    // Outermost first, each decided against the plan with the earlier ones in it: a
    // protected file inside a protected directory (a run's log in the runs directory) is
    // read-only already, and no directory between them is pinned writable over it.
    let mut ordered: Vec<&'a PathBuf> = protected.iter().collect();
    ordered.sort_by_key(|p| p.components().count());
    for file in ordered {
        in_order(&mut plan);
        let covering = match deciding(&plan, file) {
            Some((MountKind::ReadWrite | MountKind::Pinned, path)) => path,
            Some(_) => continue,
            None if policy.allow_write_all => root,
            None => continue,
        };
        let between: Vec<&'a Path> = file
            .ancestors()
            .skip(1)
            .take_while(|dir| *dir != covering)
            .filter(|dir| !plan.iter().any(|(_, p)| p == dir))
            .collect();
        plan.extend(between.into_iter().map(|dir| (MountKind::Pinned, dir)));
        plan.push((MountKind::ReadOnly, file.as_path()));
    }
    in_order(&mut plan);
    plan
}

/// The listed mounts (the private /tmp, `platform.bwrap.tmpfs`, the read and write paths and
/// the extra binds) in the order bwrap must make them: a mount hides whatever an earlier one
/// put at or under its path, so outer paths come first and the deepest path decides. A read
/// path inside a write path is read-only (`.git` in a writable project), a tmpfs inside a
/// bound path hides what is there (`~/.ssh` under a readable home), a bind under /tmp shows
/// through the private /tmp. A bind whose nearest enclosing mount is a bind of the same kind
/// is dropped: bwrap binds recursively, so it would change nothing.
fn mount_plan(policy: &SandboxPolicy) -> Vec<(MountKind, &Path)> {
    let tmp = Path::new("/tmp");
    let mut plan: Vec<(MountKind, &Path)> = policy
        .private_tmp
        .then_some((MountKind::Tmpfs, tmp))
        .into_iter()
        .chain(policy.extra_tmpfs.iter().map(|p| (MountKind::Tmpfs, p.as_path())))
        .chain(
            policy
                .read_paths
                .iter()
                .chain(&policy.extra_ro_binds)
                .map(|p| (MountKind::ReadOnly, p.as_path())),
        )
        .chain(
            policy
                .write_paths
                .iter()
                .chain(&policy.extra_rw_binds)
                .map(|p| (MountKind::ReadWrite, p.as_path())),
        )
        .collect();
    in_order(&mut plan);
    let mut kept: Vec<(MountKind, &Path)> = Vec::with_capacity(plan.len());
    for (kind, path) in plan {
        let covered =
            kind != MountKind::Tmpfs && deciding(&kept, path).is_some_and(|(outer, _)| outer == kind);
        if !covered {
            kept.push((kind, path));
        }
    }
    kept
}

#[cfg(test)]
#[path = "argv_tests.rs"]
mod tests;
