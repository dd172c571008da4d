//! The agent's side of the control plane: filing an exception request and reading the
//! task's exceptions through a sandgate proxy's admin API (`/v1/exceptions`), with the
//! requester token from the configuration. A request answers with an exception: the one
//! filed (201), or the one that already answers it (200: an identical request still
//! pending, or an active exception that covers it); all three read the same. The agent holds no approver token: it cannot
//! approve anything, its own requests included. The calls go through the shared admin
//! client (`sandgate_control::client`: an IP address or localhost, never a name looked up;
//! bounded in time and size), each on a blocking thread.

use std::time::Duration;

use sandgate_control::client::{AdminClient, AdminError, AdminUrl, Limits, path_segment};
use sandgate_policy::Exception;
use sandgate_policy::exception::{BelowHost, Tweak};
use serde_json::{Value, json};

use crate::config::Egress;

/// A call takes at most this long: an agent waits on it.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

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
    call(egress, "/v1/exceptions".to_owned(), Some(body)).await
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
    call(egress, "/v1/exceptions".to_owned(), Some(body)).await
}

/// One exception by id.
pub async fn show(egress: &Egress, id: &str) -> Result<Value, ControlError> {
    call(egress, format!("/v1/exceptions/{}", path_segment(id)), None).await
}

/// Every exception the token may see.
pub async fn list(egress: &Egress) -> Result<Value, ControlError> {
    call(egress, "/v1/exceptions".to_owned(), None).await
}

/// The exceptions of `task`, typed (an entry that does not read as one is left out).
pub async fn exceptions_of(egress: &Egress, task: &str) -> Result<Vec<Exception>, ControlError> {
    let all = list(egress).await?;
    Ok(all
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| crate::at(x, "task_id") == task)
        .filter_map(|x| serde_json::from_value(x.clone()).ok())
        .collect())
}

/// An answer read as an exception.
pub fn exception(answer: Value) -> Result<Exception, ControlError> {
    serde_json::from_value(answer).map_err(|e| ControlError::Answer(e.to_string()))
}

/// GET `path`, or POST `body` to it.
async fn call(egress: &Egress, path: String, body: Option<Value>) -> Result<Value, ControlError> {
    let url = AdminUrl::parse(&egress.admin).map_err(AdminError::from)?;
    let limits = Limits {
        timeout: CALL_TIMEOUT,
        ..Limits::default()
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
