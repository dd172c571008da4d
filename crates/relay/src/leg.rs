//! One end of a tunnel: a TCP socket, or a stream of an HTTP/2 connection between a node
//! and a central proxy (RFC 9113 section 8.5). The core reads a tunnel's first bytes and
//! relays it through a [`Leg`] whichever it is; two sockets are relayed with splice(2),
//! anything else by [`relay`] (`leg/frames.rs`), which passes an HTTP/2 stream's frames
//! through as they come (no socket pair, no second copy), keeps HTTP/2 flow control honest
//! (a stream's window is given back only once its bytes are written on), and tells a
//! stream's reset (RST_STREAM) from its clean end. Here are the ends themselves and their
//! byte I/O: [`NodeStream`], [`Upstream`] (what the core owns) and [`Leg`] (what it drives).

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

mod frames;

pub(crate) use frames::relay;

/// How long a stream given up cleanly waits for its peer's end before it is reset.
const LINGER: Duration = Duration::from_secs(10);

/// An HTTP/2 stream carrying a tunnel: the two halves, and bytes taken from the receiving
/// half (their window already given back) that nothing has read yet.
#[derive(Debug)]
pub struct NodeStream {
    send: SendStream<Bytes>,
    recv: RecvStream,
    pending: Bytes,
    /// The peer ended its half (END_STREAM).
    ended: bool,
    /// This side ended its half.
    finished: bool,
    /// The stream's place on its connection, given back when it ends.
    _slot: Option<StreamSlot>,
}

/// A stream's place among a connection's streams: counted while it is held.
#[derive(Debug)]
pub struct StreamSlot(pub Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl NodeStream {
    pub fn new(send: SendStream<Bytes>, recv: RecvStream, slot: Option<StreamSlot>) -> NodeStream {
        NodeStream {
            send,
            recv,
            pending: Bytes::new(),
            ended: false,
            finished: false,
            _slot: slot,
        }
    }

    /// Ends the stream abruptly (RST_STREAM CANCEL): the peer sees a reset, not an end.
    pub fn reset(&mut self) {
        self.send.send_reset(h2::Reason::CANCEL);
    }

    /// Ends the stream cleanly when it is no longer wanted (a kept connection given up):
    /// END_STREAM, then the peer's remaining bytes are read and dropped until it ends its
    /// half too, for at most [`LINGER`]. Dropping a stream resets it, which its peer records
    /// as the client's reset.
    pub async fn linger(mut self) {
        if !self.finished {
            let _ = self.send.send_data(Bytes::new(), true);
        }
        if self.ended {
            return;
        }
        let drain = async {
            while let Some(Ok(data)) = self.recv.data().await {
                let _ = self.recv.flow_control().release_capacity(data.len());
            }
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
    }
}

/// A stream as a byte stream, for code that reads and writes an upstream connection itself
/// (the HTTP/1 forwarder): a reset is an error, not an end, and a write waits for the
/// peer's window.
impl AsyncRead for NodeStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let s = &mut *self;
        while s.pending.is_empty() && !s.ended {
            match s.recv.poll_data(cx) {
                Poll::Ready(Some(Ok(data))) => {
                    let _ = s.recv.flow_control().release_capacity(data.len());
                    s.pending = data;
                }
                Poll::Ready(None) => s.ended = true,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(stream_error(e))),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = buf.remaining().min(s.pending.len());
        buf.put_slice(&s.pending.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for NodeStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let send = &mut self.send;
        send.reserve_capacity(buf.len());
        // h2 0.4.15 and later never report a capacity of 0 (h2 issue 270). Were one
        // reported, the report is consumed: the next poll registers this task and waits.
        match send.poll_capacity(cx) {
            Poll::Ready(Some(Ok(0))) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(Some(Ok(n))) => {
                let n = n.min(buf.len());
                let data = Bytes::copy_from_slice(buf.get(..n).unwrap_or_default());
                Poll::Ready(send.send_data(data, false).map(|()| n).map_err(stream_error))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Err(stream_error(e))),
            Poll::Ready(None) => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// END_STREAM: the clean end of this side.
    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.finished {
            return Poll::Ready(Ok(()));
        }
        self.finished = true;
        Poll::Ready(self.send.send_data(Bytes::new(), true).map_err(stream_error))
    }
}

impl NodeStream {
    /// Whether a kept stream can carry another request: the peer has neither ended it,
    /// reset it, nor sent anything unasked.
    pub fn is_idle(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        self.pending.is_empty()
            && !self.ended
            && matches!(self.recv.poll_data(&mut cx), Poll::Pending)
            && matches!(self.send.poll_reset(&mut cx), Poll::Pending)
    }
}

/// An upstream connection the core owns: a socket, or a stream to a central proxy.
#[derive(Debug)]
pub enum Upstream {
    Tcp(TcpStream),
    Stream(Box<NodeStream>),
}

impl Upstream {
    pub fn leg(&mut self) -> Leg<'_> {
        match self {
            Upstream::Tcp(s) => Leg::Tcp(s),
            Upstream::Stream(s) => Leg::Stream(s),
        }
    }

    /// Whether a kept connection can carry another request: the peer has neither closed
    /// it nor sent anything unasked.
    pub fn is_idle(&mut self) -> bool {
        match self {
            Upstream::Tcp(s) => {
                let mut probe = [0u8; 1];
                matches!(s.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            Upstream::Stream(s) => s.is_idle(),
        }
    }

    /// Gives the connection up cleanly: a socket is closed, a stream ended
    /// ([`NodeStream::linger`], in a task of its own).
    pub fn close(self) {
        if let Upstream::Stream(s) = self
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(s.linger());
        }
    }
}

impl AsyncRead for Upstream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Upstream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Upstream::Stream(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Upstream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Upstream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Upstream::Stream(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Upstream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Upstream::Stream(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Upstream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Upstream::Stream(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// A tunnel's end as the core drives it (borrowed: the front end or the core owns it).
#[derive(Debug)]
pub enum Leg<'a> {
    Tcp(&'a TcpStream),
    Stream(&'a mut NodeStream),
}

impl Leg<'_> {
    /// Waits until a read would not block (data, an end, or an error to report).
    pub async fn readable(&mut self) -> io::Result<()> {
        poll_fn(|cx| self.poll_readable(cx)).await
    }

    /// Ready when a read would not block (data, an end, or an error to report). A socket's
    /// readiness is awaited in the socket's own registration, a stream's data taken into
    /// its pending bytes: nothing is held per wait (issue 32: a tunnel waiting for its first
    /// bytes costs what an idle one does).
    pub fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Leg::Tcp(s) => s.poll_read_ready(cx),
            Leg::Stream(s) => {
                while s.pending.is_empty() && !s.ended {
                    match s.recv.poll_data(cx) {
                        Poll::Ready(Some(Ok(data))) => {
                            let _ = s.recv.flow_control().release_capacity(data.len());
                            s.pending = data;
                        }
                        Poll::Ready(None) => s.ended = true,
                        Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(stream_error(e))),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Poll::Ready(Ok(()))
            }
        }
    }

    /// Reads what is there without waiting: `Ok(0)` at the end, `WouldBlock` when nothing is.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Leg::Tcp(s) => s.try_read(buf),
            Leg::Stream(s) if !s.pending.is_empty() => {
                let n = buf.len().min(s.pending.len());
                let taken = s.pending.split_to(n);
                if let Some(dst) = buf.get_mut(..n) {
                    dst.copy_from_slice(&taken);
                }
                Ok(n)
            }
            Leg::Stream(s) if s.ended => Ok(0),
            Leg::Stream(_) => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Writes all of `data`.
    pub async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Leg::Tcp(s) => super::write_all(s, data).await,
            Leg::Stream(s) => send(&mut s.send, Bytes::copy_from_slice(data)).await,
        }
    }
}

impl<'s> Leg<'s> {
    /// The socket, where this end is one, borrowed for as long as the end borrows it (not
    /// only while the end is looked at).
    pub(crate) fn tcp(&self) -> Option<&'s TcpStream> {
        match self {
            Leg::Tcp(s) => Some(*s),
            Leg::Stream(_) => None,
        }
    }
}

/// A stream's failure as an I/O error: a reset (whatever its reason) or a lost connection.
fn stream_error(e: h2::Error) -> io::Error {
    if e.is_io() {
        e.into_io()
            .unwrap_or_else(|| io::ErrorKind::ConnectionReset.into())
    } else {
        io::Error::new(io::ErrorKind::ConnectionReset, e)
    }
}

/// Sends `data` as the peer's window allows (waiting for it: a reader that stops holds
/// this stream back, no other).
async fn send(send: &mut SendStream<Bytes>, mut data: Bytes) -> io::Result<()> {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let room = match poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(n)) => n,
            Some(Err(e)) => return Err(stream_error(e)),
            None => return Err(io::ErrorKind::BrokenPipe.into()),
        };
        if room == 0 {
            continue;
        }
        let chunk = data.split_to(room.min(data.len()));
        send.send_data(chunk, false).map_err(stream_error)?;
    }
    Ok(())
}
