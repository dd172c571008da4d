//! A central proxy's front end for node-local proxies (`role: node`): a TLS handshake that
//! requires a client certificate from the listener's CA, the node known by its
//! certificate's names in `spec.nodes`, then HTTP/2. Each stream is one request: a CONNECT
//! (RFC 9113 section 8.5) whose attribution fields the node's entry must vouch for; the
//! core decides, vets, dials and records it like any other, and the stream is bridged to
//! the core's relay. A refused handshake, an unknown node and a refused stream are each one
//! deny on record.

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use sandgate_policy::{Access, Identity, NodeSpec};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{ACCESS_FIELD, NodeListener, attribution, bridge, tls};
use crate::egress::{Egress, Refused};
use crate::refusal::{NodeRefusal, Refusal};

/// Flow control (RFC 9113 section 5.2). Each stream may have `STREAM_WINDOW` bytes in
/// flight that its reader has not taken, and the connection's window is that times the
/// most streams a connection may have open: so streams whose readers stop (a client that
/// never reads, whether slow or hostile) can hold at most their own windows, never the
/// connection's, and cannot stall the other tunnels on it. The product is also the most a
/// connection can buffer (128 MiB, reached only when every stream is stalled).
pub(crate) const STREAM_WINDOW: u32 = 256 * 1024;
/// Streams one node connection may have open at once (more wait for a free one).
pub(crate) const MAX_STREAMS: u32 = 512;
pub(crate) const CONNECTION_WINDOW: u32 = STREAM_WINDOW * MAX_STREAMS;
/// The largest DATA frame either side accepts: bulk tunnels move in fewer frames.
pub(crate) const MAX_FRAME: u32 = 64 * 1024;
/// PING a quiet connection this often; no answer within the timeout ends it.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(10);
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connection limits each stream counts against, like a connection of its own: a
/// stream's tunnel holds descriptors (the upstream socket and the bridge's pair) and memory
/// on the central whichever connection it came on, so one node cannot use up the
/// descriptors by multiplexing. Each stream takes two slots (its three descriptors, where a
/// connection's slot stands for two).
#[derive(Debug, Clone)]
pub(crate) struct StreamGate {
    pub admission: Arc<crate::admission::Admission>,
    pub slots: crate::admission::ListenerSlots,
}

impl StreamGate {
    fn admit(&self, peer: SocketAddr) -> Result<[crate::admission::Permit; 2], crate::refusal::LimitKind> {
        Ok([
            self.admission.admit(&self.slots, peer.ip())?,
            self.admission.admit(&self.slots, peer.ip())?,
        ])
    }
}

/// Serves one node connection until it ends or the proxy stops.
pub(crate) async fn serve(
    egress: Arc<Egress>,
    stream: TcpStream,
    peer: SocketAddr,
    listener: Arc<NodeListener>,
    gate: StreamGate,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(listener.tls.get());
    let handshake = tokio::time::timeout(egress.limits.head_timeout, acceptor.accept(stream)).await;
    let tls = match handshake {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return refuse_connection(&egress, peer, NodeRefusal::Handshake(e.to_string())).await,
        Err(_) => {
            let why = NodeRefusal::Handshake("timed out".into());
            return refuse_connection(&egress, peer, why).await;
        }
    };
    let (_, conn) = tls.get_ref();
    let h2 = match conn.alpn_protocol() {
        Some(b"h2") => true,
        Some(b"http/1.1") => false,
        _ => {
            let why = NodeRefusal::Handshake("the node offered neither h2 nor http/1.1 (ALPN)".into());
            return refuse_connection(&egress, peer, why).await;
        }
    };
    let names = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(tls::cert_names)
        .unwrap_or_default();
    let Some(node) = listener.nodes().find(names.iter().map(String::as_str)).cloned() else {
        return refuse_connection(&egress, peer, NodeRefusal::Unknown(names.join(", "))).await;
    };
    tracing::debug!(%peer, node = %node.name, "node connected");
    let names: Arc<[String]> = Arc::from(names);
    let service = {
        let egress = egress.clone();
        let tracker = tracker.clone();
        let listener = listener.clone();
        hyper::service::service_fn(move |req| {
            let (egress, tracker, listener, names, gate) = (
                egress.clone(),
                tracker.clone(),
                listener.clone(),
                names.clone(),
                gate.clone(),
            );
            async move {
                // The node's entry as it stands now: a reload that drops or narrows it
                // applies to the next stream of a connection already up.
                let node = listener.nodes().find(names.iter().map(String::as_str)).cloned();
                // In a task of its own: a stream the node resets mid-decision (hyper then
                // drops this future) is still decided, dialled and recorded to the end.
                let work = tokio::spawn(stream_request(egress, peer, node, names, gate, tracker, req));
                Ok::<_, Infallible>(work.await.unwrap_or_else(|_| {
                    let mut r = Response::new(Full::new(Bytes::new()));
                    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    r
                }))
            }
        })
    };
    if !h2 {
        // HTTP/1.1: one tunnel per connection (`--upstream-transport http1`, for comparison).
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(egress.limits.head_timeout)
            .max_buf_size(16 * 1024)
            .serve_connection(TokioIo::new(tls), service)
            .with_upgrades();
        tokio::pin!(connection);
        tokio::select! {
            _ = connection.as_mut() => {}
            () = stop.cancelled() => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
        }
        return;
    }
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_STREAMS)
        .max_frame_size(MAX_FRAME)
        .keep_alive_interval(Some(KEEPALIVE))
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .max_header_list_size(16 * 1024);
    let connection = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = stop.cancelled() => {
            // No new streams; the ones open run on (their tunnels are tracked tasks).
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// Records a refused node connection (there is no HTTP exchange to answer on).
async fn refuse_connection(egress: &Egress, peer: SocketAddr, why: NodeRefusal) {
    tracing::warn!(%peer, reason = %why, "node connection refused");
    let pending = egress.begin(peer, Arc::new(Identity::default()), None);
    let _ = egress.refuse(pending, None, Refusal::Node(why)).await;
}

/// One stream: checks, decides, dials; on success answers 200 and carries the tunnel in a
/// tracked task.
async fn stream_request(
    egress: Arc<Egress>,
    peer: SocketAddr,
    node: Option<NodeSpec>,
    cert_names: Arc<[String]>,
    gate: StreamGate,
    tracker: TaskTracker,
    mut req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let method = Cow::Owned(req.method().as_str().to_owned());
    let claimed = attribution::read(req.headers());
    let identity = Arc::new(claimed.clone().unwrap_or_default());
    let name = node.as_ref().map(|n| Arc::<str>::from(n.name.as_str()));
    let pending = egress.begin_via(peer, identity.clone(), Some(method), name);
    let permits = match gate.admit(peer) {
        Ok(p) => p,
        Err(kind) => return refused(egress.refuse(pending, None, Refusal::ConnectionLimit(kind)).await),
    };
    let Some(node) = node else {
        let why = NodeRefusal::Unknown(cert_names.join(", "));
        return refused(egress.refuse(pending, None, Refusal::Node(why)).await);
    };
    if req.method() != Method::CONNECT {
        let why = NodeRefusal::NotConnect(req.method().to_string());
        return refused(egress.refuse(pending, None, Refusal::Node(why)).await);
    }
    if let Err(e) = claimed {
        return refused(egress.refuse(pending, None, Refusal::Node(e.into())).await);
    }
    if let Err(e) = node.vouches(identity.task.as_deref(), identity.project.as_deref()) {
        return refused(egress.refuse(pending, None, Refusal::Node(e.into())).await);
    }
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default();
    let target = match sandgate_policy::target::parse_connect_target(&authority) {
        Ok(t) => t,
        Err(e) => return refused(egress.refuse(pending, None, Refusal::Target(e)).await),
    };
    let access = match req.headers().get(ACCESS_FIELD).map(|v| v.as_bytes()) {
        Some(b"http") => Access::Http,
        _ => Access::Connect,
    };
    let decided = match egress.decide(pending, &target, access).await {
        Ok(d) => d,
        Err(r) => return refused(r),
    };
    let dialed = match decided.dial(&egress).await {
        Ok(d) => d,
        Err(r) => return refused(r),
    };
    // The bridge before the answer: a 200 promises a tunnel.
    let (core, pump) = match bridge::pair() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "cannot bridge a node stream");
            let refusal = Refusal::ConnectionLimit(crate::refusal::LimitKind::Proxy);
            return refused(dialed.refuse(&egress, refusal).await);
        }
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tracker.spawn(async move {
        let _permits = permits;
        let stream = match upgrade.await {
            Ok(s) => s,
            Err(_) => return egress.abandon(dialed, Some(200)).await,
        };
        // The node resetting its stream ends the tunnel here too (an error, not a half-close).
        let reset = dialed.stop().child_token();
        let pump_reset = reset.clone();
        let carry = async move {
            egress
                .carry_linked(&core, dialed, Vec::new(), Some(200), Some(reset))
                .await;
            // `core` is dropped here: the pump sees the end and resets the stream.
        };
        tokio::join!(carry, bridge::pump(stream, pump, Some(pump_reset)));
    });
    Response::new(Full::new(Bytes::new()))
}

/// A refusal as an HTTP/2 response: the status, `Proxy-Status` (RFC 9209) and a short body.
fn refused(r: Refused) -> Response<Full<Bytes>> {
    let c = &r.classified;
    let body = format!("sandgate: {}\nrequest id: {}\n", c.text, r.id);
    let status = StatusCode::from_u16(c.status).unwrap_or(StatusCode::FORBIDDEN);
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let proxy_status = format!(
        "sandgate; error={}; details={}",
        c.error_type,
        crate::http1::render::sf_string(&c.text)
    );
    if let Ok(v) = hyper::header::HeaderValue::from_str(&proxy_status) {
        response.headers_mut().insert("proxy-status", v);
    }
    response
}
