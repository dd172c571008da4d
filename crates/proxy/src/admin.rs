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
        Some(extra) => router(metrics).merge(extra),
        None => router(metrics),
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
