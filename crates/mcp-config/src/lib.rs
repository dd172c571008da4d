//! The `McpServer` document of `sandgate mcp`, read and checked whole before the server
//! starts, and the pure checks a run is admitted by. Nothing here serves, runs or dials:
//! the server (`sandgate-mcp`) and `sandgate check-config` both read a configuration
//! through it.
//!
//! - `config.rs`: the `McpServer` document (task, audit log, control plane, sandboxes and
//!   their gates), validated whole at start (`config/sandbox.rs`: each sandbox's gates and
//!   policy; `config/policy.rs`: what each sandbox's policy says; `config/lines.rs`: each
//!   problem at its line).
//! - `approvals.rs`: how an approved exception reaches each sandbox's runs (a followed
//!   control plane, an upstream proxy, or not at all), which exceptions answer a request,
//!   and which apply to a sandbox; a server that files requests refuses at start a sandbox
//!   they could never reach.
//! - `own_files.rs`: the server's own files (configuration, policies, token, audit log,
//!   binary): no workspace may hold one, and every run gets each read-only.
//! - `gates.rs`: the pure checks a run must pass (program, time limit, workspace).
//! - `limits.rs`: what an admitted run may take (the gates' ceilings over its policy's).

pub mod approvals;
pub mod config;
pub mod gates;
pub mod limits;
pub mod own_files;
