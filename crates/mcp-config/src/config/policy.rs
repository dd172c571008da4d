//! What the server takes from a sandbox's policy at start, read through the sandbox crate's
//! parser: its network mode and allowed destinations, its limits, the files it names (which
//! become the server's own), how approvals reach its runs, the task those runs carry, and
//! whether they start in their workspace. Bound paths are not resolved here (each run checks
//! its own); the one file read besides the policy is a central node's certificate, for its
//! name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sandgate_sandbox::policy::{Limits, NetMode};

use crate::approvals::Approvals;

/// What the server takes from a sandbox's policy at start.
#[derive(Debug)]
pub(super) struct PolicyFacts {
    pub(super) net: NetMode,
    pub(super) allowed_hosts: Vec<String>,
    pub(super) limits: Limits,
    /// Files the policy names, which a run reads as its configuration, and what each is.
    pub(super) files: Vec<(PathBuf, &'static str)>,
    pub(super) approvals: Approvals,
    pub(super) run_task: String,
    pub(super) start_in_workspace: bool,
    /// Whether its runs have a PID namespace of their own (`platform.bwrap.unshare.pid`),
    /// so stopping a run stops everything it started.
    pub(super) own_pids: bool,
}

/// The policy's network mode, allowed destinations, limits, the files it names, how
/// approvals reach its runs, the task they carry, and whether they start in the workspace.
/// `${WORKSPACE}` stands for the first allowed workspace (or a placeholder): bound paths are
/// not resolved here (each run checks its own).
pub(super) fn read_policy(
    path: &Path,
    workspace: Option<&PathBuf>,
    task: &str,
) -> Result<PolicyFacts, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut params = BTreeMap::new();
    let ws = workspace.map_or_else(|| PathBuf::from("/nonexistent-workspace"), |w| w.to_path_buf());
    params.insert("WORKSPACE".to_owned(), ws.display().to_string());
    let identity = |p: &Path| Ok(p.to_path_buf());
    let file = path.display().to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let policy = sandgate_sandbox::policy::parse_at(&text, &params, &identity, None, &file, now)
        .map_err(|e| e.to_string())?;
    // As `sandgate run` finds them: beside the policy that names them.
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut files = Vec::new();
    if let Some(egress) = &policy.egress_policy {
        files.push((dir.join(egress), "the egress policy"));
    }
    if let Some(feed) = &policy.exceptions {
        files.push((dir.join(&feed.token_file), "the follower token"));
    }
    if let Some(central) = &policy.central {
        files.push((central.ca.clone(), "the central proxies' CA"));
        files.push((central.cert.clone(), "the node certificate"));
        files.push((central.key.clone(), "the node key"));
    }
    let run_task = match &policy.central {
        None => task.to_owned(),
        Some(central) => node_task(&central.cert, task)?,
    };
    // The run starts where the policy binds the workspace, unless the policy says where.
    let binds = |paths: &[PathBuf]| paths.contains(&ws);
    let start_in_workspace =
        policy.cwd.is_none() && (binds(&policy.write_paths) || binds(&policy.read_paths));
    let approvals = Approvals::of(&policy);
    Ok(PolicyFacts {
        net: policy.net,
        allowed_hosts: allowed_hosts(&policy),
        limits: policy.limits,
        files,
        approvals,
        run_task,
        start_in_workspace,
        own_pids: policy.unshare_pid,
    })
}

/// What the sandbox's own lists allow (its patterns, then `net.allowlist` and its presets'
/// entries), each as `host:port` when it names ports, with what it allows below the host.
fn allowed_hosts(policy: &sandgate_sandbox::policy::SandboxPolicy) -> Vec<String> {
    let patterns = policy.allow.iter().map(ToString::to_string);
    let entries = policy.allow_entries.iter().flat_map(|e| {
        let below = e.request.as_ref().map(|r| format!(" [{r}]")).unwrap_or_default();
        let hosts: Vec<String> = match &e.ports {
            Some(ports) => ports
                .iter()
                .map(|p| format!("{}:{p}{below}", e.pattern))
                .collect(),
            None => vec![format!("{}{below}", e.pattern)],
        };
        hosts
    });
    patterns.chain(entries).collect()
}

/// The task a node of central proxies names its runs' requests under: `NODE:TASK`, the node
/// being the first name of its certificate (as `sandgate run` names it; a central's
/// exceptions apply to that task, not the bare one).
fn node_task(cert: &Path, task: &str) -> Result<String, String> {
    let node = sandgate_proxy::transport::tls::node_name(cert)
        .map_err(|e| format!("net.proxy.tls.cert: {e}"))?
        .ok_or_else(|| format!("net.proxy.tls.cert: {} names no node", cert.display()))?;
    let named = format!("{node}:{task}");
    if !sandgate_policy::ids::valid(&named) {
        return Err(format!(
            "the runs' task under the node's name, {named:?}, is longer than an id may be ({})",
            sandgate_policy::ids::ID_RULE
        ));
    }
    Ok(named)
}
