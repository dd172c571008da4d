//! What `sandgate run` says when its command has exited: one [`RunSummary`] (the run's ids,
//! its exit status, the totals, the destinations not reached, where the audit log is), from
//! which both the text on stderr and the JSON of `--summary-json FILE` are rendered. The
//! JSON's schema is in docs/sandbox.md ("The exit summary as JSON"); `version` changes
//! only when a field changes meaning or goes away.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Counted, Totals, counted, read, total_line, totals};

/// The schema version of the summary's JSON.
pub const JSON_VERSION: u64 = 1;

/// The ids a run is known by: its own, and those its requests are recorded under.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunIds {
    /// `run-PID-T`.
    pub run: String,
    pub task: String,
    pub project: Option<String>,
    pub job: Option<String>,
    pub subject: String,
    /// The agent acting for the subject (`--agent`; `mcp:CLIENT` for an MCP run), as stated.
    pub agent: Option<String>,
}

/// The run, summed up at its end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    pub ids: RunIds,
    /// The net mode (`none`, `allowlist`, ...): without the run's proxy (`none`, `all`)
    /// there is no audit log and nothing is counted.
    pub net_mode: String,
    /// The command's exit status (128+N for a signal); `None` when it is not known.
    pub exit_status: Option<i32>,
    pub totals: Totals,
    pub unreached: Vec<Counted>,
    /// Where the audit log stays after the run (`None`: it went with the run's state).
    pub audit_log: Option<PathBuf>,
    /// Lines of the audit log that are not events, as the reader describes them.
    pub skipped: Vec<String>,
}

/// Where a proxied run's audit log was written, and where it stays (if it does).
#[derive(Debug, Clone, Copy)]
pub struct AuditPlace<'a> {
    pub written: &'a Path,
    pub kept: Option<&'a Path>,
}

impl RunSummary {
    /// The summary of a run: from its audit log when it had one.
    pub fn of(
        ids: RunIds,
        net_mode: &str,
        exit_status: Option<i32>,
        log: Option<AuditPlace<'_>>,
    ) -> RunSummary {
        let (records, skipped) = log.map(|l| read(l.written)).unwrap_or_default();
        RunSummary {
            ids,
            net_mode: net_mode.to_owned(),
            exit_status,
            totals: totals(&records),
            unreached: counted(&records),
            audit_log: log.and_then(|l| l.kept).map(Path::to_path_buf),
            skipped,
        }
    }

    /// The text on stderr: unreadable lines, one line per destination not reached, the
    /// totals, and with `learn` the command that turns the log into a policy.
    pub fn lines(&self, learn: bool) -> Vec<String> {
        let mut out: Vec<String> = self.skipped.iter().map(|l| format!("sandgate: {l}")).collect();
        out.extend(self.unreached.iter().map(Counted::line));
        out.push(total_line(&self.totals, self.audit_log.as_deref()));
        if let (true, Some(kept)) = (learn, &self.audit_log) {
            out.push(format!(
                "sandgate: learn: sandgate policy suggest --from {} --output learned.yaml (then net.egress_policy: learned.yaml)",
                kept.display()
            ));
        }
        out
    }

    /// The JSON of `--summary-json` (docs/sandbox.md).
    pub fn json(&self) -> Value {
        let group = |which: super::Unreached| {
            self.unreached
                .iter()
                .filter(|c| c.unreached == which)
                .map(|c| json!({"destination": c.destination, "reason": c.reason, "count": c.count}))
                .collect::<Vec<_>>()
        };
        let t = &self.totals;
        json!({
            "version": JSON_VERSION,
            "ids": {
                "run": self.ids.run,
                "task": self.ids.task,
                "project": self.ids.project,
                "job": self.ids.job,
                "subject": self.ids.subject,
                "agent": self.ids.agent,
            },
            "net_mode": self.net_mode,
            "exit_status": self.exit_status,
            "allowed": t.allowed,
            "learned": t.learned,
            "denied": t.denied,
            "bytes_sent": t.sent,
            "bytes_received": t.received,
            "blocked": group(super::Unreached::Blocked),
            "failed": group(super::Unreached::Failed),
            "audit_log": self.audit_log.as_ref().map(|p| p.display().to_string()),
            "skipped_lines": self.skipped,
        })
    }

    /// Writes the JSON to `path`: to a new file beside it, then renamed over it, so a
    /// symbolic link the command left at `path` is replaced, never followed.
    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        let name = path
            .file_name()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut tmp_name = name.to_os_string();
        tmp_name.push(format!(".{}-{nanos}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut f| writeln!(f, "{:#}", self.json()).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

/// Where a run's summary goes at its end: stderr unless `--quiet`, `--learn`'s wording, and
/// `--summary-json FILE`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExitOutput<'a> {
    pub(crate) quiet: bool,
    pub(crate) learn: bool,
    pub(crate) json: Option<&'a std::path::Path>,
}

/// At the end of a run: the summary on stderr (a proxied run, unless `--quiet`), and its
/// JSON to `--summary-json FILE` (every run).
pub(crate) fn at_exit(out: ExitOutput<'_>, summary: &RunSummary, proxied: bool) {
    if proxied && !out.quiet {
        for line in summary.lines(out.learn) {
            eprintln!("{line}");
        }
    }
    if let Some(path) = out.json
        && let Err(e) = summary.write_json(path)
    {
        eprintln!("sandgate: --summary-json {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::Unreached;

    fn summary() -> RunSummary {
        RunSummary {
            ids: RunIds {
                run: "run-1-2".into(),
                task: "t-1".into(),
                project: Some("p".into()),
                job: None,
                subject: "alice".into(),
                agent: Some("mcp:claude-code".into()),
            },
            net_mode: "allowlist".into(),
            exit_status: Some(3),
            totals: Totals {
                allowed: 1,
                learned: 0,
                denied: 2,
                sent: 10,
                received: 20,
            },
            unreached: vec![
                Counted {
                    unreached: Unreached::Blocked,
                    destination: Some("evil.test:443".into()),
                    reason: "not_allowlisted".into(),
                    count: 2,
                },
                Counted {
                    unreached: Unreached::Failed,
                    destination: None,
                    reason: "dns".into(),
                    count: 1,
                },
            ],
            audit_log: Some("/s/run-1-2.jsonl".into()),
            skipped: Vec::new(),
        }
    }

    #[test]
    fn the_text_and_the_json_say_the_same() {
        let s = summary();
        assert_eq!(
            s.lines(true),
            [
                "blocked: evil.test:443 (not allowlisted), 2 times",
                "failed: (malformed request) (dns), once",
                "sandgate: 1 allowed, 2 denied, 10 bytes sent, 20 bytes received; audit log: /s/run-1-2.jsonl",
                "sandgate: learn: sandgate policy suggest --from /s/run-1-2.jsonl --output learned.yaml (then net.egress_policy: learned.yaml)",
            ]
        );
        assert_eq!(
            s.json(),
            json!({
                "version": 1,
                "ids": {"run": "run-1-2", "task": "t-1", "project": "p", "job": null, "subject": "alice", "agent": "mcp:claude-code"},
                "net_mode": "allowlist",
                "exit_status": 3,
                "allowed": 1, "learned": 0, "denied": 2, "bytes_sent": 10, "bytes_received": 20,
                "blocked": [{"destination": "evil.test:443", "reason": "not_allowlisted", "count": 2}],
                "failed": [{"destination": null, "reason": "dns", "count": 1}],
                "audit_log": "/s/run-1-2.jsonl",
                "skipped_lines": [],
            })
        );
    }

    #[test]
    fn the_json_replaces_a_link_left_at_its_path() {
        let dir = std::env::temp_dir().join(format!("sandgate-summary-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("target");
        std::fs::write(&target, "untouched").unwrap();
        let path = dir.join("summary.json");
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(&target, &path).unwrap();
        summary().write_json(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
        let written: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(written["exit_status"], 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
