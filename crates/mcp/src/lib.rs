//! `sandgate mcp`: a Model Context Protocol server (rmcp, over stdio) through which an
//! agent runs commands under named sandboxes and asks for egress that a person approves.
//!
//! - `config.rs`: the `McpServer` document (task, audit log, control plane, sandboxes and
//!   their gates), validated whole at start.
//! - `own_files.rs`: the server's own files (configuration, policies, token, audit log,
//!   binary): no workspace may hold one, and every run gets each read-only.
//! - `gates.rs`: the pure checks a run must pass (program, time limit, workspace).
//! - `limits.rs`: what an admitted run may take (the gates' ceilings over its policy's).
//! - `runner.rs`: one run as a `sandgate run --no-terminal` child in a session of its own
//!   (`session.rs`: the step that makes it), with pipes, bounded output, a kill at the time
//!   limit, and the blocked destinations from its audit.
//! - `control.rs`: exception requests through a sandgate proxy's admin API, with a
//!   requester token (the agent can never approve).
//! - `audit.rs`: one JSON line per tool call, fsynced; a call that cannot be recorded does
//!   not run.
//! - `server.rs`: the tools.

pub mod audit;
pub mod config;
pub mod control;
pub mod gates;
pub mod limits;
pub mod own_files;
pub mod runner;
pub mod server;
pub mod session;

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
    let audit = audit::ToolAudit::open(&config.audit_log).map_err(|cause| McpError::Audit {
        path: config.audit_log.clone(),
        cause,
    })?;
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
