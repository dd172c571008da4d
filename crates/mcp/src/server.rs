//! The MCP server (rmcp): its state, the `ServerHandler` glue, and the tool
//! `list_sandboxes`; `run` (with the tweaks active for its sandbox applied, within its
//! bounds, and watched while it holds one) is in `server/run_tool.rs`, the egress tools,
//! `request_egress` and `egress_status`, in `server/egress_tools.rs`, and `request_tweak` in
//! `server/tweak_tools.rs`, each set a tool router of its own, added together in
//! [`SandgateMcp::new`]. Each call is audited before it acts (fail closed) and after. Input
//! schemas come from the Rust types (schemars), so a client sees exactly what is accepted;
//! unknown fields are refused. The server names itself sandgate, with its version.

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Json;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

use crate::audit::ToolAudit;
use crate::config::{Config, Sandbox};
use crate::limits;

mod egress_tools;
mod run_tool;
mod tweak_tools;

pub use egress_tools::{EgressAnswer, EgressParams, EgressStatus};
pub use run_tool::RunParams;
pub use tweak_tools::{TweakAnswer, TweakParams, TweaksInfo};

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

/// How many runs go at once: `max_concurrent_runs`, except one at a time where a sandbox
/// takes workspaces and the bwrap found has no `--bind-fd`. Such a bwrap mounts a workspace
/// by its path as it finds it when it starts, so a concurrent run that can write a parent of
/// another's workspace could swap a directory of that path for a symlink after the check
/// and have a directory outside the gates bound; with `--bind-fd` what is bound is what was
/// opened and checked (docs/sandbox.md, "Bind sources are opened once").
fn runs_at_once(config: &Config) -> usize {
    let takes_workspaces = config
        .sandboxes
        .iter()
        .any(|s| s.gates.all_workspaces().next().is_some());
    if config.max_concurrent_runs <= 1 || !takes_workspaces {
        return config.max_concurrent_runs;
    }
    let binds_fds = sandgate_sandbox::host::find_bwrap()
        .is_some_and(|b| sandgate_sandbox::run::bwrap_options(&b).bind_fd);
    if binds_fds {
        return config.max_concurrent_runs;
    }
    eprintln!(
        "sandgate mcp: warning: bwrap has no --bind-fd (bubblewrap 0.10.0, or a distribution's backport), so runs that take workspaces go one at a time (max_concurrent_runs {} not used)",
        config.max_concurrent_runs
    );
    1
}

impl SandgateMcp {
    pub fn new(config: Config, audit: ToolAudit, sandgate: PathBuf) -> SandgateMcp {
        SandgateMcp {
            runs: Arc::new(tokio::sync::Semaphore::new(runs_at_once(&config))),
            waits: Arc::new(tokio::sync::Semaphore::new(egress_tools::MAX_WAITING)),
            protect: config.own_files.iter().map(|f| f.path.clone()).collect(),
            config: Arc::new(config),
            audit: Arc::new(audit),
            sandgate,
            tool_router: Self::sandbox_tools()
                + Self::run_tools()
                + Self::egress_tools()
                + Self::tweak_tools(),
        }
    }

    fn sandbox(&self, name: &str) -> Option<&Sandbox> {
        self.config.sandboxes.iter().find(|s| s.name == name)
    }
}

/// `list_sandboxes`.
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

fn merge(into: &mut Value, more: Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, more) {
        a.extend(b);
    }
}
