//! The portable tunnel relay: two copy loops that hold a buffer only while data moves, an
//! idle watch, and the shutdown signal. Compiled on every platform (the Linux fast path is
//! `splice`); [`relay_streams`] relays any pair of streams (TLS ones included).

use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use socket2::SockRef;
use tokio::net::TcpStream;

use super::write_all;

use sandgate_audit::event::Outcome;

/// Read size while a tunnel moves data.
const TUNNEL_CHUNK: usize = 64 * 1024;

/// The portable relay for two TCP sockets: two copy loops, an idle watch and the shutdown
/// signal.
#[cfg_attr(
    all(target_os = "linux", not(test)),
    expect(
        dead_code,
        reason = "splice is the Linux relay; this one is kept compiled and tested"
    )
)]
pub(super) async fn copy_relay(
    stream: &TcpStream,
    upstream: &TcpStream,
    idle: Duration,
    hard_stop: &tokio_util::sync::CancellationToken,
) -> (u64, u64, Outcome) {
    let sent = AtomicU64::new(0);
    let received = AtomicU64::new(0);
    let last_activity = AtomicU64::new(0);
    let epoch = Instant::now();
    let both = async {
        tokio::try_join!(
            async {
                pump(stream, upstream, &sent, &last_activity, epoch)
                    .await
                    .map_err(|_| Side::Client)
            },
            async {
                pump(upstream, stream, &received, &last_activity, epoch)
                    .await
                    .map_err(|_| Side::Upstream)
            },
        )
    };
    let outcome = settle(both, (&last_activity, epoch, idle), hard_stop).await;
    (
        sent.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed),
        outcome,
    )
}

/// Runs both directions until they end, the tunnel idles out or `stop` cuts it.
pub(super) async fn settle<T>(
    both: impl Future<Output = Result<T, Side>>,
    (last_activity, epoch, idle): (&AtomicU64, Instant, Duration),
    stop: &tokio_util::sync::CancellationToken,
) -> Outcome {
    tokio::select! {
        r = both => match r {
            Ok(_) => Outcome::Ok,
            Err(Side::Client) => Outcome::ClientReset,
            Err(Side::Upstream) => Outcome::UpstreamReset,
        },
        _ = idle_watch(last_activity, epoch, idle) => Outcome::IdleTimeout,
        _ = stop.cancelled() => Outcome::Shutdown,
    }
}

/// Which side of a tunnel failed.
#[derive(Debug, Clone, Copy)]
pub(super) enum Side {
    Client,
    Upstream,
}

/// Progress counters shared by both directions of a tunnel.
pub(super) struct Meter<'a> {
    pub count: &'a AtomicU64,
    pub last: &'a AtomicU64,
    pub epoch: Instant,
}

impl Meter<'_> {
    pub(super) fn moved(&self, n: usize) {
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        self.last
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// Moves bytes from `src` to `dst` until EOF, then half-closes `dst`.
async fn pump(
    src: &TcpStream,
    dst: &TcpStream,
    count: &AtomicU64,
    last: &AtomicU64,
    epoch: Instant,
) -> io::Result<()> {
    let meter = Meter { count, last, epoch };
    copy_pump(src, dst, &meter).await
}

/// The portable relay: a buffer is allocated when data arrives and freed when the socket
/// runs dry.
async fn copy_pump(src: &TcpStream, dst: &TcpStream, meter: &Meter<'_>) -> io::Result<()> {
    loop {
        src.readable().await?;
        // Allocated only while data moves; freed as soon as the socket runs dry.
        let mut buf: Vec<u8> = Vec::with_capacity(TUNNEL_CHUNK);
        loop {
            buf.clear();
            match src.try_read_buf(&mut buf) {
                Ok(0) => {
                    let _ = SockRef::from(dst).shutdown(Shutdown::Write);
                    return Ok(());
                }
                Ok(n) => {
                    write_all(dst, &buf).await?;
                    meter.moved(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Completes once no byte has moved for `idle`.
async fn idle_watch(last: &AtomicU64, epoch: Instant, idle: Duration) {
    loop {
        let last_ms = last.load(Ordering::Relaxed);
        let due = epoch + Duration::from_millis(last_ms) + idle;
        tokio::time::sleep_until(due.into()).await;
        if last.load(Ordering::Relaxed) == last_ms {
            return;
        }
    }
}

/// Relays any two streams (a TLS stream, a multiplexed stream) until both directions end,
/// one fails, nothing moves for `idle`, or `stop` cuts it: each direction copies through a
/// buffer of its own and passes a clean EOF on as a shutdown of the other side's writes.
/// Returns bytes `a`-to-`b`, `b`-to-`a`, and the outcome (as [`super::tunnel`]'s, with `a`
/// the client).
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "the relay for any two streams; the node bridge has a pump of its own, which tells a socket closed outright from a half-close"
    )
)]
pub(crate) async fn relay_streams<A, B>(
    a: A,
    b: B,
    idle: Duration,
    stop: &tokio_util::sync::CancellationToken,
) -> (u64, u64, Outcome)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut a_read, mut a_write) = tokio::io::split(a);
    let (mut b_read, mut b_write) = tokio::io::split(b);
    let sent = AtomicU64::new(0);
    let received = AtomicU64::new(0);
    let last_activity = AtomicU64::new(0);
    let epoch = Instant::now();
    let both = async {
        tokio::try_join!(
            stream_pump(
                &mut a_read,
                &mut b_write,
                (Side::Client, Side::Upstream),
                &sent,
                &last_activity,
                epoch
            ),
            stream_pump(
                &mut b_read,
                &mut a_write,
                (Side::Upstream, Side::Client),
                &received,
                &last_activity,
                epoch
            ),
        )
    };
    let outcome = settle(both, (&last_activity, epoch, idle), stop).await;
    (
        sent.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed),
        outcome,
    )
}

/// One direction of [`relay_streams`]; a read error is the source's fault, a write error
/// the destination's (`sides` names them).
async fn stream_pump<R, W>(
    src: &mut R,
    dst: &mut W,
    sides: (Side, Side),
    count: &AtomicU64,
    last: &AtomicU64,
    epoch: Instant,
) -> Result<(), Side>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let meter = Meter { count, last, epoch };
    let mut buf = vec![0u8; TUNNEL_CHUNK];
    loop {
        let n = src.read(&mut buf).await.map_err(|_| sides.0)?;
        if n == 0 {
            let _ = dst.shutdown().await;
            return Ok(());
        }
        dst.write_all(buf.get(..n).unwrap_or_default())
            .await
            .map_err(|_| sides.1)?;
        // A TLS stream may hold written bytes until flushed (sandgate-proxy's node/bridge.rs).
        dst.flush().await.map_err(|_| sides.1)?;
        meter.moved(n);
    }
}
