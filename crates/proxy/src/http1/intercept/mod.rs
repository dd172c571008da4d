//! TLS interception: a CONNECT that only allow entries with methods or paths allow
//! (docs/policy.md, Methods and paths), served request by request when the proxy has an
//! interception CA (`crate::inspect`).
//!
//! The CONNECT is recorded as allowed (`reason_code: inspected`). The client's TLS ends here,
//! with a leaf the CA issued for the tunnel's host (a client naming another in its SNI is
//! refused); the upstream's TLS starts here, verified against the system's roots. Each
//! request inside (HTTP/2 or HTTP/1.1, as the client's ALPN chose; HTTP/2 streams in tasks of
//! their own) is then one call into the core, like a plain-HTTP request, with its method
//! and path: decided, recorded (`scheme: https`), forwarded on an upstream HTTP/1.1
//! connection of its own while its exchange lasts (parallel streams on parallel
//! connections, each past the CONNECT's own admitted against the connection limits as the
//! client's connection was, `upstreams.rs`), its trailers dropped, cut when the rule that
//! allowed it is revoked or expires, and closed with its status and bytes once its request
//! and response bodies have both ended. A request whose `Host`, absolute URI or
//! `:authority` names another host than the tunnel's is refused (400, `host_mismatch`). A
//! tunnel that moves no byte either way for the tunnel idle timeout ends (`idle_timeout`),
//! HTTP/2 or not, as a blind tunnel does.

mod body;
mod exchange;
mod fields;
mod socket;
mod upstreams;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper_util::rt::TokioIo;
use sandgate_policy::{Host, Identity, Target};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use self::exchange::{Exchanges, MAX_STREAMS};
use self::socket::{Prefixed, Watched};
use self::upstreams::Upstreams;
use crate::audit::event::Outcome;
use crate::egress::{Dialed, Egress, End, Grant, Opened};
use crate::inspect::Interceptor;
use crate::refusal::Refusal;
use crate::relay::Upstream;

/// A response body on its way to the client (it may fail on a cut).
type ResBody = UnsyncBoxBody<Bytes, body::BoxError>;
/// A request body on its way upstream (it may fail on a placeholder it carries).
type ReqBody = UnsyncBoxBody<Bytes, body::BoxError>;
type Sender = hyper::client::conn::http1::SendRequest<ReqBody>;

/// Who the tunnel's requests come from.
pub(crate) struct Client {
    pub stream: TcpStream,
    /// Bytes the client sent behind its CONNECT (its ClientHello, pipelined).
    pub early: Vec<u8>,
    pub peer: SocketAddr,
    pub identity: Arc<Identity>,
    /// What the client's connection was admitted as: the tunnel's further upstream
    /// connections are admitted the same way (`None`: it opens none).
    pub standing: Option<Arc<crate::admission::Standing>>,
}

/// Serves an intercepted tunnel until it ends, or its grant is cut; records its decision
/// once the client's TLS handshake is done (a client that names another host in its SNI is
/// refused, `sni_mismatch`) and its close at the end.
pub(crate) async fn serve(egress: &Arc<Egress>, client: Client, dialed: Dialed) {
    let Some(interceptor) = egress.interceptor.get().cloned() else {
        return egress.abandon(dialed, Some(200)).await;
    };
    let target = dialed.target().clone();
    let Ok(config) = interceptor.server_config(&target.host) else {
        return egress.abandon(dialed, Some(200)).await;
    };
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(Prefixed {
        early: client.early,
        at: 0,
        inner: client.stream,
    });
    let accepted = tokio::select! {
        accepted = tokio::time::timeout(egress.limits.head_timeout, accept) => accepted,
        () = dialed.stop().cancelled() => return egress.abandon(dialed, Some(200)).await,
    };
    let tls = match accepted {
        Ok(Ok(tls)) => tls,
        // A client that does not trust the CA (certificate pinning) ends here: allowed,
        // and closed as the client's failure.
        _ => return egress.abandon(dialed, Some(200)).await,
    };
    let sni = tls.get_ref().1.server_name().map(str::to_owned);
    if let Some(seen) = sni.clone().filter(|seen| !names(&target.host, seen)) {
        let refusal = sandgate_policy::TunnelRefusal::SniMismatch { seen };
        let _ = dialed.refuse(egress, Refusal::Tunnel { target, refusal }).await;
        return;
    }
    // Refused (on record) when the audit log failed during the handshake: nothing carried.
    let Ok(Opened {
        stream, addr, grant, ..
    }) = dialed.admit(egress, sni).await
    else {
        return;
    };
    let totals = Totals::default();
    let stop = grant.stop().clone();
    let tunnel = Tunnel {
        egress,
        interceptor: &interceptor,
        target: &target,
        addr,
        totals: &totals,
    };
    let peer = (client.peer, client.identity, client.standing);
    let (closes, mut closed) = mpsc::unbounded_channel::<(Grant, End)>();
    let outcome = tokio::select! {
        outcome = Box::pin(tunnel.run(tls, peer, stream, closes, &mut closed)) => outcome,
        () = stop.cancelled() => egress.cut_outcome(&grant),
    };
    // The exchanges still owing their closes record them here: HTTP/2 streams still
    // running in tasks of their own, and those of a cut tunnel, dropped with it just now.
    while let Ok(Some((grant, end))) = tokio::time::timeout(DRAIN, closed.recv()).await {
        tunnel.record(grant, end).await;
    }
    let end = End {
        sent: totals.sent.load(Ordering::Relaxed),
        received: totals.received.load(Ordering::Relaxed),
        status: Some(200),
        outcome,
    };
    egress.close(grant, end).await;
}

/// Bytes of request and response bodies relayed in a tunnel.
#[derive(Debug, Default)]
struct Totals {
    sent: AtomicU64,
    received: AtomicU64,
}

struct Tunnel<'a> {
    egress: &'a Arc<Egress>,
    interceptor: &'a Arc<Interceptor>,
    target: &'a Target,
    addr: SocketAddr,
    totals: &'a Totals,
}

/// How long, once the client's connection has ended or the tunnel was cut, the exchanges
/// still running (HTTP/2 streams in tasks of their own) have to record their closes here; a later one records
/// its own in a task of its own.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

impl Tunnel<'_> {
    /// Serves the tunnel's requests until the client's connection ends or goes idle,
    /// recording the closes `closed` brings meanwhile (`closes`: where the exchanges send
    /// them).
    async fn run(
        &self,
        tls: ClientTls,
        (peer, identity, standing): Peer,
        upstream: Upstream,
        closes: mpsc::UnboundedSender<(Grant, End)>,
        closed: &mut mpsc::UnboundedReceiver<(Grant, End)>,
    ) -> Outcome {
        let limits = &self.egress.limits;
        let exchanges = Arc::new(Exchanges {
            egress: self.egress.clone(),
            target: self.target.clone(),
            addr: self.addr,
            peer,
            identity,
            interceptor: self.interceptor.clone(),
            upstreams: Upstreams::new(upstream, standing),
            closes,
        });
        // HTTP/1.1 or HTTP/2, as the client's ALPN chose; HTTP/2 streams run in tasks of
        // their own, each exchange decided and recorded like an HTTP/1.1 one.
        let mut builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        builder
            .http1()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.head_timeout);
        builder
            .http2()
            .timer(hyper_util::rt::TokioTimer::new())
            .max_concurrent_streams(MAX_STREAMS);
        let service = hyper::service::service_fn(move |req| {
            let exchanges = exchanges.clone();
            async move { exchanges.exchange(req).await }
        });
        // Bytes moving either way keep the tunnel; none for the idle timeout end it, HTTP/2
        // pings and all (hyper's timers bound a request's head, not a silent connection).
        let since = tokio::time::Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        let watched = Watched {
            inner: tls,
            since,
            last: last.clone(),
        };
        let idle = limits.tunnel_idle_timeout;
        let mut serve = Box::pin(builder.serve_connection(TokioIo::new(watched), service));
        // Each exchange's close is recorded once its request and response bodies have ended.
        let served = loop {
            let quiet_from = since + std::time::Duration::from_millis(last.load(Ordering::Relaxed));
            tokio::select! {
                served = &mut serve => break Some(served),
                Some((grant, end)) = closed.recv() => self.record(grant, end).await,
                () = tokio::time::sleep_until(quiet_from + idle) => {
                    if quiet_from.elapsed() >= idle
                        && since + std::time::Duration::from_millis(last.load(Ordering::Relaxed)) == quiet_from
                    {
                        break None;
                    }
                }
            }
        };
        // The service (and its sender of closes) goes with the connection; streams still
        // running hold the rest, and record their closes once this returns.
        drop(serve);
        let Some(served) = served else {
            return Outcome::IdleTimeout;
        };
        match served {
            Ok(()) => Outcome::Ok,
            Err(e)
                if e.downcast_ref::<hyper::Error>()
                    .is_some_and(hyper::Error::is_timeout) =>
            {
                Outcome::IdleTimeout
            }
            Err(_) => Outcome::ClientReset,
        }
    }

    async fn record(&self, grant: Grant, end: End) {
        self.totals.sent.fetch_add(end.sent, Ordering::Relaxed);
        self.totals.received.fetch_add(end.received, Ordering::Relaxed);
        self.egress.close(grant, end).await;
    }
}

type ClientTls = tokio_rustls::server::TlsStream<Prefixed>;

/// The client's address, identity and admission, as its tunnel's requests need them.
type Peer = (SocketAddr, Arc<Identity>, Option<Arc<crate::admission::Standing>>);

/// Does the client's SNI name the tunnel's host? (Names compare without case and without a
/// trailing dot; an IP address is never a valid SNI, so a client naming one was not asked.)
fn names(host: &Host, sni: &str) -> bool {
    match host {
        Host::Name(n) => n.as_str().eq_ignore_ascii_case(sni.trim_end_matches('.')),
        Host::Ip(_) => false,
    }
}
