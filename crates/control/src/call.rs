//! A call to the admin listener, from the API or the approvals page: who called from where,
//! and how ([`Call`]), and the one bounded path by which a refused call is put on the audit
//! trail as an `admin_refused` event ([`record_refusal`], [`throttled`]), and the one HTTP
//! status of each service error ([`status_of`]), which the API and the page both answer with.
//! Which calls are refused, and the answer's body, are `api.rs`'s and `ui/`'s.

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use sandgate_proxy::audit::event::{AdminRefusal, Event};

use crate::service::ControlError;
use crate::state::ApiState;
use crate::store::StoreError;
use crate::throttle::Wait;

/// The parts of a call the handlers need: who called from where, and how.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) method: Method,
    pub(crate) uri: Uri,
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) headers: HeaderMap,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Call {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Call, Self::Rejection> {
        Ok(Call {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            peer: parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0),
            headers: parts.headers.clone(),
        })
    }
}

impl Call {
    pub(crate) fn parts(&self) -> (&Method, &Uri, Option<SocketAddr>) {
        (&self.method, &self.uri, self.peer)
    }
}

/// Records a refusal by the throttle, when it is the first since an attempt was let through
/// (the rest of the run are not: they cost the caller nothing to send).
pub(crate) async fn throttled(state: &ApiState, call: (&Method, &Uri, Option<SocketAddr>), wait: &Wait) {
    if wait.record {
        let status = StatusCode::TOO_MANY_REQUESTS;
        record_refusal(state, None, call, status, &wait.reason()).await;
    }
}

/// At most this many characters of a refused call's path and reason go on record. Both are
/// the caller's (a reason can quote its task id back); unbounded, a caller without a token
/// could write megabytes per call into the audit log and the live event ring.
const RECORDED_CHARS: usize = 256;

/// `text` cut to [`RECORDED_CHARS`] characters, saying how long it was when cut.
fn recorded(text: &str) -> String {
    if text.chars().count() <= RECORDED_CHARS {
        return text.to_owned();
    }
    let head: String = text.chars().take(RECORDED_CHARS).collect();
    format!("{head}... ({} bytes)", text.len())
}

/// Puts a refused call (an API call or a page login) on record, bounded in size:
/// `who` is the token's name when the token was valid.
pub(crate) async fn record_refusal(
    state: &ApiState,
    who: Option<&str>,
    (method, uri, client_addr): (&Method, &Uri, Option<SocketAddr>),
    status: StatusCode,
    reason: &str,
) {
    state
        .proxy
        .record_event(Event::AdminRefused(AdminRefusal {
            who: who.map(str::to_owned),
            action: recorded(&format!("{method} {}", uri.path())),
            status: status.as_u16(),
            reason: recorded(reason),
            client_addr,
        }))
        .await;
}

/// The one HTTP status of each refusal or failure (the API's and the approvals page's).
pub(crate) fn status_of(e: &ControlError) -> StatusCode {
    use sandgate_policy::{RequestError, TransitionError};
    match e {
        ControlError::Request(RequestError::NotEnabled { .. }) => StatusCode::FORBIDDEN,
        ControlError::Request(_) => StatusCode::UNPROCESSABLE_ENTITY,
        ControlError::Transition(TransitionError::SelfApproval { .. }) => StatusCode::FORBIDDEN,
        // A narrowing that would widen (a host, a method, a tweak's field) is a bad body, not
        // a state to wait out: 400, the message naming the field.
        ControlError::Transition(TransitionError::Widens(_)) => StatusCode::BAD_REQUEST,
        ControlError::Transition(_) => StatusCode::CONFLICT,
        ControlError::NotFound(_) => StatusCode::NOT_FOUND,
        ControlError::Forbidden(_) => StatusCode::FORBIDDEN,
        ControlError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
        ControlError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
        ControlError::Conflict(_) => StatusCode::CONFLICT,
        // The store down or unreachable: try again later; decisions go on meanwhile.
        ControlError::Store(StoreError::Unavailable { .. }) => StatusCode::SERVICE_UNAVAILABLE,
        ControlError::Store(StoreError::Conflict { .. }) => StatusCode::CONFLICT,
        ControlError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
