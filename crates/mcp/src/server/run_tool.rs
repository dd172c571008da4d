//! The tool `run` (its own rmcp tool router, `run_tools`, added to the server's in
//! [`SandgateMcp::new`]): a command in a named sandbox, admitted by its gates widened by the
//! tweaks active for it (within its bounds), audited before it starts (fail closed) and
//! when it ends. A run that holds something only a tweak gave it is watched
//! ([`crate::watch`]) and stopped when that tweak ends; its close says so.

use std::path::PathBuf;
use std::time::Duration;

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use sandgate_policy::Exception;
use sandgate_sandbox::policy::NetMode;

use super::{SandgateMcp, merge, who};
use crate::audit::command_digest;
use crate::config::{Gates, Sandbox};
use crate::tweaks::{self, Granted, Holding};
use crate::{gates, limits, runner, watch};

/// The most an agent may hand a command on standard input.
const MAX_STDIN_BYTES: usize = 1024 * 1024;

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

/// A refusal: the gate that said no, and the message naming it.
type Refused = (&'static str, String);

/// A run the gates let through: its sandbox, input and workspace, the gates in force, its
/// time limit, and what it holds of the tweaks granted now.
struct Admission<'a> {
    sandbox: &'a Sandbox,
    stdin: String,
    workspace: Option<PathBuf>,
    gates: Gates,
    seconds: u64,
    granted: Granted,
    /// The approved exceptions read for it (its watch starts from them).
    known: Vec<Exception>,
    holding: Holding,
}

/// `run`.
#[tool_router(router = run_tools, vis = "pub(super)")]
impl SandgateMcp {
    /// Runs a command in a sandbox.
    #[tool(
        name = "run",
        description = "Run a command (program and arguments, no shell) in a named sandbox. Returns the exit status, stdout and stderr (cut at the sandbox's output limit, with a marker), whether it was killed at its time limit or stopped because a tweak it ran under ended, and the network destinations blocked during the run. A program, timeout or workspace outside the sandbox's gates is refused, naming the gate."
    )]
    pub async fn run(
        &self,
        Parameters(p): Parameters<RunParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<runner::RunReport>, String> {
        let base = json!({
            "tool": "run",
            "subject": who(&ctx),
            "task_id": self.config.task,
            "sandbox": p.sandbox,
            "command_sha256": command_digest(&p.command),
            "program": p.command.first(),
        });
        let refuse = |(gate, message): Refused| -> Result<Json<runner::RunReport>, String> {
            let mut e = base.clone();
            merge(
                &mut e,
                json!({"outcome": "refused", "gate": gate, "detail": message}),
            );
            self.audit.record("tool_call", e)?;
            Err(message)
        };
        let a = match self.admit(&p).await {
            Ok(a) => a,
            Err(refused) => return refuse(refused),
        };
        let Ok(_slot) = self.runs.clone().try_acquire_owned() else {
            let most = self.config.max_concurrent_runs;
            return refuse((
                "concurrency",
                format!(
                    "refused by gate `concurrency`: {most} run(s) already in progress, at most {most} at once"
                ),
            ));
        };
        let sandbox = a.sandbox;
        let limits = limits::for_run(&sandbox.gates.limits, &sandbox.policy_limits, a.seconds);
        let limit_flags = limits::flags(&limits, &sandbox.policy_limits);
        let held: Vec<&str> = a
            .granted
            .grants
            .iter()
            .filter(|g| a.holding.relies_on(g))
            .map(|g| g.id.as_str())
            .collect();
        // Fail closed: a run that cannot be recorded does not start.
        let (mut started, job) = (base.clone(), runner::next_job());
        merge(
            &mut started,
            json!({"outcome": "started", "job_id": job, "timeout_seconds": a.seconds, "limits": limits::text(&limits), "tweaks": held}),
        );
        self.audit.record("tool_call_started", started)?;
        let spec = runner::RunSpec {
            sandgate: &self.sandgate,
            policy: &sandbox.policy,
            command: &p.command,
            stdin: a.stdin.as_bytes(),
            workspace: a.workspace.as_deref(),
            limit: Duration::from_secs(a.seconds),
            max_output_bytes: a.gates.max_output_bytes,
            plain_output_bytes: sandbox.gates.max_output_bytes,
            subject: &sandgate_sandbox::run::user_subject(),
            agent: &agent_id(&ctx),
            task: &self.config.task,
            job: &job,
            protect: &self.protect,
            limits: &limit_flags,
            start_in_workspace: sandbox.start_in_workspace,
        };
        let report = self.watched(&spec, &a).await;
        let mut end = base;
        match &report {
            Ok(r) => merge(&mut end, closed(r)),
            Err(e) => merge(&mut end, json!({"outcome": "error", "detail": e})),
        }
        self.audit.record("tool_call", end)?;
        report.map(Json)
    }
}

impl SandgateMcp {
    /// Checks a run against its sandbox's gates, widened by what a person granted the
    /// sandbox for now, within its bounds (the plain gates when nothing is, or the control
    /// plane cannot be read).
    async fn admit(&self, p: &RunParams) -> Result<Admission<'_>, Refused> {
        let Some(sandbox) = self.sandbox(&p.sandbox) else {
            let known: Vec<&str> = self.config.sandboxes.iter().map(|s| s.name.as_str()).collect();
            let known = known.join(", ");
            return Err((
                "sandbox",
                format!(
                    "refused by gate `sandbox`: no sandbox {:?} (known: {known})",
                    p.sandbox
                ),
            ));
        };
        let stdin = p.stdin.clone().unwrap_or_default();
        if stdin.len() > MAX_STDIN_BYTES {
            let n = stdin.len();
            return Err((
                "stdin",
                format!("refused by gate `stdin`: {n} bytes of input, at most {MAX_STDIN_BYTES}"),
            ));
        }
        let workspace = match p.workspace.as_deref().map(std::fs::canonicalize) {
            None => None,
            Some(Ok(w)) => Some(w),
            Some(Err(e)) => {
                let asked = p.workspace.clone().unwrap_or_default();
                return Err((
                    "workspaces",
                    format!("refused by gate `workspaces`: {asked:?}: {e}"),
                ));
            }
        };
        let (granted, known) = self.granted(sandbox).await;
        let gates = tweaks::widened(&sandbox.gates, &granted);
        if sandbox.net != NetMode::None && !gates.network {
            return Err((
                "network",
                format!(
                    "refused by gate `network`: sandbox {:?} has a network (net.mode {}) only while a person grants it (request_tweak with network)",
                    sandbox.name,
                    sandbox.net.name()
                ),
            ));
        }
        let seconds = gates::check(&gates, &p.command, p.timeout_seconds, workspace.as_deref())
            .map_err(|r| (r.gate, r.to_string()))?
            .seconds;
        // What only a tweak gives it: the run ends when that tweak ends (`watch.rs`).
        let holding = Holding::of(sandbox, seconds, gates.max_output_bytes, workspace.as_deref());
        Ok(Admission {
            sandbox,
            stdin,
            workspace,
            gates,
            seconds,
            granted,
            known,
            holding,
        })
    }

    /// Runs `spec`; watched when it holds a tweak, so it stops when that tweak ends.
    async fn watched(
        &self,
        spec: &runner::RunSpec<'_>,
        a: &Admission<'_>,
    ) -> Result<runner::RunReport, String> {
        let egress = match &self.config.egress {
            Some(egress) if !a.holding.is_nothing() => egress.clone(),
            _ => return runner::run(spec, std::future::pending::<runner::Stopping>()).await,
        };
        let watch = watch::Watch {
            egress,
            sandbox: a.sandbox.clone(),
            holding: a.holding.clone(),
            at_start: a.granted.clone(),
            known: a.known.clone(),
        };
        runner::run(spec, watch::until_ended(watch)).await
    }
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

/// The tool audit's close of a run that ran: how it ended, and what stopped it, if
/// anything did.
fn closed(r: &runner::RunReport) -> Value {
    let outcome = match (&r.stopped, r.timed_out) {
        (Some(_), _) => "stopped",
        (None, true) => "timeout",
        (None, false) => "exited",
    };
    let mut e = json!({
        "outcome": outcome,
        "exit_code": r.exit_code,
        "signal": r.signal,
        "duration_ms": r.duration_ms,
        "blocked": r.blocked.len(),
    });
    if let Some(s) = &r.stopped {
        let by: Vec<Value> = s
            .tweaks
            .iter()
            .map(|t| json!({"id": t.id, "state": t.state}))
            .collect();
        merge(&mut e, json!({"stopped_by": by, "detail": s.message}));
    }
    e
}
