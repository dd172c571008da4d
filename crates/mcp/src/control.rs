//! The agent's side of the control plane: filing an exception request and reading the
//! task's exceptions through a sandgate proxy's admin API (`/v1/exceptions`), with the
//! requester token from the configuration. A request answers with an exception: the one
//! filed (201), or the one that already answers it (200: an identical request still
//! pending, or an active exception that covers it); all three read the same. The agent holds no approver token: it cannot
//! approve anything, its own requests included. The calls go through the shared admin
//! client (`sandgate_control::client`: an IP address or localhost, never a name looked up;
//! bounded in time and size), each on a blocking thread.
//!
//! What is read is what is needed: the approved exceptions (`?state=approved`, with
//! `below=1`, which a tweak's row needs), not the task's whole history; one exception by
//! id for a request's own state. A run that holds a tweak reads them with a shorter time
//! limit ([`WATCH_TIMEOUT`]): its watch must notice a revocation within about a second.

use std::time::Duration;

use sandgate_control::client::{AdminClient, AdminError, AdminUrl, Limits, path_segment};
use sandgate_policy::Exception;
use sandgate_policy::exception::{BelowHost, Tweak};
use serde_json::{Value, json};

use crate::config::Egress;

/// A call takes at most this long: an agent waits on it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// A call of the watch over a running run's tweaks takes at most this long; a slower
/// control plane counts as unreadable, and the run keeps only what it knows.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(1);

/// The approved exceptions read at once: the answer's size bound ([`MAX_ANSWER_BYTES`])
/// holds them; more are not read.
const MAX_APPROVED: usize = 4096;

/// The largest answer read: an exception's JSON is well under a kibibyte.
const MAX_ANSWER_BYTES: u64 = 2 << 20;

/// The approved exceptions, tweaks and rules below the host included (`below=1`).
const APPROVED: &str = "/v1/exceptions?state=approved&below=1";

/// A failed call: the admin client's error, or the call's thread ended without an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("the control plane: {0}")]
    Admin(#[from] AdminError),
    #[error("the call to the control plane stopped before it answered: {0}")]
    Interrupted(String),
    #[error("the control plane answered with something other than an exception: {0}")]
    Answer(String),
}

/// Files a request; returns the exception as the API shows it.
pub async fn request(
    egress: &Egress,
    task: &str,
    hosts: &[String],
    ports: Option<&[u16]>,
    ttl_seconds: u32,
    reason: &str,
    below: &BelowHost,
) -> Result<Value, ControlError> {
    let mut body = json!({
        "task_id": task,
        "requested_hosts": hosts,
        "ttl_seconds": ttl_seconds,
        "reason": reason,
    });
    if let Some(map) = body.as_object_mut() {
        if let Some(ports) = ports {
            map.insert("requested_ports".into(), json!(ports));
        }
        // The same names in a request as in the exception that answers it.
        if let Ok(Value::Object(fields)) = serde_json::to_value(below) {
            map.extend(fields);
        }
    }
    call(egress, "/v1/exceptions".to_owned(), Some(body), CALL_TIMEOUT).await
}

/// Files a tweak request (no hosts: [`Tweak`] names the sandbox and what it asks);
/// returns the exception as the API shows it.
pub async fn request_tweak(
    egress: &Egress,
    task: &str,
    tweak: &Tweak,
    ttl_seconds: u32,
    reason: &str,
) -> Result<Value, ControlError> {
    let body = json!({
        "task_id": task,
        "requested_hosts": [],
        "tweak": tweak,
        "ttl_seconds": ttl_seconds,
        "reason": reason,
    });
    call(egress, "/v1/exceptions".to_owned(), Some(body), CALL_TIMEOUT).await
}

/// One exception by id, within `timeout`.
pub async fn show(egress: &Egress, id: &str, timeout: Duration) -> Result<Value, ControlError> {
    call(
        egress,
        format!("/v1/exceptions/{}", path_segment(id)),
        None,
        timeout,
    )
    .await
}

/// The exceptions the token may see in `state` (`approved`, `pending`, ...).
pub async fn in_state(egress: &Egress, state: &str) -> Result<Value, ControlError> {
    let path = format!("/v1/exceptions?state={}&below=1", path_segment(state));
    call(egress, path, None, CALL_TIMEOUT).await
}

/// The approved exceptions of `task` (active or past their expiry second), typed (an
/// entry that does not read as one is left out), read within `timeout`.
pub async fn approved_of(
    egress: &Egress,
    task: &str,
    timeout: Duration,
) -> Result<Vec<Exception>, ControlError> {
    let all = call(egress, APPROVED.to_owned(), None, timeout).await?;
    Ok(all
        .as_array()
        .into_iter()
        .flatten()
        .take(MAX_APPROVED)
        .filter(|x| crate::at(x, "task_id") == task)
        .filter_map(|x| serde_json::from_value(x.clone()).ok())
        .collect())
}

/// An answer read as an exception.
pub fn exception(answer: Value) -> Result<Exception, ControlError> {
    serde_json::from_value(answer).map_err(|e| ControlError::Answer(e.to_string()))
}

/// GET `path`, or POST `body` to it, within `timeout`.
async fn call(
    egress: &Egress,
    path: String,
    body: Option<Value>,
    timeout: Duration,
) -> Result<Value, ControlError> {
    let url = AdminUrl::parse(&egress.admin).map_err(AdminError::from)?;
    let limits = Limits {
        timeout,
        connect_timeout: timeout.min(Limits::default().connect_timeout),
        max_body: MAX_ANSWER_BYTES,
    };
    let client = AdminClient::with_limits(url, &egress.token, limits);
    let answer = tokio::task::spawn_blocking(move || match body {
        None => client.get(&path),
        Some(body) => client.post(&path, &body),
    })
    .await
    .map_err(|e| ControlError::Interrupted(e.to_string()))?;
    Ok(answer?)
}
