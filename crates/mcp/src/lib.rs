//! `sandgate mcp`: a Model Context Protocol server (rmcp, over stdio) through which an
//! agent runs commands under named sandboxes and asks for egress that a person approves.
//!
//! The server's configuration, and the pure checks a run is admitted by (`config`,
//! `approvals`, `own_files`, `gates`, `limits`), are the `sandgate-mcp-config` crate's,
//! re-exported here under the same names.
//!
//! - `runner.rs`: one run as a `sandgate run --no-terminal` child in a session of its own
//!   (`session.rs`: the step that makes it), with pipes, bounded output, a kill at the time
//!   limit or when the caller stops it, and the blocked destinations from its audit.
//! - `control.rs`: exception requests through a sandgate proxy's admin API, with a
//!   requester token (the agent can never approve), and the task's approved exceptions (not
//!   its whole history), read while a request waits, a run starts or a run holds a tweak.
//! - `egress.rs`: what `request_egress` decides around those calls: the sandboxes a request
//!   is for and the task their runs carry, and "approved" only when the next run passes.
//! - `tweaks.rs`: what a person may grant a sandbox's runs beyond its gates (`gates.tweaks`:
//!   time, output, network, a workspace), what the active tweaks grant a run (never beyond
//!   those bounds), what a run holds of them, and when a `request_tweak` is approved.
//! - `watch.rs`: the watch over a running run's tweaks: it stops a run within about a
//!   second of the end (revocation, expiry) of a tweak it holds; while the control plane
//!   cannot be read, at the tweak's known expiry.
//! - `audit.rs`: one JSON line per tool call, fsynced; a call that cannot be recorded does
//!   not run.
//! - `server.rs`: the MCP server and its tool `list_sandboxes` (`server/run_tool.rs`: the
//!   tool `run`, watched while it holds a tweak; `server/egress_tools.rs`: the tools `request_egress` and `egress_status`, and the wait
//!   for a decision; `server/tweak_tools.rs`: the tool `request_tweak`, and the tweaks a run
//!   and `list_sandboxes` read).

pub mod audit;
pub mod control;
pub mod egress;
pub mod runner;
pub mod server;
pub mod session;
pub mod tweaks;
pub mod watch;

pub use sandgate_mcp_config::{approvals, config, gates, limits, own_files};

use std::path::{Path, PathBuf};

use rmcp::ServiceExt;

/// Why the server did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("{0}")]
    Config(#[from] config::ConfigError),
    #[error("cannot open the audit log {path}: {cause}")]
    Audit { path: PathBuf, cause: std::io::Error },
    #[error("MCP transport: {0}")]
    Transport(String),
}

/// Serves MCP on stdin/stdout until the client goes away. `sandgate` is the binary that
/// runs sandboxes (this one).
pub async fn serve_stdio(config_path: &Path, sandgate: PathBuf) -> Result<(), McpError> {
    let config = config::load(config_path, &sandgate)?;
    let failed = |cause| McpError::Audit {
        path: config.audit_log.clone(),
        cause,
    };
    if config.audit_log_default
        && let Some(dir) = config.audit_log.parent()
    {
        // The state directory's, private to the user as `sandgate run` keeps its own.
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(failed)?;
    }
    let audit = audit::ToolAudit::open(&config.audit_log).map_err(failed)?;
    let server = server::SandgateMcp::new(config, audit, sandgate);
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Transport(e.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|e| McpError::Transport(e.to_string()))?;
    Ok(())
}

/// A field of a JSON object (`null` when absent): indexing without a panic path.
pub(crate) fn at<'a>(v: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    v.get(key).unwrap_or(&serde_json::Value::Null)
}
