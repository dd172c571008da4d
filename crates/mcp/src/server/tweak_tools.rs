//! The tool `request_tweak` (its own rmcp tool router, `tweak_tools`, added to the server's
//! in [`SandgateMcp::new`]), and the tweaks a run and `list_sandboxes` read: an agent asks
//! for more than a sandbox's gates give (a longer time limit, more output, its network, a
//! workspace), within the bounds its operator set (`gates.tweaks`); a person decides at the
//! control plane, as for egress. Refused before anything is filed when it asks beyond the
//! bounds ([`crate::tweaks::admissible`]); audited before it is filed and after, like
//! `request_egress`, whose link to the approvals page and wait it shares.

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use sandgate_policy::Exception;
use sandgate_policy::exception::Tweak;

use super::egress_tools::now;
use super::{SandgateMcp, merge, who};
use crate::config::Sandbox;
use crate::tweaks::{self, Granted};
use crate::{control, egress};

/// `request_tweak`'s input.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TweakParams {
    /// The sandbox whose runs need it (see `list_sandboxes`: `tweaks` says what may be asked).
    pub sandbox: String,
    /// A longer time limit for its runs, in seconds.
    #[serde(default)]
    pub max_seconds: Option<u64>,
    /// More output kept of each stream, in bytes.
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    /// The sandbox policy's network, where the gates keep it off.
    #[serde(default)]
    pub network: bool,
    /// A directory (under one of the sandbox's `tweaks.workspaces`) its runs may name as
    /// their workspace, or one under it.
    #[serde(default)]
    pub workspace: Option<String>,
    /// How long it should last, in seconds (the control plane's maximum applies).
    pub ttl_seconds: u32,
    /// Why the task needs it; shown to the person who decides.
    pub reason: String,
    /// Wait up to this many seconds (at most 600) for a person's decision; 0 or absent:
    /// return at once.
    #[serde(default)]
    pub wait_seconds: Option<u64>,
}

/// A tweak request's state.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TweakAnswer {
    /// The exception the state is of (when approved, any active tweak that covers the ask).
    pub id: String,
    /// The request filed (or the identical one already pending, or the active tweak the
    /// control plane returned instead).
    pub requested_id: String,
    /// `approved` (the sandbox's next run gets what was asked), `not_applied` (approved for
    /// less than asked: the message says what the next run gets), `pending`, `denied`,
    /// `revoked` or `expired`.
    pub state: String,
    /// When it ends, once approved: RFC 3339.
    pub expires_at: Option<String>,
    /// Where a person decides.
    pub approvals_url: String,
    pub message: String,
}

/// What may be asked for a sandbox beyond its gates (`gates.tweaks`), and what is granted
/// now.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TweaksInfo {
    /// The most a person may grant: `max_seconds`, `max_output_bytes`, `network`,
    /// `workspaces` (absent: that cannot be asked).
    pub bounds: serde_json::Value,
    /// What active tweaks give its runs now (the gates in force), with their ids; empty
    /// when none, or when the control plane cannot be read (runs then get the plain gates).
    pub granted: serde_json::Value,
}

/// `request_tweak`.
#[tool_router(router = tweak_tools, vis = "pub(super)")]
impl SandgateMcp {
    /// Files a tweak request for the task the sandbox's runs carry, and waits, if asked,
    /// until an active tweak covers it.
    #[tool(
        name = "request_tweak",
        description = "Ask for more than a sandbox's gates give, for a time: a longer time limit (max_seconds), more output (max_output_bytes), the sandbox's network, or a workspace. Only within the bounds list_sandboxes shows as `tweaks`. A person approves or denies it in sandgate's CLI or web page; the agent cannot. With wait_seconds, waits up to that long. The state is `approved` only when the next run of the sandbox gets it."
    )]
    pub async fn request_tweak(
        &self,
        Parameters(p): Parameters<TweakParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<TweakAnswer>, String> {
        let mut event = json!({
            "tool": "request_tweak",
            "subject": who(&ctx),
            "task_id": self.config.task,
            "sandbox": p.sandbox,
            "max_seconds": p.max_seconds,
            "max_output_bytes": p.max_output_bytes,
            "network": p.network,
            "workspace": p.workspace,
            "ttl_seconds": p.ttl_seconds,
        });
        let refuse = |mut event: serde_json::Value,
                      gate: &str,
                      message: String|
         -> Result<Json<TweakAnswer>, String> {
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
                "refused by gate `egress`: this server takes no requests (no spec.egress)".to_owned(),
            );
        };
        let Some(sandbox) = self.sandbox(&p.sandbox) else {
            let known: Vec<&str> = self.config.sandboxes.iter().map(|s| s.name.as_str()).collect();
            return refuse(
                event,
                "sandbox",
                format!(
                    "refused by gate `sandbox`: no sandbox {:?} (known: {})",
                    p.sandbox,
                    known.join(", ")
                ),
            );
        };
        // The workspace as the run's gate will see it: canonical.
        let workspace = match p.workspace.as_deref().map(std::fs::canonicalize) {
            None => None,
            Some(Ok(w)) => Some(w.display().to_string()),
            Some(Err(e)) => {
                let asked = p.workspace.clone().unwrap_or_default();
                return refuse(
                    event,
                    "tweaks",
                    format!("refused by gate `tweaks`: {asked:?}: {e}"),
                );
            }
        };
        let asked = Tweak {
            sandbox: sandbox.name.clone(),
            max_seconds: p.max_seconds,
            max_output_bytes: p.max_output_bytes,
            network: p.network,
            workspace,
        };
        if let Err(r) = tweaks::admissible(sandbox, &asked) {
            return refuse(event, r.gate, r.message);
        }
        let task = sandbox.run_task.clone();
        merge(&mut event, json!({"task_id": task, "tweak": asked.to_string()}));
        // Recorded before it is filed: a request the log never saw must not reach a person.
        let mut started = event.clone();
        merge(&mut started, json!({"outcome": "started", "reason": p.reason}));
        self.audit.record("tool_call_started", started)?;
        let filed = control::request_tweak(egress, &task, &asked, p.ttl_seconds, &p.reason)
            .await
            .and_then(control::exception);
        let filed = self.on_record(filed, &mut event)?;
        let id = filed.id.clone();
        let verdict = tweaks::judge(sandbox, &asked, &filed, &[], now());
        if !verdict.is_final() {
            let message = format!(
                "The agent asks for {asked} for {} s: {}. Approve or deny it on sandgate's approvals page (request {id}).",
                p.ttl_seconds, p.reason
            );
            self.point_with(&ctx, egress, message, &id, &event).await?;
        }
        let verdict = self
            .wait_for(egress, &task, filed, verdict, p.wait_seconds, |current, seen| {
                tweaks::judge(sandbox, &asked, current, seen, now())
            })
            .await;
        let ex = verdict.exception();
        let message = match &verdict {
            egress::Verdict::Approved { exception, .. } => format!(
                "Approved (exception {}): the next run in {} gets {asked} until {}, unless it is revoked.",
                exception.id,
                sandbox.name,
                exception
                    .expires_at
                    .and_then(sandgate_policy::rfc3339::format)
                    .unwrap_or_else(|| "it expires".to_owned())
            ),
            egress::Verdict::Filed(e) if e.state == sandgate_policy::ExceptionState::Pending => {
                format!("Waiting for a person to decide at {}.", egress.approvals_url)
            }
            egress::Verdict::NotApplied { exception, why } => format!(
                "Exception {} is {why}, until {}, unless it is revoked.",
                exception.id,
                exception
                    .expires_at
                    .and_then(sandgate_policy::rfc3339::format)
                    .unwrap_or_else(|| "it expires".to_owned())
            ),
            other => format!("The request is {}.", other.state(now())),
        };
        Ok(Json(TweakAnswer {
            id: ex.id.clone(),
            requested_id: id,
            state: verdict.state(now()),
            expires_at: ex.expires_at.and_then(sandgate_policy::rfc3339::format),
            approvals_url: egress.approvals_url.clone(),
            message,
        }))
    }
}

impl SandgateMcp {
    /// What the active tweaks grant `sandbox`'s runs now, within its bounds, and the
    /// approved exceptions read (a run's watch starts from them). Nothing when it takes no
    /// tweaks, the server files no requests, or the control plane cannot be read (a run
    /// then gets the plain gates, never more).
    pub(super) async fn granted(&self, sandbox: &Sandbox) -> (Granted, Vec<Exception>) {
        let (Some(egress), Some(_)) = (&self.config.egress, &sandbox.gates.tweaks) else {
            return (Granted::default(), Vec::new());
        };
        match control::approved_of(egress, &sandbox.run_task, control::Lane::Agent).await {
            Ok(seen) => (tweaks::granted(sandbox, &seen, now()), seen),
            Err(e) => {
                tracing::warn!(sandbox = %sandbox.name, error = %e, "tweaks not read; the run gets the plain gates");
                (Granted::default(), Vec::new())
            }
        }
    }

    /// `list_sandboxes`' view of a sandbox's tweaks: none when it takes none.
    pub(super) async fn tweaks_info(&self, sandbox: &Sandbox) -> Option<TweaksInfo> {
        let b = sandbox.gates.tweaks.as_ref()?;
        let (g, _) = self.granted(sandbox).await;
        let paths =
            |ps: &[std::path::PathBuf]| ps.iter().map(|w| w.display().to_string()).collect::<Vec<_>>();
        Some(TweaksInfo {
            bounds: json!({
                "max_seconds": b.max_seconds,
                "max_output_bytes": b.max_output_bytes,
                "network": b.network,
                "workspaces": paths(&b.workspaces),
            }),
            granted: if g.is_nothing() {
                json!({})
            } else {
                json!({
                    "exceptions": g.ids,
                    "max_seconds": g.max_seconds,
                    "max_output_bytes": g.max_output_bytes,
                    "network": g.network,
                    "workspaces": paths(&g.workspaces),
                })
            },
        })
    }
}
