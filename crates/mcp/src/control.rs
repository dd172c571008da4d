//! The agent's side of the control plane: filing an exception request and reading the
//! task's exceptions through a sandgate proxy's admin API (`/v1/exceptions`), with the
//! requester token from the configuration. The agent holds no approver token: it cannot
//! approve anything, its own requests included. The calls go through the shared admin
//! client (`sandgate_control::client`: an IP address or localhost, never a name looked up;
//! bounded in time and size), each on a blocking thread.

use std::time::Duration;

use sandgate_control::client::{AdminClient, AdminError, AdminUrl, Limits, path_segment};
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
}

/// Files a request; returns the exception as the API shows it.
pub async fn request(
    egress: &Egress,
    task: &str,
    hosts: &[String],
    ports: Option<&[u16]>,
    ttl_seconds: u32,
    reason: &str,
) -> Result<Value, ControlError> {
    let mut body = json!({
        "task_id": task,
        "requested_hosts": hosts,
        "ttl_seconds": ttl_seconds,
        "reason": reason,
    });
    if let (Some(ports), Some(map)) = (ports, body.as_object_mut()) {
        map.insert("requested_ports".into(), json!(ports));
    }
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
