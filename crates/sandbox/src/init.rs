//! `sandgate sandbox-init`: the first process inside every sandbox with its own PID
//! namespace (PID 1: bubblewrap runs it `--as-pid-1`, so no process of bubblewrap's own is
//! inside). It makes itself not dumpable (the command, the same user, can then neither read
//! nor write its memory through /proc/1/mem), marks inherited descriptors close-on-exec and
//! loads the same seccomp filter as the command, with Unix sockets allowed only when it has
//! bridges to reach; so no process inside is without the filter.
//!
//! In the proxied modes (and with `net.loopback_ports`), for each forward (`--forward 127.0.0.1:3128=/run/sandgate/proxy.sock`, and the SOCKS5
//! port's `127.0.0.1:1080=/run/sandgate/socks.sock`) it listens on the sandbox's own
//! loopback and relays every connection to the bridge socket, behind which the run's proxy
//! (or a bridged host loopback port) waits ([`crate::bridge`]). It asks every bridge at
//! once and refuses to start the command if any end is not ready (fail closed): the
//! command never runs with a broken or missing way out, and the message names what is
//! missing. Then it starts the
//! command: in the child it forks, what `sandbox-exec` does (descriptors, the run's rlimits,
//! the command's own filter on top of the init's; [`crate::exec::Confinement`]) and the
//! execve, with no second execution of the sandgate binary in between. Without bridges the
//! two filters are the same one, compiled once and loaded here, and the command inherits it
//! from the fork. It reaps
//! every process that ends inside (orphans come to PID 1) until the command ends, and exits
//! with its status. It ignores
//! SIGINT/SIGTERM/SIGHUP itself: the runner signals the command directly, and the init stays
//! until the command is gone. Only the bridges need an async runtime (the current thread's);
//! without them the init starts none.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream, UnixStream};

use crate::bridge::{READY, UNREACHABLE};

/// Exit status when the bridge is not ready (EX_SOFTWARE).
pub const EXIT_BRIDGE: i32 = 70;
/// Exit status when the command cannot be started (as a shell does).
pub const EXIT_NO_COMMAND: i32 = 127;
/// How long a bridge connection may take to report the host end.
const STATUS_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs the init; returns the process exit status. `allow_unix_sockets`: the policy's
/// `platform.seccomp.allow_unix_sockets` (the init's filter is never narrower than the
/// command's, so the command's decides); `rlimits`: the command's (`NAME=VALUE`).
pub fn run(
    forwards: &[(SocketAddr, PathBuf)],
    allow_unix_sockets: bool,
    rlimits: &[String],
    command: &[OsString],
) -> i32 {
    if let Err(e) = not_dumpable() {
        eprintln!("sandgate: sandbox init: cannot protect itself ({e}); the command was not run");
        return EXIT_BRIDGE;
    }
    let command_options = crate::seccomp::FilterOptions { allow_unix_sockets };
    let mut confinement = match crate::exec::Confinement::new(command_options, rlimits) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandgate: sandbox init: {e}; the command was not run");
            return EXIT_BRIDGE;
        }
    };
    let options = crate::seccomp::FilterOptions {
        allow_unix_sockets: allow_unix_sockets || !forwards.is_empty(),
    };
    // Without bridges the init's filter is the command's: compiled once, loaded here, and
    // inherited by the command's process from the fork.
    let filtered = crate::fds::cloexec_from_3().and_then(|()| {
        if options == command_options {
            confinement
                .load_here()
                .map_err(|e| format!("cannot load the seccomp filter: {}", e.desc()))
        } else {
            crate::seccomp::load(options)
        }
    });
    if let Err(e) = filtered {
        eprintln!("sandgate: sandbox init: {e}; the command was not run");
        return EXIT_BRIDGE;
    }
    if forwards.is_empty() {
        // Nothing to relay: no runtime, only the command and the reaping.
        if let Err(e) = crate::exec::ignore_stop_signals() {
            eprintln!("sandgate: sandbox init: cannot ignore signals ({e}); the command was not run");
            return EXIT_BRIDGE;
        }
        return match start(confinement, command) {
            Ok(pid) => reap_until(pid),
            Err(code) => code,
        };
    }
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        eprintln!("sandgate: sandbox init: cannot start its runtime");
        return EXIT_BRIDGE;
    };
    rt.block_on(serve(forwards, confinement, command))
}

/// Not dumpable: the command runs as the same user, and must not read or write this
/// process's memory through /proc/1/mem or process_vm_writev (and so run code as PID 1).
#[cfg(target_os = "linux")]
fn not_dumpable() -> Result<(), String> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| e.to_string())
}

/// The init is PID 1 of a Linux sandbox only (bubblewrap's PID namespace); elsewhere it
/// refuses to start the command.
#[cfg(not(target_os = "linux"))]
fn not_dumpable() -> Result<(), String> {
    Err("sandbox-init runs only inside the Linux sandbox".to_owned())
}

/// Parses `ADDR=SOCKET`.
pub fn parse_forward(text: &str) -> Result<(SocketAddr, PathBuf), String> {
    let (addr, socket) = text
        .split_once('=')
        .ok_or_else(|| format!("invalid --forward {text:?}: expected ADDR=SOCKET"))?;
    let addr = addr
        .parse()
        .map_err(|_| format!("invalid --forward {text:?}: {addr:?} is not IP:PORT"))?;
    Ok((addr, PathBuf::from(socket)))
}

/// Connects to a bridge socket and reads its status byte: the stream, ready to relay, or
/// the host side's reason why nothing is behind it.
pub(crate) async fn open_bridge(bridge: &Path) -> Result<UnixStream, String> {
    let mut unix = UnixStream::connect(bridge)
        .await
        .map_err(|e| format!("{}: {e}", bridge.display()))?;
    let mut status = [0u8; 1];
    let read = tokio::time::timeout(STATUS_TIMEOUT, unix.read_exact(&mut status)).await;
    let [status] = status;
    match read {
        Ok(Ok(_)) if status == READY => Ok(unix),
        Ok(Ok(_)) if status == UNREACHABLE => {
            let mut reason = Vec::new();
            let _ =
                tokio::time::timeout(STATUS_TIMEOUT, (&mut unix).take(512).read_to_end(&mut reason)).await;
            Err(String::from_utf8_lossy(&reason).into_owned())
        }
        Ok(Ok(_)) => Err(format!("{}: unexpected status", bridge.display())),
        Ok(Err(e)) => Err(format!("{}: {e}", bridge.display())),
        Err(_) => Err(format!("{}: no answer", bridge.display())),
    }
}

async fn serve(
    forwards: &[(SocketAddr, PathBuf)],
    confinement: crate::exec::Confinement,
    command: &[OsString],
) -> i32 {
    let mut ready = Vec::with_capacity(forwards.len());
    for (listen, bridge) in forwards {
        let listener = match TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("sandgate: bridge not ready: cannot listen on {listen} in the sandbox: {e}");
                return EXIT_BRIDGE;
            }
        };
        ready.push((listener, bridge.clone()));
    }
    // Every bridge asked at once (each answer is a round trip through the runner), every
    // answer awaited: the command starts only when all of them said ready.
    let checks: Vec<_> = ready
        .iter()
        .map(|(_, bridge)| {
            let bridge = bridge.clone();
            tokio::spawn(async move { open_bridge(&bridge).await.map(drop) })
        })
        .collect();
    for check in checks {
        let reason = match check.await {
            Ok(Ok(())) => continue,
            Ok(Err(reason)) => reason,
            Err(e) => format!("the check did not finish ({e})"),
        };
        eprintln!("sandgate: bridge not ready: {reason}; the command was not run");
        return EXIT_BRIDGE;
    }
    for kind in [
        tokio::signal::unix::SignalKind::interrupt(),
        tokio::signal::unix::SignalKind::terminate(),
        tokio::signal::unix::SignalKind::hangup(),
    ] {
        // Installing a handler is what keeps these signals from ending the init.
        if let Ok(mut s) = tokio::signal::unix::signal(kind) {
            tokio::spawn(async move { while s.recv().await.is_some() {} });
        }
    }
    for (listener, bridge) in ready {
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(relay(tcp, bridge.clone()));
            }
        });
    }
    match start(confinement, command) {
        Ok(pid) => tokio::task::spawn_blocking(move || reap_until(pid))
            .await
            .unwrap_or(EXIT_BRIDGE),
        Err(code) => code,
    }
}

/// Starts the command under its confinement; its pid, or the exit status to end with.
fn start(confinement: crate::exec::Confinement, command: &[OsString]) -> Result<nix::unistd::Pid, i32> {
    let Some((program, args)) = command.split_first() else {
        eprintln!("sandgate: sandbox init: no command");
        return Err(EXIT_NO_COMMAND);
    };
    match confinement.command(program, args).spawn() {
        Ok(child) => Ok(nix::unistd::Pid::from_raw(
            i32::try_from(child.id()).unwrap_or(-1),
        )),
        Err(e) => {
            eprintln!("sandgate: cannot run {}: {e}", program.to_string_lossy());
            Err(crate::exec::exit_status_for(&e))
        }
    }
}

/// As PID 1, reaps every process that ends in the sandbox (orphans are re-parented here:
/// left as zombies they would count against the process limit for the rest of the run)
/// until the command itself ends; returns its exit status (128+N for a signal).
fn reap_until(command: nix::unistd::Pid) -> i32 {
    use nix::sys::wait::{WaitStatus, waitpid};
    loop {
        match waitpid(nix::unistd::Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == command => return code,
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == command => return 128 + signal as i32,
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                eprintln!("sandgate: waiting for the command failed: {e}");
                return EXIT_BRIDGE;
            }
        }
    }
}

/// Relays one connection of the command; when nothing is behind the bridge, resets it so
/// the client sees a refused connection rather than an empty reply.
pub(crate) async fn relay(mut tcp: TcpStream, bridge: PathBuf) {
    match open_bridge(&bridge).await {
        Ok(mut unix) => {
            let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
        }
        Err(_) => {
            // SO_LINGER 0: close() sends RST instead of FIN.
            let _ = tcp.set_zero_linger();
        }
    }
}
