//! The host side of the sandbox's bridges: a Unix socket in the run's bridge directory
//! (bound read-only into the sandbox) whose every connection is relayed to a host loopback
//! address: one of the run's proxy listeners (HTTP, SOCKS5) or a port listed in
//! `net.loopback_ports`.
//!
//! Each connection starts with one status byte from the host side, so the in-sandbox init
//! ([`crate::init`]) knows whether the host end was reached: [`READY`] and then the relayed
//! bytes, or [`UNREACHABLE`] followed by a one-line reason and the end of the stream. The
//! init's readiness check fails closed on it, naming the port, and later connections that
//! find nothing behind the bridge are reset, not answered with an empty reply.
//!
//! A bridge serves only its own run: on Linux each connection's peer (`SO_PEERCRED`, and
//! still running after, by its pidfd) must be a process at most [`MAX_DEPTH`] generations
//! below this runner (bwrap and the sandbox's init, which makes every bridge connection, are
//! two). Another run that can reach the socket, through a path its policy lists, is closed
//! on without a byte, and the run warns on the first such connection and then at each power
//! of two, so a flood of them cannot fill the run's stderr. Under bwrap a connection from
//! the runner itself is its check of the socket bwrap binds (`run/sources.rs`), dropped at
//! once. (On macOS the peer is not checked.)

use std::net::SocketAddr;
use std::time::Duration;

use sandgate_proxy::PeerFilter;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;

/// The host end answered; relayed bytes follow.
pub const READY: u8 = 0;
/// The host end could not be reached; a reason (UTF-8, one line) follows, then EOF.
pub const UNREACHABLE: u8 = 1;
/// How long the host side waits to connect to a loopback port.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Relays each connection on `listener` to `target`. `what` names the target in failure
/// reasons ("the run's proxy", "host loopback port 5432"). With `peers`, each outgoing
/// socket's address is registered before connecting, so the run's proxy serves only this
/// bridge.
///
/// With `probed`, the runner checks the socket once through bwrap's bind descriptor
/// (`run/sources.rs`) and nothing else of this process connects: a connection from this
/// process is that check, dropped at once, before it reaches the proxy or a host port.
/// Without (Seatbelt, whose front ports in this process relay here), it is served.
pub async fn serve(
    listener: UnixListener,
    target: SocketAddr,
    what: String,
    peers: Option<PeerFilter>,
    probed: bool,
) {
    let mut refused: u64 = 0;
    loop {
        let Ok((unix, _)) = listener.accept().await else {
            continue;
        };
        #[cfg(target_os = "linux")]
        if probed && peer_is_self(&unix) {
            continue;
        }
        if let Err(e) = ours(&unix) {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    target = what,
                    refused,
                    "a connection to the run's bridge was refused: {e}"
                );
            }
            continue;
        }
        tokio::spawn(relay(unix, target, what.clone(), peers.clone()));
    }
}

/// Whether the peer of `unix` is a process of this run: this process or one at most
/// [`MAX_DEPTH`] generations below it (its pid from `SO_PEERCRED`).
///
/// That pid is the number the process had when it connected. Where the kernel gives the
/// peer's pidfd (`SO_PEERPIDFD`, Linux 6.5) the peer must still be running once its parents
/// have been read: a peer that has exited could have its number given to another process,
/// whose parents would have been read instead. (A pidfd turns readable when its process
/// exits: one `poll`, no file read.)
#[cfg(target_os = "linux")]
fn ours(unix: &tokio::net::UnixStream) -> Result<(), String> {
    use nix::sys::socket::{getsockopt, sockopt::PeerPidfd};
    let pidfd = getsockopt(unix, PeerPidfd).ok();
    let pid = unix
        .peer_cred()
        .map_err(|e| format!("its peer cannot be read: {e}"))?
        .pid()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or("its peer has no process id here")?;
    if !descends_from(pid, std::process::id()) {
        return Err(format!("process {pid} is not in this run's sandbox"));
    }
    match pidfd {
        Some(fd) if exited(&fd) => Err(format!("process {pid} exited while it was checked")),
        _ => Ok(()),
    }
}

/// Whether the peer of `unix` is this process.
#[cfg(target_os = "linux")]
fn peer_is_self(unix: &tokio::net::UnixStream) -> bool {
    unix.peer_cred()
        .ok()
        .and_then(|c| c.pid())
        .and_then(|p| u32::try_from(p).ok())
        == Some(std::process::id())
}

/// Whether the process a pidfd names has exited (or cannot be asked).
#[cfg(target_os = "linux")]
fn exited(fd: &std::os::fd::OwnedFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd as _;
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
}

#[cfg(not(target_os = "linux"))]
fn ours(_: &tokio::net::UnixStream) -> Result<(), String> {
    Ok(())
}

/// The most parents followed from a peer toward the runner: the init that connects is two
/// generations below it (bwrap, then the init), a setuid bwrap may add one; a deeper chain
/// is not the run's, and the check never reads more than this many files.
#[cfg(target_os = "linux")]
const MAX_DEPTH: usize = 8;

/// Whether process `pid` is `root` or at most [`MAX_DEPTH`] generations below it, by its
/// parents in `/proc` (a process whose parent cannot be read is not).
#[cfg(target_os = "linux")]
fn descends_from(mut pid: u32, root: u32) -> bool {
    for _ in 0..=MAX_DEPTH {
        if pid == root {
            return true;
        }
        match parent_of(pid) {
            Some(parent) if parent != 0 && parent != pid => pid = parent,
            _ => return false,
        }
    }
    false
}

/// The parent of `pid`: the field after the state, past the command name's closing
/// parenthesis (the name may hold spaces and parentheses of its own).
#[cfg(target_os = "linux")]
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[expect(
    clippy::disallowed_methods,
    reason = "the bridge dials only a fixed host loopback address: the run's own proxy or a port the policy lists; no name, no destination of the command's choosing"
)]
async fn relay(
    mut unix: tokio::net::UnixStream,
    target: SocketAddr,
    what: String,
    peers: Option<PeerFilter>,
) {
    // Bind first, so the proxy knows this source address before the connection arrives.
    let socket = match tokio::net::TcpSocket::new_v4() {
        Ok(s) => s,
        Err(e) => return refuse(&mut unix, &what, &e.to_string()).await,
    };
    if let Err(e) = socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))) {
        return refuse(&mut unix, &what, &e.to_string()).await;
    }
    let local = socket.local_addr().ok();
    if let (Some(p), Some(local)) = (&peers, local) {
        p.allow(local);
    }
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(target)).await {
        Ok(Ok(mut tcp)) => {
            if unix.write_all(&[READY]).await.is_ok() {
                let _ = tokio::io::copy_bidirectional(&mut unix, &mut tcp).await;
            }
        }
        Ok(Err(e)) => refuse(&mut unix, &what, &e.to_string()).await,
        Err(_) => refuse(&mut unix, &what, "connect timed out").await,
    }
    if let (Some(p), Some(local)) = (&peers, local) {
        p.forget(local);
    }
}

async fn refuse(unix: &mut tokio::net::UnixStream, what: &str, reason: &str) {
    tracing::debug!(target = what, reason, "bridge connection refused");
    let mut message = vec![UNREACHABLE];
    message.extend_from_slice(format!("nothing answers on {what}: {reason}").as_bytes());
    let _ = unix.write_all(&message).await;
    let _ = unix.shutdown().await;
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::{descends_from, ours, parent_of};

    /// A peer is checked as the process that connected: this process itself and a live
    /// child of it are this run's; a peer that has exited is not, whatever its number now
    /// names.
    #[tokio::test]
    async fn a_peer_is_the_process_that_connected_while_it_lives() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bridge.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let _mine = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert_eq!(ours(&accepted), Ok(()));
        // A child that connects and waits to be told to exit.
        let mut child = crate::test_support::python_until_told(&format!(
            "s = socket.socket(socket.AF_UNIX)\ns.connect({:?})",
            path.display().to_string()
        ));
        let (from_child, _) = listener.accept().await.unwrap();
        assert_eq!(ours(&from_child), Ok(()));
        drop(child.stdin.take());
        child.wait().unwrap();
        let gone = ours(&from_child).unwrap_err();
        assert!(
            gone.contains("exited") || gone.contains("not in this run's sandbox"),
            "{gone}"
        );
    }

    #[test]
    fn a_child_descends_from_this_process_and_this_process_not_from_it() {
        let mut child = std::process::Command::new("sleep").arg("10").spawn().unwrap();
        let me = std::process::id();
        assert_eq!(parent_of(child.id()), Some(me));
        assert!(descends_from(child.id(), me));
        assert!(descends_from(me, me));
        assert!(!descends_from(me, child.id()));
        // Not a process (past pid_max), and the kernel's: not below anything.
        assert!(!descends_from(u32::MAX, me));
        assert!(!descends_from(2, me));
        let _ = child.kill();
        let _ = child.wait();
    }

    /// A chain deeper than the bound is not followed to its end (each step is a file read,
    /// and a stranger could build a long chain to make every refusal cost more).
    #[test]
    fn a_chain_deeper_than_the_bound_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("chain.sh");
        // Each shell starts the next and waits for it; the last one starts a sleep.
        std::fs::write(
            &script,
            "if [ \"$1\" -gt 1 ]; then sh \"$0\" $(($1 - 1)); else sleep 10; fi; true\n",
        )
        .unwrap();
        let shells = super::MAX_DEPTH + 3;
        let mut top = std::process::Command::new("sh")
            .arg(&script)
            .arg(shells.to_string())
            .spawn()
            .unwrap();
        let me = std::process::id();
        let mut bottom = None;
        for _ in 0..500 {
            bottom = leaf(top.id()).filter(|b| {
                std::fs::read_to_string(format!("/proc/{b}/comm")).is_ok_and(|c| c.trim() == "sleep")
            });
            if bottom.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let bottom = bottom.expect("the chain of shells never reached its sleep");
        let length = chain_length(bottom, me).unwrap();
        assert!(length > super::MAX_DEPTH, "the chain is {length} long");
        // The process exactly MAX_DEPTH generations below is accepted, the bottom is not.
        let mut at_bound = bottom;
        for _ in super::MAX_DEPTH..length {
            at_bound = parent_of(at_bound).unwrap();
        }
        assert_eq!(chain_length(at_bound, me), Some(super::MAX_DEPTH));
        assert!(descends_from(at_bound, me));
        assert!(
            !descends_from(bottom, me),
            "{length} generations below were accepted"
        );
        let _ = std::process::Command::new("kill")
            .arg(bottom.to_string())
            .status();
        let _ = top.wait();
    }

    /// The last descendant of `pid` along first children (`/proc/PID/task/PID/children`).
    fn leaf(mut pid: u32) -> Option<u32> {
        for _ in 0..64 {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
            match children.split_whitespace().next() {
                Some(c) => pid = c.parse().ok()?,
                None => return Some(pid),
            }
        }
        None
    }

    /// Generations from `pid` up to `root`, if it is below it at all.
    fn chain_length(mut pid: u32, root: u32) -> Option<usize> {
        for n in 0..64 {
            if pid == root {
                return Some(n);
            }
            pid = parent_of(pid)?;
        }
        None
    }
}
