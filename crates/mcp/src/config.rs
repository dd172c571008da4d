//! The `McpServer` document: the task an agent works for, where its tool calls are audited,
//! where it may ask for egress, and the named sandboxes it may run commands in, each with
//! its gates. Parsed and validated whole at start; every problem names its field.
//!
//! ```yaml
//! apiVersion: sandgate.dev/v1
//! kind: McpServer
//! metadata: { name: agent-tools }
//! spec:
//!   task: agent-7
//!   audit_log: mcp-audit.jsonl
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

use crate::limits::RunLimits;
use crate::own_files::{self, OwnFile};
use sandgate_sandbox::policy::RawLimits;

/// The only `apiVersion` understood.
pub const API_VERSION: &str = "sandgate.dev/v1";
/// The only `kind` understood.
pub const KIND: &str = "McpServer";

/// Defaults and ceilings of the gates.
pub const DEFAULT_MAX_SECONDS: u64 = 60;
pub const MAX_MAX_SECONDS: u64 = 3600;
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;
pub const MAX_MAX_OUTPUT_BYTES: usize = 16 * 1024 * 1024;
/// The longest an agent may wait in `request_egress` for a decision.
pub const MAX_WAIT_SECONDS: u64 = 600;

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    /// The task every run and every egress request is attributed to.
    pub task: String,
    pub audit_log: PathBuf,
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
    audit_log: String,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSandbox {
    name: String,
    #[serde(default)]
    description: String,
    policy: String,
    #[serde(default)]
    gates: RawGates,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGates {
    #[serde(default)]
    commands: Vec<String>,
    #[serde(default)]
    max_seconds: Option<u64>,
    #[serde(default)]
    max_output_bytes: Option<u64>,
    #[serde(default)]
    network: bool,
    #[serde(default)]
    workspaces: Vec<String>,
    #[serde(default)]
    limits: RawLimits,
}

/// Reads and validates the configuration at `path` (relative paths in it are relative to
/// its directory), and each sandbox's policy; `sandgate` is the binary each run starts. No
/// workspace may hold one of the server's own files (these, the policies and what they name,
/// the token and the audit log; [`own_files`]).
pub fn load(path: &Path, sandgate: &Path) -> Result<Config, ConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| ConfigError(vec![format!("{}: {e}", path.display())]))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let file = path.display().to_string();
    let mut config = parse(&text, &file, base)?;
    config
        .own_files
        .push(OwnFile::new(path, "the server's configuration"));
    config.own_files.push(OwnFile::new(
        sandgate,
        "the sandgate binary that starts every run",
    ));
    let workspaces: Vec<&[PathBuf]> = config
        .sandboxes
        .iter()
        .map(|s| s.gates.workspaces.as_slice())
        .collect();
    let conflicts = own_files::workspace_conflicts(&workspaces, &config.own_files);
    if !conflicts.is_empty() {
        return Err(ConfigError(
            conflicts.into_iter().map(|c| format!("{file}: {c}")).collect(),
        ));
    }
    Ok(config)
}

/// Parses and validates configuration text; `base` anchors relative paths.
pub fn parse(text: &str, file: &str, base: &Path) -> Result<Config, ConfigError> {
    let raw: RawDoc = serde_saphyr::from_str(text).map_err(|e| {
        let line = e.location().map_or(0, |l| l.line());
        let message = e.to_string().lines().next().unwrap_or("invalid YAML").to_owned();
        ConfigError(vec![format!("{file}:{line}: {message}")])
    })?;
    let mut errors = Vec::new();
    let mut error = |field: &str, message: String| errors.push(format!("{file}: {field}: {message}"));
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
    let mut own = vec![OwnFile::new(&base.join(&spec.audit_log), "the tool audit log")];
    let egress = match spec.egress {
        None => None,
        Some(e) => {
            let admin = e.admin.trim_end_matches('/').to_owned();
            // Checked now, so a name the client would refuse stops the server at start.
            if let Err(e) = sandgate_control::client::AdminUrl::parse(&admin) {
                error("spec.egress.admin", e.to_string());
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
            Some(Egress {
                admin,
                token,
                approvals_url,
            })
        }
    };
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
        match sandbox(s, &field, base) {
            Ok((sb, files)) => {
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
    } else if max_concurrent_runs > 1 && sandboxes.iter().any(|s| !s.gates.workspaces.is_empty()) {
        // One run could swap a directory for a symlink while another's workspace is checked.
        error(
            "spec.max_concurrent_runs",
            "runs at once must be 1 while a sandbox takes workspaces (one run could change another's workspace path between its check and its use)".to_owned(),
        );
    }
    if !errors.is_empty() {
        return Err(ConfigError(errors));
    }
    Ok(Config {
        name: raw.metadata.name,
        task: spec.task,
        audit_log: base.join(spec.audit_log),
        egress,
        sandboxes,
        max_concurrent_runs: max_concurrent_runs as usize,
        own_files: own,
    })
}

/// Problems found, each as (field, message).
type Problems = Vec<(String, String)>;

/// A sandbox, and its files the server must keep from every run (its policy, what that
/// names).
fn sandbox(s: RawSandbox, field: &str, base: &Path) -> Result<(Sandbox, Vec<OwnFile>), Problems> {
    let mut errors = Vec::new();
    let g = s.gates;
    let limits = match RunLimits::parse(&g.limits) {
        Ok(l) => l,
        Err((key, message)) => {
            errors.push((format!("{field}.gates.limits.{key}"), message));
            RunLimits::default()
        }
    };
    let max_seconds = g.max_seconds.unwrap_or(DEFAULT_MAX_SECONDS);
    if !(1..=MAX_MAX_SECONDS).contains(&max_seconds) {
        errors.push((
            format!("{field}.gates.max_seconds"),
            format!("{max_seconds}: give 1 to {MAX_MAX_SECONDS}"),
        ));
    }
    let max_output = g.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES as u64);
    if !(1..=MAX_MAX_OUTPUT_BYTES as u64).contains(&max_output) {
        errors.push((
            format!("{field}.gates.max_output_bytes"),
            format!("{max_output}: give 1 to {MAX_MAX_OUTPUT_BYTES}"),
        ));
    }
    if g.commands.is_empty() {
        errors.push((
            format!("{field}.gates.commands"),
            "list the programs an agent may run (a bare name or an absolute path each)".to_owned(),
        ));
    }
    for c in &g.commands {
        if c.is_empty() || (c.contains('/') && !c.starts_with('/')) {
            errors.push((
                format!("{field}.gates.commands"),
                format!("{c:?}: a bare program name or an absolute path"),
            ));
        }
    }
    let mut workspaces = Vec::new();
    for w in &g.workspaces {
        match std::fs::canonicalize(base.join(w)) {
            Ok(p) if p.is_dir() => workspaces.push(p),
            Ok(p) => errors.push((
                format!("{field}.gates.workspaces"),
                format!("{} is not a directory", p.display()),
            )),
            Err(e) => errors.push((format!("{field}.gates.workspaces"), format!("{w}: {e}"))),
        }
    }
    let policy = base.join(&s.policy);
    let facts = match read_policy(&policy, workspaces.first()) {
        Ok(v) => v,
        Err(e) => {
            errors.push((format!("{field}.policy"), format!("{}: {e}", policy.display())));
            PolicyFacts {
                net: NetMode::None,
                allowed_hosts: Vec::new(),
                limits: Limits::default(),
                files: Vec::new(),
            }
        }
    };
    let net = facts.net;
    if net != NetMode::None && !g.network {
        errors.push((
            format!("{field}.gates.network"),
            format!(
                "the policy's net.mode is {}; allow it with `network: true` or use a policy with net.mode none",
                net.name()
            ),
        ));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let who = format!("sandbox {:?}", s.name);
    let mut own = vec![OwnFile::new(&policy, format!("the policy of {who}"))];
    own.extend(
        facts
            .files
            .iter()
            .map(|(path, what)| OwnFile::new(path, format!("{what} of {who}"))),
    );
    let sandbox = Sandbox {
        name: s.name,
        description: s.description,
        policy,
        net,
        allowed_hosts: facts.allowed_hosts,
        policy_limits: facts.limits,
        gates: Gates {
            commands: g.commands,
            max_seconds,
            max_output_bytes: max_output as usize,
            network: g.network,
            workspaces,
            limits,
        },
    };
    Ok((sandbox, own))
}

/// What the server takes from a sandbox's policy at start.
#[derive(Debug)]
struct PolicyFacts {
    net: NetMode,
    allowed_hosts: Vec<String>,
    limits: Limits,
    /// Files the policy names, which a run reads as its configuration, and what each is.
    files: Vec<(PathBuf, &'static str)>,
}

/// The policy's network mode, allowed destinations, limits and the files it names.
/// `${WORKSPACE}` stands for the first allowed workspace (or a placeholder): bound paths are
/// not resolved here (each run checks its own).
fn read_policy(path: &Path, workspace: Option<&PathBuf>) -> Result<PolicyFacts, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut params = BTreeMap::new();
    let ws = workspace.map_or_else(
        || "/nonexistent-workspace".to_owned(),
        |w| w.display().to_string(),
    );
    params.insert("WORKSPACE".to_owned(), ws);
    let identity = |p: &Path| Ok(p.to_path_buf());
    let policy =
        sandgate_sandbox::policy::parse(&text, &params, &identity, None).map_err(|e| e.to_string())?;
    let mut files = Vec::new();
    // As `sandgate run` finds it: beside the policy that names it.
    if let Some(egress) = &policy.egress_policy {
        let dir = path.parent().unwrap_or(Path::new("."));
        files.push((dir.join(egress), "the egress policy"));
    }
    if let Some(central) = &policy.central {
        files.push((central.ca.clone(), "the central proxies' CA"));
        files.push((central.cert.clone(), "the node certificate"));
        files.push((central.key.clone(), "the node key"));
    }
    Ok(PolicyFacts {
        net: policy.net,
        allowed_hosts: policy.allow.iter().map(ToString::to_string).collect(),
        limits: policy.limits,
        files,
    })
}
