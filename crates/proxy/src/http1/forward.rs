//! Plain-HTTP forwarding: one absolute-form request in, one origin-form request out, the
//! response relayed back (RFC 9110 section 7.6, RFC 9112).
//!
//! Each request on a client connection is decided on its own. An outbound connection is
//! kept for the next request only when that request names the same host and port, which
//! was already vetted, so reuse never skips the guard. The request-target decides the
//! destination; the Host header sent upstream is rewritten from it. Bodies are relayed
//! verbatim (chunk framing included); hop-by-hop fields are dropped both ways.

use std::net::SocketAddr;

use bytes::{Buf, BytesMut};
use sandgate_policy::{Access, Host, HttpTarget, parse_http_target};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use super::body::{RelayError, relay_body};
use super::rewrite::{request_head_bytes, response_head_bytes};
use super::{ClientConn, Next};
use crate::audit::event::{Outcome, UpstreamFailure as F};
use crate::egress::{Egress, End, Request};
use crate::h1::framing::BodyKind;
use crate::h1::head::{RequestHead, ResponseHead, parse_response_head};
use crate::refusal::{Refusal, ResponseError};
use crate::relay::Upstream;

/// Largest upstream response head accepted.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// A kept outbound connection idle for longer is not reused. A server closes an idle
/// connection on its own timer (Apache httpd and Node.js after 5 s, a central proxy after
/// its head timeout, 10 s by default); a request written as it does so is lost, and the
/// client would get a 502 for a request a fresh connection serves. Below the shortest
/// common timeout, that race cannot happen with those servers.
const KEEP_IDLE: std::time::Duration = std::time::Duration::from_secs(4);

/// A kept-alive outbound connection (to the origin, or to the upstream proxy when chained)
/// and the destination it was vetted for.
#[derive(Debug)]
pub(crate) struct Outbound {
    host: Host,
    port: u16,
    addr: SocketAddr,
    stream: Upstream,
    buf: BytesMut,
    /// The connection goes to an upstream proxy: requests go in absolute form.
    chained: bool,
    /// Who it was opened for: a central's stream carries the identity it was opened with,
    /// so a request of another (a second credential on the same client connection) gets a
    /// stream of its own.
    identity: std::sync::Arc<sandgate_policy::Identity>,
    /// When its last exchange ended (or it was opened).
    idle_since: std::time::Instant,
}

impl Outbound {
    /// A kept connection is reusable only if it has not idled past [`KEEP_IDLE`], the
    /// origin has not closed it and has sent nothing unasked (a non-blocking read that
    /// would block means both).
    fn is_alive(&mut self) -> bool {
        self.idle_since.elapsed() < KEEP_IDLE && self.buf.is_empty() && self.stream.is_idle()
    }
}

/// Handles one absolute-form request. Returns whether the client connection may carry on.
pub(crate) async fn handle_http<S: AsyncRead + AsyncWrite + Unpin>(
    egress: &Egress,
    client: &mut ClientConn<S>,
    head: RequestHead,
    outbound: &mut Option<Outbound>,
) -> Next {
    let (dest, http) = match parse_http_target(&head.target) {
        Ok(http) => (Ok((http.target.clone(), Access::Http)), Some(http)),
        Err(e) => (Err(Refusal::Target(e)), None),
    };
    let request = Request {
        peer: client.peer,
        identity: client.identity.clone(),
        node: client.node.clone(),
        method: head.method.clone().into(),
        path: http.as_ref().map(|h| h.origin_form.as_str()),
        dest,
    };
    let (decided, http) = match (egress.clear(request).await, http) {
        (Ok(decided), Some(http)) => (decided, http),
        (Err(refused), _) => {
            client.reply(&refused).await;
            return Next::Close;
        }
        // Never: the core refuses a destination that did not parse. (Dropped, the allow
        // would record itself as abandoned.)
        (Ok(_), None) => return Next::Close,
    };
    // Allowed by its method and path: what they cannot judge (a body on a read, a TRACE)
    // must not ride along.
    if decided.judged() && !sandgate_policy::judgeable(&head.method, head.body != BodyKind::Empty) {
        let refusal = Refusal::Target(sandgate_policy::TargetError::NotJudgeable);
        let refused = decided.refuse(egress, refusal).await;
        client.reply(&refused).await;
        return Next::Close;
    }
    // A credential's placeholder is never sent in the clear, nor to another host.
    let fields = head.fields.iter().map(|f| (f.name.as_str(), f.value.as_slice()));
    if let Err(leak) = egress.carried(&http.target, false, &http.origin_form, fields) {
        let refused = decided.refuse(egress, Refusal::CredentialLeak(leak)).await;
        client.reply(&refused).await;
        return Next::Close;
    }
    let mut grant = match connect(egress, decided, &http, &client.identity, outbound).await {
        Ok(grant) => grant,
        Err(refused) => {
            client.reply(&refused).await;
            return Next::Close;
        }
    };
    if let Some(kept) = grant.keep_cut() {
        client.cut = Some(kept);
    }
    let Some(up) = outbound.as_mut() else {
        let end = End {
            sent: 0,
            received: 0,
            status: None,
            outcome: Outcome::ClientFailure,
        };
        egress.close(grant, end).await;
        return Next::Close;
    };
    // A revocation or an expiry ends an exchange in flight too (a dripping download, an
    // endless upload).
    let stop = grant.stop().clone();
    let outcome = tokio::select! {
        outcome = exchange(egress, client, &head, &http, up) => outcome,
        _ = stop.cancelled(), if grant.cuttable() => Exchange::failed(0, 0, egress.cut_outcome(&grant)),
    };
    match outcome.refusal {
        // The upstream failed before a response: answer the client ourselves.
        Some(refusal) => {
            let refused = egress.fail(grant, refusal, outcome.sent, outcome.received).await;
            client.reply(&refused).await;
        }
        None => {
            let end = End {
                sent: outcome.sent,
                received: outcome.received,
                status: outcome.status,
                outcome: outcome.label,
            };
            egress.close(grant, end).await;
        }
    }
    if !outcome.outbound_reusable {
        // The origin closes it after a whole exchange (ended cleanly), or the exchange
        // failed (reset).
        if matches!(outcome.label, Outcome::Ok) {
            give_up(outbound);
        } else {
            *outbound = None;
        }
    } else if let Some(kept) = outbound.as_mut() {
        kept.idle_since = std::time::Instant::now();
    }
    if outcome.client_reusable && !head.close {
        Next::KeepAlive
    } else {
        Next::Close
    }
}

/// Reuses the kept outbound connection when it serves this same destination (the allow is
/// recorded with its address), or has the core open a new one.
async fn connect(
    egress: &Egress,
    decided: crate::egress::Decided,
    http: &HttpTarget,
    identity: &std::sync::Arc<sandgate_policy::Identity>,
    outbound: &mut Option<Outbound>,
) -> Result<crate::egress::Grant, crate::egress::Refused> {
    let reusable = outbound
        .as_mut()
        .filter(|u| u.host == http.target.host && u.port == http.target.port && u.identity == *identity)
        .and_then(|u| u.is_alive().then_some(u.addr));
    if let Some(addr) = reusable {
        return Ok(decided.reuse(egress, addr).await);
    }
    give_up(outbound);
    let opened = decided.open(egress).await?;
    *outbound = Some(Outbound {
        host: http.target.host.clone(),
        port: http.target.port,
        addr: opened.addr,
        stream: opened.stream,
        buf: BytesMut::new(),
        chained: opened.chained,
        identity: identity.clone(),
        idle_since: std::time::Instant::now(),
    });
    Ok(opened.grant)
}

/// Gives a kept connection up cleanly (one to another destination, or the client's
/// connection ended): a stream to a central proxy ends, rather than being reset.
pub(crate) fn give_up(outbound: &mut Option<Outbound>) {
    if let Some(o) = outbound.take() {
        o.stream.close();
    }
}

/// The kept connection of a client connection, given up cleanly when the connection ends,
/// however it does.
#[derive(Debug, Default)]
pub(crate) struct Kept(pub Option<Outbound>);

impl Drop for Kept {
    fn drop(&mut self) {
        give_up(&mut self.0);
    }
}

/// The result of relaying one request and its response.
#[derive(Debug)]
struct Exchange {
    sent: u64,
    received: u64,
    status: Option<u16>,
    label: Outcome,
    refusal: Option<Refusal>,
    client_reusable: bool,
    outbound_reusable: bool,
}

impl Exchange {
    fn failed(sent: u64, received: u64, label: Outcome) -> Exchange {
        Exchange {
            sent,
            received,
            status: None,
            label,
            refusal: None,
            client_reusable: false,
            outbound_reusable: false,
        }
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    egress: &Egress,
    client: &mut ClientConn<S>,
    head: &RequestHead,
    http: &HttpTarget,
    up: &mut Outbound,
) -> Exchange {
    let limits = &egress.limits;
    let out_head = request_head_bytes(head, http, up.chained);
    if let Err(_e) = up.stream.write_all(&out_head).await {
        return Exchange {
            refusal: Some(Refusal::Response {
                target: http.target.clone(),
                error: ResponseError::Closed,
            }),
            ..Exchange::failed(0, 0, Outcome::Upstream(F::Closed))
        };
    }
    let mut sent = out_head.len() as u64;
    let body_done = Notify::new();
    let (client_read, mut client_write) = tokio::io::split(&mut client.stream);
    let (up_read, mut up_write) = tokio::io::split(&mut up.stream);
    let mut client_read = client_read;
    let mut up_read = up_read;
    let request_body = async {
        let r = relay_body(
            &mut client_read,
            &mut client.buf,
            &mut up_write,
            head.body,
            limits.body_idle_timeout,
        )
        .await;
        body_done.notify_one();
        r
    };
    let response_head = read_response_head(
        &mut up_read,
        &mut up.buf,
        &mut client_write,
        &head.method,
        &body_done,
        limits.response_timeout,
    );
    let (body_result, head_result) = tokio::join!(request_body, response_head);
    if let Err(e) = &body_result {
        tracing::debug!(error = %e, "request body relay stopped");
    }
    let (mut received, interim) = match &head_result {
        Ok((_, n)) => (0, *n),
        Err(_) => (0, 0),
    };
    received += interim;
    match &body_result {
        Ok(n) => sent += n,
        Err(RelayError::Source(_) | RelayError::Truncated | RelayError::Framing(_)) => {
            return Exchange::failed(sent, received, Outcome::ClientFailure);
        }
        Err(RelayError::Dest(_) | RelayError::Idle | RelayError::Stalled) => {}
    }
    let response = match head_result {
        Ok((response, _)) => response,
        Err(error) => {
            let label = match error {
                ResponseError::Timeout => Outcome::Upstream(F::ResponseTimeout),
                _ => Outcome::Upstream(F::Closed),
            };
            return Exchange {
                refusal: Some(Refusal::Response {
                    target: http.target.clone(),
                    error,
                }),
                ..Exchange::failed(sent, received, label)
            };
        }
    };
    relay_response(
        egress,
        client,
        head,
        up,
        response,
        (sent, received),
        body_result.is_ok(),
    )
    .await
}

/// Sends the response head (with a small body that came along) and relays the body.
async fn relay_response<S: AsyncRead + AsyncWrite + Unpin>(
    egress: &Egress,
    client: &mut ClientConn<S>,
    head: &RequestHead,
    up: &mut Outbound,
    response: ResponseHead,
    (sent, mut received): (u64, u64),
    request_complete: bool,
) -> Exchange {
    let client_closes = head.close || response.close || !request_complete;
    let mut out = response_head_bytes(&response, client_closes);
    let mut body = response.body;
    // A small body that already arrived with the head goes out in the same write.
    if let BodyKind::Length(n) = body
        && let Some(whole) = usize::try_from(n).ok().and_then(|n| up.buf.get(..n))
    {
        out.extend_from_slice(whole);
        up.buf.advance(whole.len());
        body = BodyKind::Empty;
    }
    let idle = egress.limits.body_idle_timeout;
    if !matches!(
        tokio::time::timeout(idle, client.stream.write_all(&out)).await,
        Ok(Ok(()))
    ) {
        return Exchange::failed(sent, received, Outcome::ClientFailure);
    }
    received += out.len() as u64;
    let relayed = relay_body(
        &mut up.stream,
        &mut up.buf,
        &mut client.stream,
        body,
        egress.limits.body_idle_timeout,
    )
    .await;
    let status = Some(response.status);
    // When chained, the upstream proxy's own refusal is a refusal upstream, not an origin's
    // answer (classified in refusal.rs).
    let proxy_status = response
        .fields
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case("proxy-status"))
        .map(|f| f.value.as_slice());
    let label = if up.chained && crate::refusal::refused_upstream(response.status, proxy_status) {
        Outcome::Upstream(F::UpstreamDenied)
    } else {
        Outcome::Ok
    };
    match relayed {
        Ok(n) => Exchange {
            sent,
            received: received + n,
            status,
            label,
            refusal: None,
            client_reusable: !client_closes,
            outbound_reusable: !response.close && request_complete,
        },
        Err(e) => {
            tracing::debug!(error = %e, "response body relay stopped");
            let label = match e {
                RelayError::Dest(_) | RelayError::Stalled => Outcome::ClientFailure,
                RelayError::Idle => Outcome::Upstream(F::IdleTimeout),
                _ => Outcome::Upstream(F::ResponseBody),
            };
            Exchange {
                status,
                ..Exchange::failed(sent, received, label)
            }
        }
    }
}

/// Reads the final response head, forwarding any 1xx interim responses to the client as they
/// come, each rebuilt and filtered as a final response head is. The response timeout starts
/// once the request body has been sent. Returns the head and the bytes of interim responses
/// forwarded.
async fn read_response_head<R, W>(
    src: &mut R,
    buf: &mut BytesMut,
    client: &mut W,
    method: &str,
    body_done: &Notify,
    timeout: std::time::Duration,
) -> Result<(ResponseHead, u64), ResponseError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut interim = 0u64;
    let mut timer_armed = false;
    let mut deadline = tokio::time::Instant::now() + timeout;
    loop {
        if !buf.is_empty() {
            match parse_response_head(buf, method) {
                Ok(Some((head, len))) if (100..200).contains(&head.status) => {
                    if head.status == 101 {
                        return Err(ResponseError::Malformed(crate::h1::head::HeadError::Syntax(
                            "unrequested upgrade",
                        )));
                    }
                    // Rebuilt like a final response (CRLF line ends, hop-by-hop fields
                    // dropped, Via added), never relayed byte for byte (RFC 9110 15.2).
                    let rebuilt = response_head_bytes(&head, false);
                    client.write_all(&rebuilt).await.map_err(ResponseError::Io)?;
                    interim += rebuilt.len() as u64;
                    buf.advance(len);
                    continue;
                }
                Ok(Some((head, len))) => {
                    buf.advance(len);
                    return Ok((head, interim));
                }
                Ok(None) if buf.len() >= MAX_RESPONSE_HEAD => return Err(ResponseError::HeadTooLarge),
                Ok(None) => {}
                Err(crate::h1::head::HeadError::TooManyFields) => return Err(ResponseError::HeadTooLarge),
                Err(e) => return Err(ResponseError::Malformed(e)),
            }
        }
        buf.reserve(8192);
        let read = tokio::select! {
            read = src.read_buf(buf) => read,
            _ = body_done.notified(), if !timer_armed => {
                timer_armed = true;
                deadline = tokio::time::Instant::now() + timeout;
                continue;
            }
            _ = tokio::time::sleep_until(deadline), if timer_armed => return Err(ResponseError::Timeout),
        };
        match read {
            Ok(0) => return Err(ResponseError::Closed),
            Ok(_) => {}
            Err(e) => return Err(ResponseError::Io(e)),
        }
    }
}
