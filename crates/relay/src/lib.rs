//! Byte relays for tunnels: both directions at once, a clean EOF passed on as a half-close
//! while the other direction carries on, an error in either ending the tunnel (and only it),
//! an idle timer, and the shutdown signal. Nothing here looks at the bytes.
//!
//! [`tunnel`] relays a tunnel's two ends ([`Leg`]s). Two TCP sockets go on Linux through
//! splice(2) (`splice.rs`: payload never enters user space, and the whole tunnel is one
//! small hand-written future), elsewhere through the portable copy relay (`copy.rs`). An end
//! that is an HTTP/2 stream between a node and a central proxy is relayed frame by frame
//! (`leg/frames.rs`; the ends themselves, [`Leg`] and [`Upstream`], are `leg.rs`'s).
//! `copy.rs` also relays any pair of async streams ([`relay_streams`], a buffer per
//! direction; the HTTP/1.1 node transport's bridge has a pump of its own, sandgate-proxy's
//! `transport/bridge.rs`). No relay holds a user-space buffer while a tunnel idles.

mod copy;
mod leg;
#[cfg(target_os = "linux")]
mod splice;

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use sandgate_audit::event::Outcome;

#[cfg_attr(
    not(test),
    expect(
        unused_imports,
        reason = "see relay_streams: no caller outside the tests today"
    )
)]
pub(crate) use copy::relay_streams;
pub use leg::{Leg, NodeStream, StreamSlot, Upstream};

/// Relays `client` and `upstream` until both directions end, one fails, the tunnel idles
/// out, or `stop` cuts it. Returns bytes client-to-upstream, upstream-to-client (each
/// counted on from `carried`, what the caller already moved each way), and the outcome
/// (`ok`, `client_reset`, `upstream_reset`, `idle_timeout`, `shutdown`,
/// `proxy_out_of_descriptors`).
///
/// Every idle tunnel holds this future, so it is the socket relay's own future and nothing
/// around it: a plain function choosing the relay, not an `async fn` (which would hold its
/// arguments once more beside the relay's), and `upstream` taken whole so the caller keeps
/// no end of its own beside it.
pub fn tunnel<'a>(
    client: &'a mut Leg<'_>,
    mut upstream: Leg<'a>,
    idle: Duration,
    stop: &'a CancellationToken,
    carried: (u64, u64),
) -> impl Future<Output = (u64, u64, Outcome)> + Send + 'a {
    match (client.tcp(), upstream.tcp()) {
        (Some(client), Some(upstream)) => Either::Left(sockets(client, upstream, idle, stop, carried)),
        // Boxed: the frame relay's state would otherwise enlarge every tunnel's future,
        // spliced ones included.
        _ => Either::Right(Box::pin(async move {
            let (sent, received, outcome) = leg::relay(client, &mut upstream, idle, stop).await;
            (carried.0 + sent, carried.1 + received, outcome)
        })),
    }
}

/// Relays two sockets.
fn sockets<'a>(
    client: &'a TcpStream,
    upstream: &'a TcpStream,
    idle: Duration,
    stop: &'a CancellationToken,
    carried: (u64, u64),
) -> impl Future<Output = (u64, u64, Outcome)> + Send + 'a {
    #[cfg(target_os = "linux")]
    {
        splice::relay(client, upstream, idle, stop, carried)
    }
    #[cfg(not(target_os = "linux"))]
    {
        async move {
            let (sent, received, outcome) = copy::copy_relay(client, upstream, idle, stop).await;
            (carried.0 + sent, carried.1 + received, outcome)
        }
    }
}

/// Writes all of `data` through a shared reference (each relay direction holds one).
pub(crate) async fn write_all(dst: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        dst.writable().await?;
        match dst.try_write(data) {
            Ok(n) => data = data.get(n..).unwrap_or_default(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
