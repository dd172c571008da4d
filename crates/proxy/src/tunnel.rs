//! CONNECT tunnels (RFC 9110 section 9.3.6): decide, vet, dial, answer 200, then relay
//! bytes both ways without looking at them (TLS is never terminated).
//!
//! The relay holds no buffer while a tunnel is idle: each direction waits for readiness and
//! borrows a buffer only while data moves, so thousands of idle tunnels cost little more than
//! their sockets. A clean EOF in one direction is passed on as a half-close and the other
//! direction carries on; an error in either ends the tunnel, and only that tunnel.

use std::borrow::Cow;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sandgate_policy::{Access, Verdict, parse_connect_target};
use socket2::SockRef;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::audit::EventKind;
use crate::dial::DialError;
use crate::forward::{audit_allow, refuse};
use crate::head::RequestHead;
use crate::respond::Refusal;
use crate::server::{ClientConn, Shared, event};

/// Read size while a tunnel moves data.
const TUNNEL_CHUNK: usize = 64 * 1024;

/// Handles a CONNECT request; the client connection ends with it.
pub(crate) async fn handle_connect(shared: &Shared, mut client: ClientConn, head: RequestHead) {
    let started = Instant::now();
    let request_id = shared.ids.next();
    let target = match parse_connect_target(&head.target) {
        Ok(t) => t,
        Err(e) => {
            refuse(
                shared,
                &mut client,
                None,
                Refusal::Target(e),
                "CONNECT",
                Some(request_id),
            )
            .await;
            return;
        }
    };
    let dest = (&target.host, target.port, Access::Connect);
    let decision = shared.rules.decide(&target, Access::Connect);
    if decision.verdict == Verdict::Deny {
        let refusal = Refusal::Policy {
            target: target.clone(),
            reason: decision.reason,
        };
        refuse(
            shared,
            &mut client,
            Some(dest),
            refusal,
            "CONNECT",
            Some(request_id),
        )
        .await;
        return;
    }
    let vetted = match shared.dialer.vet(&target).await {
        Ok(v) => v,
        Err(error) => {
            if error.prohibited_class().is_none() && !matches!(error, DialError::SelfConnect(_)) {
                audit_allow(
                    shared,
                    &request_id,
                    client.peer,
                    "CONNECT",
                    dest,
                    None,
                    decision.rule.clone(),
                )
                .await;
            }
            let refusal = Refusal::Dial {
                target: target.clone(),
                error,
            };
            refuse(
                shared,
                &mut client,
                Some(dest),
                refusal,
                "CONNECT",
                Some(request_id),
            )
            .await;
            return;
        }
    };
    audit_allow(
        shared,
        &request_id,
        client.peer,
        "CONNECT",
        dest,
        vetted.primary(),
        decision.rule.clone(),
    )
    .await;
    let (upstream, addr) = match shared.dialer.connect(&vetted).await {
        Ok(pair) => pair,
        Err(error) => {
            let refusal = Refusal::Dial {
                target: target.clone(),
                error,
            };
            refuse(
                shared,
                &mut client,
                Some(dest),
                refusal,
                "CONNECT",
                Some(request_id),
            )
            .await;
            return;
        }
    };
    let mut close = event(EventKind::Close, &request_id, client.peer);
    close.method = Some("CONNECT".to_owned());
    close.scheme = Some("connect");
    close.destination_host = Some(target.host.to_string());
    close.destination_port = Some(target.port);
    close.resolved_ip = Some(addr.ip());
    close.status = Some(200);
    let (sent, received, outcome) = relay(shared, client, upstream).await;
    close.bytes_sent = Some(sent);
    close.bytes_received = Some(received);
    close.duration_ms = Some(started.elapsed().as_millis() as u64);
    close.outcome = Some(outcome);
    shared.audit.record(close).await;
}

/// Answers 200, forwards bytes the client sent early, then tunnels until both sides are done.
async fn relay(shared: &Shared, client: ClientConn, upstream: TcpStream) -> (u64, u64, Cow<'static, str>) {
    let ClientConn { mut stream, buf, .. } = client;
    if stream
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .is_err()
    {
        return (0, 0, Cow::Borrowed("client_failure"));
    }
    // A client may pipeline its first bytes (a TLS ClientHello) behind the CONNECT head.
    let early = buf.len() as u64;
    if early > 0 && write_all(&upstream, &buf).await.is_err() {
        return (0, 0, Cow::Borrowed("upstream_failure:closed"));
    }
    drop(buf);
    let sent = AtomicU64::new(early);
    let received = AtomicU64::new(0);
    let last_activity = AtomicU64::new(0);
    let epoch = Instant::now();
    let idle = shared.limits.tunnel_idle_timeout;
    let both = async {
        tokio::try_join!(
            async {
                pump(&stream, &upstream, &sent, &last_activity, epoch)
                    .await
                    .map_err(|_| Side::Client)
            },
            async {
                pump(&upstream, &stream, &received, &last_activity, epoch)
                    .await
                    .map_err(|_| Side::Upstream)
            },
        )
    };
    let outcome: &'static str = tokio::select! {
        r = both => match r {
            Ok(_) => "ok",
            Err(Side::Client) => "client_reset",
            Err(Side::Upstream) => "upstream_reset",
        },
        _ = idle_watch(&last_activity, epoch, idle) => "idle_timeout",
        _ = shared.hard_stop.cancelled() => "shutdown",
    };
    (
        sent.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed),
        Cow::Borrowed(outcome),
    )
}

/// Which side of a tunnel failed.
#[derive(Debug, Clone, Copy)]
enum Side {
    Client,
    Upstream,
}

/// Moves bytes from `src` to `dst` until EOF, then half-closes `dst`.
async fn pump(
    src: &TcpStream,
    dst: &TcpStream,
    count: &AtomicU64,
    last: &AtomicU64,
    epoch: Instant,
) -> io::Result<()> {
    loop {
        src.readable().await?;
        // Allocated only while data moves; freed as soon as the socket runs dry.
        let mut buf: Vec<u8> = Vec::with_capacity(TUNNEL_CHUNK);
        loop {
            buf.clear();
            match src.try_read_buf(&mut buf) {
                Ok(0) => {
                    let _ = SockRef::from(dst).shutdown(Shutdown::Write);
                    return Ok(());
                }
                Ok(n) => {
                    write_all(dst, &buf).await?;
                    count.fetch_add(n as u64, Ordering::Relaxed);
                    last.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
}

async fn write_all(dst: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        dst.writable().await?;
        match dst.try_write(data) {
            Ok(n) => data = data.get(n..).unwrap_or_default(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Completes once no byte has moved for `idle`.
async fn idle_watch(last: &AtomicU64, epoch: Instant, idle: Duration) {
    loop {
        let last_ms = last.load(Ordering::Relaxed);
        let due = epoch + Duration::from_millis(last_ms) + idle;
        tokio::time::sleep_until(due.into()).await;
        if last.load(Ordering::Relaxed) == last_ms {
            return;
        }
    }
}
