//! The approvals page's actions, each a form POST from the page's script, answered in JSON
//! (`{"exception": ...}`, or `{"error": "..."}` with the API's status for the same refusal):
//! approve (a TTL choice; for a tweak, what is granted of what was asked), deny and revoke
//! (a note), and an approver's one-click allow of a live deny
//! ([`Control::allow`](crate::Control::allow): filed and approved in one step, within the
//! policy's bounds).
//!
//! Each needs the session's cookie and its CSRF token; the role is the service's to check,
//! so a viewer's session is refused there, and on record, like a viewer's API call.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::FormRejection;
use axum::extract::{Form, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sandgate_policy::NewRequest;
use sandgate_policy::exception::{Narrowing, Tweak};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::call::{self, Call};
use crate::service::ControlError;
use crate::session::Session;
use crate::state::ApiState;

/// Characters of a note kept (the same bound as a request's reason).
const MAX_NOTE: usize = 1000;

/// Every field any action takes; each action reads its own.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Fields {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    ttl: Option<String>,
    #[serde(default)]
    note: Option<String>,
    /// An approval's "read-only" box: only GET, HEAD and OPTIONS (`on` when ticked).
    #[serde(default)]
    read_only: Option<String>,
    /// An approval of a tweak: what is granted (the sandbox named, each field narrowed
    /// or left out; [`granted_tweak`]).
    #[serde(flatten)]
    tweak: TweakFields,
    #[serde(default)]
    task: Option<String>,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    port: Option<String>,
    /// The denied request's id, for the allow's reason (only if it looks like one).
    #[serde(default)]
    request_id: Option<String>,
}

/// Approve, deny or revoke one exception.
pub(super) async fn act(
    State(state): State<Arc<ApiState>>,
    Path((action, id)): Path<(String, String)>,
    call: Call,
    form: Result<Form<Fields>, FormRejection>,
) -> Response {
    let (s, f) = match admit(&state, &call, form).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let c = &state.control;
    let result = match action.as_str() {
        "approve" => {
            let ttl_seconds = match number::<u32>(f.ttl.as_deref(), "ttl") {
                Ok(t) => t,
                Err(why) => return refusal(StatusCode::UNPROCESSABLE_ENTITY, &why),
            };
            let tweak = match granted_tweak(&f.tweak) {
                Ok(t) => t,
                Err(why) => return refusal(StatusCode::UNPROCESSABLE_ENTITY, &why),
            };
            let narrow = Narrowing {
                ttl_seconds,
                read_only: f.read_only.as_deref() == Some("on"),
                tweak,
                ..Narrowing::default()
            };
            c.approve(&s.who, &id, &narrow).await
        }
        "deny" | "revoke" => {
            let note = match note(f.note.as_deref(), &action) {
                Ok(n) => n,
                Err(why) => return refusal(StatusCode::UNPROCESSABLE_ENTITY, &why),
            };
            if action == "deny" {
                c.deny(&s.who, &id, Some(note)).await
            } else {
                c.revoke(&s.who, &id, Some(note)).await
            }
        }
        _ => return refusal(StatusCode::NOT_FOUND, "no such action"),
    };
    answer(&state, &s, &call, result.map(|ex| json!({ "exception": ex }))).await
}

/// Allow a live deny's task, host and port for a time, as this approver's own decision.
pub(super) async fn allow(
    State(state): State<Arc<ApiState>>,
    call: Call,
    form: Result<Form<Fields>, FormRejection>,
) -> Response {
    let (s, f) = match admit(&state, &call, form).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let (Some(task), Some(host)) = (f.task, f.host) else {
        return refusal(StatusCode::UNPROCESSABLE_ENTITY, "task and host are required");
    };
    let (port, ttl) = match (
        number::<u16>(f.port.as_deref(), "port"),
        number::<u32>(f.ttl.as_deref(), "ttl"),
    ) {
        (Ok(Some(port)), Ok(Some(ttl))) => (port, ttl),
        (Err(why), _) | (_, Err(why)) => return refusal(StatusCode::UNPROCESSABLE_ENTITY, &why),
        _ => return refusal(StatusCode::UNPROCESSABLE_ENTITY, "port and ttl are required"),
    };
    // The id is the browser's to send: only one that looks like a request id is quoted.
    let after = f
        .request_id
        .filter(|r| (1..=64).contains(&r.len()) && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        .map_or_else(String::new, |r| format!(" (request {r})"));
    let req = NewRequest {
        task_id: task,
        project_id: None,
        requested_hosts: vec![host],
        requested_ports: Some(vec![port]),
        ttl_seconds: ttl,
        reason: format!("allowed on the approvals page after a deny{after}"),
        ..NewRequest::default()
    };
    let result = state.control.allow(&s.who, req).await;
    let result =
        result.map(|filed| json!({ "existing": !filed.is_new(), "exception": filed.into_exception() }));
    answer(&state, &s, &call, result).await
}

/// The session and the form, if the cookie names a live session and the form carries its
/// CSRF token. A wrong token from a live session is on record: a page of this origin
/// always sends the right one.
async fn admit(
    state: &ApiState,
    call: &Call,
    form: Result<Form<Fields>, FormRejection>,
) -> Result<(Session, Fields), Response> {
    let Some(s) = state.sessions.get(&call.headers) else {
        return Err(refusal(
            StatusCode::UNAUTHORIZED,
            "not logged in (the session ended); log in again",
        ));
    };
    let f = match form {
        Ok(Form(f)) => f,
        Err(e) => return Err(refusal(StatusCode::BAD_REQUEST, &e.body_text())),
    };
    if !same_secret(&f.csrf, &s.csrf) {
        let (status, reason) = (StatusCode::FORBIDDEN, "stale or forged form");
        call::record_refusal(state, Some(&s.who.name), call.parts(), status, reason).await;
        return Err(refusal(status, "stale or forged form; reload the page"));
    }
    Ok((s, f))
}

/// The JSON answer, or the refusal with the API's status for it; a refusal by role is on
/// record, as the API's are.
async fn answer(state: &ApiState, s: &Session, call: &Call, result: Result<Value, ControlError>) -> Response {
    match result {
        Ok(body) => Json(body).into_response(),
        Err(e) => {
            let status = crate::call::status_of(&e);
            let message = e.to_string();
            if status == StatusCode::FORBIDDEN {
                call::record_refusal(state, Some(&s.who.name), call.parts(), status, &message).await;
            }
            if status.is_server_error() {
                tracing::error!(error = %message, "approvals page action failed");
            }
            refusal(status, &message)
        }
    }
}

/// `{"error": message}` with `status`.
pub(super) fn refusal(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

/// The fields of a tweak's approval: the page sends them all for a tweak, prefilled with
/// what was asked, and none for hosts.
#[derive(Debug, Default, Deserialize)]
pub(super) struct TweakFields {
    #[serde(default)]
    tweak_sandbox: Option<String>,
    /// Seconds; empty: no longer time limit granted.
    #[serde(default)]
    tweak_max_seconds: Option<String>,
    /// Bytes; empty: no more output granted.
    #[serde(default)]
    tweak_max_output_bytes: Option<String>,
    /// `on` when the network box is ticked.
    #[serde(default)]
    tweak_network: Option<String>,
    /// A workspace path; empty: none granted.
    #[serde(default)]
    tweak_workspace: Option<String>,
}

/// The tweak an approval grants, when the form names a sandbox. Whether it lies within
/// what was asked is the model's to check (`Exception::approve`), as for the API.
fn granted_tweak(f: &TweakFields) -> Result<Option<Tweak>, String> {
    let Some(sandbox) = f.tweak_sandbox.as_deref().map(str::trim) else {
        return Ok(None);
    };
    let workspace = f
        .tweak_workspace
        .as_deref()
        .map(str::trim)
        .filter(|w| !w.is_empty());
    Ok(Some(Tweak {
        sandbox: sandbox.to_owned(),
        max_seconds: number(f.tweak_max_seconds.as_deref(), "tweak.max_seconds")?,
        max_output_bytes: number(f.tweak_max_output_bytes.as_deref(), "tweak.max_output_bytes")?,
        network: f.tweak_network.as_deref() == Some("on"),
        workspace: workspace.map(str::to_owned),
    }))
}

/// An optional number field; a field that is not one is refused, naming it.
fn number<T: std::str::FromStr>(text: Option<&str>, field: &str) -> Result<Option<T>, String> {
    match text.map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) => t.parse().map(Some).map_err(|_| {
            let shown: String = t.chars().take(20).collect();
            format!("{field}: a whole number in range, not {shown:?}")
        }),
    }
}

/// The decider's note, or the page's default; bounded like a request's reason.
fn note(text: Option<&str>, action: &str) -> Result<String, String> {
    let text = text.map(str::trim).unwrap_or_default();
    if text.chars().count() > MAX_NOTE {
        return Err(format!("a note is at most {MAX_NOTE} characters"));
    }
    Ok(if text.is_empty() {
        let done = if action == "deny" { "denied" } else { "revoked" };
        format!("{done} on the approvals page")
    } else {
        text.to_owned()
    })
}

/// Compares two secrets in time that depends on their lengths only.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
