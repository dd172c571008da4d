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
//! id for a request's own state.
//!
//! Calls go in lanes ([`Lane`]). The agent's tool calls share [`AGENT_SLOTS`] slots, waited
//! for without a thread, so however many calls an agent sends at once, they hold a few of
//! the blocking threads and the control plane sees a few calls. The watch over a run's
//! tweaks has a lane of its own, bounded as a whole (the wait for a thread included) by
//! [`WATCH_TIMEOUT`]: it must notice a revocation within about a second, and an agent that
//! floods the server cannot make it wait.

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

/// Calls the agent's tools make at once; more wait their turn (within their time limit).
pub const AGENT_SLOTS: usize = 4;

/// The agent's calls' slots.
static AGENT: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(AGENT_SLOTS);

/// Who a call is for, and so how long it may take and whether it waits for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A tool call of the agent's: one of [`AGENT_SLOTS`], within [`CALL_TIMEOUT`] in all.
    Agent,
    /// The watch over a running run's tweaks: no slot, within [`WATCH_TIMEOUT`] in all.
    Watch,
    /// Naming how a tweak ended, once its run is being stopped: no slot, within the time
    /// given (at most [`WATCH_TIMEOUT`]).
    Naming(Duration),
}

impl Lane {
    /// The whole call's bound: the wait for a slot and a thread, and the exchange.
    fn timeout(self) -> Duration {
        match self {
            Lane::Agent => CALL_TIMEOUT,
            Lane::Watch => WATCH_TIMEOUT,
            Lane::Naming(d) => d.min(WATCH_TIMEOUT),
        }
    }
}

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
    #[error("the control plane did not answer within {0:?}")]
    Timeout(Duration),
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
    call(egress, "/v1/exceptions".to_owned(), Some(body), Lane::Agent).await
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
    call(egress, "/v1/exceptions".to_owned(), Some(body), Lane::Agent).await
}

/// One exception by id.
pub async fn show(egress: &Egress, id: &str, lane: Lane) -> Result<Value, ControlError> {
    call(egress, format!("/v1/exceptions/{}", path_segment(id)), None, lane).await
}

/// The exceptions the token may see in `state` (`approved`, `pending`, ...).
pub async fn in_state(egress: &Egress, state: &str) -> Result<Value, ControlError> {
    let path = format!("/v1/exceptions?state={}&below=1", path_segment(state));
    call(egress, path, None, Lane::Agent).await
}

/// The approved exceptions of `task` (those the control plane shows approved: active, or
/// past their expiry second only between its clock and ours), typed (an entry that does
/// not read as one is left out). An answer that is not a list is not read as "none": it is
/// an error, as an unreachable control plane is (a server at that address that is no
/// control plane answers so).
pub async fn approved_of(egress: &Egress, task: &str, lane: Lane) -> Result<Vec<Exception>, ControlError> {
    let all = call(egress, APPROVED.to_owned(), None, lane).await?;
    let Some(all) = all.as_array() else {
        return Err(ControlError::Answer(format!(
            "a list of exceptions was asked for, not {}",
            match all {
                Value::Null => "nothing",
                Value::Object(_) => "an object",
                _ => "a single value",
            }
        )));
    };
    Ok(all
        .iter()
        .take(MAX_APPROVED)
        .filter(|x| crate::at(x, "task_id") == task)
        .filter_map(|x| serde_json::from_value(x.clone()).ok())
        .collect())
}

/// An answer read as an exception.
pub fn exception(answer: Value) -> Result<Exception, ControlError> {
    serde_json::from_value(answer).map_err(|e| ControlError::Answer(e.to_string()))
}

/// GET `path`, or POST `body` to it, in `lane`: the whole call within the lane's bound.
async fn call(egress: &Egress, path: String, body: Option<Value>, lane: Lane) -> Result<Value, ControlError> {
    let timeout = lane.timeout();
    match tokio::time::timeout(timeout, call_in(egress, path, body, lane)).await {
        Ok(answer) => answer,
        Err(_) => Err(ControlError::Timeout(timeout)),
    }
}

async fn call_in(
    egress: &Egress,
    path: String,
    body: Option<Value>,
    lane: Lane,
) -> Result<Value, ControlError> {
    let timeout = lane.timeout();
    let _slot = match lane {
        Lane::Agent => Some(
            AGENT
                .acquire()
                .await
                .map_err(|e| ControlError::Interrupted(e.to_string()))?,
        ),
        Lane::Watch | Lane::Naming(_) => None,
    };
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Instant;

    use super::*;

    /// A control plane that accepts and never answers (its connections held open).
    fn silent() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| unreachable!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| unreachable!("{e}"));
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming().take(4096).flatten() {
                held.push(conn);
            }
        });
        format!("http://{addr}")
    }

    /// A control plane that answers every request at once with no exception.
    fn answering() -> String {
        answering_with("[]")
    }

    /// A server that answers every request at once, 200 with `body` as JSON.
    fn answering_with(body: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| unreachable!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| unreachable!("{e}"));
        std::thread::spawn(move || {
            for mut conn in listener.incoming().take(64).flatten() {
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head);
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes());
                let _ = conn.write_all(body.as_bytes());
            }
        });
        format!("http://{addr}")
    }

    /// Shuts a runtime down without waiting for its blocking threads.
    struct Background(Option<tokio::runtime::Runtime>);

    impl Drop for Background {
        fn drop(&mut self) {
            if let Some(rt) = self.0.take() {
                rt.shutdown_background();
            }
        }
    }

    fn egress(admin: String) -> Egress {
        Egress {
            admin,
            token: "t".to_owned(),
            approvals_url: String::new(),
        }
    }

    /// As an attacker: an agent floods the server with tool calls whose control-plane calls
    /// hang. They hold their few slots and wait without a thread; the watch's read still
    /// gets a thread at once and answers within its bound. (Before, the flood's calls took
    /// every blocking thread, and the watch's read waited behind them for as long as they
    /// hung: a revoked tweak kept until its expiry.)
    #[test]
    fn a_flood_of_agent_calls_never_delays_the_watch() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(AGENT_SLOTS + 2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| unreachable!("{e}"));
        // The flood's threads stay blocked until their own time limit: not waited for.
        let _shutdown = Background(Some(rt));
        let rt = _shutdown.0.as_ref().unwrap_or_else(|| unreachable!());
        rt.block_on(async {
            let stuck = egress(silent());
            let flood: Vec<_> = (0..64)
                .map(|_| {
                    let stuck = stuck.clone();
                    tokio::spawn(async move { approved_of(&stuck, "t-1", Lane::Agent).await })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(200)).await;
            let started = Instant::now();
            let read = approved_of(&egress(answering()), "t-1", Lane::Watch).await;
            assert_eq!(read.map(|v| v.len()), Ok(0));
            assert!(started.elapsed() < WATCH_TIMEOUT, "{:?}", started.elapsed());
            // And a watch read that cannot be answered fails within its bound, thread wait
            // and all.
            let started = Instant::now();
            let stuck_read = approved_of(&stuck, "t-1", Lane::Watch).await;
            assert!(
                matches!(stuck_read, Err(ControlError::Timeout(_))),
                "{stuck_read:?}"
            );
            assert!(started.elapsed() < WATCH_TIMEOUT * 2, "{:?}", started.elapsed());
            for f in flood {
                f.abort();
            }
        });
    }

    /// As an attacker holding the control plane's old address (a test's origin, any server
    /// that answers 200 with JSON): its answer is not a list of exceptions, and it is an
    /// error, so a run keeps the tweaks last read until they expire. (Before, it read as
    /// "nothing approved": every tweak ended at once, named `ended`.)
    #[test]
    fn an_answer_that_is_not_a_list_is_an_error_not_none() {
        // Every answer comes at once: no thread is left blocked to wait for.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| unreachable!("{e}"));
        rt.block_on(async {
            for body in [r#"{"ok":true}"#, "null", r#""approved""#, " "] {
                let read = approved_of(&egress(answering_with(body)), "t-1", Lane::Watch).await;
                assert!(matches!(read, Err(ControlError::Answer(_))), "{body}: {read:?}");
            }
        });
    }
}
