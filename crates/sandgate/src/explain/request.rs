//! `sandgate explain --request-id ID`: "why was I blocked?" from the id a refusal printed.
//! Finds the request's decision and close in the audit log (through the trail's one typed
//! reader), says what they mean and what would let it through ([`super::remedy`]); with a
//! policy given (`--policy`, `--allow`, `--deny`), also how that policy decides the same
//! destination now ([`super::target::Explanation`]). [`super::report`] prints it.
//!
//! Which log: `--audit-log FILE`, else `SANDGATE_AUDIT_LOG` (as `sandgate audit` reads it),
//! else `./audit.jsonl` and then the kept logs of `sandgate run`, newest first. A log is read
//! with its rotated files (`FILE.N` .. `FILE.1`, `FILE`). An id that is not there is a usage
//! error (64) that says where it looked.

use std::io::BufReader;
use std::path::PathBuf;
use std::process::ExitCode;

use sandgate_policy::{Access, parse_connect_target};
use sandgate_proxy::audit::record::Requester;
use sandgate_proxy::audit::{ReadError, Reader, Record, Recorded};
use sandgate_proxy::audit_query::log_files;

use super::remedy::{self, Request};
use super::report;
use super::target::{Explanation, Setup};
use crate::cli::ExplainArgs;

/// The environment variable `sandgate proxy` and `sandgate audit` take the log from.
const AUDIT_LOG_VAR: &str = "SANDGATE_AUDIT_LOG";

/// Reads a request id: 16 hex digits, as the egress core makes them (a per-process prefix
/// and a counter) and every refusal prints them (`request id: 5f3a...` in a body,
/// `Sandgate-Request-Id` in the head).
fn parse_id(text: &str) -> Result<String, String> {
    let id = text.trim();
    if id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(id.to_ascii_lowercase());
    }
    Err(format!(
        "invalid --request-id {:?}: a request id is 16 hex digits, as a refusal prints it (request id: 5f3a9c0e00000003)",
        text.chars().take(64).collect::<String>()
    ))
}

/// One log: its files, oldest first.
struct Log {
    name: PathBuf,
    files: Vec<PathBuf>,
}

/// The logs to search, in order, and what to say if none holds the id.
fn logs(args: &ExplainArgs) -> Result<Vec<Log>, String> {
    let named = args.audit_log.clone().or_else(|| {
        std::env::var_os(AUDIT_LOG_VAR)
            .filter(|v| !v.is_empty() && v != "-")
            .map(PathBuf::from)
    });
    if let Some(path) = named {
        let files = log_files(&path);
        if files.is_empty() {
            return Err(format!("no audit log at {}", path.display()));
        }
        return Ok(vec![Log { name: path, files }]);
    }
    let here = PathBuf::from("audit.jsonl");
    let logs: Vec<Log> = std::iter::once(here)
        .chain(run_logs())
        .map(|name| Log {
            files: log_files(&name),
            name,
        })
        .filter(|l| !l.files.is_empty())
        .collect();
    if logs.is_empty() {
        let runs = sandgate_sandbox::runlog::dir()
            .map(|d| format!(", and there are no run logs in {}", d.display()))
            .unwrap_or_default();
        return Err(format!(
            "no audit log to search: pass --audit-log FILE (the proxy's --audit-log; sandgate proxy writes to stdout \
             unless it names a file) or set {AUDIT_LOG_VAR}; there is no ./audit.jsonl{runs}"
        ));
    }
    Ok(logs)
}

/// The kept logs of `sandgate run`, newest first by the start time their run ids carry.
fn run_logs() -> Vec<PathBuf> {
    sandgate_sandbox::runlog::newest_first()
}

/// One line of the request, where it was read.
pub(super) struct Line {
    pub(super) file: PathBuf,
    pub(super) line: usize,
    /// As written.
    pub(super) text: String,
    pub(super) record: Record,
}

/// The request's lines.
#[derive(Default)]
pub(super) struct Found {
    pub(super) decision: Option<Line>,
    pub(super) close: Option<Line>,
}

impl Found {
    pub(super) fn request(&self) -> Request<'_> {
        Request {
            decision: self.decision.as_ref().and_then(|l| match &l.record.event {
                Recorded::Decision(d) => Some(d),
                _ => None,
            }),
            close: self.close.as_ref().and_then(|l| match &l.record.event {
                Recorded::Close(c) => Some(c),
                _ => None,
            }),
        }
    }

    /// Who made the request, as its decision (else its close) says.
    pub(super) fn requester(&self) -> Option<&Requester> {
        let request = self.request();
        request
            .decision
            .map(|d| &d.requester)
            .or_else(|| request.close.map(|c| &c.requester))
    }

    /// The first line found: where the request's time is read.
    pub(super) fn first(&self) -> Option<&Line> {
        self.decision.as_ref().or(self.close.as_ref())
    }
}

/// What searching a log found: the request's lines, the events read and the lines that
/// could not be read (each said, should the id be among them).
#[derive(Default)]
struct Search {
    found: Found,
    events: usize,
    skipped: Vec<String>,
}

/// Reads every file of `log` for the lines of request `id`.
fn search(log: &Log, id: &str, into: &mut Search) -> Result<(), String> {
    for file in &log.files {
        let opened = std::fs::File::open(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        for item in Reader::new(BufReader::new(opened)) {
            let entry = match item {
                Ok(entry) => entry,
                Err(ReadError::Io(e)) => return Err(format!("cannot read {}: {e}", file.display())),
                Err(e) => {
                    into.skipped.push(format!("{}: {e}", file.display()));
                    continue;
                }
            };
            into.events += 1;
            if entry.record.request_id != id {
                continue;
            }
            let slot = match entry.record.event {
                Recorded::Decision(_) => &mut into.found.decision,
                Recorded::Close(_) => &mut into.found.close,
                _ => continue,
            };
            slot.get_or_insert(Line {
                file: file.clone(),
                line: entry.line,
                text: entry.text,
                record: entry.record,
            });
        }
    }
    Ok(())
}

/// Why the id is in none of `logs`.
fn not_found(id: &str, logs: &[Log], search: &Search) -> String {
    let searched: Vec<String> = logs
        .iter()
        .map(|l| match l.files.len() {
            1 => l.name.display().to_string(),
            2 => format!("{} (and 1 rotated file)", l.name.display()),
            n => format!("{} (and {} rotated files)", l.name.display(), n - 1),
        })
        .collect();
    let skipped = match search.skipped.first() {
        Some(first) => format!(
            "; {} lines could not be read (first: {first})",
            search.skipped.len()
        ),
        None => String::new(),
    };
    format!(
        "request id {id} is not in {} ({} events read{skipped}). It may be in another proxy's log (pass \
         --audit-log FILE: the log of the proxy that answered; a refusal relayed from an upstream proxy carries \
         that proxy's id), in a rotated file since removed (--audit-keep), or an allowed request folded into an \
         aggregate (--audit-aggregate-window)",
        searched.join(", "),
        search.events
    )
}

/// `sandgate explain --request-id ID`: exits 0 when the request was allowed, 1 when it was
/// refused (here or by an upstream proxy), 2 when it was allowed and failed upstream.
pub(super) fn explain(args: &ExplainArgs, id: &str) -> Result<ExitCode, String> {
    let id = parse_id(id)?;
    // A bad policy file or flag is said before any log is read.
    let setup = match Setup::given(args) {
        true => Some(Setup::from_args(args)?),
        false => None,
    };
    let logs = logs(args)?;
    let mut found = Search::default();
    for log in &logs {
        search(log, &id, &mut found)?;
        if found.found.decision.is_some() || found.found.close.is_some() {
            break;
        }
    }
    if found.found.decision.is_none() && found.found.close.is_none() {
        return Err(not_found(&id, &logs, &found));
    }
    let found = found.found;
    let remedy = remedy::remedy(found.request());
    let now = match &setup {
        Some(setup) => now(args, setup, &found)?,
        None => None,
    };
    if args.json {
        println!("{}", report::json(&id, &found, &remedy, now.as_ref()));
    } else {
        for line in report::text(&id, &found, &remedy, now.as_ref()) {
            println!("{line}");
        }
    }
    Ok(ExitCode::from(remedy.exit))
}

/// How the policy given decides the request's destination now, for its task and project
/// (unless `--task` or `--project` say otherwise).
fn now(args: &ExplainArgs, setup: &Setup, found: &Found) -> Result<Option<Explanation>, String> {
    let request = found.request();
    let requester = found.requester();
    let Some(dest) = request
        .decision
        .and_then(|d| d.dest.as_ref())
        .or_else(|| request.close.and_then(|c| c.dest.as_ref()))
    else {
        return Ok(None);
    };
    let Ok(target) = parse_connect_target(&dest.to_string()) else {
        return Ok(None);
    };
    let task = args
        .task
        .as_deref()
        .or(requester.and_then(|r| r.task_id.as_deref()));
    let project = args
        .project
        .as_deref()
        .or(requester.and_then(|r| r.project_id.as_deref()));
    let access = dest.access.unwrap_or(Access::Connect);
    // A plain-HTTP request is explained with its recorded method and path.
    let line = match (access, requester) {
        (Access::Http | Access::Https, Some(r)) => r.method.clone().zip(r.path.clone()),
        _ => None,
    };
    Explanation::of(args, setup, &(target, access, line), (task, project)).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_id_is_sixteen_hex_digits() {
        assert_eq!(parse_id("5F3A9C0E00000003").unwrap(), "5f3a9c0e00000003");
        assert_eq!(parse_id(" 5f3a9c0e00000003\n").unwrap(), "5f3a9c0e00000003");
        for bad in [
            "",
            "5f3a",
            "5f3a9c0e000000030",
            "ex-5f3a9c0e000000",
            "reload-1",
            "5f3a9c0e0000000g",
        ] {
            let e = parse_id(bad).unwrap_err();
            assert!(e.contains("a request id is 16 hex digits"), "{bad}: {e}");
        }
    }

    #[test]
    fn not_found_says_where_it_looked_and_why_it_may_be_missing() {
        let logs = [Log {
            name: PathBuf::from("/l/audit.jsonl"),
            files: vec![PathBuf::from("/l/audit.jsonl.1"), PathBuf::from("/l/audit.jsonl")],
        }];
        let search = Search {
            events: 12,
            ..Search::default()
        };
        let e = not_found("0123456789abcdef", &logs, &search);
        assert!(
            e.starts_with(
                "request id 0123456789abcdef is not in /l/audit.jsonl (and 1 rotated file) (12 events read)"
            ),
            "{e}"
        );
        assert!(e.contains("--audit-keep"), "{e}");
    }
}
