//! A central proxy's front end for node-local proxies (`role: node`): a TLS handshake that
//! requires a client certificate from the listener's CA, the node known by its
//! certificate's first name in `spec.nodes`, then HTTP/2. Each stream is a CONNECT (RFC 9113
//! section 8.5) whose attribution fields the node's entry must vouch for: a tunnel, which
//! the core decides, vets, dials, records and relays like any other, or (`sandgate-access:
//! http`) a stream of plain HTTP requests for one destination, served by the HTTP/1 front
//! end, each request decided and recorded on its own. A refused handshake, an unknown node
//! and a refused stream are each one deny on record.

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use sandgate_policy::{Access, Identity, NodeSpec, Target};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::Permit;
use crate::egress::{self, Dialed, Egress, Refused};
use crate::http1::{self, ClientConn};
use crate::refusal::{NodeRefusal, Refusal};
use crate::relay::{Leg, NodeStream};
use crate::transport::{
    ACCESS_FIELD, CONNECTION_WINDOW, MAX_FRAME, MAX_HEADER_LIST, MAX_STREAMS, NodeListener, STREAM_WINDOW,
    attribution, bridge, tls,
};

/// The connection limits each stream counts against, like a connection of its own: a
/// stream's tunnel holds a descriptor (the upstream socket; an HTTP/1.1-transport tunnel
/// also a bridge's pair, beside the connection's own slot) and memory on the central
/// whichever connection it came on, so one node cannot use up the descriptors by
/// multiplexing.
#[derive(Debug, Clone)]
pub(crate) struct StreamGate {
    pub admission: Arc<crate::admission::Admission>,
    pub slots: crate::admission::ListenerSlots,
}

impl StreamGate {
    fn admit(&self, peer: SocketAddr) -> Result<Permit, crate::refusal::LimitKind> {
        self.admission.admit(&self.slots, peer.ip())
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
    // Told of the TLS files' next reload (subscribed before the configuration is taken,
    // so none is missed): the connection then takes no new streams.
    let reloads = listener.tls.subscribe();
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
    let Some(node) = listener.nodes().find(names.first().map(String::as_str)).cloned() else {
        return refuse_connection(&egress, peer, NodeRefusal::Unknown(names.join(", "))).await;
    };
    tracing::debug!(%peer, node = %node.name, "node connected");
    let names: Arc<[String]> = Arc::from(names);
    let conn = Conn {
        egress,
        peer,
        listener,
        names,
        gate,
        stop: stop.clone(),
    };
    if h2 {
        serve_h2(conn, tls, tracker, stop, reloads).await;
    } else {
        serve_http1(conn, tls, tracker, stop).await;
    }
}

/// One node connection's parts each stream needs.
#[derive(Clone)]
struct Conn {
    egress: Arc<Egress>,
    peer: SocketAddr,
    listener: Arc<NodeListener>,
    /// The names of the node's certificate.
    names: Arc<[String]>,
    gate: StreamGate,
    /// The proxy is stopping: a stream of requests ends between requests.
    stop: CancellationToken,
}

impl Conn {
    /// The node's entry as it stands now: a reload that drops or narrows it applies to the
    /// next stream of a connection already up.
    fn node(&self) -> Option<NodeSpec> {
        self.listener
            .nodes()
            .find(self.names.first().map(String::as_str))
            .cloned()
    }
}

/// HTTP/2: each stream in a tracked task of its own (a stream the node resets mid-decision
/// is still decided, dialled and recorded to the end), relayed by the core as it is. When
/// the listener's TLS files are reloaded (a rotated client CA among them), the connection
/// gets GOAWAY: the node opens its next streams on a new connection, which must pass the
/// new files, while the streams open here run on.
async fn serve_h2(
    conn: Conn,
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    tracker: TaskTracker,
    stop: CancellationToken,
    mut reloads: tokio::sync::watch::Receiver<u64>,
) {
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_STREAMS)
        .max_frame_size(MAX_FRAME)
        .max_header_list_size(MAX_HEADER_LIST);
    let handshake = builder.handshake::<_, Bytes>(tls);
    let mut connection = match tokio::time::timeout(conn.egress.limits.head_timeout, handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return tracing::debug!(peer = %conn.peer, error = %e, "node connection: no HTTP/2"),
        Err(_) => return tracing::debug!(peer = %conn.peer, "node connection: no HTTP/2 preface in time"),
    };
    let keepalive = crate::transport::keepalive(connection.ping_pong());
    tokio::pin!(keepalive);
    let mut stopping = false;
    // Told of a reload once (or the listener is gone: nothing more to hear).
    let mut retired = false;
    loop {
        tokio::select! {
            next = connection.accept() => match next {
                Some(Ok((request, respond))) => {
                    tracker.spawn(conn.egress.droppable(h2_stream(conn.clone(), request, respond)));
                }
                Some(Err(e)) => {
                    tracing::debug!(peer = %conn.peer, error = %e, "node connection ended");
                    break;
                }
                None => break,
            },
            // No new streams; the ones open run on (the connection is served until they end).
            () = stop.cancelled(), if !stopping => {
                connection.graceful_shutdown();
                stopping = true;
            }
            changed = reloads.changed(), if !stopping && !retired => {
                retired = true;
                if changed.is_ok() {
                    tracing::debug!(peer = %conn.peer, "TLS files reloaded; the node's connection takes no new streams");
                    connection.graceful_shutdown();
                    stopping = true;
                }
            }
            () = &mut keepalive => {
                tracing::warn!(peer = %conn.peer, "node stopped answering pings; connection dropped");
                break;
            }
        }
    }
}

/// One HTTP/2 stream: checked; a tunnel decided and dialled, then answered 200 and
/// carried; a stream of plain HTTP requests answered 200 and served request by request.
async fn h2_stream(
    conn: Conn,
    request: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    let (parts, body) = request.into_parts();
    let (admitted, _permits) = match admit(&conn, &parts).await {
        Ok(admitted) => admitted,
        Err(refused) => {
            let (head, body) = refusal(refused);
            if let Ok(mut send) = respond.send_response(head, false) {
                let _ = send.send_data(body, true);
            }
            return;
        }
    };
    let send = respond.send_response(Response::new(()), false);
    match (admitted, send) {
        (Admitted::Tunnel(dialed), Ok(send)) => {
            let dialed = *dialed;
            let mut stream = NodeStream::new(send, body, None);
            conn.egress
                .carry(Leg::Stream(&mut stream), dialed, Vec::new(), Some(200))
                .await;
        }
        (Admitted::Tunnel(dialed), Err(_)) => conn.egress.abandon(*dialed, Some(200)).await,
        (Admitted::Requests(r), Ok(send)) => {
            let mut client = r.client(&conn, NodeStream::new(send, body, None));
            http1::serve_node_stream(&conn.egress, &mut client, &r.target, &conn.stop).await;
            client.stream.linger().await;
        }
        (Admitted::Requests(_), Err(_)) => {}
    }
}

/// What an admitted stream carries.
enum Admitted {
    /// A tunnel, decided and dialled.
    Tunnel(Box<Dialed>),
    /// Plain HTTP requests for one destination, each to be decided on its own.
    Requests(Requests),
}

/// A node's stream of plain HTTP requests: who they are from and where they go.
struct Requests {
    target: Target,
    identity: Arc<Identity>,
    node: Arc<str>,
}

impl Requests {
    fn client<S: AsyncRead + AsyncWrite + Unpin>(&self, conn: &Conn, stream: S) -> ClientConn<S> {
        let mut client = ClientConn::new(stream, conn.peer, self.identity.clone());
        client.node = Some(self.node.clone());
        client
    }
}

/// HTTP/1.1: one tunnel per connection (`--upstream-transport http1`, for comparison),
/// bridged to the core through a socket pair.
async fn serve_http1(
    conn: Conn,
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let head_timeout = conn.egress.limits.head_timeout;
    let service = hyper::service::service_fn(move |req| {
        let (conn, tracker) = (conn.clone(), tracker.clone());
        async move {
            // In a task of its own: a request the node drops mid-decision is still decided,
            // dialled and recorded to the end.
            let work = tokio::spawn(http1_request(conn, tracker, req));
            Ok::<_, Infallible>(work.await.unwrap_or_else(|_| {
                let mut r = Response::new(Full::new(Bytes::new()));
                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                r
            }))
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
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
}

/// One HTTP/1.1 CONNECT: on success answers 200 and carries the tunnel, or serves the
/// stream of plain HTTP requests, in a tracked task.
async fn http1_request(
    conn: Conn,
    tracker: TaskTracker,
    mut req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let (dialed, permits) = match admit(&conn, &to_parts(&req)).await {
        Ok((Admitted::Tunnel(dialed), permits)) => (*dialed, permits),
        Ok((Admitted::Requests(r), permits)) => {
            let upgrade = hyper::upgrade::on(&mut req);
            let egress = conn.egress.clone();
            tracker.spawn(egress.droppable(async move {
                let _permits = permits;
                let Ok(stream) = upgrade.await else { return };
                let mut client = r.client(&conn, TokioIo::new(stream));
                http1::serve_node_stream(&conn.egress, &mut client, &r.target, &conn.stop).await;
                let _ = client.stream.shutdown().await;
            }));
            return Response::new(Full::new(Bytes::new()));
        }
        Err(refused) => {
            let (head, body) = refusal(refused);
            return head.map(|()| Full::new(body));
        }
    };
    let egress = conn.egress;
    let stall = egress.limits.tunnel_idle_timeout;
    // The bridge before the answer: a 200 promises a tunnel.
    let (core, pump) = match bridge::pair() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "cannot bridge a node connection");
            let refusal_ = Refusal::ConnectionLimit(crate::refusal::LimitKind::Proxy);
            let (head, body) = refusal(dialed.refuse(&egress, refusal_).await);
            return head.map(|()| Full::new(body));
        }
    };
    let upgrade = hyper::upgrade::on(&mut req);
    let droppable = egress.clone();
    tracker.spawn(droppable.droppable(async move {
        let _permits = permits;
        let stream = match upgrade.await {
            Ok(s) => s,
            Err(_) => return egress.abandon(dialed, Some(200)).await,
        };
        // The connection failing ends the tunnel here too (an error, not a half-close).
        let reset = dialed.stop().child_token();
        let pump_reset = reset.clone();
        let carry = async move {
            egress
                .carry_linked(Leg::Tcp(&core), dialed, Vec::new(), Some(200), Some(reset))
                .await;
            // `core` is dropped here: the pump sees the end and resets the connection.
        };
        tokio::join!(
            carry,
            bridge::pump(TokioIo::new(stream), pump, Some(pump_reset), stall)
        );
    }));
    Response::new(Full::new(Bytes::new()))
}

/// A request's head without its body.
fn to_parts<B>(req: &Request<B>) -> hyper::http::request::Parts {
    let mut parts = Request::new(()).into_parts().0;
    parts.method = req.method().clone();
    parts.uri = req.uri().clone();
    parts.headers = req.headers().clone();
    parts
}

/// Records a refused node connection (there is no HTTP exchange to answer on).
async fn refuse_connection(egress: &Egress, peer: SocketAddr, why: NodeRefusal) {
    tracing::warn!(%peer, reason = %why, "node connection refused");
    let pending = egress.begin(peer, Arc::new(Identity::default()), None);
    let _ = egress.refuse(pending, None, Refusal::Node(why)).await;
}

/// One stream's request: admitted against the connection limits, the node's entry checked
/// (known, a CONNECT, attribution it may vouch for), then a tunnel decided and dialled by
/// the core (a stream of plain HTTP requests is decided request by request). The permits
/// are the stream's for as long as it lasts.
async fn admit(conn: &Conn, req: &hyper::http::request::Parts) -> Result<(Admitted, Permit), Refused> {
    let egress = &conn.egress;
    let node = conn.node();
    let claimed = attribution::read(&req.headers);
    let identity = Arc::new(claimed.clone().unwrap_or_default());
    let name = node.as_ref().map(|n| Arc::<str>::from(n.name.as_str()));
    // A stream of plain HTTP requests is not a request itself (each request on it is begun,
    // decided and recorded on its own): a request is begun here only to be refused, or for
    // a tunnel.
    let begin = || {
        let method = Cow::Owned(req.method.as_str().to_owned());
        egress.begin_via(conn.peer, identity.clone(), Some(method), name.clone())
    };
    let refuse = |refusal| async { Err(egress.refuse(begin(), None, refusal).await) };
    let permits = match conn.gate.admit(conn.peer) {
        Ok(p) => p,
        Err(kind) => return refuse(Refusal::ConnectionLimit(kind)).await,
    };
    let Some(node) = node else {
        let why = NodeRefusal::Unknown(conn.names.join(", "));
        return refuse(Refusal::Node(why)).await;
    };
    if req.method != Method::CONNECT {
        let why = NodeRefusal::NotConnect(req.method.to_string());
        return refuse(Refusal::Node(why)).await;
    }
    if let Err(e) = claimed {
        return refuse(Refusal::Node(e.into())).await;
    }
    if let Err(e) = node.vouches(identity.task.as_deref(), identity.project.as_deref()) {
        return refuse(Refusal::Node(e.into())).await;
    }
    let authority = req
        .uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default();
    let target = match sandgate_policy::target::parse_connect_target(&authority) {
        Ok(t) => t,
        Err(e) => return refuse(Refusal::Target(e)).await,
    };
    if let Some(b"http") = req.headers.get(ACCESS_FIELD).map(|v| v.as_bytes()) {
        let requests = Requests {
            target,
            identity,
            node: Arc::from(node.name.as_str()),
        };
        return Ok((Admitted::Requests(requests), permits));
    }
    let request = egress::Request {
        peer: conn.peer,
        identity,
        node: name,
        method: Cow::Owned(req.method.as_str().to_owned()),
        path: None,
        dest: Ok((target, Access::Connect)),
    };
    let decided = egress.clear(request).await?;
    let dialed = decided.dial(egress).await?;
    Ok((Admitted::Tunnel(Box::new(dialed)), permits))
}

/// A refusal as a response head and body: the status, `Proxy-Status` (RFC 9209) and a
/// short text.
fn refusal(r: Refused) -> (Response<()>, Bytes) {
    let c = &r.classified;
    let body = format!("sandgate: {}\nrequest id: {}\n", c.text, r.id);
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::from_u16(c.status).unwrap_or(StatusCode::FORBIDDEN);
    let proxy_status = format!(
        "sandgate; error={}; details={}",
        c.error_type,
        crate::http1::render::sf_string(&c.text)
    );
    if let Ok(v) = hyper::header::HeaderValue::from_str(&proxy_status) {
        response.headers_mut().insert("proxy-status", v);
    }
    (response, Bytes::from(body))
}
