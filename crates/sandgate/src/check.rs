//! `sandgate check-config FILE`: everything about a policy file that can be known without
//! binding a socket, for each kind: a SandboxPolicy is checked as `sandgate run` would
//! load it, an McpServer as `sandgate mcp` would (its sandboxes' policies, tokens and
//! workspaces with it); for an EgressPolicy, see below. Errors (exit 64) are what `sandgate proxy --policy FILE` would refuse
//! at start: the document's own errors, secret files that cannot be read, listeners that
//! cannot all be bound, a node listener's TLS files that cannot be used. Warnings (exit 0) are what would start but cannot be what was meant:
//! an entry already expired, a CIDR with host bits, a host both allowed and denied, an
//! allowed address the guard refuses, admin tokens with no admin listener.

use std::path::Path;
use std::process::ExitCode;

use sandgate_policy::AddressGuard;

use crate::{EX_USAGE, settings};

/// `check-config FILE`: dispatches on the document's `kind` (a file of the first sandbox
/// form, with no `kind` but sandbox sections, is a SandboxPolicy too); anything else is
/// read as an EgressPolicy, whose errors then say what is wrong.
pub fn run(file: &Path, params: &[String]) -> ExitCode {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    match sandgate_sandbox::policy::document_kind(&text).as_deref() {
        Some(sandgate_sandbox::policy::KIND) => sandbox_check(file, params),
        Some(sandgate_mcp::config::KIND) => mcp_check(file),
        None | Some(sandgate_policy::document::KIND | sandgate_policy::document::GOVERNANCE_KIND) => {
            egress_check(file)
        }
        Some(other) => {
            eprintln!(
                "{}: kind: {other:?}: check-config reads EgressPolicy (sandgate proxy), SandboxPolicy (sandgate run) and McpServer (sandgate mcp)",
                file.display()
            );
            ExitCode::from(EX_USAGE)
        }
    }
}

/// A SandboxPolicy: everything `sandgate run` checks before it starts anything (paths
/// resolved on this machine, a named EgressPolicy read and checked).
fn sandbox_check(file: &Path, params: &[String]) -> ExitCode {
    use sandgate_sandbox::run::{RunError, RunOptions};
    let mut values = std::collections::BTreeMap::new();
    for p in params {
        let Some((k, v)) = p.split_once('=') else {
            eprintln!("sandgate: invalid --param {p:?}: expected NAME=VALUE");
            return ExitCode::from(EX_USAGE);
        };
        values.insert(k.to_owned(), v.to_owned());
    }
    let opts = RunOptions {
        policy_path: file.to_path_buf(),
        params: values,
        ..RunOptions::default()
    };
    match sandgate_sandbox::run::load_policy(&opts) {
        Ok(p) => {
            if let Some(feed) = &p.exceptions
                && let Err(e) = crate::control::feed_url(&feed.from, feed.ca.as_deref())
            {
                eprintln!("{}: net.exceptions.from: {e}", file.display());
                return ExitCode::from(EX_USAGE);
            }
            println!(
                "{}: ok: {} (SandboxPolicy: net mode {}, {} read paths, {} write paths)",
                file.display(),
                p.name.as_deref().unwrap_or("unnamed"),
                p.net.name(),
                p.read_paths.len(),
                p.write_paths.len()
            );
            ExitCode::SUCCESS
        }
        Err(RunError::Usage(m) | RunError::Unavailable(m)) => {
            eprintln!("{m}");
            ExitCode::from(EX_USAGE)
        }
    }
}

/// An McpServer: everything `sandgate mcp` checks before it serves (each problem as
/// `file:line: field: message`), then how approvals reach each sandbox.
fn mcp_check(file: &Path) -> ExitCode {
    // The binary every run starts is this one, as for `sandgate mcp`.
    let sandgate = std::env::current_exe().unwrap_or_else(|_| "sandgate".into());
    let config = match sandgate_mcp::config::load(file, &sandgate) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let admin = config.egress.as_ref().map(|e| e.admin.as_str());
    println!(
        "{}: ok: {} (McpServer: task {}, {} sandboxes, audit log {})",
        file.display(),
        config.name,
        config.task,
        config.sandboxes.len(),
        config.audit_log.display()
    );
    for s in &config.sandboxes {
        println!(
            "  {}: net mode {}, runs of task {}; approvals: {}: {}",
            s.name,
            s.net.name(),
            s.run_task,
            s.approvals.kind(admin),
            s.approvals.detail(admin, &s.run_task)
        );
    }
    ExitCode::SUCCESS
}

fn egress_check(file: &Path) -> ExitCode {
    let policy = match sandgate_proxy::reload::load_file(file) {
        Ok((policy, _)) => policy,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    if let Err(e) = sandgate_proxy::reload::admin_principals(&policy, file) {
        eprintln!("{e}");
        return ExitCode::from(EX_USAGE);
    }
    // A node listener's certificate, key and client CA must be readable and match.
    for tls in policy.listeners.iter().filter_map(|l| l.node_tls.as_ref()) {
        if let Err(e) = settings::node_tls_files(file, tls).load() {
            eprintln!("{}: spec.listeners.tls: {e}", file.display());
            return ExitCode::from(EX_USAGE);
        }
    }
    for w in settings::warnings::for_file(&policy, &AddressGuard::new(policy.allow_ranges.clone())) {
        eprintln!("{w}");
    }
    println!(
        "{}: ok: {} ({} allow, {} deny entries, {} listeners)",
        file.display(),
        policy.name,
        policy.allow.len(),
        policy.deny.len(),
        policy.listeners.len()
    );
    ExitCode::SUCCESS
}
