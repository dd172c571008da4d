//! `sandgate check-config FILE`: everything about a policy file that can be known without
//! binding a socket, for each kind: a SandboxPolicy is checked as `sandgate run` would
//! load it, an McpServer as `sandgate mcp` would (its sandboxes' policies, tokens and
//! workspaces with it); for an EgressPolicy, see below. Errors (exit 64) are what `sandgate proxy --policy FILE` would refuse
//! at start: the document's own errors, secret files that cannot be read, listeners that
//! cannot all be bound, a node listener's TLS files that cannot be used. Warnings (exit 0) are what would start but cannot be what was meant:
//! an entry already expired, a CIDR with host bits, a host both allowed and denied, an
//! allowed address the guard refuses, admin tokens with no admin listener.
//!
//! Each kind's check returns a [`Report`]; it is printed as text (errors and warnings on
//! stderr, `file:line: field: message`; the ok line on stdout) or, with `--json`, as one
//! JSON object on stdout (docs/policy.md, "check-config --json"). The exit status is the
//! same either way.

use std::path::Path;
use std::process::ExitCode;

use sandgate_policy::AddressGuard;
use sandgate_policy::document::DocError;
use serde_json::{Value, json};

use crate::{EX_USAGE, settings};

/// `check-config FILE`: dispatches on the document's `kind` (a file of the first sandbox
/// form, with no `kind` but sandbox sections, is a SandboxPolicy too); anything else is
/// read as an EgressPolicy, whose errors then say what is wrong.
pub fn run(file: &Path, params: &[String], json: bool) -> ExitCode {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let report = match sandgate_sandbox::policy::document_kind(&text).as_deref() {
        Some(sandgate_sandbox::policy::KIND) => sandbox_check(file, params),
        Some(sandgate_mcp::config::KIND) => mcp_check(file),
        None => egress_check(file, sandgate_policy::document::KIND),
        Some(kind @ (sandgate_policy::document::KIND | sandgate_policy::document::GOVERNANCE_KIND)) => {
            egress_check(file, kind)
        }
        Some(other) => {
            let mut r = Report::new(file, other);
            r.error_text(format!(
                "{}: kind: {other:?}: check-config reads EgressPolicy (sandgate proxy), SandboxPolicy (sandgate run) and McpServer (sandgate mcp)",
                file.display()
            ));
            r
        }
    };
    if json {
        println!("{}", report.json());
    } else {
        report.print();
    }
    ExitCode::from(report.exit())
}

/// Whether a problem stops the file from loading (exit 64) or is only reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Severity {
    Error,
    Warning,
}

/// One error or warning, as the JSON says it and as the text says it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Problem {
    severity: Severity,
    file: String,
    /// `None` when no line can be named (0 in a [`DocError`]).
    line: Option<u64>,
    /// The field's dotted path, when the problem is about one field.
    field: Option<String>,
    message: String,
    /// The line the text output prints (as before `--json`).
    text: String,
    /// The loader printed it already (a SandboxPolicy's warnings).
    said: bool,
}

impl Problem {
    fn of_doc(e: &DocError, severity: Severity) -> Problem {
        Problem {
            severity,
            file: e.file.clone(),
            line: (e.line > 0).then_some(e.line),
            field: (!e.field.is_empty()).then(|| e.field.clone()),
            message: e.message.clone(),
            text: match severity {
                Severity::Error => e.to_string(),
                Severity::Warning => e.as_warning(),
            },
            said: false,
        }
    }

    /// A problem the loaders gave as text: `FILE:LINE: [warning: ]FIELD: MESSAGE`, with the
    /// line and field optional (`FILE: MESSAGE`); anything else is a message about `file`.
    fn of_text(text: &str, file: &Path, severity: Severity) -> Problem {
        let file = file.display().to_string();
        // This file first (its name may hold anything), then any `FILE:LINE: `.
        let (named, line, rest) = match text.strip_prefix(file.as_str()).and_then(|r| r.strip_prefix(':')) {
            Some(after) => match after
                .split_once(": ")
                .and_then(|(n, rest)| Some((line_number(n)?, rest)))
            {
                Some((line, rest)) => (file, Some(line), rest),
                None => (file, None, after.trim_start()),
            },
            None => match located(text) {
                Some((named, line, rest)) => (named.to_owned(), Some(line), rest),
                None => (file, None, text),
            },
        };
        let rest = rest.strip_prefix("warning: ").unwrap_or(rest);
        let (field, message) = match rest.split_once(": ") {
            Some((f, m)) if is_field(f) => (Some(f.to_owned()), m),
            _ => (None, rest),
        };
        Problem {
            severity,
            file: named,
            line: line.filter(|&l| l > 0),
            field,
            message: message.to_owned(),
            text: text.to_owned(),
            said: false,
        }
    }

    fn json(&self) -> Value {
        json!({
            "severity": match self.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            },
            "file": self.file,
            "line": self.line,
            "field": self.field,
            "message": self.message,
        })
    }
}

/// `FILE:LINE: REST` split at the first `:LINE: ` whose `FILE` holds no `: ` (a path may
/// hold `:`, not followed by digits and `: ` in practice).
fn located(text: &str) -> Option<(&str, u64, &str)> {
    text.match_indices(':').find_map(|(i, _)| {
        let (digits, rest) = text.get(i + 1..)?.split_once(": ")?;
        let file = text.get(..i).filter(|f| !f.is_empty() && !f.contains(": "))?;
        Some((file, line_number(digits)?, rest))
    })
}

/// A line number as the loaders write it: digits only.
fn line_number(digits: &str) -> Option<u64> {
    digits
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| digits.parse().ok())
        .flatten()
}

/// A dotted field path (`spec.network.allowlist.host`), not the start of a message.
fn is_field(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'[' | b']'))
}

/// What checking one file found.
struct Report {
    file: String,
    kind: String,
    /// The document's `metadata.name`, when it loaded.
    name: Option<String>,
    problems: Vec<Problem>,
    /// What the text output prints on stdout when there is no error.
    ok: Vec<String>,
}

impl Report {
    fn new(file: &Path, kind: &str) -> Report {
        Report {
            file: file.display().to_string(),
            kind: kind.to_owned(),
            name: None,
            problems: Vec::new(),
            ok: Vec::new(),
        }
    }

    fn error_text(&mut self, text: String) {
        let file = Path::new(&self.file).to_path_buf();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            self.problems.push(Problem::of_text(line, &file, Severity::Error));
        }
    }

    fn has_errors(&self) -> bool {
        self.problems.iter().any(|p| p.severity == Severity::Error)
    }

    fn exit(&self) -> u8 {
        if self.has_errors() { EX_USAGE } else { 0 }
    }

    /// The text output: each problem on stderr, then (without errors) the ok lines.
    fn print(&self) {
        for p in self.problems.iter().filter(|p| !p.said) {
            eprintln!("{}", p.text);
        }
        if !self.has_errors() {
            for line in &self.ok {
                println!("{line}");
            }
        }
    }

    fn json(&self) -> Value {
        let count = |s: Severity| self.problems.iter().filter(|p| p.severity == s).count();
        json!({
            "file": self.file,
            "kind": self.kind,
            "name": self.name,
            "ok": !self.has_errors(),
            "exit_status": self.exit(),
            "errors": count(Severity::Error),
            "warnings": count(Severity::Warning),
            "problems": self.problems.iter().map(Problem::json).collect::<Vec<_>>(),
        })
    }
}

/// A SandboxPolicy: everything `sandgate run` checks before it starts anything (paths
/// resolved on this machine, a named EgressPolicy read and checked).
fn sandbox_check(file: &Path, params: &[String]) -> Report {
    use sandgate_sandbox::run::{RunError, RunOptions};
    let mut report = Report::new(file, sandgate_sandbox::policy::KIND);
    let mut values = std::collections::BTreeMap::new();
    for p in params {
        let Some((k, v)) = p.split_once('=') else {
            report.error_text(format!("sandgate: invalid --param {p:?}: expected NAME=VALUE"));
            return report;
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
            // `load_policy` printed these on stderr already.
            for w in &p.warnings {
                let mut warning = Problem::of_text(w, file, Severity::Warning);
                warning.said = true;
                report.problems.push(warning);
            }
            if let Some(feed) = &p.exceptions
                && let Err(e) = crate::control::feed_url(&feed.from, feed.ca.as_deref())
            {
                report.error_text(format!("{}: net.exceptions.from: {e}", file.display()));
            }
            report.name = p.name.clone();
            report.ok.push(format!(
                "{}: ok: {} (SandboxPolicy: net mode {}, {} read paths, {} write paths)",
                file.display(),
                p.name.as_deref().unwrap_or("unnamed"),
                p.net.name(),
                p.read_paths.len(),
                p.write_paths.len()
            ));
        }
        Err(RunError::Usage(m) | RunError::Unavailable(m)) => report.error_text(m),
    }
    report
}

/// An McpServer: everything `sandgate mcp` checks before it serves (each problem as
/// `file:line: field: message`), then how approvals reach each sandbox.
fn mcp_check(file: &Path) -> Report {
    let mut report = Report::new(file, sandgate_mcp::config::KIND);
    // The binary every run starts is this one, as for `sandgate mcp`.
    let sandgate = std::env::current_exe().unwrap_or_else(|_| "sandgate".into());
    let config = match sandgate_mcp::config::load(file, &sandgate) {
        Ok(c) => c,
        Err(e) => {
            for line in &e.0 {
                report.error_text(line.clone());
            }
            return report;
        }
    };
    let admin = config.egress.as_ref().map(|e| e.admin.as_str());
    report.name = Some(config.name.clone());
    report.ok.push(format!(
        "{}: ok: {} (McpServer: task {}, {} sandboxes, audit log {})",
        file.display(),
        config.name,
        config.task,
        config.sandboxes.len(),
        config.audit_log.display()
    ));
    for s in &config.sandboxes {
        report.ok.push(format!(
            "  {}: net mode {}, runs of task {}; approvals: {}: {}",
            s.name,
            s.net.name(),
            s.run_task,
            s.approvals.kind(admin),
            s.approvals.detail(admin, &s.run_task)
        ));
    }
    report
}

/// An EgressPolicy: the document, then what loading it reads (secret files, TLS files).
fn egress_check(file: &Path, kind: &str) -> Report {
    use sandgate_proxy::reload::LoadError;
    let mut report = Report::new(file, kind);
    let failed = |report: &mut Report, e: LoadError| match e {
        LoadError::Invalid(errors) => report
            .problems
            .extend(errors.0.iter().map(|e| Problem::of_doc(e, Severity::Error))),
        other => report.error_text(other.to_string()),
    };
    let policy = match sandgate_proxy::reload::load_file(file) {
        Ok((policy, _)) => policy,
        Err(e) => {
            failed(&mut report, e);
            return report;
        }
    };
    if let Err(e) = sandgate_proxy::reload::admin_principals(&policy, file) {
        failed(&mut report, e);
        return report;
    }
    // A node listener's certificate, key and client CA must be readable and match.
    for tls in policy.listeners.iter().filter_map(|l| l.node_tls.as_ref()) {
        if let Err(e) = settings::node_tls_files(file, tls).load() {
            report.error_text(format!("{}: spec.listeners.tls: {e}", file.display()));
            return report;
        }
    }
    let guard = AddressGuard::new(policy.allow_ranges.clone());
    for w in settings::warnings::for_file(&policy, &guard) {
        report
            .problems
            .push(Problem::of_text(&w, file, Severity::Warning));
    }
    report.name = Some(policy.name.clone());
    report.ok.push(format!(
        "{}: ok: {} ({} allow, {} deny entries, {} listeners)",
        file.display(),
        policy.name,
        policy.allow.len(),
        policy.deny.len(),
        policy.listeners.len()
    ));
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loaders_line_is_split_into_file_line_field_and_message() {
        let file = Path::new("/d/p.yaml");
        let p = Problem::of_text(
            "/d/p.yaml:5: fs.tmp: \"shared\": use private or none",
            file,
            Severity::Error,
        );
        assert_eq!(
            (p.file.as_str(), p.line, p.field.as_deref(), p.message.as_str()),
            (
                "/d/p.yaml",
                Some(5),
                Some("fs.tmp"),
                "\"shared\": use private or none"
            )
        );
        let p = Problem::of_text(
            "/d/e.yaml:9: warning: spec.network.allowlist: 10.0.0.1 is a private address",
            file,
            Severity::Warning,
        );
        assert_eq!(
            (p.file.as_str(), p.line, p.field.as_deref()),
            ("/d/e.yaml", Some(9), Some("spec.network.allowlist"))
        );
        let p = Problem::of_text("/d/p.yaml: net mode \"x\": use none", file, Severity::Error);
        assert_eq!(
            (p.line, p.field, p.message.as_str()),
            (None, None, "net mode \"x\": use none")
        );
        let p = Problem::of_text("cannot read /d/p.yaml: gone", file, Severity::Error);
        assert_eq!(
            (p.file.as_str(), p.line, p.message.as_str()),
            ("/d/p.yaml", None, "cannot read /d/p.yaml: gone")
        );
    }
}
