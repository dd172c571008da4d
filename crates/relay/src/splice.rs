//! The Linux relay: splice(2) moves bytes socket -> pipe -> socket inside the kernel, and
//! the whole tunnel is one small hand-written future (two directions, an idle timer, the
//! shutdown signal) rather than a tree of async blocks, so an idle tunnel costs a few
//! hundred bytes of user memory. A direction holds a pipe only while a burst of bytes is
//! moving: it is made when bytes arrive and closed when the socket runs dry.

use std::future::Future;
use std::io;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::pin::pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use sandgate_audit::event::Outcome;

/// Pipe capacity asked for, and bytes asked of one splice call. Larger than the 64 KiB
/// default so a busy tunnel wakes the proxy less often; pages are only held while bytes
/// sit in the pipe, which is empty between bursts.
const CHUNK: usize = 1024 * 1024;

fn flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK
}

/// What failed.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Src,
    Dst,
    /// No pipe could be made (descriptor limit).
    Local,
}

/// Empty pipes kept per worker thread, so a short tunnel does not pay for pipe2 and
/// close on every burst. Bounded: beyond it, pipes are closed.
const POOL: usize = 64;

thread_local! {
    static PIPES: std::cell::RefCell<Vec<(OwnedFd, OwnedFd)>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn take_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    if let Some(pipe) = PIPES.with(|p| p.borrow_mut().pop()) {
        return Ok(pipe);
    }
    let pipe = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
    // Best effort: unprivileged users are capped by fs.pipe-max-size.
    let _ = fcntl(&pipe.1, FcntlArg::F_SETPIPE_SZ(CHUNK as i32));
    Ok(pipe)
}

/// Returns an empty pipe to this thread's pool (only ever called with nothing in it).
fn give_pipe(pipe: (OwnedFd, OwnedFd)) {
    PIPES.with(|p| {
        let mut pool = p.borrow_mut();
        if pool.len() < POOL {
            pool.push(pipe);
        }
    });
}

/// One direction of the tunnel.
#[derive(Debug)]
struct Direction {
    pipe: Option<(OwnedFd, OwnedFd)>,
    /// Bytes in the pipe not yet written to the destination (at most [`CHUNK`]; 32 bits,
    /// since every idle tunnel holds two of these).
    pending: u32,
    moved: u64,
    done: bool,
}

impl Direction {
    /// A direction that already moved `moved` bytes (before the relay took over).
    fn carried(moved: u64) -> Direction {
        Direction {
            pipe: None,
            pending: 0,
            moved,
            done: false,
        }
    }

    /// Moves what is available; `Ready(Ok)` at end of stream (after half-closing `dst`).
    /// Sets `*active` when any byte moved.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        src: &TcpStream,
        dst: &TcpStream,
        active: &mut bool,
    ) -> Poll<Result<(), (Fault, io::Error)>> {
        loop {
            if self.pending > 0 {
                let Some((pipe_r, _)) = &self.pipe else {
                    return Poll::Ready(Ok(()));
                };
                ready!(dst.poll_write_ready(cx)).map_err(|e| (Fault::Dst, e))?;
                match dst.try_io(Interest::WRITABLE, || {
                    splice(pipe_r, None, dst, None, self.pending as usize, flags()).map_err(io::Error::from)
                }) {
                    Ok(n) => {
                        self.pending = self.pending.saturating_sub(count(n));
                        *active = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err((Fault::Dst, e))),
                }
                continue;
            }
            ready!(src.poll_read_ready(cx)).map_err(|e| (Fault::Src, e))?;
            let pipe_w = match &self.pipe {
                Some((_, w)) => w,
                None => &self.pipe.insert(take_pipe().map_err(|e| (Fault::Local, e))?).1,
            };
            // The pipe is empty here, so EAGAIN means the socket has nothing to read.
            match src.try_io(Interest::READABLE, || {
                splice(src, None, pipe_w, None, CHUNK, flags()).map_err(io::Error::from)
            }) {
                Ok(0) => {
                    let _ = SockRef::from(dst).shutdown(Shutdown::Write);
                    self.done = true;
                    // The pipe is empty (nothing was pending): back to the pool. A tunnel
                    // usually ends this way, and closing its pipes cost a fifth of a short
                    // tunnel's CPU (pipe2, F_SETPIPE_SZ and close on every new tunnel).
                    if let Some(pipe) = self.pipe.take() {
                        give_pipe(pipe);
                    }
                    return Poll::Ready(Ok(()));
                }
                Ok(n) => {
                    self.pending = count(n);
                    self.moved += n as u64;
                    *active = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Drained and the pipe is empty: hand it back, so an idle tunnel holds
                    // only its sockets.
                    if let Some(pipe) = self.pipe.take() {
                        give_pipe(pipe);
                    }
                }
                Err(e) => return Poll::Ready(Err((Fault::Src, e))),
            }
        }
    }
}

impl Drop for Direction {
    /// A pipe left with bytes in it (the tunnel ended mid-burst) is closed with them; an
    /// empty one goes back to the pool.
    fn drop(&mut self) {
        if self.pending == 0
            && let Some(pipe) = self.pipe.take()
        {
            give_pipe(pipe);
        }
    }
}

/// A splice's count as a pipe's fill (a splice moves at most [`CHUNK`] bytes).
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn outcome(fault: Fault, src_is_client: bool) -> Outcome {
    match (fault, src_is_client) {
        (Fault::Src, true) | (Fault::Dst, false) => Outcome::ClientReset,
        (Fault::Src, false) | (Fault::Dst, true) => Outcome::UpstreamReset,
        (Fault::Local, _) => Outcome::OutOfDescriptors,
    }
}

/// Relays until both directions end, one fails, the tunnel idles out, or shutdown cuts it.
/// Returns bytes client-to-upstream, bytes upstream-to-client (counted on from `carried`),
/// and the outcome.
///
/// A plain function returning an `async` block (an `async fn` would hold its arguments
/// twice), whose one poll function owns both directions: every idle tunnel holds this.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice, in every idle tunnel"
)]
pub(super) fn relay<'a>(
    client: &'a TcpStream,
    upstream: &'a TcpStream,
    idle: Duration,
    hard_stop: &'a CancellationToken,
    carried: (u64, u64),
) -> impl Future<Output = (u64, u64, Outcome)> + Send + 'a {
    async move {
        let mut timer = pin!(tokio::time::sleep(idle));
        let mut stop = pin!(hard_stop.cancelled());
        let mut up = Direction::carried(carried.0);
        let mut down = Direction::carried(carried.1);
        // Borrowed, not copied into the poll function beside this block's own.
        let idle = &idle;
        std::future::poll_fn(move |cx| {
            let mut active = false;
            if !up.done
                && let Poll::Ready(Err((fault, _))) = up.poll(cx, client, upstream, &mut active)
            {
                return Poll::Ready((up.moved, down.moved, outcome(fault, true)));
            }
            if !down.done
                && let Poll::Ready(Err((fault, _))) = down.poll(cx, upstream, client, &mut active)
            {
                return Poll::Ready((up.moved, down.moved, outcome(fault, false)));
            }
            if up.done && down.done {
                return Poll::Ready((up.moved, down.moved, Outcome::Ok));
            }
            if stop.as_mut().poll(cx).is_ready() {
                return Poll::Ready((up.moved, down.moved, Outcome::Shutdown));
            }
            if active {
                timer.as_mut().reset(tokio::time::Instant::now() + *idle);
            }
            match timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready((up.moved, down.moved, Outcome::IdleTimeout)),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}
