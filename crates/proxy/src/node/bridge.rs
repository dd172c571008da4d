//! The bridge between an HTTP/2 stream and the egress core: the core moves bytes between
//! sockets (readiness, splice), so each stream gets a connected pair of local stream
//! sockets; one end goes to the core, the other is pumped to and from the stream here.
//! A clean end of either side is passed on as a half-close; dropping the core's end ends
//! the pump and resets the stream, and the stream's end closes the core's socket.

use std::io;
use std::os::fd::OwnedFd;

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixStream};

/// The pump never ends a quiet stream itself: the core's relay on the other end of the
/// socket pair keeps the tunnel's idle timer and closes its end, which ends the pump.
const NO_IDLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// A connected pair: the core's end (a stream socket the core drives like an accepted TCP
/// connection: reads, writes, shutdown and splice all work on it) and the pump's end.
pub(crate) fn pair() -> io::Result<(TcpStream, UnixStream)> {
    let (core, pump) = std::os::unix::net::UnixStream::pair()?;
    core.set_nonblocking(true)?;
    pump.set_nonblocking(true)?;
    // The core's relay works on socket readiness and splice(2), which AF_UNIX stream
    // sockets support like TCP ones; only socket options would differ, and none are set on
    // this end.
    let core = std::net::TcpStream::from(OwnedFd::from(core));
    Ok((TcpStream::from_std(core)?, UnixStream::from_std(pump)?))
}

/// Moves bytes between `stream` and `pump` (the relay for any two streams) until both
/// directions end or either fails.
pub(crate) async fn pump(stream: Upgraded, pump: UnixStream) {
    let never = tokio_util::sync::CancellationToken::new();
    let _ = crate::relay::relay_streams(TokioIo::new(stream), pump, NO_IDLE_LIMIT, &never).await;
}
