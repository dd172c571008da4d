//! The bodies of an intercepted tunnel: counting bodies, request and response, that share
//! their exchange's close and send it once both have ended (and hand its upstream
//! connection back), a request body without its trailers, a request body searched for
//! placeholders bound elsewhere, and a refused request's body read and dropped (bounded) so
//! its client reads the refusal.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::upstreams::Lease;
use crate::audit::event::Outcome;
use crate::egress::{Egress, End, Grant};

/// Which body of an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Request,
    Response,
}

/// How one body of an exchange ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// Read to its end.
    Whole,
    /// Its source failed: the client's stream (a request), the origin's connection (a
    /// response), or a placeholder found in a request body.
    Failed,
    /// Dropped before its end: by the client (a response), or with its upstream connection
    /// (a request the origin answered and stopped reading).
    Dropped,
    /// Ended by its grant's stop: a revocation, an expiry, the shutdown.
    Cut,
}

/// The close an exchange owes once its request body and its response body have both
/// ended, shared by the two. The grant and the connection are put in when the response
/// head came; until then the request body's end is only noted.
pub(super) struct Done {
    pub(super) egress: Arc<Egress>,
    pub(super) grant: Option<Grant>,
    pub(super) sent: Arc<AtomicU64>,
    pub(super) received: Arc<AtomicU64>,
    pub(super) status: Option<u16>,
    pub(super) closes: mpsc::UnboundedSender<(Grant, End)>,
    /// Where the request body's search leaves a leak it finds.
    pub(super) leaked: Arc<Mutex<Option<sandgate_policy::Leak>>>,
    /// The upstream connection the exchange uses, and its turn: handed back for the
    /// tunnel's next requests once both bodies ended whole, closed otherwise.
    pub(super) lease: Option<Lease>,
    pub(super) request: Option<Ended>,
    pub(super) response: Option<Ended>,
}

/// An exchange's [`Done`], as its two bodies hold it.
pub(super) type Owed = Arc<Mutex<Done>>;

/// What is left to do once an exchange is over: its close to send, its connection to
/// hand back or close.
struct Settled {
    grant: Grant,
    end: End,
    lease: Option<Lease>,
    reuse: bool,
    closes: mpsc::UnboundedSender<(Grant, End)>,
    egress: Arc<Egress>,
}

impl Done {
    /// Notes that `side` ended as `how`. The exchange is over once both have, or at once
    /// when the response did not end whole (its connection is closed, and the request
    /// body with it): while the request body still streams after a whole response (an
    /// origin that answered early), the connection stays the exchange's, its turn and its
    /// slot with it.
    fn ended(&mut self, side: Side, how: Ended) -> Option<Settled> {
        match side {
            Side::Request => self.request.get_or_insert(how),
            Side::Response => self.response.get_or_insert(how),
        };
        let response = self.response?;
        if !over(self.request, response) {
            return None;
        }
        let grant = self.grant.take()?;
        let leaked = self.leaked.lock().is_ok_and(|l| l.is_some());
        // Cut (its own stop, or the tunnel's with it): what cut it, however its bodies ended.
        let cut = (grant.stop().is_cancelled() || [Some(response), self.request].contains(&Some(Ended::Cut)))
            .then(|| self.egress.cut_outcome(&grant));
        let outcome = outcome(leaked, cut, self.request, response);
        let reuse = outcome == Outcome::Ok && self.request == Some(Ended::Whole);
        let end = End {
            sent: self.sent.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            status: self.status,
            outcome,
        };
        Some(Settled {
            grant,
            end,
            lease: self.lease.take(),
            reuse,
            closes: self.closes.clone(),
            egress: self.egress.clone(),
        })
    }
}

/// Whether an exchange is over, its response ended as `response` and its request body as
/// `request` (`None`: still streaming): a whole response waits for the request body.
fn over(request: Option<Ended>, response: Ended) -> bool {
    response != Ended::Whole || request.is_some()
}

/// An exchange's close's outcome: a placeholder the request body carried (`leaked`), else
/// a cut (`cut`: what cut it), else the response's failure, else the request's.
fn outcome(leaked: bool, cut: Option<Outcome>, request: Option<Ended>, response: Ended) -> Outcome {
    if leaked {
        return Outcome::CredentialLeak;
    }
    if let Some(cut) = cut {
        return cut;
    }
    match (response, request) {
        (Ended::Failed, _) => Outcome::UpstreamReset,
        (Ended::Dropped, _) => Outcome::ClientReset,
        (_, Some(Ended::Failed)) => Outcome::ClientReset,
        _ => Outcome::Ok,
    }
}

impl Settled {
    fn send(self) {
        match (self.lease, self.reuse) {
            (Some(lease), true) => lease.release(),
            (lease, _) => drop(lease),
        }
        // The tunnel records it; gone (the tunnel was cut or has ended), a task of its own.
        if let Err(mpsc::error::SendError((grant, end))) = self.closes.send((self.grant, self.end)) {
            let egress = self.egress;
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { egress.close(grant, end).await });
            }
        }
    }
}

fn lock(owed: &Owed) -> MutexGuard<'_, Done> {
    owed.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Notes that `side` of the exchange `owed` ended as `how`, and settles the exchange when
/// it is over (outside the lock: a connection closed drops its request body, which notes
/// its own end here). A response that ended whole while the request body still streams
/// (an origin that answered early) starts the request body's watch ([`watch_request`]).
pub(super) fn end(owed: &Owed, side: Side, how: Ended) {
    let (settled, watch) = {
        let mut done = lock(owed);
        let settled = done.ended(side, how);
        let waits = side == Side::Response && how == Ended::Whole && settled.is_none();
        let watch = done
            .grant
            .as_ref()
            .filter(|_| waits)
            .map(|grant| (grant.stop().clone(), done.egress.limits.body_idle_timeout));
        (settled, watch)
    };
    if let Some(settled) = settled {
        settled.send();
    }
    if let Some((stop, idle)) = watch {
        watch_request(Arc::downgrade(owed), stop, idle);
    }
}

/// After a whole response, the request body of its exchange may take at most `idle` (the
/// body idle timeout) to end, and none past its grant's stop (a revocation, an expiry, the
/// shutdown). Its upstream connection's task holds it, and the origin that answered may
/// have stopped reading: then the body is never polled again, and nothing else would end
/// the exchange (the connection, its turn and its slot held, its close never written).
/// Past either, the request body is failed here: the exchange settles, its connection is
/// closed (its task aborted, the body dropped with it) and its close written.
fn watch_request(
    owed: std::sync::Weak<Mutex<Done>>,
    stop: tokio_util::sync::CancellationToken,
    idle: std::time::Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(idle) => {}
            () = stop.cancelled() => {}
        }
        // Gone or settled already: the body ended in time.
        if let Some(owed) = owed.upgrade() {
            end(&owed, Side::Request, Ended::Failed);
        }
    });
}

/// Puts the grant and the connection of an exchange whose response head came into its
/// [`Done`], with the response's status.
pub(super) fn answered(owed: &Owed, grant: Grant, lease: Lease, status: u16) {
    let mut done = lock(owed);
    done.grant = Some(grant);
    done.lease = Some(lease);
    done.status = Some(status);
}

/// The error a body ends with when its grant is cut.
#[derive(Debug, thiserror::Error)]
#[error("cut: the rule that allowed the request was revoked or expired, or the proxy stops")]
pub(super) struct CutError;

/// One body of an exchange, counting its bytes and noting its end in the exchange's
/// [`Done`] (whole, failed, cut by its grant's stop, or dropped unfinished).
pub(super) struct Counted<B: Body> {
    pub(super) inner: B,
    pub(super) bytes: Arc<AtomicU64>,
    pub(super) side: Side,
    pub(super) owed: Option<Owed>,
    /// Ready when the exchange's grant is cut (`None`: it cannot be).
    pub(super) cut: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
}

impl<B: Body> Counted<B> {
    /// Notes this body's end as `how` (once).
    pub(super) fn finish(&mut self, how: Ended) {
        if let Some(owed) = self.owed.take() {
            self.cut = None;
            end(&owed, self.side, how);
        }
    }
}

impl<B> Body for Counted<B>
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
        if let Some(cut) = self.cut.as_mut()
            && cut.as_mut().poll(cx).is_ready()
        {
            self.finish(Ended::Cut);
            return Poll::Ready(Some(Err(CutError.into())));
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                // A body of known length is not polled past its last byte.
                if self.inner.is_end_stream() {
                    self.finish(Ended::Whole);
                }
            }
            Poll::Ready(None) => self.finish(Ended::Whole),
            Poll::Ready(Some(Err(_))) => self.finish(Ended::Failed),
            Poll::Pending => {}
        }
        polled.map(|f| f.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: Body> Drop for Counted<B> {
    fn drop(&mut self) {
        // A body with nothing left (a request without one) is whole unread; any other was
        // dropped unfinished: the client went away, the tunnel was cut, or its connection
        // closed.
        let how = match self.inner.is_end_stream() {
            true => Ended::Whole,
            false => Ended::Dropped,
        };
        self.finish(how);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A response the origin gave early (a 401 while the upload still streams) does not end
    /// its exchange: the connection stays the exchange's until the request body ends too,
    /// so its turn and its slot are not given back while the origin still reads.
    #[test]
    fn a_whole_response_waits_for_the_request_body() {
        assert!(!over(None, Ended::Whole), "request still streaming");
        for request in [Ended::Whole, Ended::Failed, Ended::Dropped, Ended::Cut] {
            assert!(over(Some(request), Ended::Whole), "{request:?}");
        }
        // A response that did not end whole closes its connection, the request with it.
        for response in [Ended::Failed, Ended::Dropped, Ended::Cut] {
            assert!(over(None, response), "{response:?}");
        }
    }

    /// A placeholder the request body's search found after the response ended is the
    /// close's outcome; a cut comes next, then the response's failure, then the request's.
    #[test]
    fn a_late_leak_then_a_cut_name_the_close() {
        let whole = Some(Ended::Whole);
        assert_eq!(
            outcome(true, None, Some(Ended::Failed), Ended::Whole),
            Outcome::CredentialLeak
        );
        assert_eq!(
            outcome(true, Some(Outcome::Revoked), whole, Ended::Cut),
            Outcome::CredentialLeak
        );
        assert_eq!(
            outcome(false, Some(Outcome::Expired), whole, Ended::Dropped),
            Outcome::Expired
        );
        assert_eq!(outcome(false, None, whole, Ended::Failed), Outcome::UpstreamReset);
        assert_eq!(outcome(false, None, whole, Ended::Dropped), Outcome::ClientReset);
        assert_eq!(
            outcome(false, None, Some(Ended::Failed), Ended::Whole),
            Outcome::ClientReset
        );
        assert_eq!(
            outcome(false, None, Some(Ended::Dropped), Ended::Whole),
            Outcome::Ok
        );
        assert_eq!(outcome(false, None, whole, Ended::Whole), Outcome::Ok);
    }
}
