//! The admin API (`/v1`), JSON over HTTP on the admin listener, beside `/metrics`.
//!
//! | method and path | role | |
//! |---|---|---|
//! | `POST /v1/exceptions` | requester (its tasks), approver | file a request: 201; an identical one pending, or an active exception covering it: 200 and that one |
//! | `GET /v1/exceptions`, `GET /v1/exceptions/{id}` | any (a requester sees its tasks') | read |
//! | `POST /v1/exceptions/{id}/approve` | approver, not the requester | body: optional `hosts`, `ttl_seconds`, `methods`, `paths`, `read_only`, `tweak` (each only narrows; one that would widen is 400, naming the field) |
//! | `POST /v1/exceptions/{id}/deny`, `/revoke` | approver | body: optional `note` |
//! | `GET /v1/events` | any (a requester: its tasks') | server-sent events: every audit event, live |
//! | `GET /healthz`, `GET /readyz` | none | liveness; readiness (the store answers) |
//!
//! Callers authenticate with `Authorization: Bearer TOKEN` (tokens from `spec.admin.tokens`,
//! kept as SHA-256). No or a wrong token is 401, the wrong role 403; each refusal is
//! recorded in the audit trail. Wrong tokens are limited per client address and in all
//! ([`crate::throttle`], shared with the approvals page's login): over a limit, a call with a
//! token is 429 with `Retry-After`, its token unchecked, and only the first such refusal
//! since a call was let through is recorded. Errors are `{"error": "..."}` naming the rule.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use sandgate_policy::exception::Narrowing;
use sandgate_policy::{Exception, NewRequest, Principal};
use serde::Deserialize;
use serde_json::json;

use crate::call::{Call, record_refusal, throttled};
use crate::service::ControlError;
use crate::state::ApiState;

/// The `/v1` routes and the health checks.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/v1/exceptions", post(create).get(list))
        .route("/v1/exceptions/{id}", get(show))
        .route(
            "/v1/exceptions/{id}/approve",
            post(|s, i, c, b| decide(Decide::Approve, s, i, c, b)),
        )
        .route(
            "/v1/exceptions/{id}/deny",
            post(|s, i, c, b| decide(Decide::Deny, s, i, c, b)),
        )
        .route(
            "/v1/exceptions/{id}/revoke",
            post(|s, i, c, b| decide(Decide::Revoke, s, i, c, b)),
        )
        .route("/v1/events", get(events))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(state.clone())
        .merge(crate::ui::router(state))
}

/// A refusal or failure, as JSON with its status (and, for too many wrong tokens, when to
/// try again).
#[derive(Debug)]
struct ApiError(StatusCode, String, Option<u64>);

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError(status, message.into(), None)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.0, Json(json!({ "error": self.1 }))).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"sandgate\""),
            );
        }
        if let Some(secs) = self.2 {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        resp
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> ApiError {
        let status = crate::call::status_of(&e);
        if status == StatusCode::INTERNAL_SERVER_ERROR || status == StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!(error = %e, "admin API failed");
        }
        ApiError::new(status, e.to_string())
    }
}

/// The caller, from its bearer token; a refusal is recorded before it is answered. A token
/// is checked only while the throttle lets the caller's address try; a wrong one counts.
async fn caller(
    state: &ApiState,
    headers: &HeaderMap,
    call: (&Method, &Uri, Option<SocketAddr>),
) -> Result<Principal, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(token) = token else {
        // Nothing guessed: refused, not counted.
        return refuse(state, None, call, StatusCode::UNAUTHORIZED, "no bearer token").await;
    };
    let now = Instant::now();
    let found = state.throttle.attempt(call.2, now, || {
        state.principals.verify_bearer(token).cloned().ok_or(())
    });
    match found {
        Ok(Ok(p)) => {
            // A person's token (one that may use the page) vouches for its address.
            if p.role.uses_page() {
                state.throttle.vouch(call.2, now);
            }
            Ok(p)
        }
        Ok(Err(())) => {
            refuse(
                state,
                None,
                call,
                StatusCode::UNAUTHORIZED,
                "unknown bearer token",
            )
            .await
        }
        Err(wait) => {
            throttled(state, call, &wait).await;
            Err(ApiError(
                StatusCode::TOO_MANY_REQUESTS,
                wait.reason(),
                Some(wait.retry_after),
            ))
        }
    }
}

async fn refuse<T>(
    state: &ApiState,
    who: Option<&Principal>,
    call: (&Method, &Uri, Option<SocketAddr>),
    status: StatusCode,
    reason: &str,
) -> Result<T, ApiError> {
    record_refusal(state, who.map(|p| p.name.as_str()), call, status, reason).await;
    Err(ApiError::new(status, reason))
}

/// Records a refused call by a known caller (the wrong role, another task) and passes the
/// result on.
async fn checked<T>(
    state: &ApiState,
    who: &Principal,
    call: (&Method, &Uri, Option<SocketAddr>),
    result: Result<T, ControlError>,
) -> Result<T, ApiError> {
    match result {
        Ok(v) => Ok(v),
        Err(e) => {
            let error = ApiError::from(e);
            // Every refusal by role, scope or self-approval is on record, not only some.
            if error.0 == StatusCode::FORBIDDEN {
                return refuse(state, Some(who), call, StatusCode::FORBIDDEN, &error.1).await;
            }
            Err(error)
        }
    }
}

async fn create(
    State(state): State<Arc<ApiState>>,
    call: Call,
    body: Result<Json<NewRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Exception>), ApiError> {
    let who = caller(&state, &call.headers, call.parts()).await?;
    let Json(req) = body.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let filed = checked(&state, &who, call.parts(), state.control.request(&who, req).await).await?;
    // 201 for a new request; 200 for the pending or active exception that already answers it.
    let status = if filed.is_new() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(filed.into_exception())))
}

async fn list(State(state): State<Arc<ApiState>>, call: Call) -> Result<Json<Vec<Exception>>, ApiError> {
    let who = caller(&state, &call.headers, call.parts()).await?;
    let (only, below) = list_query(call.uri.query())?;
    // A follower from before methods, paths and tweaks would read such an exception as the
    // whole host (or as one for no host): it gets them only when it says it reads them.
    let readable = |e: &Exception| who.role != sandgate_policy::Role::Follower || below || plain(e);
    let listed = match only {
        Some(wanted) => state.control.list_in(&who, wanted).await,
        None => state.control.list(&who).await,
    }
    .map(|all| all.into_iter().filter(readable).collect());
    Ok(Json(checked(&state, &who, call.parts(), listed).await?))
}

/// An exception every version reads alike: hosts, ports and nothing below them.
fn plain(e: &Exception) -> bool {
    e.below.is_everything() && e.tweak.is_none()
}

/// `?state=STATE` (a follower asks for `approved` only) and `below=1` (a follower that reads
/// methods, paths and tweaks); no other parameter.
fn list_query(query: Option<&str>) -> Result<(Option<sandgate_policy::ExceptionState>, bool), ApiError> {
    let mut state = None;
    let mut below = false;
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("state", value)) => {
                state = Some(sandgate_policy::ExceptionState::parse(value).ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "state: use pending, approved, denied, revoked or expired".to_owned(),
                    )
                })?);
            }
            Some(("below", "1")) => below = true,
            _ => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "the query parameters are state=STATE and below=1".to_owned(),
                ));
            }
        }
    }
    Ok((state, below))
}

async fn show(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
    call: Call,
) -> Result<Json<Exception>, ApiError> {
    let who = caller(&state, &call.headers, call.parts()).await?;
    Ok(Json(
        checked(&state, &who, call.parts(), state.control.show(&who, &id).await).await?,
    ))
}

/// The body of deny and revoke.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Note {
    #[serde(default)]
    note: Option<String>,
}

/// A decision on one exception.
#[derive(Debug, Clone, Copy)]
enum Decide {
    Approve,
    Deny,
    Revoke,
}

async fn decide(
    action: Decide,
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
    call: Call,
    body: axum::body::Bytes,
) -> Result<Json<Exception>, ApiError> {
    let who = caller(&state, &call.headers, call.parts()).await?;
    let c = &state.control;
    let result = match action {
        Decide::Approve => c.approve(&who, &id, &optional_json::<Narrowing>(&body)?).await,
        Decide::Deny => c.deny(&who, &id, optional_json::<Note>(&body)?.note).await,
        Decide::Revoke => c.revoke(&who, &id, optional_json::<Note>(&body)?.note).await,
    };
    Ok(Json(checked(&state, &who, call.parts(), result).await?))
}

/// An empty body is the default; anything else must be the JSON shape, bounded in size.
fn optional_json<T: Default + serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    if body.len() > 64 * 1024 {
        return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body over 64 KiB"));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

async fn events(State(state): State<Arc<ApiState>>, call: Call) -> Result<Response, ApiError> {
    let who = caller(&state, &call.headers, call.parts()).await?;
    Ok(crate::events::stream(&state, who).into_response())
}

/// Ready when the exception store answers; otherwise 503 naming the store.
async fn ready(State(state): State<Arc<ApiState>>) -> Result<&'static str, ApiError> {
    state.control.ready().await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: exception store {}: {e}", state.control.store_name()),
        )
    })?;
    Ok("ready\n")
}
