//! CONNECT tunnels (RFC 9110 section 9.3.6): decide, vet, dial, answer 200, then relay
//! bytes both ways without looking at them (TLS is never terminated).
//!
//! On Linux each direction moves bytes with splice(2), socket to pipe to socket, so payload
//! never enters user space, and the tunnel is one small hand-written future. Elsewhere a
//! portable copy relay (compiled only there) borrows a buffer only while data moves.
//! Either way an idle tunnel holds no user-space buffer. A clean EOF in one direction is
//! passed on as a half-close and the other direction carries on; an error in either ends the
//! tunnel, and only that tunnel.

use std::borrow::Cow;
use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use sandgate_policy::{Access, Target, Verdict, parse_connect_target};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::audit::EventKind;
use crate::forward::{refuse, vet_and_dial};
use crate::head::RequestHead;
use crate::respond::Refusal;
use crate::server::{ClientConn, Shared, event};

/// Handles a CONNECT request; the client connection ends with it.
pub(crate) async fn handle_connect(shared: &Shared, mut client: ClientConn, head: RequestHead) {
    let started = Instant::now();
    let request_id = shared.ids.next();
    // Boxed and finished before the relay starts, so a long-lived tunnel carries none of
    // the set-up state (the head, the decision, the vetted addresses).
    let established = Box::pin(establish(shared, &mut client, &head.target, &request_id)).await;
    drop(head);
    let Some((target, upstream, addr)) = established else {
        return;
    };
    let peer = client.peer;
    let identity = client.identity.clone();
    let (sent, received, outcome) = relay(shared, client, upstream).await;
    let mut close = event(EventKind::Close, &request_id, peer, &identity);
    close.method = Some("CONNECT".to_owned());
    close.scheme = Some("connect");
    close.destination_host = Some(target.host.to_string());
    close.destination_port = Some(target.port);
    close.resolved_ip = Some(addr.ip());
    close.status = Some(200);
    close.bytes_sent = Some(sent);
    close.bytes_received = Some(received);
    close.duration_ms = Some(started.elapsed().as_millis() as u64);
    close.outcome = Some(outcome);
    shared.audit.record(close).await;
}

/// Parses, decides, vets and dials; answers and audits every refusal itself. Returns the
/// target and the upstream connection when the tunnel may open.
async fn establish(
    shared: &Shared,
    client: &mut ClientConn,
    raw_target: &str,
    request_id: &str,
) -> Option<(Target, TcpStream, SocketAddr)> {
    let request_id = request_id.to_owned();
    let target = match parse_connect_target(raw_target) {
        Ok(t) => t,
        Err(e) => {
            refuse(
                shared,
                client,
                None,
                Refusal::Target(e),
                "CONNECT",
                Some(request_id),
            )
            .await;
            return None;
        }
    };
    let dest = (&target.host, target.port, Access::Connect);
    let decision = shared.rules().decide(
        &target,
        Access::Connect,
        &crate::server::context(&client.identity),
    );
    if decision.verdict == Verdict::Deny {
        let refusal = Refusal::Policy {
            target: target.clone(),
            reason: decision.reason,
        };
        refuse(shared, client, Some(dest), refusal, "CONNECT", Some(request_id)).await;
        return None;
    }
    let (upstream, addr) = vet_and_dial(
        shared,
        client,
        &target,
        Access::Connect,
        "CONNECT",
        &request_id,
        decision.rule_label(),
    )
    .await?;
    Some((target, upstream, addr))
}

/// Answers 200, forwards bytes the client sent early, then tunnels until both sides are done.
async fn relay(shared: &Shared, client: ClientConn, upstream: TcpStream) -> (u64, u64, Cow<'static, str>) {
    let ClientConn { mut stream, buf, .. } = client;
    if stream
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .is_err()
    {
        return (0, 0, Cow::Borrowed("client_failure"));
    }
    // A client may pipeline its first bytes (a TLS ClientHello) behind the CONNECT head.
    let early = buf.len() as u64;
    if early > 0 && write_all(&upstream, &buf).await.is_err() {
        return (0, 0, Cow::Borrowed("upstream_failure:closed"));
    }
    drop(buf);
    let idle = shared.limits.tunnel_idle_timeout;
    #[cfg(target_os = "linux")]
    {
        let (sent, received, outcome) = splice::relay(&stream, &upstream, idle, &shared.hard_stop).await;
        (early + sent, received, Cow::Borrowed(outcome))
    }
    #[cfg(not(target_os = "linux"))]
    {
        copy::copy_relay(&stream, &upstream, early, idle, &shared.hard_stop).await
    }
}

async fn write_all(dst: &TcpStream, mut data: &[u8]) -> io::Result<()> {
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

/// The portable relay, for platforms without splice(2): two copy loops that hold a buffer
/// only while data moves, an idle watch, and the shutdown signal.
#[cfg(not(target_os = "linux"))]
mod copy {
    use std::borrow::Cow;
    use std::io;
    use std::net::Shutdown;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use socket2::SockRef;
    use tokio::net::TcpStream;

    use super::write_all;

    /// Read size while a tunnel moves data.
    const TUNNEL_CHUNK: usize = 64 * 1024;

    /// The portable relay: two copy loops, an idle watch and the shutdown signal.
    pub(super) async fn copy_relay(
        stream: &TcpStream,
        upstream: &TcpStream,
        early: u64,
        idle: Duration,
        hard_stop: &tokio_util::sync::CancellationToken,
    ) -> (u64, u64, Cow<'static, str>) {
        let sent = AtomicU64::new(early);
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
        let outcome: &'static str = tokio::select! {
            r = both => match r {
                Ok(_) => "ok",
                Err(Side::Client) => "client_reset",
                Err(Side::Upstream) => "upstream_reset",
            },
            _ = idle_watch(&last_activity, epoch, idle) => "idle_timeout",
            _ = hard_stop.cancelled() => "shutdown",
        };
        (
            sent.load(Ordering::Relaxed),
            received.load(Ordering::Relaxed),
            Cow::Borrowed(outcome),
        )
    }

    /// Which side of a tunnel failed.
    #[derive(Debug, Clone, Copy)]
    enum Side {
        Client,
        Upstream,
    }

    /// Progress counters shared by both directions of a tunnel.
    struct Meter<'a> {
        count: &'a AtomicU64,
        last: &'a AtomicU64,
        epoch: Instant,
    }

    impl Meter<'_> {
        fn moved(&self, n: usize) {
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
}

#[cfg(target_os = "linux")]
mod splice {
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
    #[derive(Debug, Default)]
    struct Direction {
        pipe: Option<(OwnedFd, OwnedFd)>,
        /// Bytes in the pipe not yet written to the destination.
        pending: usize,
        moved: u64,
        done: bool,
    }

    impl Direction {
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
                        splice(pipe_r, None, dst, None, self.pending, flags()).map_err(io::Error::from)
                    }) {
                        Ok(n) => {
                            self.pending = self.pending.saturating_sub(n);
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
                        return Poll::Ready(Ok(()));
                    }
                    Ok(n) => {
                        self.pending = n;
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

    fn outcome(fault: Fault, src_is_client: bool) -> &'static str {
        match (fault, src_is_client) {
            (Fault::Src, true) | (Fault::Dst, false) => "client_reset",
            (Fault::Src, false) | (Fault::Dst, true) => "upstream_reset",
            (Fault::Local, _) => "proxy_out_of_descriptors",
        }
    }

    /// Relays until both directions end, one fails, the tunnel idles out, or shutdown cuts it.
    /// Returns bytes client-to-upstream, bytes upstream-to-client, and the outcome.
    pub(super) async fn relay(
        client: &TcpStream,
        upstream: &TcpStream,
        idle: Duration,
        hard_stop: &CancellationToken,
    ) -> (u64, u64, &'static str) {
        let mut up = Direction::default();
        let mut down = Direction::default();
        let mut timer = pin!(tokio::time::sleep(idle));
        let mut stop = pin!(hard_stop.cancelled());
        let outcome = std::future::poll_fn(|cx| {
            let mut active = false;
            if !up.done
                && let Poll::Ready(Err((fault, _))) = up.poll(cx, client, upstream, &mut active)
            {
                return Poll::Ready(outcome(fault, true));
            }
            if !down.done
                && let Poll::Ready(Err((fault, _))) = down.poll(cx, upstream, client, &mut active)
            {
                return Poll::Ready(outcome(fault, false));
            }
            if up.done && down.done {
                return Poll::Ready("ok");
            }
            if stop.as_mut().poll(cx).is_ready() {
                return Poll::Ready("shutdown");
            }
            if active {
                timer.as_mut().reset(tokio::time::Instant::now() + idle);
            }
            match timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready("idle_timeout"),
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        (up.moved, down.moved, outcome)
    }
}
