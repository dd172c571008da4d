//! Plain-HTTP forwarding: one absolute-form request in, one origin-form request out, the
//! response relayed back (RFC 9110 section 7.6, RFC 9112).
//!
//! Each request on a client connection is decided on its own. An upstream connection is
//! kept for the next request only when that request names the same host and port, which
//! was already vetted, so reuse never skips the guard. The request-target decides the
//! destination; the Host header sent upstream is rewritten from it. Bodies are relayed
//! verbatim (chunk framing included); hop-by-hop fields are dropped both ways.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, BytesMut};
use sandgate_policy::{Access, Host, HttpTarget, Target, Verdict, parse_http_target};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::audit::EventKind;
use crate::dial::DialError;
use crate::framing::{BodyKind, ChunkError, ChunkedScanner};
use crate::head::{Field, RequestHead, ResponseHead, end_to_end_fields, parse_response_head};
use crate::respond::{Refusal, UpstreamError};
use crate::server::{ClientConn, Next, Shared, event};

/// Largest upstream response head accepted.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Read size while relaying bodies.
const RELAY_CHUNK: usize = 64 * 1024;
/// Added to every forwarded message (RFC 9110 section 7.6.3).
const VIA: &str = "1.1 sandgate";

/// A kept-alive upstream connection and the destination it was vetted for.
#[derive(Debug)]
pub(crate) struct Upstream {
    host: Host,
    port: u16,
    addr: SocketAddr,
    stream: TcpStream,
    buf: BytesMut,
}

impl Upstream {
    /// A kept connection is reusable only if the origin has not closed it and has sent
    /// nothing unasked (a non-blocking read that would block means both).
    fn is_alive(&self) -> bool {
        let mut probe = [0u8; 1];
        self.buf.is_empty()
            && matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

/// Writes a refusal, audits it, and (for allowed-then-failed requests) audits the close.
pub(crate) async fn refuse(
    shared: &Shared,
    client: &mut ClientConn,
    target: Option<(&Host, u16, Access)>,
    refusal: Refusal,
    method: &str,
    request_id: Option<String>,
) {
    let request_id = request_id.unwrap_or_else(|| shared.ids.next());
    let reply = refusal.reply(&request_id, method);
    let _ = client.stream.write_all(reply.bytes()).await;
    let kind = if reply.is_denial {
        EventKind::Decision
    } else {
        EventKind::Close
    };
    let mut e = event(kind, &request_id, client.peer, &client.identity);
    e.decision = reply.is_denial.then_some(Verdict::Deny);
    e.reason_code = Some(reply.reason_code.clone());
    e.status = Some(reply.status);
    if method != "-" {
        e.method = Some(method.to_owned());
    }
    if let Some((host, port, access)) = target {
        e.destination_host = Some(host.to_string());
        e.destination_port = Some(port);
        e.scheme = Some(access.scheme());
    }
    match &refusal {
        Refusal::Dial {
            error: DialError::Prohibited(p),
            ..
        } => e.resolved_ip = Some(p.ip),
        Refusal::AddressDenied { ip, rule, .. } => {
            e.resolved_ip = Some(*ip);
            e.rule = Some(rule.clone());
        }
        _ => {}
    }
    if !reply.is_denial {
        e.outcome = Some(reply.reason_code);
        e.bytes_sent = Some(0);
        e.bytes_received = Some(0);
    }
    if matches!(refusal, Refusal::AuditUnavailable(_)) {
        // Must not wait behind a queue that cannot drain; the client is answered anyway.
        shared.audit.record_now_or_log(e);
    } else {
        shared.audit.record(e).await;
    }
}

/// Audits an allow decision.
pub(crate) async fn audit_allow(
    shared: &Shared,
    request_id: &str,
    client: &ClientConn,
    method: &str,
    target: (&Host, u16, Access),
    resolved: Option<std::net::IpAddr>,
    rule: Option<std::sync::Arc<str>>,
) {
    let mut e = event(EventKind::Decision, request_id, client.peer, &client.identity);
    e.decision = Some(Verdict::Allow);
    e.reason_code = Some(Cow::Borrowed("allowlisted"));
    e.method = Some(method.to_owned());
    e.destination_host = Some(target.0.to_string());
    e.destination_port = Some(target.1);
    e.scheme = Some(target.2.scheme());
    e.resolved_ip = resolved;
    e.rule = rule;
    shared.audit.record(e).await;
}

/// Vets an allowed destination and dials it: resolves and classifies (a guard refusal is the
/// request's deny decision), audits the allow decision, connects. Every failure is answered
/// and audited here. `None`: the client has been answered and the connection should close.
pub(crate) async fn vet_and_dial(
    shared: &Shared,
    client: &mut ClientConn,
    target: &Target,
    access: Access,
    method: &str,
    request_id: &str,
    rule: Option<Arc<str>>,
) -> Option<(TcpStream, SocketAddr)> {
    let dest = (&target.host, target.port, access);
    let refuse_dial = |error| Refusal::Dial {
        target: target.clone(),
        error,
    };
    let vetted = match shared.dialer.vet(target).await {
        Ok(v) => v,
        Err(error) => {
            let guard_denied =
                error.prohibited_class().is_some() || matches!(error, DialError::SelfConnect(_));
            if !guard_denied {
                // Allowed by policy, failed upstream (DNS): an allow followed by a close.
                audit_allow(shared, request_id, client, method, dest, None, rule).await;
            }
            refuse(
                shared,
                client,
                Some(dest),
                refuse_dial(error),
                method,
                Some(request_id.to_owned()),
            )
            .await;
            return None;
        }
    };
    // Deny entries that are addresses apply to what the name resolved to (not when chained:
    // no name is resolved here then, and the upstream applies its own policy).
    if shared.dialer.upstream_proxy().is_none() {
        let rules = shared.rules();
        let ctx = crate::server::context(&client.identity);
        let denied = vetted
            .ips()
            .find_map(|ip| Some((ip, rules.deny_address(ip, target.port, &ctx)?.label.clone())));
        if let Some((ip, rule)) = denied {
            let refusal = Refusal::AddressDenied {
                target: target.clone(),
                ip,
                rule,
            };
            refuse(
                shared,
                client,
                Some(dest),
                refusal,
                method,
                Some(request_id.to_owned()),
            )
            .await;
            return None;
        }
    }
    audit_allow(shared, request_id, client, method, dest, vetted.primary(), rule).await;
    let connected = match shared.dialer.connect(&vetted).await {
        // Chained: the connection goes to the upstream proxy, which must open the tunnel.
        Ok((mut stream, addr)) if access == Access::Connect && shared.dialer.upstream_proxy().is_some() => {
            shared
                .dialer
                .upstream_tunnel(&mut stream, target, shared.limits.response_timeout)
                .await
                .map(|()| (stream, addr))
        }
        other => other,
    };
    match connected {
        Ok(pair) => Some(pair),
        Err(error) => {
            refuse(
                shared,
                client,
                Some(dest),
                refuse_dial(error),
                method,
                Some(request_id.to_owned()),
            )
            .await;
            None
        }
    }
}

/// Handles one absolute-form request. Returns whether the client connection may carry on.
pub(crate) async fn handle_http(
    shared: &Shared,
    client: &mut ClientConn,
    head: RequestHead,
    upstream: &mut Option<Upstream>,
) -> Next {
    let started = Instant::now();
    let request_id = shared.ids.next();
    let http = match parse_http_target(&head.target) {
        Ok(t) => t,
        Err(e) => {
            refuse(
                shared,
                client,
                None,
                Refusal::Target(e),
                &head.method,
                Some(request_id),
            )
            .await;
            return Next::Close;
        }
    };
    let dest = (&http.target.host, http.target.port, Access::Http);
    let decision = shared.rules().decide(
        &http.target,
        Access::Http,
        &crate::server::context(&client.identity),
    );
    if decision.verdict == Verdict::Deny {
        let refusal = Refusal::Policy {
            target: http.target.clone(),
            reason: decision.reason,
        };
        refuse(
            shared,
            client,
            Some(dest),
            refusal,
            &head.method,
            Some(request_id),
        )
        .await;
        return Next::Close;
    }
    let reusable = upstream
        .as_ref()
        .is_some_and(|u| u.host == http.target.host && u.port == http.target.port && u.is_alive());
    if !reusable {
        *upstream = None;
        let dialled = vet_and_dial(
            shared,
            client,
            &http.target,
            Access::Http,
            &head.method,
            &request_id,
            decision.rule_label(),
        )
        .await;
        let Some((stream, addr)) = dialled else {
            return Next::Close;
        };
        *upstream = Some(Upstream {
            host: http.target.host.clone(),
            port: http.target.port,
            addr,
            stream,
            buf: BytesMut::new(),
        });
    } else {
        let ip = upstream.as_ref().map(|u| u.addr.ip());
        audit_allow(
            shared,
            &request_id,
            client,
            &head.method,
            dest,
            ip,
            decision.rule_label(),
        )
        .await;
    }
    let Some(up) = upstream.as_mut() else {
        return Next::Close;
    };
    let outcome = exchange(shared, client, &head, &http, up).await;
    let mut e = event(EventKind::Close, &request_id, client.peer, &client.identity);
    e.method = Some(head.method.clone());
    e.destination_host = Some(http.target.host.to_string());
    e.destination_port = Some(http.target.port);
    e.scheme = Some("http");
    e.resolved_ip = Some(up.addr.ip());
    e.bytes_sent = Some(outcome.sent);
    e.bytes_received = Some(outcome.received);
    e.duration_ms = Some(started.elapsed().as_millis() as u64);
    e.status = outcome.status;
    e.outcome = Some(outcome.label.clone());
    if let Some(refusal) = outcome.refusal {
        // The upstream failed before a response: answer the client ourselves.
        let reply = refusal.reply(&request_id, &head.method);
        let _ = client.stream.write_all(reply.bytes()).await;
        e.status = Some(reply.status);
        e.outcome = Some(reply.reason_code);
    }
    shared.audit.record(e).await;
    if !outcome.upstream_reusable {
        *upstream = None;
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
    label: Cow<'static, str>,
    refusal: Option<Refusal>,
    client_reusable: bool,
    upstream_reusable: bool,
}

impl Exchange {
    fn failed(sent: u64, received: u64, label: &'static str) -> Exchange {
        Exchange {
            sent,
            received,
            status: None,
            label: Cow::Borrowed(label),
            refusal: None,
            client_reusable: false,
            upstream_reusable: false,
        }
    }
}

async fn exchange(
    shared: &Shared,
    client: &mut ClientConn,
    head: &RequestHead,
    http: &HttpTarget,
    up: &mut Upstream,
) -> Exchange {
    let limits = &shared.limits;
    let out_head = request_head_bytes(head, http, shared.dialer.upstream_proxy().is_some());
    if let Err(_e) = up.stream.write_all(&out_head).await {
        return Exchange {
            refusal: Some(Refusal::Upstream {
                target: http.target.clone(),
                error: UpstreamError::Closed,
            }),
            ..Exchange::failed(0, 0, "upstream_failure:closed")
        };
    }
    let mut sent = out_head.len() as u64;
    let body_done = Notify::new();
    let (client_read, mut client_write) = client.stream.split();
    let (up_read, mut up_write) = up.stream.split();
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
            return Exchange::failed(sent, received, "client_failure");
        }
        Err(RelayError::Dest(_) | RelayError::Idle) => {}
    }
    let response = match head_result {
        Ok((response, _)) => response,
        Err(error) => {
            let label = match error {
                UpstreamError::Timeout => "upstream_failure:response_timeout",
                _ => "upstream_failure:closed",
            };
            return Exchange {
                refusal: Some(Refusal::Upstream {
                    target: http.target.clone(),
                    error,
                }),
                ..Exchange::failed(sent, received, label)
            };
        }
    };
    let request_complete = body_result.is_ok();
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
    if client.stream.write_all(&out).await.is_err() {
        return Exchange::failed(sent, received, "client_failure");
    }
    received += out.len() as u64;
    let relayed = relay_body(
        &mut up.stream,
        &mut up.buf,
        &mut client.stream,
        body,
        limits.body_idle_timeout,
    )
    .await;
    let status = Some(response.status);
    match relayed {
        Ok(n) => Exchange {
            sent,
            received: received + n,
            status,
            label: Cow::Borrowed("ok"),
            refusal: None,
            client_reusable: !client_closes,
            upstream_reusable: !response.close && request_complete,
        },
        Err(e) => {
            tracing::debug!(error = %e, "response body relay stopped");
            let label = match e {
                RelayError::Dest(_) => "client_failure",
                RelayError::Idle => "upstream_failure:idle_timeout",
                _ => "upstream_failure:response_body",
            };
            Exchange {
                status,
                ..Exchange::failed(sent, received, label)
            }
        }
    }
}

/// Reads the final response head, forwarding any 1xx interim responses to the client as they
/// come, each rebuilt and filtered as a final response head is. The response timeout starts once the request body has been sent. Returns the head
/// and the bytes of interim responses forwarded.
async fn read_response_head<R, W>(
    src: &mut R,
    buf: &mut BytesMut,
    client: &mut W,
    method: &str,
    body_done: &Notify,
    timeout: std::time::Duration,
) -> Result<(ResponseHead, u64), UpstreamError>
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
                        return Err(UpstreamError::Malformed(crate::head::HeadError::Syntax(
                            "unrequested upgrade",
                        )));
                    }
                    // Rebuilt like a final response (CRLF line ends, hop-by-hop fields
                    // dropped, Via added), never relayed byte for byte (RFC 9110 15.2).
                    let rebuilt = response_head_bytes(&head, false);
                    client.write_all(&rebuilt).await.map_err(UpstreamError::Io)?;
                    interim += rebuilt.len() as u64;
                    buf.advance(len);
                    continue;
                }
                Ok(Some((head, len))) => {
                    buf.advance(len);
                    return Ok((head, interim));
                }
                Ok(None) if buf.len() >= MAX_RESPONSE_HEAD => return Err(UpstreamError::HeadTooLarge),
                Ok(None) => {}
                Err(crate::head::HeadError::TooManyFields) => return Err(UpstreamError::HeadTooLarge),
                Err(e) => return Err(UpstreamError::Malformed(e)),
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
            _ = tokio::time::sleep_until(deadline), if timer_armed => return Err(UpstreamError::Timeout),
        };
        match read {
            Ok(0) => return Err(UpstreamError::Closed),
            Ok(_) => {}
            Err(e) => return Err(UpstreamError::Io(e)),
        }
    }
}

/// Why a body relay stopped early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RelayError {
    #[error("reading the body failed: {0}")]
    Source(std::io::Error),
    #[error("writing the body failed: {0}")]
    Dest(std::io::Error),
    #[error("the body ended early")]
    Truncated,
    #[error("bad chunked framing: {0}")]
    Framing(ChunkError),
    #[error("the body stalled")]
    Idle,
}

/// Copies one message body from `src` (starting with what is already in `buf`) to `dst`,
/// unchanged, and stops exactly at its end. Returns the bytes copied.
pub(crate) async fn relay_body<R, W>(
    src: &mut R,
    buf: &mut BytesMut,
    dst: &mut W,
    kind: BodyKind,
    idle: std::time::Duration,
) -> Result<u64, RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut copied = 0u64;
    let mut remaining = match kind {
        BodyKind::Empty => return Ok(0),
        BodyKind::Length(n) => n,
        BodyKind::Chunked | BodyKind::UntilClose => u64::MAX,
    };
    let mut scanner = ChunkedScanner::new();
    loop {
        if buf.is_empty() {
            buf.reserve(RELAY_CHUNK);
            let n = match tokio::time::timeout(idle, src.read_buf(buf)).await {
                Err(_) => return Err(RelayError::Idle),
                Ok(Err(e)) => return Err(RelayError::Source(e)),
                Ok(Ok(n)) => n,
            };
            if n == 0 {
                return match kind {
                    BodyKind::UntilClose => {
                        dst.flush().await.map_err(RelayError::Dest)?;
                        Ok(copied)
                    }
                    _ => Err(RelayError::Truncated),
                };
            }
        }
        let take = match kind {
            BodyKind::Chunked => scanner.feed(buf).map_err(RelayError::Framing)?,
            _ => usize::try_from(remaining).unwrap_or(usize::MAX).min(buf.len()),
        };
        dst.write_all(buf.get(..take).unwrap_or_default())
            .await
            .map_err(RelayError::Dest)?;
        buf.advance(take);
        copied += take as u64;
        if matches!(kind, BodyKind::Length(_)) {
            remaining -= take as u64;
        }
        let done = match kind {
            BodyKind::Chunked => scanner.is_done(),
            BodyKind::Length(_) => remaining == 0,
            _ => false,
        };
        if done {
            return Ok(copied);
        }
    }
}

fn push_field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The request head sent upstream: origin-form target (absolute-form to an upstream proxy),
/// Host from the request-target,
/// end-to-end fields only, and Via.
fn request_head_bytes(head: &RequestHead, http: &HttpTarget, absolute: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + head.fields.len() * 32);
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    if absolute {
        // Chained through an upstream proxy: it needs the absolute form to know the target.
        out.extend_from_slice(b"http://");
        out.extend_from_slice(http.authority.as_bytes());
    }
    out.extend_from_slice(http.origin_form.as_bytes());
    out.extend_from_slice(if head.minor_version == 0 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    push_field(&mut out, "Host", http.authority.as_bytes());
    for field in end_to_end_fields(&head.fields).filter(|f| !f.is("via")) {
        push_field(&mut out, &field.name, &field.value);
    }
    push_field(&mut out, "Via", via(&head.fields).as_bytes());
    out.extend_from_slice(b"\r\n");
    out
}

/// The response head sent to the client: end-to-end fields, Via, and `Connection: close`
/// when this connection ends after the response.
fn response_head_bytes(head: &ResponseHead, close: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + head.fields.len() * 32);
    let line = format!(
        "HTTP/1.{} {} {}\r\n",
        head.minor_version, head.status, head.reason
    );
    out.extend_from_slice(line.as_bytes());
    for field in end_to_end_fields(&head.fields).filter(|f| !f.is("via")) {
        push_field(&mut out, &field.name, &field.value);
    }
    push_field(&mut out, "Via", via(&head.fields).as_bytes());
    if close {
        push_field(&mut out, "Connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Appends this hop to any Via the message already carries.
fn via(fields: &[Field]) -> String {
    let prior: Vec<String> = fields
        .iter()
        .filter(|f| f.is("via"))
        .map(|f| String::from_utf8_lossy(&f.value).into_owned())
        .collect();
    if prior.is_empty() {
        VIA.to_owned()
    } else {
        format!("{}, {VIA}", prior.join(", "))
    }
}
