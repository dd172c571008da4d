//! The MCP tools (rmcp): `list_sandboxes`, `run`, `request_egress`, `egress_status`. Each
//! call is audited before it acts (fail closed) and after. Input schemas come from the Rust
//! types below (schemars), so a client sees exactly what is accepted; unknown fields are
//! refused.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::audit::{ToolAudit, command_digest};
use crate::config::{Config, MAX_WAIT_SECONDS, Sandbox};
use crate::{at, control, gates, limits, runner};

/// The most an agent may hand a command on standard input.
const MAX_STDIN_BYTES: usize = 1024 * 1024;

/// The server: the configuration, the audit log, the sandgate binary that runs sandboxes.
#[derive(Debug, Clone)]
pub struct SandgateMcp {
    config: Arc<Config>,
    audit: Arc<ToolAudit>,
    sandgate: PathBuf,
    /// The server's own files, given to every run as `--protect`.
    protect: Arc<[PathBuf]>,
    /// Runs in progress (at most `max_concurrent_runs`).
    runs: Arc<tokio::sync::Semaphore>,
    /// `request_egress` calls waiting for a decision (the rest return at once).
    waits: Arc<tokio::sync::Semaphore>,
    tool_router: ToolRouter<Self>,
}

/// `request_egress` calls that may wait for a decision at the same time.
const MAX_WAITING: usize = 4;

/// One sandbox as the agent sees it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SandboxInfo {
    pub name: String,
    pub description: String,
    /// `none`, `loopback`, `allowlist`, `proxy` or `all`.
    pub network_mode: String,
    /// Destinations the sandbox's own policy allows (exceptions come on top).
    pub allowed_hosts: Vec<String>,
    /// Programs `run` accepts as the command's first word.
    pub commands: Vec<String>,
    pub max_seconds: u64,
    pub max_output_bytes: usize,
    /// Directories a run may name as its workspace.
    pub workspaces: Vec<String>,
    /// What a run may take, as `NAME=VALUE` (`off`: no limit): processes, memory, tmpfs
    /// (each tmpfs, `/tmp` among them), cpu_seconds (per process; at most the run's timeout
    /// unless the operator says otherwise), open_files.
    pub limits: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SandboxList {
    /// The task this server's runs and egress requests are attributed to.
    pub task: String,
    pub sandboxes: Vec<SandboxInfo>,
}

/// `run`'s input.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    /// The sandbox's name (see `list_sandboxes`).
    pub sandbox: String,
    /// The program and its arguments, not a shell line: the program must be one of the
    /// sandbox's `commands`.
    pub command: Vec<String>,
    /// Text given to the command on standard input (at most 1 MiB).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Seconds before the run is killed; default and maximum: the sandbox's `max_seconds`.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// A directory under one of the sandbox's `workspaces`, bound where the policy says
    /// `${WORKSPACE}`.
    #[serde(default)]
    pub workspace: Option<String>,
}

/// `request_egress`'s input.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressParams {
    /// Exact host names (no wildcards, no IP addresses), at most 16.
    pub hosts: Vec<String>,
    /// Ports; default 443 and 80 (the control plane's bounds apply).
    #[serde(default)]
    pub ports: Option<Vec<u16>>,
    /// How long the exception should last, in seconds (the policy's maximum applies).
    pub ttl_seconds: u32,
    /// Why the task needs it; shown to the person who decides.
    pub reason: String,
    /// Wait up to this many seconds (at most 600) for a person's decision; 0 or absent:
    /// return at once.
    #[serde(default)]
    pub wait_seconds: Option<u64>,
}

/// An exception request's state.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EgressAnswer {
    pub id: String,
    /// `pending`, `approved`, `denied`, `revoked` or `expired`.
    pub state: String,
    /// Unix seconds, once approved.
    pub expires_at: Option<i64>,
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

#[tool_router(router = tool_router)]
impl SandgateMcp {
    pub fn new(config: Config, audit: ToolAudit, sandgate: PathBuf) -> SandgateMcp {
        SandgateMcp {
            runs: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent_runs)),
            waits: Arc::new(tokio::sync::Semaphore::new(MAX_WAITING)),
            protect: config.own_files.iter().map(|f| f.path.clone()).collect(),
            config: Arc::new(config),
            audit: Arc::new(audit),
            sandgate,
            tool_router: Self::tool_router(),
        }
    }

    /// Lists the sandboxes: name, description, network mode, allowed hosts, gates.
    #[tool(
        name = "list_sandboxes",
        description = "List the sandboxes commands can run in: name, description, network mode, allowed hosts, and the gates (programs, time and output limits, workspaces)."
    )]
    pub async fn list_sandboxes(&self, ctx: RequestContext<RoleServer>) -> Result<Json<SandboxList>, String> {
        self.audit.record(
            "tool_call",
            json!({"tool": "list_sandboxes", "subject": who(&ctx), "task_id": self.config.task, "outcome": "ok"}),
        )?;
        let sandboxes = self
            .config
            .sandboxes
            .iter()
            .map(|s| SandboxInfo {
                name: s.name.clone(),
                description: s.description.clone(),
                network_mode: s.net.name().to_owned(),
                allowed_hosts: s.allowed_hosts.clone(),
                commands: s.gates.commands.clone(),
                max_seconds: s.gates.max_seconds,
                max_output_bytes: s.gates.max_output_bytes,
                workspaces: s
                    .gates
                    .workspaces
                    .iter()
                    .map(|w| w.display().to_string())
                    .collect(),
                limits: limits::text(&limits::for_run(
                    &s.gates.limits,
                    &s.policy_limits,
                    s.gates.max_seconds,
                )),
            })
            .collect();
        Ok(Json(SandboxList {
            task: self.config.task.clone(),
            sandboxes,
        }))
    }

    /// Runs a command in a sandbox.
    #[tool(
        name = "run",
        description = "Run a command (program and arguments, no shell) in a named sandbox. Returns the exit status, stdout and stderr (cut at the sandbox's output limit, with a marker), whether it was killed at its time limit, and the network destinations blocked during the run. A program, timeout or workspace outside the sandbox's gates is refused, naming the gate."
    )]
    pub async fn run(
        &self,
        Parameters(p): Parameters<RunParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<runner::RunReport>, String> {
        let subject = who(&ctx);
        let digest = command_digest(&p.command);
        let base = json!({
            "tool": "run",
            "subject": subject,
            "task_id": self.config.task,
            "sandbox": p.sandbox,
            "command_sha256": digest,
            "program": p.command.first(),
        });
        let refuse = |gate: &str, message: String| -> Result<Json<runner::RunReport>, String> {
            let mut e = base.clone();
            merge(
                &mut e,
                json!({"outcome": "refused", "gate": gate, "detail": message}),
            );
            self.audit.record("tool_call", e)?;
            Err(message)
        };
        let Some(sandbox) = self.sandbox(&p.sandbox) else {
            let known: Vec<&str> = self.config.sandboxes.iter().map(|s| s.name.as_str()).collect();
            return refuse(
                "sandbox",
                format!(
                    "refused by gate `sandbox`: no sandbox {:?} (known: {})",
                    p.sandbox,
                    known.join(", ")
                ),
            );
        };
        let stdin = p.stdin.unwrap_or_default();
        if stdin.len() > MAX_STDIN_BYTES {
            return refuse(
                "stdin",
                format!(
                    "refused by gate `stdin`: {} bytes of input, at most {MAX_STDIN_BYTES}",
                    stdin.len()
                ),
            );
        }
        let workspace = match p.workspace.as_deref().map(std::fs::canonicalize) {
            None => None,
            Some(Ok(w)) => Some(w),
            Some(Err(e)) => {
                return refuse(
                    "workspaces",
                    format!(
                        "refused by gate `workspaces`: {:?}: {e}",
                        p.workspace.unwrap_or_default()
                    ),
                );
            }
        };
        let admitted = match gates::check(
            &sandbox.gates,
            &p.command,
            p.timeout_seconds,
            workspace.as_deref(),
        ) {
            Ok(a) => a,
            Err(refusal) => return refuse(refusal.gate, refusal.to_string()),
        };
        let Ok(_slot) = self.runs.clone().try_acquire_owned() else {
            return refuse(
                "concurrency",
                format!(
                    "refused by gate `concurrency`: {} run(s) already in progress, at most {} at once",
                    self.config.max_concurrent_runs, self.config.max_concurrent_runs
                ),
            );
        };
        let limits = limits::for_run(&sandbox.gates.limits, &sandbox.policy_limits, admitted.seconds);
        let limit_flags = limits::flags(&limits, &sandbox.policy_limits);
        // Fail closed: a run that cannot be recorded does not start.
        let (mut started, job) = (base.clone(), runner::next_job());
        merge(
            &mut started,
            json!({"outcome": "started", "job_id": job, "timeout_seconds": admitted.seconds, "limits": limits::text(&limits)}),
        );
        self.audit.record("tool_call_started", started)?;
        let spec = runner::RunSpec {
            sandgate: &self.sandgate,
            policy: &sandbox.policy,
            command: &p.command,
            stdin: stdin.as_bytes(),
            workspace: workspace.as_deref(),
            limit: Duration::from_secs(admitted.seconds),
            max_output_bytes: sandbox.gates.max_output_bytes,
            subject: &subject_id(&ctx),
            task: &self.config.task,
            job: &job,
            protect: &self.protect,
            limits: &limit_flags,
        };
        let report = runner::run(&spec).await;
        let mut end = base;
        match &report {
            Ok(r) => merge(
                &mut end,
                json!({
                    "outcome": if r.timed_out { "timeout" } else { "exited" },
                    "exit_code": r.exit_code,
                    "signal": r.signal,
                    "duration_ms": r.duration_ms,
                    "blocked": r.blocked.len(),
                }),
            ),
            Err(e) => merge(&mut end, json!({"outcome": "error", "detail": e})),
        }
        self.audit.record("tool_call", end)?;
        report.map(Json)
    }

    /// Files an exception request for the task.
    #[tool(
        name = "request_egress",
        description = "Ask for temporary network access for this task (exact hosts, ports, a TTL and a reason). A person approves or denies it in sandgate's CLI or web page; the agent cannot. Returns the request's id and state; with wait_seconds, waits up to that long for the decision."
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
            "hosts": p.hosts,
            "ports": p.ports,
            "ttl_seconds": p.ttl_seconds,
        });
        let Some(egress) = &self.config.egress else {
            merge(&mut event, json!({"outcome": "refused", "gate": "egress"}));
            self.audit.record("tool_call", event)?;
            return Err(
                "refused by gate `egress`: this server takes no egress requests (no spec.egress)".to_owned(),
            );
        };
        // Recorded before it is filed: a request the log never saw must not reach a person.
        let mut started = event.clone();
        merge(&mut started, json!({"outcome": "started", "reason": p.reason}));
        self.audit.record("tool_call_started", started)?;
        let filed = control::request(
            egress,
            &self.config.task,
            &p.hosts,
            p.ports.as_deref(),
            p.ttl_seconds,
            &p.reason,
        )
        .await;
        let exception = match filed {
            Ok(x) => x,
            Err(e) => {
                merge(&mut event, json!({"outcome": "refused", "detail": e.to_string()}));
                self.audit.record("tool_call", event)?;
                return Err(e.to_string());
            }
        };
        let id = at(&exception, "id").as_str().unwrap_or_default().to_owned();
        merge(&mut event, json!({"exception_id": id, "outcome": "requested"}));
        self.audit.record("tool_call", event.clone())?;
        // Point the person at the approvals page where the client can show a link. What
        // the client answers changes nothing: only a decision in sandgate approves.
        if let Ok(url) = url::Url::parse(&egress.approvals_url) {
            let message = format!(
                "The agent asks for network access to {} for {} s: {}. Approve or deny it on sandgate's approvals page (request {id}).",
                p.hosts.join(", "),
                p.ttl_seconds,
                p.reason
            );
            let asked = ctx
                .peer
                .elicit_url_with_timeout(message, url, id.clone(), Some(Duration::from_secs(5)))
                .await;
            if let Ok(action) = asked {
                let mut e = event.clone();
                merge(
                    &mut e,
                    json!({"outcome": "elicitation_answered", "detail": format!("{action:?} (not an approval)")}),
                );
                self.audit.record("tool_call", e)?;
            }
        }
        let slot = self.waits.clone().try_acquire_owned().ok();
        let wait = match slot {
            Some(_) => Duration::from_secs(p.wait_seconds.unwrap_or(0).min(MAX_WAIT_SECONDS)),
            None => Duration::ZERO,
        };
        let deadline = Instant::now() + wait;
        let mut current = exception;
        while at(&current, "state") == "pending" && Instant::now() < deadline {
            tokio::time::sleep(
                Duration::from_millis(500).min(deadline.saturating_duration_since(Instant::now())),
            )
            .await;
            if let Ok(x) = control::show(egress, &id).await {
                current = x;
            }
        }
        let state = at(&current, "state").as_str().unwrap_or("unknown").to_owned();
        let message = match state.as_str() {
            "pending" => format!("Waiting for a person to decide at {}.", egress.approvals_url),
            "approved" => {
                "Approved: the next run reaches these hosts until the exception expires.".to_owned()
            }
            other => format!("The request is {other}."),
        };
        Ok(Json(EgressAnswer {
            id,
            state,
            expires_at: at(&current, "expires_at").as_i64(),
            approvals_url: egress.approvals_url.clone(),
            message,
        }))
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
        let all = control::list(egress).await.map_err(|e| e.to_string())?;
        let mine = all
            .as_array()
            .into_iter()
            .flatten()
            .filter(|x| at(x, "task_id") == self.config.task.as_str());
        let (mut active, mut pending) = (Vec::new(), Vec::new());
        for x in mine {
            match at(x, "state").as_str() {
                Some("approved") => active.push(x.clone()),
                Some("pending") => pending.push(x.clone()),
                _ => {}
            }
        }
        Ok(Json(EgressStatus {
            task: self.config.task.clone(),
            active,
            pending,
        }))
    }

    fn sandbox(&self, name: &str) -> Option<&Sandbox> {
        self.config.sandboxes.iter().find(|s| s.name == name)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandgateMcp {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.instructions = Some(format!(
            "Runs commands in sandboxes for task {}. Use list_sandboxes first. Network access beyond a sandbox's policy must be asked for with request_egress and approved by a person.",
            self.config.task
        ));
        info
    }
}

/// Who is calling: the client's name and version from its handshake, when it made one.
fn who(ctx: &RequestContext<RoleServer>) -> String {
    ctx.peer.peer_info().map_or_else(
        || "unknown client".to_owned(),
        |info| format!("{} {}", info.client_info.name, info.client_info.version),
    )
}

/// The client as an id for a run's `--subject`: `mcp:` and its stated name, each character
/// an id may not hold replaced by `_`.
fn subject_id(ctx: &RequestContext<RoleServer>) -> String {
    let name = ctx
        .peer
        .peer_info()
        .map_or_else(|| "unknown".to_owned(), |info| info.client_info.name.clone());
    let clean: String = name
        .chars()
        .take(120)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' | ':' => c,
            _ => '_',
        })
        .collect();
    format!("mcp:{clean}")
}

fn merge(into: &mut Value, more: Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, more) {
        a.extend(b);
    }
}
