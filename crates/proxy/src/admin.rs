//! The opt-in admin listener (`--metrics-listen`): an axum router, served with graceful
//! shutdown inside the proxy's task tracker, so its connections end with the proxy's. Today
//! it answers `GET /metrics` with the OpenMetrics text exposition and 404 elsewhere; the
//! control plane's API (exceptions, approvals) mounts here.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
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
/// serves, `/readyz` while the audit log can be written (no request passes otherwise).
fn probes(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(metrics): State<Arc<Metrics>>| async move {
                if metrics.audit.healthy.get() == 1 {
                    (StatusCode::OK, "ready\n")
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the audit log cannot be written\n",
                    )
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

/// Serves the metrics and `extra` (the control plane's API) until `stop` is cancelled, then
/// lets open requests finish.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    extra: Option<Router>,
    stop: CancellationToken,
) {
    let app = match extra {
        // The control plane brings its own /healthz and /readyz (its store's readiness too).
        Some(extra) => router(metrics).merge(extra),
        None => router(metrics.clone()).merge(probes(metrics)),
    };
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
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
