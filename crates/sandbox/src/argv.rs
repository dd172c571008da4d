//! The bubblewrap command line, built by a pure function from the policy and the facts of
//! one run (where the sandgate binary and the bridge sockets are). Unit-tested without
//! bwrap; `sandgate run --print-argv` prints it.
//!
//! Layout inside the sandbox: nothing of the host but the listed paths (bound at their
//! canonical place, with a symlink where the policy spelled them differently); a fresh
//! /proc, a minimal /dev, a private /tmp; the root itself read-only; the sandgate binary at
//! [`INIT_PATH`]; in the proxied modes the bridge directory, read-only, at [`BRIDGE_DIR`]
//! (one socket for the HTTP proxy, one for its SOCKS5 listener).
//!
//! The command always starts through `INIT_PATH sandbox-exec`, which loads the seccomp
//! filter and then executes it; in the proxied modes (and with `net.loopback_ports`) the
//! init, which needs its Unix-socket bridge and so runs unfiltered, starts that step.
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
    /// The sandgate binary, bound read-only at [`INIT_PATH`].
    pub sandgate_exe: PathBuf,
    /// The host directory holding the bridge sockets (proxied modes, loopback ports).
    pub bridge_dir: Option<PathBuf>,
    /// `net.mode: all`: the host's DNS files that exist, as (canonical source, place inside).
    pub dns_files: Vec<(PathBuf, PathBuf)>,
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

/// Does the command start behind the in-sandbox init (which holds the bridge sockets)?
pub fn needs_init(policy: &SandboxPolicy) -> bool {
    policy.net.proxied() || !policy.loopback_ports.is_empty()
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
    let init = needs_init(policy);
    if init && policy.unshare_pid {
        // Our init waits for the command itself; bwrap need not add an init of its own.
        push(&mut argv, &["--as-pid-1"]);
    }
    argv.push("--".into());
    if init {
        push(&mut argv, &[INIT_PATH, "sandbox-init"]);
        if policy.net.proxied() {
            let socks = policy.socks_port.map(|port| (port, SOCKS_SOCKET));
            for (port, socket) in [(policy.proxy_port, PROXY_SOCKET)].into_iter().chain(socks) {
                let forward = format!("127.0.0.1:{port}={BRIDGE_DIR}/{socket}");
                push(&mut argv, &["--forward", &forward]);
            }
        }
        for port in &policy.loopback_ports {
            let forward = format!("127.0.0.1:{port}={BRIDGE_DIR}/port-{port}.sock");
            push(&mut argv, &["--forward", &forward]);
        }
        argv.push("--".into());
    }
    push(&mut argv, &[INIT_PATH, "sandbox-exec"]);
    if policy.allow_unix_sockets {
        push(&mut argv, &["--allow-unix-sockets"]);
    }
    argv.push("--".into());
    argv.extend(facts.command.iter().cloned());
    argv
}

/// The mount operations, in bwrap's order: mount points first, then binds (a bind under
/// /tmp must not be hidden by the tmpfs), then symlinks, then the root made read-only.
fn mounts(argv: &mut Vec<OsString>, policy: &SandboxPolicy, facts: &RunFacts) {
    let root = Path::new("/");
    if policy.allow_write_all {
        bind(argv, "--bind", root, root);
    } else if policy.allow_read_all {
        bind(argv, "--ro-bind", root, root);
    }
    push(argv, &["--proc", "/proc", "--dev", "/dev"]);
    if policy.private_tmp {
        push(argv, &["--tmpfs", "/tmp"]);
    }
    for t in &policy.extra_tmpfs {
        argv.push("--tmpfs".into());
        argv.push(t.into());
    }
    let read: Vec<&PathBuf> = policy.read_paths.iter().chain(&policy.extra_ro_binds).collect();
    for p in distinct(&read) {
        bind(argv, "--ro-bind", p, p);
    }
    let write: Vec<&PathBuf> = policy.write_paths.iter().chain(&policy.extra_rw_binds).collect();
    for p in distinct(&write) {
        bind(argv, "--bind", p, p);
    }
    if policy.net == NetMode::All && !policy.allow_read_all && !policy.allow_write_all {
        for (source, dest) in &facts.dns_files {
            bind(argv, "--ro-bind", source, dest);
        }
    }
    // Read-only, so the sandbox can create nothing in the host directory behind it; a
    // socket accepts connect() on a read-only mount (it needs write permission on the
    // socket inode, not a writable file system).
    if let (true, Some(dir)) = (needs_init(policy), &facts.bridge_dir) {
        bind(argv, "--ro-bind", dir, Path::new(BRIDGE_DIR));
    }
    bind(argv, "--ro-bind", &facts.sandgate_exe, Path::new(INIT_PATH));
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
    if !policy.allow_write_all {
        // bwrap's root is a tmpfs; read-only, the command cannot fill memory through it or
        // plant files beside the binds. /tmp and the binds are mounts of their own.
        push(argv, &["--remount-ro", "/"]);
    }
}

/// The paths of one kind of bind that another of the same kind does not already cover
/// (bwrap binds recursively; `/lib` resolved to `/usr/lib` under a bound `/usr` is one bind,
/// not two). All read-only binds precede all read-write ones, so dropping a covered path of
/// the same kind changes nothing inside.
fn distinct<'a>(paths: &[&'a PathBuf]) -> Vec<&'a PathBuf> {
    paths
        .iter()
        .enumerate()
        .filter(|&(i, p)| {
            !paths
                .iter()
                .enumerate()
                .any(|(j, q)| (p.starts_with(q) && p != q) || (p == q && j < i))
        })
        .map(|(_, p)| *p)
        .collect()
}

#[cfg(test)]
#[path = "argv_tests.rs"]
mod tests;
