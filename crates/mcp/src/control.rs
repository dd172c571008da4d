//! The agent's side of the control plane: filing an exception request and reading the
//! task's exceptions through a sandgate proxy's admin API (`/v1/exceptions`), with the
//! requester token from the configuration. The agent holds no approver token: it cannot
//! approve anything, its own requests included.

use std::time::Duration;

use serde_json::{Value, json};

use crate::config::Egress;

/// A failed call: the admin API's status and message, or why it could not be reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("the control plane refused it ({status}): {message}")]
    Refused { status: u16, message: String },
    #[error("cannot reach the control plane at {admin}: {cause}")]
    Unreachable { admin: String, cause: String },
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
    call(egress, "POST", "/v1/exceptions", Some(body)).await
}

/// One exception by id.
pub async fn show(egress: &Egress, id: &str) -> Result<Value, ControlError> {
    let id: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    call(egress, "GET", &format!("/v1/exceptions/{id}"), None).await
}

/// Every exception the token may see.
pub async fn list(egress: &Egress) -> Result<Value, ControlError> {
    call(egress, "GET", "/v1/exceptions", None).await
}

async fn call(
    egress: &Egress,
    method: &'static str,
    path: &str,
    body: Option<Value>,
) -> Result<Value, ControlError> {
    let url = format!("{}{path}", egress.admin);
    let auth = format!("Bearer {}", egress.token);
    let admin = egress.admin.clone();
    let result = tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(15)))
            .build()
            .into();
        let sent = match method {
            "GET" => agent.get(&url).header("Authorization", &auth).call(),
            _ => agent
                .post(&url)
                .header("Authorization", &auth)
                .header("Content-Type", "application/json")
                .send(body.map(|b| b.to_string()).unwrap_or_default()),
        };
        let mut response = sent.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(4 * 1024 * 1024)
            .read_to_string()
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((status, text))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    let (status, text) = result.map_err(|cause| ControlError::Unreachable { admin, cause })?;
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if !(200..300).contains(&status) {
        let message = value
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or(text.trim())
            .to_owned();
        return Err(ControlError::Refused { status, message });
    }
    Ok(value)
}
