//! The egress tools, `request_egress` and `egress_status`, as their own rmcp tool router
//! (`egress_tools`, added to the server's in [`SandgateMcp::new`]), with
//! their input and answer types (the input schemas come from them; unknown fields are
//! refused). Each call is audited before it acts (fail closed) and after. What a request is
//! for and whether it is "approved" (the next run passes) is decided in [`crate::egress`];
//! the control plane is reached through [`crate::control`]. A person is pointed at the
//! approvals page where the client can show a link; nothing the client answers approves.

use std::time::{Duration, Instant};

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use sandgate_policy::exception::BelowHost;

use super::{SandgateMcp, merge, who};
use crate::config::MAX_WAIT_SECONDS;
use crate::{at, control, egress};

/// `request_egress` calls that may wait for a decision at the same time.
pub(super) const MAX_WAITING: usize = 4;

/// `request_egress`'s input.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressParams {
    /// The sandbox whose runs need the hosts; default: every sandbox an approval reaches.
    #[serde(default)]
    pub sandbox: Option<String>,
    /// Exact host names (no wildcards, no IP addresses), at most 16.
    pub hosts: Vec<String>,
    /// Ports; default 443 and 80 (the control plane's bounds apply).
    #[serde(default)]
    pub ports: Option<Vec<u16>>,
    /// How long the exception should last, in seconds (the policy's maximum applies).
    pub ttl_seconds: u32,
    /// Why the task needs it; shown to the person who decides.
    pub reason: String,
    /// Only these methods (uppercase, as sent: GET, POST); default: every method.
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    /// Only these paths, as patterns (`/org/**`, `/org/*/info/refs`; docs/policy.md);
    /// default: every path. Over HTTPS, method and path rules hold where the proxy that
    /// decides inspects the tunnel (a sandbox's own proxy does).
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    /// Only GET, HEAD and OPTIONS.
    #[serde(default)]
    pub read_only: bool,
    /// Wait up to this many seconds (at most 600) for a person's decision; 0 or absent:
    /// return at once.
    #[serde(default)]
    pub wait_seconds: Option<u64>,
}

/// An exception request's state.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EgressAnswer {
    /// The exception the state is of: the one that answers (when approved, any active
    /// exception for the task that holds every host and port asked for), else the request.
    pub id: String,
    /// The request filed (or the identical one already pending, or the active exception
    /// the control plane returned instead).
    pub requested_id: String,
    /// `approved` (the next run of each sandbox in `reaches` passes), `pending`, `denied`,
    /// `revoked`, `expired`, or `not_applied` (approved at the control plane, but beyond
    /// what the sandboxes' runs apply: see the message).
    pub state: String,
    /// Sandboxes whose next run reaches the hosts (when approved).
    pub reaches: Vec<String>,
    /// When it ends, once approved: RFC 3339 (`2026-11-27T01:02:03Z`), as the admin API
    /// and the audit log write times.
    pub expires_at: Option<String>,
    /// Where a person decides.
    pub approvals_url: String,
    pub message: String,
}

/// The task's exceptions in force and requests waiting.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EgressStatus {
    pub task: String,
    pub active: Vec<Value>,
    pub pending: Vec<Value>,
}

/// `request_egress` and `egress_status`.
#[tool_router(router = egress_tools, vis = "pub(super)")]
impl SandgateMcp {
    /// Files an exception request for the task the sandboxes' runs carry, and waits, if
    /// asked, until an exception that covers it reaches their next run.
    #[tool(
        name = "request_egress",
        description = "Ask for temporary network access for this task (exact hosts, ports, a TTL and a reason; optionally the sandbox that needs it, and only some methods or paths, or read-only). A person approves or denies it in sandgate's CLI or web page; the agent cannot. Returns the request's id and state; with wait_seconds, waits up to that long. The state is `approved` only when the next run reaches the hosts; asking again while a request is pending returns that request."
    )]
    pub async fn request_egress(
        &self,
        Parameters(p): Parameters<EgressParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<EgressAnswer>, String> {
        let subject = who(&ctx);
        let mut event = json!({
            "tool": "request_egress",
            "subject": subject,
            "task_id": self.config.task,
            "sandbox": p.sandbox,
            "hosts": p.hosts,
            "ports": p.ports,
            "ttl_seconds": p.ttl_seconds,
            "methods": p.methods,
            "paths": p.paths,
            "read_only": p.read_only,
        });
        let refuse = |mut event: Value, gate: &str, message: String| -> Result<Json<EgressAnswer>, String> {
            merge(
                &mut event,
                json!({"outcome": "refused", "gate": gate, "detail": message}),
            );
            self.audit.record("tool_call", event)?;
            Err(message)
        };
        let Some(egress) = &self.config.egress else {
            return refuse(
                event,
                "egress",
                "refused by gate `egress`: this server takes no egress requests (no spec.egress)".to_owned(),
            );
        };
        // The sandboxes it is for, and the task their runs carry (the request's task).
        let plan = match egress::plan(
            &self.config,
            &egress.admin,
            p.sandbox.as_deref(),
            &p.hosts,
            p.ports.as_deref(),
            p.ttl_seconds,
            BelowHost::new(p.methods.clone(), p.paths.clone(), p.read_only),
        ) {
            Ok(plan) => plan,
            Err(r) => return refuse(event, r.gate, r.message),
        };
        merge(&mut event, json!({"task_id": plan.task}));
        // Recorded before it is filed: a request the log never saw must not reach a person.
        let mut started = event.clone();
        merge(&mut started, json!({"outcome": "started", "reason": p.reason}));
        self.audit.record("tool_call_started", started)?;
        let filed = control::request(
            egress,
            &plan.task,
            &p.hosts,
            p.ports.as_deref(),
            p.ttl_seconds,
            &p.reason,
            &plan.below,
        )
        .await
        .and_then(control::exception);
        let filed = self.on_record(filed, &mut event)?;
        let id = filed.id.clone();
        // What the task holds already: an approval may cover it, and a tweak may have opened
        // a sandbox's network (or not: then no approval reaches its runs).
        let seen = control::approved_of(egress, &plan.task, control::Lane::Agent)
            .await
            .unwrap_or_default();
        let judge = |current: &sandgate_policy::Exception, seen: &[sandgate_policy::Exception]| {
            let open = |s: &crate::config::Sandbox| {
                s.net == sandgate_sandbox::policy::NetMode::None
                    || s.gates.network
                    || crate::tweaks::granted(s, seen, now()).network
            };
            egress::judge(&plan, &egress.admin, (current, seen), now(), open)
        };
        let verdict = judge(&filed, &seen);
        if !verdict.is_final() {
            self.point_at_approvals(&ctx, egress, &p, &id, &event).await?;
        }
        let verdict = self
            .wait_for(egress, &plan.task, filed, verdict, p.wait_seconds, judge)
            .await;
        let ex = verdict.exception();
        let reaches = match &verdict {
            egress::Verdict::Approved { reaches, .. } => reaches.clone(),
            _ => Vec::new(),
        };
        Ok(Json(EgressAnswer {
            id: ex.id.clone(),
            requested_id: id,
            state: verdict.state(now()),
            reaches,
            expires_at: ex.expires_at.and_then(sandgate_policy::rfc3339::format),
            approvals_url: egress.approvals_url.clone(),
            message: egress::message(&plan, &verdict, &egress.approvals_url),
        }))
    }

    /// Points the person at the approvals page where the client can show a link. What the
    /// client answers changes nothing: only a decision in sandgate approves.
    async fn point_at_approvals(
        &self,
        ctx: &RequestContext<RoleServer>,
        egress: &crate::config::Egress,
        p: &EgressParams,
        id: &str,
        event: &Value,
    ) -> Result<(), String> {
        let message = format!(
            "The agent asks for network access to {} for {} s: {}. Approve or deny it on sandgate's approvals page (request {id}).",
            p.hosts.join(", "),
            p.ttl_seconds,
            p.reason
        );
        self.point_with(ctx, egress, message, id, event).await
    }

    /// The task's exceptions.
    #[tool(
        name = "egress_status",
        description = "This task's exceptions in force (approved, not expired) and its requests waiting for a decision."
    )]
    pub async fn egress_status(&self, ctx: RequestContext<RoleServer>) -> Result<Json<EgressStatus>, String> {
        let event = json!({"tool": "egress_status", "subject": who(&ctx), "task_id": self.config.task, "outcome": "ok"});
        self.audit.record("tool_call", event)?;
        let Some(egress) = &self.config.egress else {
            return Err(
                "refused by gate `egress`: this server takes no egress requests (no spec.egress)".to_owned(),
            );
        };
        let tasks: std::collections::BTreeSet<&str> = std::iter::once(self.config.task.as_str())
            .chain(self.config.sandboxes.iter().map(|s| s.run_task.as_str()))
            .collect();
        // Only the two states shown, not the task's whole history.
        let active = rows_in(egress, "approved", &tasks).await?;
        let pending = rows_in(egress, "pending", &tasks).await?;
        Ok(Json(EgressStatus {
            task: self.config.task.clone(),
            active,
            pending,
        }))
    }
}

/// What both request tools share: the answer on record, the link to the approvals page,
/// and the wait.
impl SandgateMcp {
    /// What the control plane answered a request, on record: the exception filed (or the
    /// one it returned instead), its id and state added to `event`; a refusal recorded and
    /// given back as the tool's error.
    pub(super) fn on_record(
        &self,
        answer: Result<sandgate_policy::Exception, control::ControlError>,
        event: &mut Value,
    ) -> Result<sandgate_policy::Exception, String> {
        let filed = match answer {
            Ok(x) => x,
            Err(e) => {
                merge(event, json!({"outcome": "refused", "detail": e.to_string()}));
                self.audit.record("tool_call", event.clone())?;
                return Err(e.to_string());
            }
        };
        merge(
            event,
            json!({"exception_id": filed.id, "state": filed.state.to_string(), "outcome": "requested"}),
        );
        self.audit.record("tool_call", event.clone())?;
        Ok(filed)
    }

    /// Shows `message` with a link to the approvals page, where the client can; records
    /// what the client answered (never an approval).
    pub(super) async fn point_with(
        &self,
        ctx: &RequestContext<RoleServer>,
        egress: &crate::config::Egress,
        message: String,
        id: &str,
        event: &Value,
    ) -> Result<(), String> {
        let Ok(url) = url::Url::parse(&egress.approvals_url) else {
            return Ok(());
        };
        let asked = ctx
            .peer
            .elicit_url_with_timeout(message, url, id.to_owned(), Some(Duration::from_secs(5)))
            .await;
        if let Ok(action) = asked {
            let mut e = event.clone();
            merge(
                &mut e,
                json!({"outcome": "elicitation_answered", "detail": format!("{action:?} (not an approval)")}),
            );
            self.audit.record("tool_call", e)?;
        }
        Ok(())
    }

    /// Waits, up to `wait_seconds` (at most [`MAX_WAIT_SECONDS`]; not at all while
    /// [`MAX_WAITING`] calls wait already), until the verdict `judge` gives on the request
    /// as last shown and the task's exceptions is final; looked at once at least (a pending
    /// answer may have a covering exception beside it).
    pub(super) async fn wait_for(
        &self,
        egress: &crate::config::Egress,
        task: &str,
        filed: sandgate_policy::Exception,
        mut verdict: egress::Verdict,
        wait_seconds: Option<u64>,
        judge: impl Fn(&sandgate_policy::Exception, &[sandgate_policy::Exception]) -> egress::Verdict,
    ) -> egress::Verdict {
        let slot = self.waits.clone().try_acquire_owned().ok();
        let wait = match slot {
            Some(_) => Duration::from_secs(wait_seconds.unwrap_or(0).min(MAX_WAIT_SECONDS)),
            None => Duration::ZERO,
        };
        let deadline = Instant::now() + wait;
        let id = filed.id.clone();
        let mut current = filed;
        let mut first = true;
        while !verdict.is_final() && (first || Instant::now() < deadline) {
            if !first {
                tokio::time::sleep(
                    Duration::from_millis(500).min(deadline.saturating_duration_since(Instant::now())),
                )
                .await;
            }
            first = false;
            // The request's own state (pending, denied, ...), and what is approved now.
            let shown = control::show(egress, &id, control::Lane::Agent)
                .await
                .and_then(control::exception);
            if let Ok(x) = shown {
                current = x;
            }
            if let Ok(seen) = control::approved_of(egress, task, control::Lane::Agent).await {
                verdict = judge(&current, &seen);
            }
        }
        verdict
    }
}

/// The exceptions in `state` of `tasks`, as the admin API writes them.
async fn rows_in(
    egress: &crate::config::Egress,
    state: &str,
    tasks: &std::collections::BTreeSet<&str>,
) -> Result<Vec<Value>, String> {
    let all = control::in_state(egress, state)
        .await
        .map_err(|e| e.to_string())?;
    Ok(all
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| at(x, "task_id").as_str().is_some_and(|t| tasks.contains(t)))
        .filter(|x| at(x, "state") == state)
        .cloned()
        .collect())
}

/// Unix seconds now: when an exception is active.
pub(super) fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}
