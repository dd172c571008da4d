//! Carrying a tunnel (CONNECT, SOCKS5) once its front end has told the client it is open:
//! the first bytes are read and checked against the tunnel rules (`spec.network.tunnels`),
//! which decides the request (its one decision event is written here, an allow with the
//! TLS server name seen, or a deny `sni_mismatch` / `sni_missing` / `not_tls`); then the
//! bytes read are forwarded unchanged and the sockets relayed until the tunnel ends.

use std::time::Duration;

use sandgate_policy::Target;
use sandgate_policy::TunnelRules;
use sandgate_policy::tunnel::SniMode;

use super::{Dialed, Egress, End, Opened};
use crate::audit::event::{Outcome, UpstreamFailure};
use crate::hello::{self, Seen, retry};
use crate::refusal::Refusal;
use crate::relay::{self, Leg};

/// A fatal TLS alert, access_denied (RFC 8446 section 6), in a TLS 1.2-versioned record.
const ACCESS_DENIED_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49];

impl Egress {
    /// Checks, records, forwards and relays a dialled tunnel; records its close. `early`
    /// holds bytes the client sent behind its request; `status` is what the front end
    /// answered (200 for CONNECT, none for SOCKS5).
    pub(crate) fn carry<'a>(
        &'a self,
        client: Leg<'a>,
        dialed: Dialed,
        early: Vec<u8>,
        status: Option<u16>,
    ) -> impl Future<Output = ()> + Send + 'a {
        self.carry_linked(client, dialed, early, status, None)
    }

    /// As [`Egress::carry`], for a client whose end cannot show a reset (a node's stream
    /// bridged through a socket pair): `reset`, a child of the dialled tunnel's stop token
    /// ([`Dialed::stop`]), is cancelled by the bridge when the stream is reset, and the
    /// relay then ends as `client_reset` rather than waiting on a half-closed tunnel.
    ///
    /// Every idle tunnel holds this future, so it holds only what the two long waits need:
    /// the wait for the first bytes (the ends, the boxed dialled tunnel, the deadline;
    /// nothing is read until there is something to read) and the relay (the ends, the
    /// grant, the stop token, the relay's own state). What happens between them, the check,
    /// its record and the bytes read, runs boxed and is freed before the relay starts.
    /// Both long waits end when the stop token is cancelled (at the hard stop at the
    /// latest), so only the work around them is made droppable ([`Egress::droppable`]): an
    /// idle tunnel holds no token of its own. (A plain function returning an `async`
    /// block: an `async fn` would hold its arguments twice, once as passed and once as
    /// moved into its body.)
    pub(crate) fn carry_linked<'a>(
        &'a self,
        mut client: Leg<'a>,
        dialed: Dialed,
        early: Vec<u8>,
        status: Option<u16>,
        reset: Option<tokio_util::sync::CancellationToken>,
    ) -> impl Future<Output = ()> + Send + 'a {
        // Boxed until the check consumes it: held inline, its bytes would stay in the
        // future through the relay, which no longer needs them.
        let mut unstarted = Box::new(Unstarted { dialed, early, reset });
        async move {
            let deadline = self.first_bytes_deadline(unstarted.dialed.target().port);
            if let Some(deadline) = deadline
                && unstarted.early.is_empty()
            {
                let stop = &unstarted.dialed.stop.0;
                let upstream = unstarted.dialed.stream.leg();
                until_readable(&mut client, upstream, deadline, stop).await;
            }
            // Unboxed by a call, so the box is freed now rather than when this block ends.
            let start = self.start(&mut client, unbox(unstarted), deadline, status);
            let Some(Some(mut relaying)) = self.droppable(Box::pin(start)).await else {
                return;
            };
            let (sent, received, outcome) = relay::tunnel(
                &mut client,
                relaying.upstream.leg(),
                self.limits.tunnel_idle_timeout,
                &relaying.stop,
                relaying.carried,
            )
            .await;
            let outcome = self.cut_outcome_of(outcome, &relaying.grant);
            let end = End {
                sent,
                received,
                status,
                outcome,
            };
            self.droppable(self.close(relaying.grant, end)).await;
        }
    }

    /// From the first bytes to the relay: checks them and records the decision, then (when
    /// the check asks) waits for a late ClientHello or checks a second one after a
    /// HelloRetryRequest, and forwards what was read. `None`: the tunnel ended here, its
    /// records written.
    async fn start(
        &self,
        client: &mut Leg<'_>,
        unstarted: Unstarted,
        deadline: Option<tokio::time::Instant>,
        status: Option<u16>,
    ) -> Option<Relaying> {
        let Unstarted { dialed, early, reset } = unstarted;
        // Boxed on its own: the check's state is freed before a late hello is waited for
        // (up to the idle timeout), so that wait costs what an idle tunnel does.
        let (opened, first, then) = Box::pin(self.check_first_bytes(client, dialed, early, deadline)).await?;
        let Opened {
            stream: mut upstream,
            grant,
            ..
        } = opened;
        let end = |sent, received, outcome| End {
            sent,
            received,
            status,
            outcome,
        };
        // What cuts the tunnel: its own token, or the bridge's when the client's stream is reset.
        let stop = reset.unwrap_or_else(|| grant.stop().clone());
        let mut up = upstream.leg();
        // Relayed after a silent start: the client's first bytes, whenever they come, get
        // the check they would have had.
        let (first, retry_rules) = match then {
            Then::Relay => (first, None),
            Then::CheckRetry(rules) => (first, Some(rules)),
            Then::CheckLate(rules) => {
                let late = check_late(
                    client,
                    &mut up,
                    &grant.target,
                    &rules,
                    self.limits.tunnel_idle_timeout,
                );
                let checked = tokio::select! {
                    checked = Box::pin(late) => checked,
                    () = stop.cancelled() => Err(Outcome::Shutdown),
                };
                match checked {
                    Ok((first, hello)) => (first, hello.then_some(rules)),
                    Err(outcome) => {
                        let outcome = self.cut_outcome_of(outcome, &grant);
                        self.close(grant, end(0, 0, outcome)).await;
                        return None;
                    }
                }
            }
        };
        let forwarded = first.len() as u64;
        if forwarded > 0 && up.write_all(&first).await.is_err() {
            let e = end(0, 0, Outcome::Upstream(UpstreamFailure::Closed));
            self.close(grant, e).await;
            return None;
        }
        drop(first);
        // A TLS handshake: a second ClientHello after a HelloRetryRequest is checked too.
        let (mut sent, mut received) = (forwarded, 0);
        if let Some(rules) = retry_rules {
            let retried = Box::pin(check_retry(client, &mut up, &grant.target, &rules)).await;
            match retried {
                Ok((more_up, down)) => (sent, received) = (sent + more_up, down),
                Err((more_up, down, outcome)) => {
                    self.close(grant, end(sent + more_up, down, outcome)).await;
                    return None;
                }
            }
        }
        Some(Relaying {
            upstream,
            grant,
            stop,
            carried: (sent, received),
        })
    }

    /// What a tunnel cut by a stop token ended as (`Shutdown` from the relay): at the end of
    /// the shutdown grace, when the proxy stops; by its own token while the proxy runs on,
    /// because the exception was revoked or the entry that allowed it expired; by the
    /// bridge's alone, because the client's stream was reset.
    fn cut_outcome_of(&self, outcome: Outcome, grant: &super::Grant) -> Outcome {
        match outcome {
            Outcome::Shutdown if grant.stop().is_cancelled() => self.cut_outcome(grant),
            Outcome::Shutdown => Outcome::ClientReset,
            other => other,
        }
    }

    /// Records a dialled tunnel whose client went away before it could be carried (the
    /// front end could not answer it).
    pub(crate) async fn abandon(&self, dialed: Dialed, status: Option<u16>) {
        self.end_unstarted(dialed, status, Outcome::ClientFailure).await;
    }

    /// Records a tunnel that ended (`outcome`) before any byte was carried: nothing was
    /// refused, so an allow and its close.
    async fn end_unstarted(&self, dialed: Dialed, status: Option<u16>, outcome: Outcome) {
        // Refused instead when the audit log failed meanwhile: that deny is its record.
        let Ok(opened) = dialed.admit(self, None).await else {
            return;
        };
        let end = End {
            sent: 0,
            received: 0,
            status,
            outcome,
        };
        self.close(opened.grant, end).await;
    }

    /// When the wait for a tunnel to `port`'s first bytes ends, if the rules read them: the
    /// first-bytes timeout, or the idle timeout when shorter.
    fn first_bytes_deadline(&self, port: u16) -> Option<tokio::time::Instant> {
        let rules = self.rules();
        let rules = rules.tunnels();
        let first_bytes = Duration::from_millis(rules.first_bytes_timeout_ms);
        let limit = first_bytes.min(self.limits.tunnel_idle_timeout);
        rules.inspects(port).then(|| tokio::time::Instant::now() + limit)
    }

    /// Reads and judges the first bytes where the rules ask for it, and records the
    /// decision. `None`: refused (on record; the connection is dropped). `deadline`: when
    /// the wait for them ends (from [`Egress::first_bytes_deadline`], taken when the wait
    /// began).
    async fn check_first_bytes(
        &self,
        client: &mut Leg<'_>,
        mut dialed: Dialed,
        early: Vec<u8>,
        deadline: Option<tokio::time::Instant>,
    ) -> Option<(Opened, Vec<u8>, Then)> {
        let rules = self.rules().tunnels().clone();
        if !rules.inspects(dialed.target().port) {
            // Refused (on record) when the audit log failed meanwhile: not carried.
            let opened = dialed.admit(self, None).await.ok()?;
            return Some((opened, early, Then::Relay));
        }
        // A tunnel that idles out before its first byte ends as idle, as it would in the relay.
        let idle = self.limits.tunnel_idle_timeout;
        let first_bytes = Duration::from_millis(rules.first_bytes_timeout_ms);
        // (The rules were reloaded to inspect this port during the wait: waited from now.)
        let deadline = deadline.unwrap_or_else(|| tokio::time::Instant::now() + first_bytes.min(idle));
        let stop = dialed.stop().clone();
        let mut upstream = dialed.stream.leg();
        // A cut wins over first bytes already there: nothing is admitted after it.
        let read = tokio::select! {
            biased;
            () = stop.cancelled() => Err(self.cut_by(dialed.decided.expires)),
            read = hello::read_first(client, &mut upstream, early, deadline) => Ok(read),
        };
        let (first, seen) = match read {
            Ok((first, Seen::Silent)) if idle <= first_bytes => {
                let _ = first;
                self.end_unstarted(dialed, None, Outcome::IdleTimeout).await;
                return None;
            }
            // Reset before a byte: nothing to carry, and no half-close to wait out.
            Ok((_, Seen::Reset)) => {
                self.end_unstarted(dialed, None, Outcome::ClientReset).await;
                return None;
            }
            Ok(read) => read,
            Err(outcome) => {
                self.end_unstarted(dialed, None, outcome).await;
                return None;
            }
        };
        match rules.check(dialed.target(), &seen.as_first_bytes()) {
            Ok(()) if stop.is_cancelled() => {
                let outcome = self.cut_by(dialed.decided.expires);
                self.end_unstarted(dialed, None, outcome).await;
                None
            }
            Ok(()) => {
                let name = seen.server_name().map(str::to_owned);
                let then = match seen {
                    _ if rules.sni == SniMode::Off => Then::Relay,
                    Seen::ClientHello { .. } => Then::CheckRetry(rules),
                    Seen::Silent => Then::CheckLate(rules),
                    _ => Then::Relay,
                };
                // Refused (on record) when the audit log failed during the wait: the
                // first bytes go nowhere.
                let opened = dialed.admit(self, name).await.ok()?;
                Some((opened, first, then))
            }
            Err(refusal) => {
                let target = dialed.target().clone();
                let _ = dialed.refuse(self, Refusal::Tunnel { target, refusal }).await;
                // A TLS client is told in its own terms, so it prints more than "reset".
                if matches!(seen, Seen::ClientHello { .. }) {
                    let _ = client.write_all(&ACCESS_DENIED_ALERT).await;
                }
                None
            }
        }
    }
}

/// Waits until either end has something to read (or has ended), `deadline` passes or `stop`
/// is cancelled: one small future over the ends' own readiness, since every tunnel waiting
/// for its first bytes holds it.
async fn until_readable(
    client: &mut Leg<'_>,
    mut upstream: Leg<'_>,
    deadline: tokio::time::Instant,
    stop: &tokio_util::sync::CancellationToken,
) {
    let mut timer = std::pin::pin!(tokio::time::sleep_until(deadline));
    let mut stopped = std::pin::pin!(stop.cancelled());
    std::future::poll_fn(|cx| {
        if client.poll_readable(cx).is_ready()
            || upstream.poll_readable(cx).is_ready()
            || stopped.as_mut().poll(cx).is_ready()
            || timer.as_mut().poll(cx).is_ready()
        {
            return std::task::Poll::Ready(());
        }
        std::task::Poll::Pending
    })
    .await;
}

/// A dialled tunnel before its first bytes were read: boxed while the tunnel waits for
/// them, since nothing of it is needed through the relay.
struct Unstarted {
    dialed: Dialed,
    /// Bytes the client sent behind its request.
    early: Vec<u8>,
    /// The bridge's token, cancelled when a node's stream is reset.
    reset: Option<tokio_util::sync::CancellationToken>,
}

/// What `boxed` holds, the box freed on return (moving out of a box in place would keep
/// its memory until the enclosing scope ends: through the relay).
#[expect(clippy::boxed_local, reason = "taking the box is the point: it is freed here")]
fn unbox<T>(boxed: Box<T>) -> T {
    *boxed
}

/// A tunnel past its first bytes, to be relayed: what the relay holds for the tunnel's life.
struct Relaying {
    upstream: crate::relay::Upstream,
    grant: super::Grant,
    /// What cuts the tunnel: its own token, or the bridge's when the client's stream is reset.
    stop: tokio_util::sync::CancellationToken,
    /// Bytes already carried each way (the first bytes, a second ClientHello, the server's
    /// answer), counted on by the relay.
    carried: (u64, u64),
}

/// What a tunnel admitted by its first bytes still needs before the plain relay.
enum Then {
    Relay,
    /// A ClientHello under `sni: must_match`: a second one after a HelloRetryRequest gets
    /// the same check ([`check_retry`]).
    CheckRetry(TunnelRules),
    /// Silent for `first_bytes_timeout_ms` on a port that is not `tls_only`, so relayed; but
    /// a ClientHello that comes later is still checked ([`check_late`]).
    CheckLate(TunnelRules),
}

/// A tunnel relayed after a silent start: waits, within the idle timeout, for the first side
/// to speak. A server that speaks first runs a banner protocol (SSH, SMTP): relayed as it
/// is. A client that speaks first gets the check its first bytes would have had, so a
/// ClientHello naming another server, sent after the first-bytes timeout, is refused as it
/// would have been before it. `Ok` with the client's bytes (not yet forwarded) and whether
/// they were a ClientHello to follow with [`check_retry`]; `Err` with the outcome.
async fn check_late(
    client: &mut Leg<'_>,
    upstream: &mut Leg<'_>,
    target: &Target,
    rules: &TunnelRules,
    idle: Duration,
) -> Result<(Vec<u8>, bool), Outcome> {
    let deadline = tokio::time::Instant::now() + idle;
    let (first, seen) = hello::read_first(client, upstream, Vec::new(), deadline).await;
    match seen {
        Seen::Silent => return Err(Outcome::IdleTimeout),
        Seen::Reset => return Err(Outcome::ClientReset),
        Seen::ServerFirst | Seen::Closed => return Ok((first, false)),
        Seen::ClientHello { .. } | Seen::NotTls | Seen::Unreadable => {}
    }
    if rules.check(target, &seen.as_first_bytes()).is_err() {
        if matches!(seen, Seen::ClientHello { .. }) {
            let _ = client.write_all(&ACCESS_DENIED_ALERT).await;
        }
        return Err(Outcome::LateHelloRefused);
    }
    Ok((first, matches!(seen, Seen::ClientHello { .. })))
}

/// After the first ClientHello went upstream: reads the server's first record and passes it
/// on; if it is a HelloRetryRequest, reads the client's second ClientHello, checks it under
/// the same rules and passes it on. `Ok((sent, received))`; `Err` with the bytes moved and
/// the outcome when the second hello is refused (the tunnel ends there) or a side failed.
async fn check_retry(
    client: &mut Leg<'_>,
    upstream: &mut Leg<'_>,
    target: &Target,
    rules: &TunnelRules,
) -> Result<(u64, u64), (u64, u64, Outcome)> {
    let limit = Duration::from_millis(rules.first_bytes_timeout_ms);
    let (down, retry) = match retry::read_server_first(upstream, limit).await {
        retry::ServerFirst::Done(bytes) => (bytes, false),
        retry::ServerFirst::Retry(bytes) => (bytes, true),
    };
    let received = down.len() as u64;
    if !down.is_empty() && client.write_all(&down).await.is_err() {
        return Err((0, 0, Outcome::ClientFailure));
    }
    if !retry {
        return Ok((0, received));
    }
    let (up, seen) = retry::read_second(client, limit).await;
    if rules.check(target, &seen.as_first_bytes()).is_err() {
        let _ = client.write_all(&ACCESS_DENIED_ALERT).await;
        return Err((0, received, Outcome::RetryRefused));
    }
    if upstream.write_all(&up).await.is_err() {
        return Err((0, received, Outcome::Upstream(UpstreamFailure::Closed)));
    }
    Ok((up.len() as u64, received))
}
