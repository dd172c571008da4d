//! Plain-HTTP forwarding: one absolute-form request in, one origin-form request out, the
//! response relayed back (RFC 9110 section 7.6, RFC 9112).
//!
//! Each request on a client connection is decided on its own. An outbound connection is
//! kept for the next request only when that request names the same host and port, which
//! was already vetted, so reuse never skips the guard. The request-target decides the
//! destination; the Host header sent upstream is rewritten from it. Bodies are relayed
//! verbatim (chunk framing included); hop-by-hop fields are dropped both ways.

use bytes::{Buf, BytesMut};
use sandgate_policy::{Access, HttpTarget, parse_http_target};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use super::body::{RelayError, relay_body};
use super::outbound::{Outbound, connect, give_up};
use super::rewrite::{request_head_bytes, response_head_bytes};
use super::{ClientConn, Next};
use crate::audit::event::{Outcome, UpstreamFailure as F};
use crate::egress::{Egress, End, Request};
use crate::h1::framing::{BodyKind, ChunkedScanner};
use crate::h1::head::{RequestHead, ResponseHead, parse_response_head};
use crate::refusal::{Refusal, ResponseError};

/// Largest upstream response head accepted.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Handles one absolute-form request. Returns whether the client connection may carry on.
pub(crate) async fn handle_http<S: AsyncRead + AsyncWrite + Unpin>(
    egress: &Egress,
    client: &mut ClientConn<S>,
    mut head: RequestHead,
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
    // Nor a field that would have the origin read it as another method than the one judged.
    if decided.judged() {
        let overrides = crate::h1::head::METHOD_OVERRIDES;
        head.fields
            .retain(|f| !overrides.iter().any(|o| f.name.eq_ignore_ascii_case(o)));
    }
    // A credential's placeholder is never sent in the clear, nor to another host.
    let fields = head.fields.iter().map(|f| (f.name.as_str(), f.value.as_slice()));
    if let Err(leak) = egress.carried(&http.target, false, (&head.method, &http.origin_form), fields) {
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

    /// The request body carried a placeholder bound elsewhere: cut, and refused as a leak.
    fn leaked(leak: sandgate_policy::Leak, sent: u64, received: u64) -> Exchange {
        Exchange {
            refusal: Some(Refusal::CredentialLeak(leak)),
            ..Exchange::failed(sent, received, Outcome::CredentialLeak)
        }
    }

    /// The request body's chunked framing was refused (a request's chunk extensions or
    /// trailers among it): cut, and answered 400.
    fn bad_body(error: crate::h1::framing::ChunkError, sent: u64, received: u64) -> Exchange {
        Exchange {
            refusal: Some(Refusal::Head(crate::h1::head::HeadError::Chunked(error))),
            ..Exchange::failed(sent, received, Outcome::ClientFailure)
        }
    }

    /// No response head from `target`: refused as the error says (502, 504).
    fn no_response(
        target: &sandgate_policy::Target,
        error: ResponseError,
        sent: u64,
        received: u64,
    ) -> Exchange {
        let label = match error {
            ResponseError::Timeout => Outcome::Upstream(F::ResponseTimeout),
            _ => Outcome::Upstream(F::Closed),
        };
        Exchange {
            refusal: Some(Refusal::Response {
                target: target.clone(),
                error,
            }),
            ..Exchange::failed(sent, received, label)
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
    if head.body == BodyKind::Empty {
        return bodiless(egress, client, head, http, up, sent).await;
    }
    let body_done = Notify::new();
    // Searched for placeholders bound elsewhere, when a credential asks for it.
    let mut scan = egress.body_scan(&http.target);
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
            ChunkedScanner::for_request(),
            limits.body_idle_timeout,
            scan.as_mut(),
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
        Some(&body_done),
        limits.response_timeout,
    );
    // Both at once (an origin may answer before the body ends), unless the body is cut on
    // a placeholder: then no response is waited for.
    let (body_result, head_result) = {
        tokio::pin!(request_body, response_head);
        tokio::select! {
            body = &mut request_body => match body {
                Err(RelayError::Leak(leak)) => return Exchange::leaked(leak, sent, 0),
                Err(RelayError::Framing(e)) => return Exchange::bad_body(e, sent, 0),
                body => (body, response_head.await),
            },
            head = &mut response_head => (request_body.await, head),
        }
    };
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
        Err(RelayError::Framing(e)) => return Exchange::bad_body(*e, sent, received),
        Err(RelayError::Source(_) | RelayError::Truncated) => {
            return Exchange::failed(sent, received, Outcome::ClientFailure);
        }
        Err(RelayError::Dest(_) | RelayError::Idle | RelayError::Stalled) => {}
        // After the response head: the rest of the exchange is refused all the same.
        Err(RelayError::Leak(leak)) => return Exchange::leaked(leak.clone(), sent, received),
    }
    let response = match head_result {
        Ok((response, _)) => response,
        Err(error) => return Exchange::no_response(&http.target, error, sent, received),
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

/// [`exchange`] for a request without a body (most are): the request is complete once its
/// head is written, so the response head is read at once, timed from the start, with no
/// split of either stream and no second future to join (they cost a lock on every read and
/// write and two allocations a request).
async fn bodiless<S: AsyncRead + AsyncWrite + Unpin>(
    egress: &Egress,
    client: &mut ClientConn<S>,
    head: &RequestHead,
    http: &HttpTarget,
    up: &mut Outbound,
    sent: u64,
) -> Exchange {
    let limits = &egress.limits;
    // What relaying an empty body does: flush (a TLS stream holds what it could not send).
    let flushed = relay_body(
        &mut client.stream,
        &mut client.buf,
        &mut up.stream,
        BodyKind::Empty,
        ChunkedScanner::new(),
        limits.body_idle_timeout,
        None,
    )
    .await;
    let response = read_response_head(
        &mut up.stream,
        &mut up.buf,
        &mut client.stream,
        &head.method,
        None,
        limits.response_timeout,
    )
    .await;
    let (response, interim) = match response {
        Ok(read) => read,
        Err(error) => return Exchange::no_response(&http.target, error, sent, 0),
    };
    let complete = flushed.is_ok();
    relay_response(egress, client, head, up, response, (sent, interim), complete).await
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
        ChunkedScanner::new(),
        egress.limits.body_idle_timeout,
        None,
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
/// forwarded. `body_done`: told when the request body has been sent (`None`: it has).
async fn read_response_head<R, W>(
    src: &mut R,
    buf: &mut BytesMut,
    client: &mut W,
    method: &str,
    body_done: Option<&Notify>,
    timeout: std::time::Duration,
) -> Result<(ResponseHead, u64), ResponseError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut interim = 0u64;
    let mut timer_armed = body_done.is_none();
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
            () = notified(body_done), if !timer_armed => {
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

/// Waits for `done` to be told; never, for `None`.
async fn notified(done: Option<&Notify>) {
    match done {
        Some(done) => done.notified().await,
        None => std::future::pending().await,
    }
}
