//! A tunnel with at least one end an HTTP/2 stream, relayed frame by frame: each DATA frame
//! is passed on as it comes (no socket pair, no second copy), a stream's window is given back
//! only once its bytes are written on, and a peer's RST_STREAM ends the tunnel as a reset,
//! not as a clean end. Both directions run at once under [`settle`]'s idle timer and stop
//! signal; a stream is reset when the tunnel ends other than cleanly.

use std::future::poll_fn;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use socket2::SockRef;
use tokio::net::TcpStream;

use super::{Leg, NodeStream, send};
use crate::copy::{Meter, Side, settle};
use sandgate_audit::event::Outcome;

/// Read size while a tunnel moves data from a socket (also the largest DATA frame).
const CHUNK: usize = 64 * 1024;

impl Leg<'_> {
    fn halves(&mut self) -> (Source<'_>, Sink<'_>) {
        match self {
            Leg::Tcp(s) => (Source::Tcp(s), Sink::Tcp(s)),
            Leg::Stream(s) => {
                let NodeStream {
                    send,
                    recv,
                    pending,
                    ended,
                    finished,
                    ..
                } = &mut **s;
                let pending = std::mem::take(pending);
                (
                    Source::Stream {
                        recv,
                        pending,
                        ended: *ended,
                    },
                    Sink::Stream(send, finished),
                )
            }
        }
    }

    /// Resets a stream (a socket is closed by its owner, which its peer sees).
    fn reset(&mut self) {
        if let Leg::Stream(s) = self {
            s.reset();
        }
    }
}

/// Where one direction reads.
enum Source<'a> {
    Tcp(&'a TcpStream),
    Stream {
        recv: &'a mut RecvStream,
        /// Read already, window given back.
        pending: Bytes,
        ended: bool,
    },
}

/// Where one direction writes (a stream's flag: its END_STREAM is sent).
enum Sink<'a> {
    Tcp(&'a TcpStream),
    Stream(&'a mut SendStream<Bytes>, &'a mut bool),
}

impl Sink<'_> {
    /// Waits for the peer to reset this stream (never, for a socket: its errors show on I/O).
    async fn reset(&mut self) {
        match self {
            Sink::Tcp(_) => std::future::pending().await,
            Sink::Stream(s, _) => {
                let _ = poll_fn(|cx| s.poll_reset(cx)).await;
            }
        }
    }

    async fn write(&mut self, data: Bytes) -> io::Result<()> {
        match self {
            Sink::Tcp(s) => crate::write_all(s, &data).await,
            Sink::Stream(s, _) => send(s, data).await,
        }
    }

    /// Passes a clean end on: a socket's writes shut down, a stream's END_STREAM.
    fn finish(&mut self) {
        match self {
            Sink::Tcp(s) => {
                let _ = SockRef::from(*s).shutdown(Shutdown::Write);
            }
            Sink::Stream(s, finished) => {
                **finished = true;
                let _ = s.send_data(Bytes::new(), true);
            }
        }
    }
}

/// Moves bytes from `src` to `dst` until the source ends (passed on as a clean end) or
/// either side fails (`sides`: which is at fault for a read error, which for a write).
async fn forward(
    mut src: Source<'_>,
    mut dst: Sink<'_>,
    sides: (Side, Side),
    meter: &Meter<'_>,
) -> Result<(), Side> {
    match &mut src {
        Source::Tcp(s) => loop {
            tokio::select! {
                ready = s.readable() => ready.map_err(|_| sides.0)?,
                () = dst.reset() => return Err(sides.1),
            }
            // Held only while data moves (dropped when the socket runs dry); each read's
            // chunk is split off, and the allocation is used again once the chunks sent
            // before it are gone.
            let mut buf = BytesMut::new();
            loop {
                buf.reserve(CHUNK);
                match s.try_read_buf(&mut buf) {
                    Ok(0) => {
                        dst.finish();
                        return Ok(());
                    }
                    Ok(n) => {
                        dst.write(buf.split().freeze()).await.map_err(|_| sides.1)?;
                        meter.moved(n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => return Err(sides.0),
                }
            }
        },
        Source::Stream { recv, pending, ended } => {
            let first = std::mem::take(pending);
            if !first.is_empty() {
                let n = first.len();
                dst.write(first).await.map_err(|_| sides.1)?;
                meter.moved(n);
            }
            if *ended {
                dst.finish();
                return Ok(());
            }
            loop {
                let data = tokio::select! {
                    data = recv.data() => data,
                    () = dst.reset() => return Err(sides.1),
                };
                match data {
                    Some(Ok(data)) => {
                        let n = data.len();
                        dst.write(data).await.map_err(|_| sides.1)?;
                        // The window comes back once the bytes are on their way.
                        let _ = recv.flow_control().release_capacity(n);
                        meter.moved(n);
                    }
                    None => {
                        dst.finish();
                        return Ok(());
                    }
                    Some(Err(_)) => return Err(sides.0),
                }
            }
        }
    }
}

/// Relays `client` and `upstream`, at least one of them a stream, until both directions
/// end, one fails, nothing moves for `idle`, or `stop` cuts it; a stream is reset when the
/// tunnel ends other than cleanly. Returns bytes client-to-upstream, upstream-to-client and
/// the outcome (as [`crate::tunnel`]'s).
pub async fn relay(
    client: &mut Leg<'_>,
    upstream: &mut Leg<'_>,
    idle: Duration,
    stop: &tokio_util::sync::CancellationToken,
) -> (u64, u64, Outcome) {
    let sent = AtomicU64::new(0);
    let received = AtomicU64::new(0);
    let last = AtomicU64::new(0);
    let epoch = Instant::now();
    let outcome = {
        let (c_src, c_dst) = client.halves();
        let (u_src, u_dst) = upstream.halves();
        let up = Meter {
            count: &sent,
            last: &last,
            epoch,
        };
        let down = Meter {
            count: &received,
            last: &last,
            epoch,
        };
        let both = async {
            tokio::try_join!(
                forward(c_src, u_dst, (Side::Client, Side::Upstream), &up),
                forward(u_src, c_dst, (Side::Upstream, Side::Client), &down),
            )
        };
        settle(both, (&last, epoch, idle), stop).await
    };
    if !matches!(outcome, Outcome::Ok) {
        client.reset();
        upstream.reset();
    }
    (
        sent.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed),
        outcome,
    )
}
