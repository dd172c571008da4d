//! The HTTP/1.1 front end: one client connection's request loop. It owns the wire format
//! only: request heads ([`head`], [`framing`]), task credentials in `Proxy-Authorization`,
//! absolute-form forwarding ([`forward`]), the CONNECT reply ([`connect`]) and the rendering
//! of refusals ([`render`]). Deciding, vetting, dialling and recording belong to the egress
//! core ([`crate::egress`]), which this module calls and which never calls back.

mod auth;
mod body;
pub(crate) mod connect;
pub(crate) mod forward;
pub(crate) mod intercept;
mod outbound;
pub(crate) mod render;
mod rewrite;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use sandgate_policy::{Access, Target, parse_connect_target, parse_http_target};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::config::{Identity, Limits};
use crate::egress::{Egress, Pending, Refused};
use crate::h1::head::{HeadError, RequestHead, parse_request_head};
use crate::refusal::{NodeRefusal, Refusal};

/// A client connection with its read buffer (bytes received but not yet consumed): a
/// client's socket, or a node's stream of requests on a central proxy.
#[derive(Debug)]
pub(crate) struct ClientConn<S = TcpStream> {
    pub stream: S,
    pub buf: BytesMut,
    pub peer: SocketAddr,
    pub identity: Arc<Identity>,
    /// On a central proxy: the node that forwarded the requests.
    pub node: Option<Arc<str>>,
    /// Set once a request on this connection was allowed by a revocable rule (an
    /// exception) or an entry with an expiry: its revocation or expiry closes the kept-alive
    /// connection too.
    pub cut: Option<(CancellationToken, crate::cuts::CutGuard)>,
    /// What the connection was admitted as, to admit the upstream connections an
    /// intercepted tunnel opens past its own (`None`: it opens none).
    pub standing: Option<Arc<crate::admission::Standing>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> ClientConn<S> {
    pub fn new(stream: S, peer: SocketAddr, identity: Arc<Identity>) -> ClientConn<S> {
        ClientConn {
            stream,
            buf: BytesMut::new(),
            peer,
            identity,
            node: None,
            cut: None,
            standing: None,
        }
    }

    /// A request from this client (named `method`, when its head was read).
    pub fn begin(&self, egress: &Egress, method: Option<String>) -> Pending {
        egress.begin_via(
            self.peer,
            self.identity.clone(),
            method.map(Into::into),
            self.node.clone(),
        )
    }

    /// Writes a recorded refusal as an HTTP/1 response (the connection then closes).
    pub async fn reply(&mut self, refused: &Refused) {
        let bytes = render::render(&refused.classified, &refused.id);
        let _ = self.stream.write_all(&bytes).await;
        let _ = self.stream.flush().await;
    }
}

/// Where a connection's requests come from: a client of this proxy (credentials checked
/// when the listener requires them; CONNECT becomes a tunnel), or a node's stream of plain
/// HTTP requests for one destination (`stream`: the authority its CONNECT named; the node
/// vouched for the identity, and a CONNECT or another destination inside is refused).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source<'a> {
    Client { require_auth: bool },
    Node { stream: &'a Target },
}

/// What to do after one exchange.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    KeepAlive,
    Close,
}

/// Serves one client connection: requests until it ends, then a CONNECT tunnel if the last
/// request asked for one. `held` (the connection's admission) is kept until the end.
///
/// The request loop and the CONNECT's set-up run boxed and are freed before the tunnel is
/// carried, so a long-lived tunnel's task holds only the socket, the dialled tunnel and
/// the carrying state: this is every idle tunnel's size (issue 32). They are droppable
/// ([`Egress::droppable`]); the tunnel's own waits end at its stop token.
pub(crate) fn serve<H: Send>(
    egress: Arc<Egress>,
    client: ClientConn,
    require_auth: bool,
    stop: CancellationToken,
    held: H,
) -> impl Future<Output = ()> + Send {
    // A plain function returning an `async` block, the request loop boxed before it: an
    // `async fn` would hold its arguments twice, and the block keeps only what it captures
    // (this future is every idle tunnel's).
    let requests = Box::pin(serve_requests(egress.clone(), client, require_auth, stop));
    async move {
        // (`let else`, not `if let`: what the request loop returned is not kept beside the
        // tunnel's future.)
        let Some(connect::Tunnel {
            stream,
            dialed,
            early,
        }) = egress.droppable(requests).await.flatten()
        else {
            return;
        };
        egress
            .carry(crate::relay::Leg::Tcp(&stream), dialed, early, Some(200))
            .await;
        drop(held);
    }
}

/// The requests of one client connection, until it ends or becomes a tunnel: then the
/// tunnel, answered and still to be carried.
async fn serve_requests(
    egress: Arc<Egress>,
    mut client: ClientConn,
    require_auth: bool,
    stop: CancellationToken,
) -> Option<connect::Tunnel> {
    let source = Source::Client { require_auth };
    let listener = client.identity.clone();
    // The first request is read and checked in a small future of its own: a CONNECT, a
    // tunnel's one request, never makes the request loop's state (kilobytes, for plain
    // HTTP), so a burst of new tunnels holds little each while they are set up (issue 32).
    let first = next_request(&egress, &mut client, source, &stop, &listener).await?;
    let head = match first.is_connect() {
        true => first,
        false => {
            let requests = request_loop(&egress, &mut client, source, &stop, Some(first), &listener);
            Box::pin(requests).await?
        }
    };
    drop(stop);
    connect::handle_connect(&egress, client, head).await
}

/// Answers a connection the proxy will not serve (a full limit) with the refusal and
/// closes it after reading what the client sent, so the answer is not lost to a reset.
pub(crate) async fn refuse_connection(egress: &Egress, mut client: ClientConn, refusal: Refusal) {
    let limit = std::time::Duration::from_secs(1);
    let pending = client.begin(egress, None);
    let answered = async {
        let refused = egress.refuse(pending, None, refusal).await;
        client.reply(&refused).await;
    };
    let _ = tokio::time::timeout(limit, answered).await;
    let _ = tokio::time::timeout(limit, async {
        let _ = client.stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let mut budget = 64 * 1024usize;
        while budget > 0 {
            match client.stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => budget = budget.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Serves a node's stream of plain HTTP requests (on a central proxy) until it ends or must
/// end (a refusal, `Connection: close`, idle past the head timeout, the proxy stopping):
/// each request decided, dialled, forwarded and recorded like a client's. The caller ends
/// the stream.
pub(crate) async fn serve_node_stream<S>(
    egress: &Egress,
    client: &mut ClientConn<S>,
    stream: &Target,
    stop: &CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let source = Source::Node { stream };
    let listener = client.identity.clone();
    let _ = Box::pin(request_loop(egress, client, source, stop, None, &listener)).await;
}

/// Serves requests (`first`, already read and checked, then the next ones) until the
/// connection ends, or returns a CONNECT head, for the connection to become a tunnel.
/// `listener`: the identity a refused login falls back to.
async fn request_loop<S>(
    egress: &Egress,
    client: &mut ClientConn<S>,
    source: Source<'_>,
    stop: &CancellationToken,
    mut first: Option<RequestHead>,
    listener: &Arc<Identity>,
) -> Option<RequestHead>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut outbound = outbound::Kept::default();
    loop {
        let head = match first.take() {
            Some(head) => head,
            None => next_request(egress, client, source, stop, listener).await?,
        };
        if head.is_connect() {
            return Some(head);
        }
        // Not boxed (a box per request cost about 3% of a GET's CPU): the request loop runs
        // in a future of its own, freed before a tunnel is carried ([`serve`]).
        if forward::handle_http(egress, client, head, &mut outbound.0).await == Next::Close {
            return None;
        }
    }
}

/// Reads the next request head and checks it: credentials (a login replaces the
/// connection's identity; a refused one falls back to `listener`'s), or a node stream's
/// destination. A bad head or a refusal is recorded and answered. `None`: the connection
/// ends.
async fn next_request<S>(
    egress: &Egress,
    client: &mut ClientConn<S>,
    source: Source<'_>,
    stop: &CancellationToken,
    listener: &Arc<Identity>,
) -> Option<RequestHead>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let head = match read_request_head(client, &egress.limits, stop).await {
        Ok(Some(head)) => head,
        Ok(None) => return None,
        Err(refusal) => {
            let pending = client.begin(egress, None);
            let refused = egress.refuse(pending, None, refusal).await;
            client.reply(&refused).await;
            return None;
        }
    };
    // Credentials, or a node stream's destination. (The fail-closed check on the audit
    // trail is the core's, in `Egress::decide`.)
    let refusal = match source {
        Source::Node { stream } => node_request(&head, stream).err(),
        Source::Client { require_auth: false } => None,
        Source::Client { require_auth: true } => match authenticate(egress, &head, listener) {
            Ok(identity) => {
                client.identity = identity;
                None
            }
            Err(e) => {
                // A refused request carries no identity an earlier request proved.
                client.identity = listener.clone();
                Some(Refusal::ProxyAuth(e))
            }
        },
    };
    if let Some(refusal) = refusal {
        let pending = client.begin(egress, Some(head.method.clone()));
        // Refused before any decision, but the record still names where it was going.
        let dest = requested(&head);
        let refused = egress
            .refuse(pending, dest.as_ref().map(|(t, a)| (t, *a)), refusal)
            .await;
        client.reply(&refused).await;
        return None;
    }
    Some(head)
}

/// The destination a head asks for, when its target parses (for the record of a request
/// refused before it was decided).
fn requested(head: &RequestHead) -> Option<(Target, Access)> {
    if head.is_connect() {
        parse_connect_target(&head.target)
            .ok()
            .map(|t| (t, Access::Connect))
    } else {
        parse_http_target(&head.target)
            .ok()
            .map(|t| (t.target, Access::Http))
    }
}

/// Checks a request's task credentials (RFC 7617 Basic in `Proxy-Authorization`); the
/// credential's task and project replace the listener's (empty) identity for this request.
/// The policy file refuses a project on an auth listener; the listener adds only its job
/// and subject.
fn authenticate(
    egress: &Egress,
    head: &RequestHead,
    listener: &Identity,
) -> Result<Arc<Identity>, sandgate_policy::AuthError> {
    let header = head
        .fields
        .iter()
        .find(|f| f.is("proxy-authorization"))
        .map(|f| f.value.as_slice());
    let (task, secret) = auth::basic_login(header)?;
    egress.login(&task, &secret, listener)
}

/// Whether a request on a node's stream is one the stream may carry: plain HTTP in absolute
/// form for the destination the stream was opened for.
fn node_request(head: &RequestHead, stream: &Target) -> Result<(), Refusal> {
    let other = |what: String| Err(Refusal::Node(NodeRefusal::StreamRequest(what)));
    if head.is_connect() {
        return other(format!("CONNECT {}", head.target));
    }
    match parse_http_target(&head.target) {
        Ok(t) if t.target == *stream => Ok(()),
        Ok(t) => other(format!("a request for {} on a stream for {stream}", t.target)),
        Err(e) => Err(Refusal::Target(e)),
    }
}

/// Reads one request head. `Ok(None)`: the connection ended (or idled out, or the proxy is
/// stopping) between requests, which needs no answer.
async fn read_request_head<S: AsyncRead + Unpin>(
    client: &mut ClientConn<S>,
    limits: &Limits,
    stop: &CancellationToken,
) -> Result<Option<RequestHead>, Refusal> {
    let deadline = tokio::time::Instant::now() + limits.head_timeout;
    // Where the bytes not yet looked at begin: a head ends with a line end, so it is parsed
    // again only once one came (or the limit is reached), not on every read: a head sent a
    // byte at a time is parsed once a line, not once a byte (a 16 KiB one, 130 MB scanned).
    let mut unseen = 0;
    loop {
        let fresh = client.buf.get(unseen..).unwrap_or_default();
        if fresh.contains(&b'\n') || (!fresh.is_empty() && client.buf.len() >= limits.max_head_bytes) {
            #[cfg(test)]
            tests::PARSES.with(|n| n.set(n.get() + 1));
            // Parsed within the limit only: a head over it is refused however the reads
            // fell (whole in one large read too), and bytes behind a head are not looked at.
            let window = client.buf.get(..limits.max_head_bytes).unwrap_or(&client.buf);
            match parse_request_head(window) {
                Ok(Some((head, len))) => {
                    client.buf.advance(len);
                    return Ok(Some(head));
                }
                Ok(None) if window.len() >= limits.max_head_bytes => return Err(Refusal::HeadTooLarge),
                Ok(None) => {}
                Err(HeadError::TooManyFields) => return Err(Refusal::HeadTooLarge),
                Err(e) => return Err(Refusal::Head(e)),
            }
        }
        let idle = client.buf.is_empty();
        // Bounded in bytes: never hold more than the head limit plus one read. A
        // connection's first read takes 1 KiB, which a CONNECT's head fits (a burst of new
        // tunnels holds no more each while they are set up); the next ones 4 KiB.
        let room = match client.buf.capacity() {
            0 => 1024,
            _ => 4096,
        };
        client.buf.reserve(room);
        unseen = client.buf.len();
        let cut = client.cut.as_ref().map(|(t, _)| t.clone()).unwrap_or_default();
        let read = tokio::select! {
            _ = stop.cancelled(), if idle => return Ok(None),
            // The exception that allowed an earlier request here was revoked.
            _ = cut.cancelled(), if client.cut.is_some() => return Ok(None),
            read = tokio::time::timeout_at(deadline, client.stream.read_buf(&mut client.buf)) => read,
        };
        match read {
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
            Ok(Ok(_)) => {}
            Err(_) if idle => return Ok(None),
            Err(_) => return Err(Refusal::HeadTimeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Heads parsed by [`read_request_head`] on this thread.
        pub(super) static PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// A head sent a byte at a time, as a client trying to make the proxy work would: it is
    /// read whole, and parsed once a line (at most), not once a byte (7,000 times here;
    /// with a 16 KiB head, 130 MB of scanning for one connection).
    #[test]
    fn a_head_sent_a_byte_at_a_time_is_parsed_once_a_line() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let filler = "x".repeat(150);
        let mut head = String::from("GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\n");
        for i in 0..40 {
            head.push_str(&format!("X-Field-{i}: {filler}\r\n"));
        }
        head.push_str("\r\n");
        let lines = head.matches('\n').count();
        let parsed = rt.block_on(async {
            let (ours, mut theirs) = tokio::io::duplex(64);
            let sender = async move {
                for byte in head.as_bytes() {
                    theirs.write_all(std::slice::from_ref(byte)).await.unwrap();
                    theirs.flush().await.unwrap();
                    tokio::task::yield_now().await;
                }
                theirs
            };
            let mut client = ClientConn::new(
                ours,
                "127.0.0.1:1".parse().unwrap(),
                Arc::new(Identity::default()),
            );
            let limits = Limits::default();
            let stop = CancellationToken::new();
            PARSES.with(|n| n.set(0));
            let (read, _theirs) = tokio::join!(read_request_head(&mut client, &limits, &stop), sender);
            read
        });
        let head = parsed.unwrap().expect("the head, read whole");
        assert_eq!(head.method, "GET");
        let parses = PARSES.with(std::cell::Cell::get);
        assert!(parses <= lines, "{parses} parses for a head of {lines} lines");
    }

    /// The size of the future `f` returns, without making one.
    fn future_size<A, B, C, D, E, F, Fut>(_: F) -> usize
    where
        F: FnOnce(A, B, C, D, E) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// As [`future_size`], for a function of six arguments.
    fn future_size6<A, B, C, D, E, G, F, Fut>(_: F) -> usize
    where
        F: FnOnce(A, B, C, D, E, G) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// An attacker's silent CONNECTs each hold one connection task for as long as the proxy
    /// lets them: the task's future is what each costs (with two socket registrations and
    /// a few small strings). The request loop and the CONNECT's set-up must be gone from it
    /// (issue 32: it was 5.5 KiB in a release build, 10 KiB before that), and so must a
    /// token of its own: the server spawns this future as it is.
    ///
    /// tokio allocates a task as its future plus 112 bytes (header, scheduler, id, stage tag,
    /// trailer; with the task tracker's token), rounded up to 128: at most 784 bytes keeps
    /// every idle tunnel's task at 896 bytes (it was 1,280: a 1,056-byte future, the
    /// admission held inline, inside the droppable wrapper, whose own token cost 112 bytes
    /// more on the heap).
    #[test]
    fn a_tunnels_task_holds_only_what_carrying_it_needs() {
        // The server hands each front end its admission boxed: one pointer, as here.
        let http1 = future_size(serve::<Box<()>>);
        let socks5 = future_size6(crate::socks5::serve::<Box<()>>);
        // 776 bytes each now, in a test build and a release alike.
        let limit = 784;
        println!("an HTTP/1 tunnel's future: {http1} bytes; a SOCKS5 one's: {socks5}");
        assert!(http1 <= limit, "an HTTP/1 tunnel's future is {http1} bytes");
        assert!(socks5 <= limit, "a SOCKS5 tunnel's future is {socks5} bytes");
    }
}
