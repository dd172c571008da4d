//! The bodies of an intercepted tunnel: a counting body that sends its exchange's close
//! when it ends, and the client's socket with the bytes it sent behind its CONNECT first.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::audit::event::Outcome;
use crate::egress::{End, Grant};

/// The close an exchange owes once its response body ends.
pub(super) struct Done {
    pub(super) grant: Grant,
    pub(super) sent: Arc<AtomicU64>,
    pub(super) status: u16,
    pub(super) closes: mpsc::UnboundedSender<(Grant, End)>,
}

/// A body that counts its bytes and, for a response, sends its exchange's close when it
/// ends (whole, failed, or dropped unfinished).
pub(super) struct Counted<B> {
    pub(super) inner: B,
    pub(super) bytes: Arc<AtomicU64>,
    pub(super) done: Option<Done>,
}

impl<B> Counted<B> {
    pub(super) fn finish(&mut self, outcome: Outcome) {
        if let Some(done) = self.done.take() {
            let end = End {
                sent: done.sent.load(Ordering::Relaxed),
                received: self.bytes.load(Ordering::Relaxed),
                status: Some(done.status),
                outcome,
            };
            // The tunnel records it; gone, the grant records its own close as it drops.
            let _ = done.closes.send((done.grant, end));
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                // A body of known length is not polled past its last byte.
                if self.inner.is_end_stream() {
                    self.finish(Outcome::Ok);
                }
            }
            Poll::Ready(None) => self.finish(Outcome::Ok),
            Poll::Ready(Some(Err(_))) => self.finish(Outcome::UpstreamReset),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        // Dropped unfinished: the client went away (or the tunnel was cut) mid-body.
        self.finish(Outcome::ClientReset);
    }
}

/// The client's socket with the bytes it sent behind its CONNECT read first.
pub(super) struct Prefixed {
    pub(super) early: Vec<u8>,
    pub(super) at: usize,
    pub(super) inner: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = buf.remaining();
        if let Some(rest) = self.early.get(self.at..).filter(|r| !r.is_empty()) {
            let chunk = rest.get(..n).unwrap_or(rest);
            buf.put_slice(chunk);
            self.at += chunk.len();
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
