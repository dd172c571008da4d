//! The MCP server (rmcp): its state, the `ServerHandler` glue, and the tools
//! `list_sandboxes` and `run` (with the tweaks active for its sandbox applied, within its
//! bounds); the egress tools, `request_egress` and `egress_status`, are in
//! `server/egress_tools.rs`, and `request_tweak` in `server/tweak_tools.rs`, each set a
//! tool router of its own, added together in
//! [`SandgateMcp::new`]. Each call is audited before it acts (fail closed) and after. Input
//! schemas come from the Rust types (schemars), so a client sees exactly what is accepted;
//! unknown fields are refused. The server names itself sandgate, with its version.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use self::egress_tools::now;
use crate::audit::{ToolAudit, command_digest};
use crate::config::{Config, Sandbox};
use crate::{gates, limits, runner, tweaks};
use sandgate_sandbox::policy::NetMode;

mod egress_tools;
mod tweak_tools;

pub use egress_tools::{EgressAnswer, EgressParams, EgressStatus};
pub use tweak_tools::{TweakAnswer, TweakParams, TweaksInfo};

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
    /// The task its runs carry, for which its exceptions are asked (the server's task, or
    /// `NODE:TASK` for a node of central proxies).
    pub task: String,
    /// Whether, and how, an approved exception reaches its runs.
    pub approvals: ApprovalsInfo,
    /// What `request_tweak` may ask beyond the gates (`bounds`), and what is granted now
    /// (`granted`); absent: nothing can be asked for this sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tweaks: Option<TweaksInfo>,
}

/// How approvals reach a sandbox's runs.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ApprovalsInfo {
    /// `followed control plane` (the run's own proxy follows the control plane this server
    /// files requests with), `upstream proxy` (the upstream decides: approvals apply only if
    /// it hosts or follows that control plane) or `none`.
    pub path: String,
    /// How, or the setting that would make it work.
    pub detail: String,
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

impl SandgateMcp {
    pub fn new(config: Config, audit: ToolAudit, sandgate: PathBuf) -> SandgateMcp {
        SandgateMcp {
            runs: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent_runs)),
            waits: Arc::new(tokio::sync::Semaphore::new(egress_tools::MAX_WAITING)),
            protect: config.own_files.iter().map(|f| f.path.clone()).collect(),
            config: Arc::new(config),
            audit: Arc::new(audit),
            sandgate,
            tool_router: Self::sandbox_tools() + Self::egress_tools() + Self::tweak_tools(),
        }
    }

    fn sandbox(&self, name: &str) -> Option<&Sandbox> {
        self.config.sandboxes.iter().find(|s| s.name == name)
    }
}

/// `list_sandboxes` and `run`.
#[tool_router(router = sandbox_tools)]
impl SandgateMcp {
    /// Lists the sandboxes: name, description, network mode, allowed hosts, gates, and how
    /// approvals reach each.
    #[tool(
        name = "list_sandboxes",
        description = "List the sandboxes commands can run in: name, description, network mode, allowed hosts, the gates (programs, time and output limits, workspaces), the task their runs carry, and whether an approved egress request reaches their runs, and how."
    )]
    pub async fn list_sandboxes(&self, ctx: RequestContext<RoleServer>) -> Result<Json<SandboxList>, String> {
        self.audit.record(
            "tool_call",
            json!({"tool": "list_sandboxes", "subject": who(&ctx), "task_id": self.config.task, "outcome": "ok"}),
        )?;
        let admin = self.config.egress.as_ref().map(|e| e.admin.as_str());
        let mut tweaks = Vec::new();
        for s in &self.config.sandboxes {
            tweaks.push(self.tweaks_info(s).await);
        }
        let sandboxes = self
            .config
            .sandboxes
            .iter()
            .zip(tweaks)
            .map(|(s, tweaks)| SandboxInfo {
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
                task: s.run_task.clone(),
                approvals: ApprovalsInfo {
                    path: s.approvals.kind(admin).to_owned(),
                    detail: s.approvals.detail(admin, &s.run_task),
                },
                tweaks,
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
        // The gates widened by what a person granted this sandbox for now, within its bounds
        // (the plain gates when nothing is, or the control plane cannot be read).
        let granted = self.granted(sandbox).await;
        let gates = tweaks::widened(&sandbox.gates, &granted);
        if sandbox.net != NetMode::None && !gates.network {
            return refuse(
                "network",
                format!(
                    "refused by gate `network`: sandbox {:?} has a network (net.mode {}) only while a person grants it (request_tweak with network)",
                    sandbox.name,
                    sandbox.net.name()
                ),
            );
        }
        let mut admitted = match gates::check(&gates, &p.command, p.timeout_seconds, workspace.as_deref()) {
            Ok(a) => a,
            Err(refusal) => return refuse(refusal.gate, refusal.to_string()),
        };
        // A run that only a tweak lets through ends when the first tweak it has ends, not
        // an hour later at its own time limit.
        let plain = gates::check(
            &sandbox.gates,
            &p.command,
            p.timeout_seconds,
            workspace.as_deref(),
        );
        let needs_tweak = plain.is_err() || (sandbox.net != NetMode::None && !sandbox.gates.network);
        if needs_tweak && let Some(ends) = granted.ends_at {
            let left = u64::try_from(ends - now()).unwrap_or(0).max(1);
            admitted.seconds = admitted.seconds.min(left);
        }
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
            json!({"outcome": "started", "job_id": job, "timeout_seconds": admitted.seconds, "limits": limits::text(&limits), "tweaks": granted.ids}),
        );
        self.audit.record("tool_call_started", started)?;
        let spec = runner::RunSpec {
            sandgate: &self.sandgate,
            policy: &sandbox.policy,
            command: &p.command,
            stdin: stdin.as_bytes(),
            workspace: workspace.as_deref(),
            limit: Duration::from_secs(admitted.seconds),
            max_output_bytes: gates.max_output_bytes,
            subject: &sandgate_sandbox::run::user_subject(),
            agent: &agent_id(&ctx),
            task: &self.config.task,
            job: &job,
            protect: &self.protect,
            limits: &limit_flags,
            start_in_workspace: sandbox.start_in_workspace,
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
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandgateMcp {
    fn get_info(&self) -> ServerConfig {
        // sandgate and its version, not the SDK's name (rmcp's default).
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("sandgate", env!("CARGO_PKG_VERSION"))
                    .with_title("sandgate: commands in sandboxes, egress a person approves"),
            )
            .with_instructions(format!(
                "Runs commands in sandboxes for task {}. Use list_sandboxes first. Network access beyond a sandbox's policy must be asked for with request_egress and approved by a person; a command finds its workspace in $SANDGATE_WORKSPACE.",
                self.config.task
            ))
    }
}

/// Who is calling: the client's name and version from its handshake, when it made one.
fn who(ctx: &RequestContext<RoleServer>) -> String {
    ctx.peer.peer_info().map_or_else(
        || "unknown client".to_owned(),
        |info| format!("{} {}", info.client_info.name, info.client_info.version),
    )
}

/// The client as an id for a run's `--agent`: `mcp:` and its stated name, each character
/// an id may not hold replaced by `_`.
fn agent_id(ctx: &RequestContext<RoleServer>) -> String {
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
