//! One request inside an intercepted tunnel: decided and recorded by the core, its
//! placeholders checked and its bound secrets written in, forwarded on an upstream
//! connection of its own for as long as its response lasts (`upstreams.rs`: one kept idle,
//! the CONNECT's, or a new one the core dials and vets), its trailers dropped, its close
//! owed by its response body.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HOST, HeaderValue};
use hyper::{Request as HttpRequest, Response};
use hyper_util::rt::TokioIo;
use sandgate_policy::{Access, Host, Identity, Target, TargetError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::body::{Counted, CutError, Done, Ended, Owed, Scanned, Side, Untrailed, discarding};
use super::fields::{authority, end_to_end, same_authority, unjudgeable};
use super::upstreams::{Conn, Lease, Upstreams};
use super::{ReqBody, ResBody, Sender};
use crate::egress::{Egress, End, Grant, Refused, Request};
use crate::inspect::Interceptor;
use crate::refusal::{LimitKind, Refusal, ResponseError};
use crate::relay::Upstream;

/// HTTP/2 streams a client may have open at once in one intercepted tunnel (their requests
/// go upstream in parallel on up to `upstreams::MAX_UPSTREAMS` HTTP/1.1 connections; the
/// rest wait for one, for at most the response timeout).
pub(super) const MAX_STREAMS: u32 = 32;

/// What each request of a tunnel shares.
pub(super) struct Exchanges {
    pub(super) egress: Arc<Egress>,
    pub(super) target: Target,
    pub(super) addr: SocketAddr,
    pub(super) peer: SocketAddr,
    pub(super) identity: Arc<Identity>,
    pub(super) interceptor: Arc<Interceptor>,
    /// The connections requests go upstream on, one request at a time on each.
    pub(super) upstreams: Arc<Upstreams>,
    pub(super) closes: mpsc::UnboundedSender<(Grant, End)>,
}

impl Exchanges {
    /// One request: decided and recorded by the core; forwarded when allowed. A refusal of
    /// a HEAD has no body (RFC 9110, 9.3.2): over HTTP/2 a body on it is a protocol error
    /// the client fails the stream on, where it should read the 403.
    /// A request its grant's stop cut before its response head fails (`Err`): hyper
    /// resets its stream.
    pub(super) async fn exchange(&self, req: HttpRequest<Incoming>) -> Result<Response<ResBody>, CutError> {
        let head = req.method() == hyper::Method::HEAD;
        let mut response = self.answer(req).await?;
        if head && response.extensions().get::<Ours>().is_some() {
            *response.body_mut() = http_body_util::Empty::new()
                .map_err(|never: Infallible| match never {})
                .boxed_unsync();
        }
        Ok(response)
    }

    async fn answer(&self, req: HttpRequest<Incoming>) -> Result<Response<ResBody>, CutError> {
        let path = req
            .uri()
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
        let (decided, swap) = match self.judge(&req, &path).await {
            Ok(judged) => judged,
            Err(refused) => return Ok(discarding(req, refused, self.egress.limits.head_timeout)),
        };
        let (grant, lease) = match self.connection_for(decided).await {
            Ok(leased) => leased,
            Err(response) => return Ok(discarding(req, response, self.egress.limits.head_timeout)),
        };
        self.forward(req, grant, lease, &path, swap).await
    }

    /// The core's decision on a request, and the secrets to write into it; a refusal comes
    /// back as the response to give.
    async fn judge(
        &self,
        req: &HttpRequest<Incoming>,
        path: &str,
    ) -> Result<(crate::egress::Decided, Vec<(String, sandgate_policy::Secret)>), Response<ResBody>> {
        let request = Request {
            peer: self.peer,
            identity: self.identity.clone(),
            node: None,
            method: req.method().as_str().to_owned().into(),
            path: Some(path),
            dest: Ok((self.target.clone(), Access::Https)),
        };
        let decided = match self.egress.clear(request).await {
            Ok(decided) => decided,
            Err(refused) => return Err(refusal(&refused)),
        };
        // What the rules cannot judge is refused: a CONNECT inside (no path; its upgrade
        // would carry anything), TRACE and TRACK (an echo of the request, secrets written
        // in included), and a body on a request that has none (GET, HEAD, OPTIONS), which an
        // origin that ignores its length reads as a second, undecided request.
        if let Some(why) = unjudgeable(req) {
            let refused = decided.refuse(&self.egress, Refusal::Target(why)).await;
            return Err(refusal(&refused));
        }
        // A request that names another host than the tunnel's: refused, recorded with the
        // tunnel's destination.
        if !same_authority(req.uri(), req.headers(), &self.target) {
            let refused = decided
                .refuse(&self.egress, Refusal::Target(TargetError::OtherHost))
                .await;
            return Err(refusal(&refused));
        }
        // The secrets bound to this host, in place of their placeholders; a placeholder
        // anywhere else is refused.
        let fields = req.headers().iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
        let line = (req.method().as_str(), path);
        match self.egress.carried(&self.target, true, line, fields) {
            Ok(sandgate_policy::Carried::Swap(swap)) => Ok((decided, swap)),
            Ok(sandgate_policy::Carried::Nothing) => Ok((decided, Vec::new())),
            Err(leak) => {
                let refused = decided.refuse(&self.egress, Refusal::CredentialLeak(leak)).await;
                Err(refusal(&refused))
            }
        }
    }

    /// The grant of an allowed request, with a connection upstream of its own: an idle one
    /// still open and ready, the CONNECT's own, or a new one the core opens, vetted again,
    /// once the connection limits admit it. Past
    /// [`upstreams::MAX_UPSTREAMS`](super::upstreams::MAX_UPSTREAMS) busy ones, or while the
    /// limits admit none, it waits, for at most the response timeout in all, then is
    /// refused (503, `connection_limit:tunnel` or the limit that stayed full). Refusals and
    /// failures come back as the response to give.
    async fn connection_for(
        &self,
        decided: crate::egress::Decided,
    ) -> Result<(Grant, Lease), Response<ResBody>> {
        let deadline = tokio::time::Instant::now() + self.egress.limits.response_timeout;
        let Some(turn) = self.upstreams.turn(deadline).await else {
            return Err(self.refuse(decided, LimitKind::Tunnel).await);
        };
        if let Some(conn) = turn.idle().await {
            // Recorded with the address this connection goes to (one `open` dialled may be
            // another than the CONNECT's).
            let grant = decided
                .reuse(&self.egress, conn.addr())
                .await
                .map_err(|refused| refusal(&refused))?;
            return Ok((grant, turn.lease(conn)));
        }
        let (grant, stream, addr, slot) = match turn.spare() {
            Some((stream, slot)) => match decided.reuse(&self.egress, self.addr).await {
                Ok(grant) => (grant, stream, self.addr, slot),
                Err(refused) => return Err(refusal(&refused)),
            },
            None => {
                let slot = match turn.slot(deadline).await {
                    Ok(slot) => slot,
                    Err(kind) => return Err(self.refuse(decided, kind).await),
                };
                match decided.open(&self.egress).await {
                    Ok(opened) => (opened.grant, opened.stream, opened.addr, slot),
                    Err(refused) => return Err(refusal(&refused)),
                }
            }
        };
        match self.connect(stream).await {
            Ok((sender, task)) => Ok((grant, turn.lease(Conn::new(sender, addr, slot, task)))),
            Err(why) => Err(self.fail(grant, ResponseError::Tls(why), 0).await),
        }
    }

    /// Refuses a request no connection could be had for: a limit stayed full.
    async fn refuse(&self, decided: crate::egress::Decided, kind: LimitKind) -> Response<ResBody> {
        let refused = decided.refuse(&self.egress, Refusal::ConnectionLimit(kind)).await;
        refusal(&refused)
    }

    /// The upstream's TLS (verified against the system's roots, for the tunnel's host) and
    /// an HTTP/1.1 connection on it, with its task (aborted, the connection closes).
    async fn connect(&self, upstream: Upstream) -> Result<(Sender, tokio::task::AbortHandle), String> {
        let name = match &self.target.host {
            Host::Name(n) => {
                rustls::pki_types::ServerName::try_from(n.as_str().to_owned()).map_err(|e| e.to_string())?
            }
            Host::Ip(ip) => rustls::pki_types::ServerName::IpAddress((*ip).into()),
        };
        let connect = tokio_rustls::TlsConnector::from(self.interceptor.upstream()).connect(name, upstream);
        let tls = match tokio::time::timeout(self.egress.limits.response_timeout, connect).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("no TLS handshake before the timeout".to_owned()),
        };
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        // Driven until it ends: the origin closes it, or the connection is dropped.
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok((sender, task.abort_handle()))
    }

    /// Forwards an allowed request on its connection. Its grant's stop (a revocation, an
    /// expiry, the shutdown) cuts it at any point: before it goes, while its response head
    /// is awaited (`Err`: the stream is reset), and while either body streams.
    async fn forward(
        &self,
        req: HttpRequest<Incoming>,
        grant: Grant,
        mut lease: Lease,
        path: &str,
        swap: Vec<(String, sandgate_policy::Secret)>,
    ) -> Result<Response<ResBody>, CutError> {
        let stop = grant.cuttable().then(|| grant.stop().clone());
        if stop.as_ref().is_some_and(CancellationToken::is_cancelled) {
            return Err(self.cut(grant, 0).await);
        }
        let (mut parts, body) = req.into_parts();
        if self.rewrite(&mut parts, path, swap).is_err() {
            return Ok(self.fail(grant, ResponseError::Closed, 0).await);
        }
        // Searched for placeholders bound elsewhere, when a credential asks for it.
        let found = Arc::new(std::sync::Mutex::new(None));
        let body: ReqBody = match self.egress.body_scan(&self.target) {
            Some(scan) => Scanned {
                inner: Untrailed { inner: body },
                scan,
                found: found.clone(),
            }
            .boxed_unsync(),
            None => Untrailed { inner: body }.map_err(Into::into).boxed_unsync(),
        };
        // The exchange's close, owed once both bodies ended.
        let (sent, received) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let owed: Owed = Arc::new(std::sync::Mutex::new(Done {
            egress: self.egress.clone(),
            grant: None,
            sent: sent.clone(),
            received: received.clone(),
            status: None,
            closes: self.closes.clone(),
            leaked: found.clone(),
            lease: None,
            request: None,
            response: None,
        }));
        let cut = || stop.clone().map(|s| Box::pin(s.cancelled_owned()));
        let body = Counted {
            inner: body,
            bytes: sent.clone(),
            side: Side::Request,
            owed: Some(owed.clone()),
            cut: cut(),
        };
        let body: ReqBody = body.boxed_unsync();
        let leaked = || found.lock().ok().and_then(|mut slot| slot.take());
        let within = self.egress.limits.response_timeout;
        let Some(sender) = lease.sender() else {
            return Ok(self.fail(grant, ResponseError::Closed, 0).await);
        };
        match tokio::time::timeout(within, sender.ready()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Ok(self.fail(grant, ResponseError::Closed, 0).await),
            Err(_) => return Ok(self.fail(grant, ResponseError::Timeout, 0).await),
        }
        // The response head within the response timeout; a stalled origin fails this
        // request, not the tunnel's next ones.
        let send = tokio::time::timeout(within, sender.send_request(HttpRequest::from_parts(parts, body)));
        let cancelled = async {
            match &stop {
                Some(stop) => stop.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let answer = tokio::select! {
            answer = send => answer,
            () = cancelled => return Err(self.cut(grant, sent.load(Ordering::Relaxed)).await),
        };
        let response = match answer {
            Ok(Ok(response)) => response,
            Err(_) => {
                let sent = sent.load(Ordering::Relaxed);
                return Ok(self.fail(grant, ResponseError::Timeout, sent).await);
            }
            Ok(Err(_)) if let Some(leak) = leaked() => {
                // The origin may keep what came before the placeholder: its connection goes
                // with the lease, dropped unreleased.
                tracing::warn!(%leak, "a request body carried a placeholder; cut");
                let sent = sent.load(Ordering::Relaxed);
                let refused = self
                    .egress
                    .fail(grant, Refusal::CredentialLeak(leak), sent, 0)
                    .await;
                return Ok(refusal(&refused));
            }
            Ok(Err(_)) if stop.as_ref().is_some_and(CancellationToken::is_cancelled) => {
                return Err(self.cut(grant, sent.load(Ordering::Relaxed)).await);
            }
            Ok(Err(e)) => {
                let error = match e.is_timeout() {
                    true => ResponseError::Timeout,
                    false => ResponseError::Closed,
                };
                return Ok(self.fail(grant, error, sent.load(Ordering::Relaxed)).await);
            }
        };
        let status = response.status().as_u16();
        let (mut parts, body) = response.into_parts();
        end_to_end(&mut parts.headers);
        super::body::answered(&owed, grant, lease, status);
        let mut body = Counted {
            inner: body,
            bytes: received,
            side: Side::Response,
            owed: Some(owed),
            cut: cut(),
        };
        // A response with no body (HEAD, 204, 304) is whole already: hyper never polls it.
        if hyper::body::Body::is_end_stream(&body.inner) {
            body.finish(Ended::Whole);
        }
        Ok(Response::from_parts(parts, body.boxed_unsync()))
    }

    /// The head as it goes upstream: HTTP/1.1 in origin form, without the fields that
    /// must not go on (trailers are dropped with the body, so none is announced), with the
    /// tunnel's host and the bound secrets written in. `Err`: the path is no URI.
    fn rewrite(
        &self,
        parts: &mut hyper::http::request::Parts,
        path: &str,
        swap: Vec<(String, sandgate_policy::Secret)>,
    ) -> Result<(), hyper::http::uri::InvalidUri> {
        parts.uri = path.parse()?;
        parts.version = hyper::Version::HTTP_11;
        end_to_end(&mut parts.headers);
        parts.headers.remove(hyper::header::TRAILER);
        if let Ok(host) = HeaderValue::from_str(&authority(&self.target)) {
            parts.headers.insert(HOST, host);
        }
        for (name, secret) in swap {
            if let (Ok(name), Ok(mut value)) = (
                hyper::header::HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(secret.expose()),
            ) {
                // Never printed: hyper leaves sensitive values out of its debug output.
                value.set_sensitive(true);
                parts.headers.insert(name, value);
            }
        }
        Ok(())
    }

    /// Records the close of a request its grant's stop cut before its response head: the
    /// stream is then reset (an HTTP/1.1 client's connection closed).
    async fn cut(&self, grant: Grant, sent: u64) -> CutError {
        let end = End {
            sent,
            received: 0,
            status: None,
            outcome: self.egress.cut_outcome(&grant),
        };
        self.egress.close(grant, end).await;
        CutError
    }

    async fn fail(&self, grant: Grant, error: ResponseError, sent: u64) -> Response<ResBody> {
        let target = self.target.clone();
        let refused = self
            .egress
            .fail(grant, Refusal::Response { target, error }, sent, 0)
            .await;
        refusal(&refused)
    }
}

/// A refusal as an HTTP response inside the tunnel: the status, the request id and the
/// words of the HTTP/1 front end's refusals.
fn refusal(refused: &Refused) -> Response<ResBody> {
    let c = &refused.classified;
    let body = crate::http1::render::body(c, &refused.id);
    let mut response = Response::new(
        http_body_util::Full::new(Bytes::from(body))
            .map_err(|never: Infallible| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = hyper::StatusCode::from_u16(c.status).unwrap_or(hyper::StatusCode::FORBIDDEN);
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(id) = HeaderValue::from_str(&refused.id) {
        headers.insert("sandgate-request-id", id);
    }
    response.extensions_mut().insert(Ours);
    response
}

/// Marks a response the proxy wrote itself (a refusal), not one of the origin's.
#[derive(Debug, Clone, Copy)]
struct Ours;
