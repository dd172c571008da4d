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
pub async fn serve(listener: UnixListener, target: SocketAddr, what: String, peers: Option<PeerFilter>) {
    loop {
        let Ok((unix, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(relay(unix, target, what.clone(), peers.clone()));
    }
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
