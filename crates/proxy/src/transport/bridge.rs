//! The bridge between an HTTP/1.1-transport connection (`--upstream-transport http1`, a TLS
//! connection per tunnel, upgraded by hyper) and the egress core, which relays sockets and
//! HTTP/2 streams: a connected pair of local stream sockets, one end for the core, the other
//! pumped to and from the connection here. A clean end of either side is passed on as a
//! half-close; the pump resets the connection when the core's end is closed outright, and
//! the connection's failure ends the core's relay (a socket pair can only show it a clean
//! end).

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, Interest};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Bytes read at once in either direction.
const PUMP_CHUNK: usize = 64 * 1024;

/// A connected pair: the core's end (a stream socket the core drives like an accepted TCP
/// connection: reads, writes, shutdown and splice all work on it) and the pump's end.
pub(crate) fn pair() -> io::Result<(TcpStream, UnixStream)> {
    let (core, pump) = std::os::unix::net::UnixStream::pair()?;
    pump.set_nonblocking(true)?;
    Ok((as_socket(core)?, UnixStream::from_std(pump)?))
}

/// A local stream socket as one the core drives like an accepted TCP connection: reads,
/// writes, shutdown and splice(2) all work on AF_UNIX stream sockets as on TCP ones; only
/// socket options would differ, and none are set on a bridge.
fn as_socket(s: std::os::unix::net::UnixStream) -> io::Result<TcpStream> {
    s.set_nonblocking(true)?;
    TcpStream::from_std(std::net::TcpStream::from(OwnedFd::from(s)))
}

/// How often a pump waiting on the connection looks whether the core has hung up.
const HANGUP_PROBE: Duration = Duration::from_secs(1);

/// Whether the core has closed its end outright (not a half-close): a hang-up shows on the
/// writing side too.
async fn core_hung_up(core: &UnixStream) -> bool {
    let ready = tokio::time::timeout(Duration::ZERO, core.ready(Interest::WRITABLE)).await;
    matches!(ready, Ok(Ok(r)) if r.is_write_closed())
}

/// The pump's writes toward the connection: each may wait `stall` for progress, and while
/// they wait the core's end is looked at every [`HANGUP_PROBE`] (across writes: a peer
/// taking a byte at a time makes many short ones). Once the core has hung up (the tunnel is
/// over on its side) everything left must go within one more `stall` in all: a peer that
/// takes a byte now and then would otherwise keep the pump draining for hours after the
/// tunnel ended (review finding).
struct Toward {
    stall: Duration,
    next_probe: Instant,
    /// Set once the core has hung up.
    last_call: Option<Instant>,
}

impl Toward {
    fn new(stall: Duration) -> Toward {
        Toward {
            stall,
            next_probe: Instant::now() + HANGUP_PROBE,
            last_call: None,
        }
    }

    /// Runs `op` (a write, a flush, the close) under those limits.
    async fn run<T>(
        &mut self,
        op: impl std::future::Future<Output = io::Result<T>>,
        core: &UnixStream,
    ) -> Result<T, Gone> {
        let limit = self
            .last_call
            .map_or(self.stall, |at| at.saturating_duration_since(Instant::now()));
        let op = tokio::time::timeout(limit, op);
        tokio::pin!(op);
        loop {
            tokio::select! {
                done = &mut op => return done.ok().and_then(Result::ok).ok_or(Gone::Stream),
                () = tokio::time::sleep_until(self.next_probe), if self.last_call.is_none() => {
                    self.next_probe = Instant::now() + HANGUP_PROBE;
                    if core_hung_up(core).await {
                        self.last_call = Some(Instant::now() + self.stall);
                    }
                }
            }
        }
    }
}

/// Why a pump ended early.
enum Gone {
    /// The stream failed (reset, or its connection lost).
    Stream,
    /// The core closed its end outright (the tunnel ended: a reset client, the idle timer, a
    /// cut), which is not a half-close.
    Core,
}

/// Moves bytes between `stream` and the core's socket until both directions end or either
/// side fails. A clean end of either is passed on as a half-close; the core closing its end
/// outright resets the stream (dropped unfinished: RST_STREAM CANCEL), and the stream
/// failing (its connection lost) cancels `reset`, so the core's relay ends at once: a
/// socket pair can only show it a clean end, which it would take for a half-close. (hyper
/// reads a CANCEL from the peer as a clean end of the stream, so a node's reset reaches
/// the central as a half-close: that tunnel then ends when its origin closes, or idles out.)
///
/// Each write to the connection is flushed before the next read from the core: a TLS
/// stream takes bytes it cannot yet put on the wire into its own buffer and says they are
/// written, and nothing else would send them once the core has no more to say (a client
/// that sent its last bytes and waits for an answer would wait for ever).
///
/// A write (or the close) the connection takes no byte of for `stall` (the tunnel idle
/// timeout) fails the stream, and so does a connection silent for `stall` after the core's
/// side has ended: a peer that stops reading but keeps its socket open would otherwise hold
/// the pump in that write for as long as TCP keeps probing its zero window, and a pump
/// blocked in a write or waiting to read cannot see the core close its end. Once the core
/// has closed its end outright, what the pump still holds must reach the connection within
/// one more `stall` (a peer taking a byte now and then cannot stretch it). On a central
/// the failure resets the core's relay (`reset`); on a node the pump's end closes, and the
/// relay sees the stream end.
pub(crate) async fn pump<S>(stream: S, pump: UnixStream, reset: Option<CancellationToken>, stall: Duration)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut s_read, mut s_write) = tokio::io::split(stream);
    let (mut p_read, mut p_write) = pump.into_split();
    // Cancelled once the core has said all it will (its clean end passed on).
    let core_done = CancellationToken::new();
    let to_stream = async {
        let mut buf = vec![0u8; PUMP_CHUNK];
        let mut toward = Toward::new(stall);
        loop {
            let n = p_read.read(&mut buf).await.map_err(|_| Gone::Core)?;
            if n == 0 {
                if core_hung_up(p_read.as_ref()).await {
                    return Err(Gone::Core);
                }
                // The close (TLS close_notify) must be taken too.
                toward.run(s_write.shutdown(), p_read.as_ref()).await?;
                core_done.cancel();
                return Ok(());
            }
            // Each write that moves a byte restarts the stall timer.
            let mut rest = buf.get(..n).unwrap_or_default();
            while !rest.is_empty() {
                match toward.run(s_write.write(rest), p_read.as_ref()).await? {
                    0 => return Err(Gone::Stream),
                    k => rest = rest.get(k..).unwrap_or_default(),
                }
            }
            toward.run(s_write.flush(), p_read.as_ref()).await?;
        }
    };
    let to_core = async {
        let mut buf = vec![0u8; PUMP_CHUNK];
        // Once the core's side has ended, this direction is the tunnel's only traffic: a
        // stream silent for the stall time then ends it (the core's relay has idled out
        // and closed its end by then, which a pump waiting to read cannot see).
        let silent = || async {
            core_done.cancelled().await;
            tokio::time::sleep(stall).await;
        };
        loop {
            let n = tokio::select! {
                read = s_read.read(&mut buf) => read.map_err(|_| Gone::Stream)?,
                () = silent() => return Err(Gone::Stream),
            };
            if n == 0 {
                let _ = p_write.shutdown().await;
                return Ok(());
            }
            p_write
                .write_all(buf.get(..n).unwrap_or_default())
                .await
                .map_err(|_| Gone::Core)?;
        }
    };
    if let Err(Gone::Stream) = tokio::try_join!(to_stream, to_core)
        && let Some(reset) = reset
    {
        reset.cancel();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};

    use super::*;

    /// A pump between a new socket pair and `conn`, with a reset token and `stall`: the
    /// core's end, the pump's task and the token.
    fn hostile(
        conn: tokio::io::DuplexStream,
        stall: Duration,
    ) -> (TcpStream, tokio::task::JoinHandle<()>, CancellationToken) {
        let (core, pump_end) = pair().expect("a socket pair");
        let reset = CancellationToken::new();
        let task = tokio::spawn(pump(conn, pump_end, Some(reset.clone()), stall));
        (core, task, reset)
    }

    /// The pump ends within 10 s, having told the core's relay the stream failed.
    async fn ends_and_resets(task: tokio::task::JoinHandle<()>, reset: &CancellationToken) {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the pump ended within 10 s")
            .expect("the pump did not panic");
        assert!(
            reset.is_cancelled(),
            "the core's relay was told the stream failed"
        );
    }

    /// A connection that keeps what it is given until flushed (as a TLS stream keeps the
    /// records its socket has no room for) still gets the core's last bytes: a client that
    /// sent them and waits for an answer must not wait for ever. Fails on the pump before it
    /// flushed (the stall the central benchmark hit over the HTTP/1.1 transport).
    #[tokio::test]
    async fn the_last_bytes_reach_a_connection_that_holds_writes_until_flushed() {
        let (core, pump_end) = pair().expect("a socket pair");
        let (conn, mut peer) = tokio::io::duplex(1 << 20);
        let task = tokio::spawn(pump(
            BufWriter::with_capacity(64 * 1024, conn),
            pump_end,
            None,
            Duration::from_secs(60),
        ));
        let mut core = core;
        core.write_all(b"the last request").await.expect("write");
        let mut got = [0u8; 16];
        tokio::time::timeout(Duration::from_secs(5), peer.read_exact(&mut got))
            .await
            .expect("the bytes reached the connection within 5 s")
            .expect("read");
        assert_eq!(&got, b"the last request");
        drop(core);
        drop(peer);
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }

    /// Attack: the far side of the connection stops reading but keeps its socket open, and
    /// the core closes its end. The pump, blocked writing to the connection, used to live
    /// (with its socket pair and the connection) for as long as TCP kept probing the zero
    /// window; it now fails the stream after the stall time and resets the core's relay.
    #[tokio::test]
    async fn a_peer_that_stops_reading_does_not_hold_the_pump_for_ever() {
        // The peer's end is kept and never read: 1 KiB fits, then writes block.
        let (conn, _peer) = tokio::io::duplex(1024);
        let (mut core, task, reset) = hostile(conn, Duration::from_millis(300));
        core.write_all(&[7u8; 16 * 1024]).await.expect("write");
        drop(core);
        ends_and_resets(task, &reset).await;
    }

    /// Attack (review finding): the core's side ends cleanly (the origin closed), then the
    /// far side of the connection goes silent without closing (a paused or hostile node),
    /// and the core's relay idles out and closes its end. The pump, waiting to read from the
    /// connection, used to live on with its sockets and the connection's slot; it now ends
    /// after the stall time, and resets the core's relay.
    #[tokio::test]
    async fn a_silent_peer_after_the_cores_clean_end_does_not_hold_the_pump_for_ever() {
        let (conn, mut peer) = tokio::io::duplex(64 * 1024);
        let (mut core, task, reset) = hostile(conn, Duration::from_millis(300));
        core.write_all(b"last words").await.expect("write");
        core.shutdown().await.expect("half-close");
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), peer.read_to_end(&mut got))
            .await
            .expect("the clean end reached the peer")
            .expect("read");
        assert_eq!(got, b"last words");
        drop(core);
        ends_and_resets(task, &reset).await;
        drop(peer);
    }

    /// Attack (review finding): the far side takes a few bytes now and then, each just
    /// inside the stall time, while the core's relay has long ended and closed its end.
    /// Each byte used to restart the timer, so the pump drained what it held at the peer's
    /// pace (here, 64 KiB at 160 bytes a second: over six minutes); once the core has hung
    /// up, what is left now gets one more stall in all.
    #[tokio::test]
    async fn a_trickling_peer_does_not_stretch_the_drain_after_the_core_is_gone() {
        let (conn, mut peer) = tokio::io::duplex(1024);
        let (mut core, task, reset) = hostile(conn, Duration::from_millis(600));
        let trickle = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            for _ in 0..6000 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if peer.read(&mut buf).await.map_or(true, |n| n == 0) {
                    break;
                }
            }
        });
        core.write_all(&[7u8; 64 * 1024]).await.expect("write");
        drop(core);
        ends_and_resets(task, &reset).await;
        trickle.abort();
    }
}
