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
use hyper::header::{HOST, HeaderMap, HeaderValue};
use hyper::{Request as HttpRequest, Response};
use hyper_util::rt::TokioIo;
use sandgate_policy::{Access, Host, Identity, Target, TargetError};
use tokio::sync::mpsc;

use super::body::{Counted, Done, Scanned, Untrailed, discarding};
use super::upstreams::{Lease, Upstreams};
use super::{ReqBody, ResBody, Sender};
use crate::egress::{Egress, End, Grant, Refused, Request};
use crate::inspect::Interceptor;
use crate::refusal::{Refusal, ResponseError};
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
    pub(super) async fn exchange(&self, req: HttpRequest<Incoming>) -> Result<Response<ResBody>, Infallible> {
        let head = req.method() == hyper::Method::HEAD;
        let mut response = self.answer(req).await?;
        if head && response.extensions().get::<Ours>().is_some() {
            *response.body_mut() = http_body_util::Empty::new()
                .map_err(|never: Infallible| match never {})
                .boxed_unsync();
        }
        Ok(response)
    }

    async fn answer(&self, req: HttpRequest<Incoming>) -> Result<Response<ResBody>, Infallible> {
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
        Ok(self.forward(req, grant, lease, &path, swap).await)
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
        match self.egress.carried(&self.target, true, path, fields) {
            Ok(sandgate_policy::Carried::Swap(swap)) => Ok((decided, swap)),
            Ok(sandgate_policy::Carried::Nothing) => Ok((decided, Vec::new())),
            Err(leak) => {
                let refused = decided.refuse(&self.egress, Refusal::CredentialLeak(leak)).await;
                Err(refusal(&refused))
            }
        }
    }

    /// The grant of an allowed request, with a connection upstream of its own: an idle one
    /// still open and ready, the CONNECT's own, or a new one the core opens, vetted again.
    /// Past [`upstreams::MAX_UPSTREAMS`](super::upstreams::MAX_UPSTREAMS) busy ones it waits
    /// for one, for at most the response timeout, then fails as a timeout (504). Refusals
    /// and failures come back as the response to give.
    async fn connection_for(
        &self,
        decided: crate::egress::Decided,
    ) -> Result<(Grant, Lease), Response<ResBody>> {
        let within = self.egress.limits.response_timeout;
        let Some(turn) = self.upstreams.turn(within).await else {
            let grant = decided.reuse(&self.egress, self.addr).await;
            return Err(self.fail(grant, ResponseError::Timeout, 0).await);
        };
        if let Some(sender) = turn.idle().await {
            let grant = decided.reuse(&self.egress, self.addr).await;
            return Ok((grant, turn.lease(sender)));
        }
        let (grant, stream) = match turn.spare() {
            Some(stream) => (decided.reuse(&self.egress, self.addr).await, stream),
            None => match decided.open(&self.egress).await {
                Ok(opened) => (opened.grant, opened.stream),
                Err(refused) => return Err(refusal(&refused)),
            },
        };
        match self.connect(stream).await {
            Ok(sender) => Ok((grant, turn.lease(sender))),
            Err(why) => Err(self.fail(grant, ResponseError::Tls(why), 0).await),
        }
    }

    /// The upstream's TLS (verified against the system's roots, for the tunnel's host) and
    /// an HTTP/1.1 connection on it.
    async fn connect(&self, upstream: Upstream) -> Result<Sender, String> {
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
        // Driven until it ends: the origin closes it, or the last sender goes.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }
    async fn forward(
        &self,
        req: HttpRequest<Incoming>,
        grant: Grant,
        mut lease: Lease,
        path: &str,
        swap: Vec<(String, sandgate_policy::Secret)>,
    ) -> Response<ResBody> {
        let (mut parts, body) = req.into_parts();
        let Ok(uri) = path.parse() else {
            return self.fail(grant, ResponseError::Closed, 0).await;
        };
        parts.uri = uri;
        parts.version = hyper::Version::HTTP_11;
        end_to_end(&mut parts.headers);
        // Trailers are dropped (the body below), so none is announced.
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
        let sent = Arc::new(AtomicU64::new(0));
        let body = Counted {
            inner: Untrailed { inner: body },
            bytes: sent.clone(),
            done: None,
        };
        // Searched for placeholders bound elsewhere, when a credential asks for it.
        let found = Arc::new(std::sync::Mutex::new(None));
        let body: ReqBody = match self.egress.body_scan(&self.target) {
            Some(scan) => Scanned {
                inner: body,
                scan,
                found: found.clone(),
            }
            .boxed_unsync(),
            None => body.map_err(Into::into).boxed_unsync(),
        };
        let leaked = || found.lock().ok().and_then(|mut slot| slot.take());
        let within = self.egress.limits.response_timeout;
        let Some(sender) = lease.sender() else {
            return self.fail(grant, ResponseError::Closed, 0).await;
        };
        match tokio::time::timeout(within, sender.ready()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return self.fail(grant, ResponseError::Closed, 0).await,
            Err(_) => return self.fail(grant, ResponseError::Timeout, 0).await,
        }
        // The response head within the response timeout; a stalled origin fails this
        // request, not the tunnel's next ones.
        let send = sender.send_request(HttpRequest::from_parts(parts, body));
        let answer = match tokio::time::timeout(within, send).await {
            Ok(answer) => answer,
            Err(_) => {
                return self
                    .fail(grant, ResponseError::Timeout, sent.load(Ordering::Relaxed))
                    .await;
            }
        };
        let response = match answer {
            Ok(response) => response,
            Err(_) if let Some(leak) = leaked() => {
                // The origin may keep what came before the placeholder: its connection goes
                // with the lease, dropped unreleased.
                tracing::warn!(%leak, "a request body carried a placeholder; cut");
                let refused = self
                    .egress
                    .fail(
                        grant,
                        Refusal::CredentialLeak(leak),
                        sent.load(Ordering::Relaxed),
                        0,
                    )
                    .await;
                return refusal(&refused);
            }
            Err(e) => {
                let error = match e.is_timeout() {
                    true => ResponseError::Timeout,
                    false => ResponseError::Closed,
                };
                return self.fail(grant, error, sent.load(Ordering::Relaxed)).await;
            }
        };
        let status = response.status().as_u16();
        let (mut parts, body) = response.into_parts();
        end_to_end(&mut parts.headers);
        let mut body = Counted {
            inner: body,
            bytes: Arc::new(AtomicU64::new(0)),
            done: Some(Done {
                grant,
                sent,
                status,
                closes: self.closes.clone(),
                leaked: found.clone(),
                lease: Some(lease),
            }),
        };
        // A response with no body (HEAD, 204, 304) is whole already: hyper never polls it.
        if hyper::body::Body::is_end_stream(&body.inner) {
            body.finish(crate::audit::event::Outcome::Ok);
        }
        Response::from_parts(parts, body.boxed_unsync())
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

/// Whether the request names the tunnel's host and port in every place it names one: its
/// absolute URI or HTTP/2 `:authority` (if any) and its `Host` (at most one), at least one of
/// them present; an `https` scheme if any. Each must agree with the tunnel's.
fn same_authority(uri: &hyper::Uri, headers: &HeaderMap, target: &Target) -> bool {
    let ours = |text: &str| {
        sandgate_policy::parse_host_field(text)
            .is_ok_and(|(host, port)| host == target.host && port.unwrap_or(443) == target.port)
    };
    if uri
        .scheme()
        .is_some_and(|s| s != &hyper::http::uri::Scheme::HTTPS)
    {
        return false;
    }
    let named = uri.authority().map(|a| ours(a.as_str()));
    let mut hosts = headers.get_all(HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(h), None) => Some(h.to_str().is_ok_and(ours)),
        (None, None) => None,
        (Some(_), Some(_)) | (None, Some(_)) => Some(false),
    };
    match (named, host) {
        (None, None) => false,
        (a, b) => a.unwrap_or(true) && b.unwrap_or(true),
    }
}

/// Why a request inside an intercepted tunnel cannot be judged by its method and path, if
/// it cannot ([`sandgate_policy::judgeable`]).
fn unjudgeable(req: &HttpRequest<Incoming>) -> Option<TargetError> {
    use hyper::body::Body as _;
    let has_body = !req.body().is_end_stream();
    (!sandgate_policy::judgeable(req.method().as_str(), has_body)).then_some(TargetError::NotJudgeable)
}

/// `host` or `host:port`, as the upstream's `Host`.
fn authority(target: &Target) -> String {
    match target.port {
        443 => target.host.to_string(),
        port => format!("{}:{port}", target.host),
    }
}

/// Drops the hop-by-hop fields (RFC 9110 section 7.6.1), those `Connection` names, the proxy
/// credentials and sandgate's own attribution fields.
fn end_to_end(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !crate::h1::head::FRAMING.contains(&t.as_str()))
        .collect();
    // And what would change the request the rules judged: a method override (Rails,
    // Google APIs) and `Expect` (hyper answered the 100-continue itself).
    for name in crate::h1::head::HOP_BY_HOP
        .iter()
        .chain(crate::h1::head::METHOD_OVERRIDES)
        .chain(&["expect"])
        .map(|s| (*s).to_owned())
        .chain(named)
    {
        headers.remove(name.as_str());
    }
    let ours: Vec<_> = headers
        .keys()
        .filter(|k| crate::h1::head::is_attribution(k.as_str()))
        .cloned()
        .collect();
    for k in ours {
        headers.remove(k);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn agrees(uri: &str, hosts: &[&str]) -> bool {
        let target = sandgate_policy::parse_connect_target("git.example:443").unwrap();
        let mut headers = HeaderMap::new();
        for h in hosts {
            headers.append(HOST, HeaderValue::from_str(h).unwrap());
        }
        same_authority(&uri.parse().unwrap(), &headers, &target)
    }

    /// Every place a request names its host must name the tunnel's: HTTP/1.1's Host and
    /// absolute URI, HTTP/2's :authority (hyper's URI) and Host.
    #[test]
    fn a_request_names_the_tunnels_host_wherever_it_names_one() {
        assert!(agrees("/x", &["git.example"]));
        assert!(agrees("/x", &["GIT.example:443"]));
        assert!(agrees("https://git.example/x", &[]));
        assert!(agrees("https://git.example:443/x", &["git.example"]));
        assert!(!agrees("/x", &[]), "nothing names a host");
        assert!(!agrees("/x", &["other.example"]));
        assert!(!agrees("/x", &["git.example:8443"]));
        assert!(!agrees("/x", &["git.example", "git.example"]), "two Host fields");
        assert!(
            !agrees("https://other.example/x", &["git.example"]),
            ":authority disagrees with Host"
        );
        assert!(
            !agrees("https://git.example/x", &["other.example"]),
            "Host disagrees with :authority"
        );
        assert!(!agrees("http://git.example/x", &["git.example"]), "not https");
        assert!(!agrees("/x", &["git.example@other.example"]));
    }

    #[test]
    fn hop_by_hop_and_attribution_fields_are_dropped() {
        let mut headers = HeaderMap::new();
        for (n, v) in [
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "5"),
            ("proxy-authorization", "Basic x"),
            ("sandgate-task", "t-other"),
            ("content-length", "3"),
            ("accept", "*/*"),
        ] {
            headers.append(
                hyper::header::HeaderName::from_static(n),
                HeaderValue::from_static(v),
            );
        }
        end_to_end(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "content-length"]);
    }
}
