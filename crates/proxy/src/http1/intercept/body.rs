//! The bodies of an intercepted tunnel: a counting body that sends its exchange's close
//! when it ends (and hands its upstream connection back), a request body without its
//! trailers, a request body searched for placeholders bound elsewhere, the client's
//! socket with the bytes it sent behind its CONNECT first, its TLS side watched for the
//! idle timeout, and a refused request's body read and dropped (bounded) so its client reads
//! the refusal.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::upstreams::Lease;
use crate::audit::event::Outcome;
use crate::egress::{End, Grant};

/// The close an exchange owes once its response body ends.
pub(super) struct Done {
    pub(super) grant: Grant,
    pub(super) sent: Arc<AtomicU64>,
    pub(super) status: u16,
    pub(super) closes: mpsc::UnboundedSender<(Grant, End)>,
    /// Where the request body's search left a leak it found after the response began.
    pub(super) leaked: Arc<std::sync::Mutex<Option<sandgate_policy::Leak>>>,
    /// The upstream connection the exchange used: handed back for the tunnel's next
    /// requests once the response was read whole, closed otherwise.
    pub(super) lease: Option<Lease>,
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
        if let Some(mut done) = self.done.take() {
            // The request's body was cut on a placeholder while the response streamed.
            let leaked = done.leaked.lock().is_ok_and(|l| l.is_some());
            let outcome = if leaked { Outcome::CredentialLeak } else { outcome };
            if let Some(lease) = done.lease.take()
                && outcome == Outcome::Ok
            {
                lease.release();
            }
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

/// A request body searched for placeholders bound to other hosts as it streams
/// ([`sandgate_policy::BodyScan`]): the chunk that completes one is not passed on; the body
/// fails instead, and the leak waits in `found` for the exchange to record.
pub(super) struct Scanned<B> {
    pub(super) inner: B,
    pub(super) scan: sandgate_policy::BodyScan,
    pub(super) found: Arc<std::sync::Mutex<Option<sandgate_policy::Leak>>>,
}

impl<B> Body for Scanned<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let Poll::Ready(Some(Ok(frame))) = polled else {
            return polled.map(|f| f.map(|r| r.map_err(Into::into)));
        };
        if let Some(data) = frame.data_ref()
            && let Err(leak) = self.scan.feed(data)
        {
            let text = leak.to_string();
            if let Ok(mut slot) = self.found.lock() {
                *slot = Some(leak);
            }
            return Poll::Ready(Some(Err(text.into())));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body without its trailers: a trailer section the client sends (HTTP/2, or
/// HTTP/1.1 chunked) is read and dropped, never forwarded, so no field the placeholder
/// check and the rules never saw (a placeholder in a trailer) reaches the origin.
pub(super) struct Untrailed<B> {
    pub(super) inner: B,
}

impl<B: Body<Data = Bytes> + Unpin> Body for Untrailed<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        // Trailers are a body's last frame; a body that sent more after them is polled on,
        // each trailer frame dropped, until it ends or waits.
        loop {
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => {}
                polled => return polled,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The error of a request body on its way upstream.
pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

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

/// The client's side of an intercepted tunnel, noting when bytes last moved either way (in
/// milliseconds since `since`), so the tunnel ends after the idle timeout as a blind one does.
pub(super) struct Watched<S> {
    pub(super) inner: S,
    pub(super) since: tokio::time::Instant,
    pub(super) last: Arc<AtomicU64>,
}

impl<S> Watched<S> {
    fn moved(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.moved();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What of a refused request's body is read and dropped, at most, so the client finishes
/// its upload and reads the refusal: over HTTP/2 a stream reset while the client still
/// sends is, to curl, a framing error in place of the 403 (git: "RPC failed; curl 92"); over
/// HTTP/1.1 the connection stays usable. Past it (or the head timeout) the rest is refused
/// the usual way: the stream reset, the connection closed.
const DISCARD: u64 = 1024 * 1024;

/// `response`, a refusal written before `req`'s body was read: that body is read and dropped
/// in a task of its own (at most [`DISCARD`] bytes, for at most `within`), never sent.
pub(super) fn discarding(
    req: hyper::Request<hyper::body::Incoming>,
    response: hyper::Response<super::ResBody>,
    within: std::time::Duration,
) -> hyper::Response<super::ResBody> {
    let mut body = req.into_body();
    if body.is_end_stream() {
        return response;
    }
    tokio::spawn(async move {
        let drain = async {
            let mut read = 0u64;
            while read < DISCARD {
                match http_body_util::BodyExt::frame(&mut body).await {
                    Some(Ok(frame)) => {
                        read += frame.data_ref().map_or(0, |d| d.len() as u64);
                    }
                    Some(Err(_)) | None => break,
                }
            }
        };
        let _ = tokio::time::timeout(within, drain).await;
    });
    response
}
