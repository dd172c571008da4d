//! The `McpServer` document: the task an agent works for, where its tool calls are audited,
//! where it may ask for egress, and the named sandboxes it may run commands in, each with
//! its gates. Parsed and validated whole at start; every problem names its field, at its
//! line where it can be found (`file:line: field: message`, as the policy kinds say it).
//!
//! With `spec.egress`, every sandbox with a network must be one an approval reaches
//! ([`Approvals`]): a run's own proxy that follows no control plane, or another control
//! plane, is refused at start, naming the sandbox and the `net.exceptions` to add.
//!
//! Paths are literal: relative to this file, never expanded (`~` and `$VARIABLES` are
//! refused, not taken as directory names). Without `audit_log`, the tool audit log is kept
//! under the state directory: `$XDG_STATE_HOME/sandgate/mcp/NAME.jsonl`, else
//! `~/.local/state/sandgate/mcp/NAME.jsonl`, as `sandgate run` keeps its logs.
//!
//! ```yaml
//! apiVersion: sandgate.dev/v1
//! kind: McpServer
//! metadata: { name: agent-tools }
//! spec:
//!   task: agent-7
//!   egress: { admin: "http://127.0.0.1:9090", token_file: agent.token }
//!   sandboxes:
//!     - name: scratch
//!       policy: sandboxes/none.yaml
//!       gates: { commands: [python3], max_seconds: 30, limits: { memory: 2GiB } }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sandgate_sandbox::policy::{Limits, NetMode};
use serde::Deserialize;

use crate::approvals::Approvals;
use crate::limits::RunLimits;
use crate::own_files::{self, OwnFile};

mod lines;
mod policy;
mod sandbox;

pub use sandbox::{DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_SECONDS, MAX_MAX_OUTPUT_BYTES, MAX_MAX_SECONDS};
use sandbox::{RawSandbox, sandbox};

/// The only `apiVersion` understood.
pub const API_VERSION: &str = "sandgate.dev/v1";
/// The only `kind` understood.
pub const KIND: &str = "McpServer";

/// The longest an agent may wait in `request_egress` for a decision.
pub const MAX_WAIT_SECONDS: u64 = 600;

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    /// The task every run and every egress request is attributed to.
    pub task: String,
    pub audit_log: PathBuf,
    /// `audit_log` is the default under the state directory, whose directories the server
    /// makes (0700) at start.
    pub audit_log_default: bool,
    pub egress: Option<Egress>,
    pub sandboxes: Vec<Sandbox>,
    /// Runs at once; more are refused (gate `concurrency`).
    pub max_concurrent_runs: usize,
    /// The server's own files, canonical: no workspace holds one, and every run gets each
    /// as `--protect` ([`own_files`]).
    pub own_files: Vec<OwnFile>,
}

/// Where egress exceptions are requested: a sandgate proxy's admin API.
#[derive(Debug, Clone)]
pub struct Egress {
    /// `http://HOST:PORT` of the admin listener.
    pub admin: String,
    /// A `requester` token for [`Config::task`] (read from `token_file`).
    pub token: String,
    /// The approvals page a person is sent to (default: the admin API's `/ui`).
    pub approvals_url: String,
}

/// A named sandbox and its gates.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub name: String,
    pub description: String,
    pub policy: PathBuf,
    /// From the policy: its network mode and allowed destinations (for `list_sandboxes`).
    pub net: NetMode,
    pub allowed_hosts: Vec<String>,
    /// From the policy as read at start: its `limits:` (the gates' limits only lower them).
    pub policy_limits: Limits,
    pub gates: Gates,
    /// How approved exceptions reach its runs.
    pub approvals: Approvals,
    /// The task its runs carry, for which its exceptions must be asked: the server's task,
    /// under the node's name when the sandbox is a node of central proxies (`NODE:TASK`, as
    /// `sandgate run` names it).
    pub run_task: String,
    /// The policy binds `${WORKSPACE}` and sets no `fs.cwd`: a run starts in its workspace
    /// (`--chdir`).
    pub start_in_workspace: bool,
}

/// What an agent may do in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gates {
    /// Programs an agent may start: a bare name matches exactly that `argv[0]` (found on
    /// the sandbox's PATH); an absolute path matches exactly that path.
    pub commands: Vec<String>,
    pub max_seconds: u64,
    pub max_output_bytes: usize,
    /// Whether a policy whose network mode is not `none` may be used at all.
    pub network: bool,
    /// Directories (canonical) an agent may name as the run's workspace (`${WORKSPACE}` in
    /// the policy); empty: none.
    pub workspaces: Vec<PathBuf>,
    /// Ceilings on the run's limits, over the policy's own.
    pub limits: RunLimits,
    /// What a person may grant beyond these gates for a time (`gates.tweaks`); `None`:
    /// nothing can be asked for this sandbox.
    pub tweaks: Option<TweakBounds>,
}

/// The most a tweak may give a sandbox's runs (`gates.tweaks`): whatever a control plane
/// publishes, a run gets no more than this.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TweakBounds {
    /// The longest time limit that may be granted.
    pub max_seconds: Option<u64>,
    /// The largest output cap that may be granted.
    pub max_output_bytes: Option<usize>,
    /// Whether the policy's network may be granted.
    pub network: bool,
    /// Directories (canonical) under which a workspace may be granted.
    pub workspaces: Vec<PathBuf>,
}

impl Gates {
    /// The workspaces a run may name now or once a person grants one (`gates.tweaks`).
    pub fn all_workspaces(&self) -> impl Iterator<Item = &PathBuf> {
        self.workspaces
            .iter()
            .chain(self.tweaks.iter().flat_map(|t| t.workspaces.iter()))
    }
}

/// Every problem found, one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct ConfigError(pub Vec<String>);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDoc {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: RawMeta,
    spec: RawSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMeta {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    task: String,
    #[serde(default)]
    audit_log: Option<String>,
    #[serde(default)]
    egress: Option<RawEgress>,
    sandboxes: Vec<RawSandbox>,
    #[serde(default)]
    max_concurrent_runs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEgress {
    admin: String,
    token_file: String,
    #[serde(default)]
    approvals_url: Option<String>,
}

/// Reads and validates the configuration at `path` (relative paths in it are relative to
/// its directory), and each sandbox's policy; `sandgate` is the binary each run starts. No
/// workspace may hold one of the server's own files (these, the policies and what they name,
/// the tokens and the audit log; [`own_files`]).
pub fn load(path: &Path, sandgate: &Path) -> Result<Config, ConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| ConfigError(vec![format!("{}: {e}", path.display())]))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let file = path.display().to_string();
    let env = |name| std::env::var(name).ok();
    let state = state_dir(env("XDG_STATE_HOME").as_deref(), env("HOME").as_deref());
    let mut config = parse(&text, &file, base, state.as_deref())?;
    config
        .own_files
        .push(OwnFile::new(path, "the server's configuration"));
    config.own_files.push(OwnFile::new(
        sandgate,
        "the sandgate binary that starts every run",
    ));
    // A workspace a person may grant is checked as one the gates name.
    let granted: Vec<Vec<PathBuf>> = config
        .sandboxes
        .iter()
        .map(|s| s.gates.all_workspaces().cloned().collect())
        .collect();
    let workspaces: Vec<&[PathBuf]> = granted.iter().map(Vec::as_slice).collect();
    let conflicts = own_files::workspace_conflicts(&workspaces, &config.own_files);
    if !conflicts.is_empty() {
        return Err(ConfigError(
            conflicts
                .into_iter()
                .map(|c| lines::locate_message(&text, &file, &c))
                .collect(),
        ));
    }
    Ok(config)
}

/// sandgate's state directory: `$XDG_STATE_HOME/sandgate`, else `~/.local/state/sandgate`
/// (as `sandgate run` keeps its logs); `None` when neither names an absolute directory.
pub fn state_dir(xdg_state_home: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    let absolute = |v: &str| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    let base = xdg_state_home
        .and_then(absolute)
        .or_else(|| home.and_then(absolute).map(|h| h.join(".local/state")))?;
    Some(base.join("sandgate"))
}

/// Parses and validates configuration text; `base` anchors relative paths, `state` is the
/// state directory ([`state_dir`]) the default audit log goes under.
pub fn parse(text: &str, file: &str, base: &Path, state: Option<&Path>) -> Result<Config, ConfigError> {
    let raw: RawDoc =
        serde_saphyr::from_str(text).map_err(|e| ConfigError(vec![lines::yaml_error(&e, text, file)]))?;
    let mut problems: Problems = Vec::new();
    let mut error = |field: &str, message: String| problems.push((field.to_owned(), message));
    if raw.api_version != API_VERSION {
        error("apiVersion", format!("expected {API_VERSION:?}"));
    }
    if raw.kind != KIND {
        error("kind", format!("expected {KIND:?}"));
    }
    let spec = raw.spec;
    if !sandgate_policy::ids::valid(&spec.task) {
        error(
            "spec.task",
            format!("{:?}: 1 to 128 of A-Z a-z 0-9 . _ - :", spec.task),
        );
    }
    let (audit_log, audit_log_default) = match &spec.audit_log {
        Some(written) => {
            if let Some(p) = not_literal(written) {
                error("spec.audit_log", p);
            }
            (base.join(written), false)
        }
        None => match default_audit_log(&raw.metadata.name, state) {
            Ok(path) => (path, true),
            Err(message) => {
                error("spec.audit_log", message);
                (PathBuf::new(), true)
            }
        },
    };
    let mut own = vec![OwnFile::new(&audit_log, "the tool audit log")];
    let egress = spec.egress.map(|e| egress(e, base, &mut own, &mut error));
    let admin = egress.as_ref().map(|e| e.admin.as_str());
    let mut sandboxes = Vec::new();
    let had_sandboxes = !spec.sandboxes.is_empty();
    let mut seen = BTreeMap::new();
    for (i, s) in spec.sandboxes.into_iter().enumerate() {
        let field = format!("spec.sandboxes[{i}]");
        if !sandgate_policy::ids::valid(&s.name) {
            error(
                &format!("{field}.name"),
                format!("{:?}: 1 to 128 of A-Z a-z 0-9 . _ - :", s.name),
            );
        }
        if seen.insert(s.name.clone(), i).is_some() {
            error(&format!("{field}.name"), format!("{:?} is named twice", s.name));
        }
        match sandbox(s, &field, base, &spec.task) {
            Ok((sb, files)) => {
                // Approvals filed with this control plane must reach the sandbox's runs.
                if let Some(problem) = admin.and_then(|a| sb.approvals.start_problem(a)) {
                    error(
                        &format!("{field}.policy"),
                        format!("sandbox {:?} ({}): {problem}", sb.name, sb.policy.display()),
                    );
                }
                sandboxes.push(sb);
                own.extend(files);
            }
            Err(list) => list.into_iter().for_each(|(f, m)| error(&f, m)),
        }
    }
    if sandboxes.is_empty() && !had_sandboxes {
        error("spec.sandboxes", "name at least one sandbox".to_owned());
    }
    let max_concurrent_runs = spec.max_concurrent_runs.unwrap_or(1);
    if !(1..=64).contains(&max_concurrent_runs) {
        error(
            "spec.max_concurrent_runs",
            format!("{max_concurrent_runs}: give 1 to 64"),
        );
    }
    // Runs at once may share workspaces' parents: one run swapping a directory of another's
    // workspace path for a symlink after its check makes that run refused, since `sandgate
    // run` binds only what it opened and found at the canonical path the gates checked.
    if !problems.is_empty() {
        return Err(ConfigError(
            problems
                .iter()
                .map(|(field, message)| lines::locate(text, file, field, message))
                .collect(),
        ));
    }
    Ok(Config {
        name: raw.metadata.name,
        task: spec.task,
        audit_log,
        audit_log_default,
        egress,
        sandboxes,
        max_concurrent_runs: max_concurrent_runs as usize,
        own_files: own,
    })
}

/// `spec.egress`: the admin URL checked now (a name the client would refuse stops the
/// server at start), the requester token read.
fn egress(e: RawEgress, base: &Path, own: &mut Vec<OwnFile>, error: &mut impl FnMut(&str, String)) -> Egress {
    let admin = e.admin.trim_end_matches('/').to_owned();
    if let Err(e) = sandgate_control::client::AdminUrl::parse(&admin) {
        error("spec.egress.admin", e.to_string());
    }
    if let Some(p) = not_literal(&e.token_file) {
        error("spec.egress.token_file", p);
    }
    let token_path = base.join(&e.token_file);
    own.push(OwnFile::new(&token_path, "the requester token"));
    let token = match std::fs::read_to_string(&token_path) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_owned(),
        Ok(_) => {
            error(
                "spec.egress.token_file",
                format!("{} is empty", token_path.display()),
            );
            String::new()
        }
        Err(err) => {
            error(
                "spec.egress.token_file",
                format!("{}: {err}", token_path.display()),
            );
            String::new()
        }
    };
    let approvals_url = e.approvals_url.unwrap_or_else(|| format!("{admin}/ui"));
    Egress {
        admin,
        token,
        approvals_url,
    }
}

/// The tool audit log when `spec.audit_log` is left out: `STATE/mcp/NAME.jsonl`.
fn default_audit_log(name: &str, state: Option<&Path>) -> Result<PathBuf, String> {
    if !sandgate_policy::ids::valid(name) {
        return Err(format!(
            "not given, and metadata.name {name:?} cannot name the default log (1 to 128 of A-Z a-z 0-9 . _ - :); write audit_log: PATH"
        ));
    }
    let state = state.ok_or_else(|| {
        "not given, and neither XDG_STATE_HOME nor HOME names a directory for the default ($XDG_STATE_HOME/sandgate/mcp/NAME.jsonl); write audit_log: PATH".to_owned()
    })?;
    Ok(state.join("mcp").join(format!("{name}.jsonl")))
}

/// Why a path as written would not be what it looks like: it is never expanded, so `~/x`
/// and `$HOME/x` would be directories named `~` and `$HOME`.
fn not_literal(written: &str) -> Option<String> {
    (written.starts_with('~') || written.contains('$')).then(|| {
        format!(
            "{written:?}: paths here are not expanded (no ~, no $VARIABLES); write an absolute path or one relative to this file"
        )
    })
}

/// Problems found, each as (field, message).
type Problems = Vec<(String, String)>;

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
