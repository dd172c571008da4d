//! The opt-in admin listener (`--metrics-listen`): an axum router, served with graceful
//! shutdown inside the proxy's task tracker, so its connections end with the proxy's. Today
//! it answers `GET /metrics` with the OpenMetrics text exposition and 404 elsewhere; the
//! control plane's API (exceptions, approvals) mounts here.
//!
//! It serves plain HTTP, or TLS when the binary gives it a certificate
//! ([`crate::Proxy::serve_admin_tls`]), so a follower on another host can read the
//! control plane. Its connections are capped ([`ADMIN_CONNECTIONS`]; more are closed as they come) and end
//! after [`ADMIN_IDLE`] without a byte either way: each holds a descriptor from the proxy's
//! reserve (`admission::RESERVED_FDS`), so a client holding idle connections here must not
//! take the descriptors the proxy's resolver and upstream dials need.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// The admin routes.
pub(crate) fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .fallback(|| async { StatusCode::NOT_FOUND })
        .with_state(metrics)
}

/// Probes for a proxy without the control plane: `/healthz` answers while the process
/// serves, `/readyz` while the audit log can be written (no request passes otherwise) and,
/// for a proxy that follows a control plane, while that can be read.
fn probes(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(metrics): State<Arc<Metrics>>| async move {
                if metrics.audit.healthy.get() != 1 {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the audit log cannot be written\n",
                    )
                } else if metrics.state_store_unavailable.get() != 0 {
                    // A follower (--exceptions-from) that cannot read its control plane:
                    // requests are still decided, on the exceptions it last read.
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the control plane this proxy follows cannot be read: exceptions it knows stay until they expire, new ones cannot arrive\n",
                    )
                } else {
                    (StatusCode::OK, "ready\n")
                }
            }),
        )
        .with_state(metrics)
}

async fn metrics_text(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

/// Connections the admin listener holds at once: a quarter of the descriptors the proxy keeps
/// in reserve.
pub(crate) const ADMIN_CONNECTIONS: usize = 64;
/// A connection that moves no byte either way for this long is closed. The event stream's
/// keep-alive comments (every 15 s) count.
const ADMIN_IDLE: Duration = Duration::from_secs(60);

/// A TLS handshake on the admin listener that takes longer than this is abandoned.
const ADMIN_HANDSHAKE: Duration = Duration::from_secs(10);

/// The admin listener, holding at most [`ADMIN_CONNECTIONS`]: a connection beyond them is
/// accepted and closed at once (a full listen backlog would be a silent wait instead). With
/// TLS, handshakes run beside the accept loop (each holding its slot, bounded in time), so
/// a client that never finishes one delays nobody.
struct Capped {
    inner: TcpListener,
    slots: Arc<Semaphore>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handshakes: tokio::task::JoinSet<Option<(Held, SocketAddr)>>,
}

impl axum::serve::Listener for Capped {
    type Io = Held;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Held, SocketAddr) {
        loop {
            tokio::select! {
                (io, addr) = axum::serve::Listener::accept(&mut self.inner) => {
                    let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                        tracing::debug!(client = %addr, "admin listener full; connection closed");
                        drop(io);
                        continue;
                    };
                    let Some(tls) = self.tls.clone() else {
                        return (Held::new(Box::new(io), slot), addr);
                    };
                    self.handshakes.spawn(async move {
                        match tokio::time::timeout(ADMIN_HANDSHAKE, tls.accept(io)).await {
                            Ok(Ok(stream)) => Some((Held::new(Box::new(stream), slot), addr)),
                            Ok(Err(e)) => {
                                tracing::debug!(client = %addr, error = %e, "admin TLS handshake failed");
                                None
                            }
                            Err(_) => {
                                tracing::debug!(client = %addr, "admin TLS handshake timed out");
                                None
                            }
                        }
                    });
                }
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(ready)) = done {
                        return ready;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A connection's bytes: a socket, or TLS over one.
trait AdminIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AdminIo for T {}

/// An admin connection: its slot, and its idle timer, reset by every byte moved.
struct Held {
    io: Box<dyn AdminIo>,
    _slot: OwnedSemaphorePermit,
    idle: Pin<Box<Sleep>>,
}

impl Held {
    fn new(io: Box<dyn AdminIo>, slot: OwnedSemaphorePermit) -> Held {
        Held {
            io,
            _slot: slot,
            idle: Box::pin(tokio::time::sleep(ADMIN_IDLE)),
        }
    }

    fn moved(&mut self) {
        self.idle.as_mut().reset(Instant::now() + ADMIN_IDLE);
    }

    /// Pending on the socket: has the connection been idle too long?
    fn idled_out(&mut self, cx: &mut Context<'_>) -> bool {
        self.idle.as_mut().poll(cx).is_ready()
    }
}

fn idle_error() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "admin connection idle")
}

impl AsyncRead for Held {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.idled_out(cx) => Poll::Ready(Err(idle_error())),
            other => other,
        }
    }
}

impl AsyncWrite for Held {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    this.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if this.idled_out(cx) => Poll::Ready(Err(idle_error())),
            other => other,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Serves the metrics and `extra` (the control plane's API) until `stop` is cancelled, then
/// lets open requests finish.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    extra: Option<Router>,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: CancellationToken,
) {
    let app = match extra {
        // The control plane brings its own /healthz and /readyz (its store's readiness too).
        Some(extra) => router(metrics).merge(extra),
        None => router(metrics.clone()).merge(probes(metrics)),
    };
    let capped = Capped {
        inner: listener,
        slots: Arc::new(Semaphore::new(ADMIN_CONNECTIONS)),
        tls: tls.map(tokio_rustls::TlsAcceptor::from),
        handshakes: tokio::task::JoinSet::new(),
    };
    // Through `tap_io`, for which axum gives the peer address as `ConnectInfo`.
    let listener = axum::serve::ListenerExt::tap_io(capped, |_: &mut Held| {});
    let served = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(stop.cancelled_owned())
        .await;
    if let Err(e) = served {
        tracing::warn!(error = %e, "the admin listener stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt as _;

    #[tokio::test]
    async fn probes_answer_without_the_control_plane() {
        let metrics = Arc::new(Metrics::new());
        metrics.audit.healthy.set(1);
        let app = router(metrics.clone()).merge(probes(metrics.clone()));
        let get = |path: &'static str| {
            axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .unwrap_or_else(|e| unreachable!("{e}"))
        };
        let status = |r: axum::response::Response| r.status();
        let ok = app.clone().oneshot(get("/healthz")).await.map(status);
        assert_eq!(ok.ok(), Some(StatusCode::OK));
        let ready = app.clone().oneshot(get("/readyz")).await.map(status);
        assert_eq!(ready.ok(), Some(StatusCode::OK));
        metrics.audit.healthy.set(0);
        let ready = app.oneshot(get("/readyz")).await.map(status);
        assert_eq!(ready.ok(), Some(StatusCode::SERVICE_UNAVAILABLE));
    }

    #[tokio::test]
    async fn metrics_and_404() {
        let app = router(Arc::new(Metrics::new()));
        let get = |path: &str| {
            axum::http::Request::builder()
                .uri(path)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let ok = app.clone().oneshot(get("/metrics")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert!(
            ok.headers()[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
        let body = axum::body::to_bytes(ok.into_body(), 1 << 20).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains("sandgate_policy_generation 1"));
        assert_eq!(
            app.oneshot(get("/nope")).await.unwrap().status(),
            StatusCode::NOT_FOUND
        );
    }
}
