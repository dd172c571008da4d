//! Reading audit logs back for `sandgate audit` and `sandgate policy suggest`: the current
//! file and its rotated siblings in order, every line through the one reader
//! ([`crate::read`]) into typed records, filters for the common questions, one human line or
//! CSV row per event, and summaries (an upstream proxy's refusal counted as denied, through
//! [`crate::upstream`], as a run's exit summary counts it). A line that cannot be read is
//! skipped and reported, never guessed at; a crash can leave at most a torn last line, which
//! is reported as such.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufReader, Seek};
use std::path::{Path, PathBuf};

use sandgate_policy::{PolicyReason, Verdict};

use crate::event::EventKind;
use crate::line::Line;
use crate::read::{Entry, ReadError, Reader};
use crate::record::{Record, Recorded};
use crate::upstream::UpstreamRefusals;

/// A line that could not be read as an event.
#[derive(Debug)]
pub struct Skipped {
    pub file: PathBuf,
    /// Why, with the line number.
    pub error: ReadError,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let file = self.file.display();
        match &self.error {
            ReadError::Torn { line } => {
                write!(f, "{file}:{line}: skipped torn last line (incomplete write)")
            }
            ReadError::TooLong { line, limit } => {
                write!(f, "{file}:{line}: skipped line longer than {limit} bytes")
            }
            ReadError::Invalid { line, cause } => {
                write!(f, "{file}:{line}: skipped malformed line ({cause})")
            }
            ReadError::NotUtf8 { line } => write!(f, "{file}:{line}: skipped malformed line (not UTF-8)"),
            ReadError::Io(e) => write!(f, "{file}: {e}"),
        }
    }
}

/// The files of an audit log, oldest first: `audit.jsonl.N` .. `audit.jsonl.1`, `audit.jsonl`.
/// Only files that exist are returned.
pub fn log_files(path: &Path) -> Vec<PathBuf> {
    let mut rotated = Vec::new();
    for n in 1.. {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        let candidate = PathBuf::from(name);
        if !candidate.exists() {
            break;
        }
        rotated.push(candidate);
    }
    rotated.reverse();
    if path.exists() {
        rotated.push(path.to_path_buf());
    }
    rotated
}

/// Reads every event of `files` in order. Lines that are not events are skipped and
/// reported; a file that cannot be opened or read is an error.
pub fn read_events(files: &[PathBuf]) -> std::io::Result<(Vec<Entry>, Vec<Skipped>)> {
    let mut entries = Vec::new();
    let mut skipped = Vec::new();
    for file in files {
        let reader = Reader::new(BufReader::new(std::fs::File::open(file)?));
        for item in reader {
            match item {
                Ok(entry) => entries.push(entry),
                Err(ReadError::Io(e)) => return Err(e),
                Err(error) => skipped.push(Skipped {
                    file: file.clone(),
                    error,
                }),
            }
        }
    }
    Ok((entries, skipped))
}

/// Reads the whole lines appended to `file` after byte `offset`; returns them, the lines
/// skipped, and the offset to resume from. A partial last line is left for the next call.
/// Used by `audit tail --follow`.
pub fn read_appended(file: &Path, offset: u64) -> std::io::Result<(Vec<Entry>, Vec<Skipped>, u64)> {
    let mut f = std::fs::File::open(file)?;
    let len = f.metadata()?.len();
    // The file was rotated or truncated: start again from its beginning.
    let start = if len < offset { 0 } else { offset };
    f.seek(std::io::SeekFrom::Start(start))?;
    let mut reader = Reader::new(BufReader::new(f));
    let mut entries = Vec::new();
    let mut skipped = Vec::new();
    for item in reader.by_ref() {
        match item {
            Ok(entry) => entries.push(entry),
            Err(ReadError::Torn { .. }) => {}
            Err(ReadError::Io(e)) => return Err(e),
            Err(error) => skipped.push(Skipped {
                file: file.to_path_buf(),
                error,
            }),
        }
    }
    Ok((entries, skipped, start + reader.offset()))
}

/// Which events to show.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only events at or after this time.
    pub since: Option<jiff::Timestamp>,
    /// Only lines with this `decision` (decisions, and aggregates as `allow`).
    pub decision: Option<Verdict>,
    pub task: Option<String>,
    /// Destination host, exact or as a `*.suffix` wildcard.
    pub host: Option<String>,
    /// Substring anywhere in the line as written.
    pub grep: Option<String>,
    /// Event kinds; empty means all.
    pub events: Vec<EventKind>,
}

impl Filter {
    pub fn matches(&self, e: &Entry) -> bool {
        let r = &e.record;
        if self.since.is_some_and(|since| r.created_at < since) {
            return false;
        }
        if self.decision.is_some_and(|d| r.verdict() != Some(d)) {
            return false;
        }
        if self.task.as_deref().is_some_and(|t| r.task_id() != Some(t)) {
            return false;
        }
        if let Some(host) = &self.host {
            let have = r.dest().map_or("", |d| d.host.as_str());
            let ok = match host.strip_prefix("*.") {
                Some(suffix) => have.ends_with(&format!(".{suffix}")),
                None => have.eq_ignore_ascii_case(host),
            };
            if !ok {
                return false;
            }
        }
        if !self.events.is_empty() && !self.events.contains(&r.kind()) {
            return false;
        }
        if let Some(g) = &self.grep
            && !e.text.contains(g.as_str())
        {
            return false;
        }
        true
    }
}

const SINCE_FORMS: &str = "use 90s, 30m, 1h, 2d, a date (2026-11-22, UTC) or an RFC 3339 time";

/// Parses `--since`: a duration back from `now` (`90s`, `30m`, `1h`, `2d`), an RFC 3339
/// time, or a date or date and time without an offset (`2026-11-22`, `2026-11-22T10:00`),
/// read as UTC like every time in the log.
pub fn parse_since(text: &str, now: jiff::Timestamp) -> Result<jiff::Timestamp, String> {
    if let Ok(t) = text.parse::<jiff::Timestamp>() {
        return Ok(t);
    }
    let civil = text.parse::<jiff::civil::DateTime>().or_else(|_| {
        text.parse::<jiff::civil::Date>()
            .map(|d| d.to_datetime(jiff::civil::Time::midnight()))
    });
    if let Ok(dt) = civil {
        return dt
            .to_zoned(jiff::tz::TimeZone::UTC)
            .map(|z| z.timestamp())
            .map_err(|e| format!("invalid --since {text:?}: {e}"));
    }
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let n: i64 = num
        .parse()
        .map_err(|_| format!("invalid --since {text:?}: {SINCE_FORMS}"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => {
            return Err(format!("invalid --since {text:?}: {SINCE_FORMS}"));
        }
    };
    now.checked_sub(jiff::SignedDuration::from_secs(secs))
        .map_err(|e| e.to_string())
}

/// One human-readable line for an event.
pub fn human(r: &Record) -> String {
    let or_dash = |s: Option<&str>| s.unwrap_or("-").to_owned();
    let dest = r.dest().map_or_else(|| "-".to_owned(), ToString::to_string);
    let task = r.task_id().map(|t| format!(" task={t}")).unwrap_or_default();
    // Milliseconds always, so every line's time is the same width and the columns after it
    // line up (the writer drops trailing zeros: `10:00:01Z`, `10:00:01.25Z`).
    let (at, id) = (format!("{:.3}", r.created_at), &r.request_id);
    match &r.event {
        Recorded::Decision(d) => {
            let verdict = match d.verdict {
                Verdict::Allow => "allow",
                Verdict::Deny => "deny",
            };
            format!(
                "{at} {verdict:5} {} {dest} {}{task} [{id}]",
                or_dash(d.requester.method.as_deref()),
                or_dash(d.reason_code.as_deref()),
            )
        }
        Recorded::Close(c) => format!(
            "{at} close {} {dest} {} sent={} received={} {}ms{task} [{id}]",
            or_dash(c.requester.method.as_deref()),
            c.outcome.as_str(),
            c.bytes_sent,
            c.bytes_received,
            c.duration_ms,
        ),
        Recorded::Aggregate(a) => format!(
            "{at} aggregate {} {dest} count={} sent={} received={} since={}{task} [{id}]",
            or_dash(a.dest.as_ref().and_then(|d| d.access).map(|a| a.scheme())),
            a.count,
            a.bytes_sent,
            a.bytes_received,
            or_dash(a.window_start.as_deref()),
        ),
        Recorded::PolicyReload(reload) => format!(
            "{at} {} {} {}",
            r.kind().as_str(),
            if reload.applied { "applied" } else { "rejected" },
            or_dash(reload.detail.as_deref())
        ),
        Recorded::Exception(x) => format!("{at} {} - {}", r.kind().as_str(), or_dash(x.note.as_deref())),
        Recorded::AdminRefused(refusal) => format!(
            "{at} {} - {}",
            r.kind().as_str(),
            or_dash(refusal.reason.as_deref())
        ),
    }
}

/// The columns of `audit export --format csv`, in order: the fields of [`Line`] as written.
pub const CSV_COLUMNS: &[&str] = &[
    "schema_version",
    "event",
    "created_at",
    "request_id",
    "client_addr",
    "task_id",
    "project_id",
    "job_id",
    "decision",
    "reason_code",
    "scheme",
    "method",
    "destination_host",
    "destination_port",
    "resolved_ip",
    "rule",
    "status",
    "bytes_sent",
    "bytes_received",
    "duration_ms",
    "outcome",
    "detail",
    "count",
    "window_start",
    "exception_id",
    "hosts",
    "ports",
    "ttl_seconds",
    "reason",
    "requested_by",
    "decided_by",
    "expires_at",
    "subject",
    "tls_server_name",
    "node",
    "would_deny",
    "agent",
    "path",
    "methods",
    "paths",
    "tweak",
];

/// One CSV record (RFC 4180 quoting): the record written as a [`Line`] again, its fields
/// in [`CSV_COLUMNS`] order.
pub fn csv_row(r: &Record) -> String {
    // The writer's own serialisation, so the export has exactly the written schema.
    let fields = serde_json::to_value(Line::of_record(r)).unwrap_or_default();
    CSV_COLUMNS
        .iter()
        .map(|k| {
            let cell = match fields.get(*k) {
                None | Some(serde_json::Value::Null) => String::new(),
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            if cell.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", cell.replace('"', "\"\""))
            } else {
                cell
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Totals for `audit summary`. Aggregate events count as the requests and bytes they fold,
/// so a log written with `--audit-aggregate-window` sums up the same as one without. A
/// request an upstream proxy refused after this proxy allowed it counts as denied, as a
/// run's exit summary counts it ([`UpstreamRefusals`]).
#[derive(Debug, Default)]
pub struct Summary {
    /// Denied requests by destination: deny decisions, and allows an upstream proxy refused.
    pub denied: Vec<(String, u64)>,
    /// Allowed requests by destination (allow decisions, plus each aggregate's `count`).
    pub allowed: Vec<(String, u64)>,
    pub bytes_by_destination: Vec<(String, u64, u64)>,
    pub bytes_by_task: Vec<(String, u64, u64)>,
}

/// How `audit summary` names a record's destination.
fn shown_dest(r: &Record) -> String {
    r.dest()
        .map_or_else(|| "(no destination)".to_owned(), ToString::to_string)
}

pub fn summarize<'a>(records: impl IntoIterator<Item = &'a Record>) -> Summary {
    let records: Vec<&Record> = records.into_iter().collect();
    let refusals = UpstreamRefusals::among(records.iter().copied());
    let mut denied: HashMap<String, u64> = HashMap::new();
    let mut allowed: HashMap<String, u64> = HashMap::new();
    let mut by_dest: HashMap<String, (u64, u64)> = HashMap::new();
    let mut by_task: HashMap<String, (u64, u64)> = HashMap::new();
    for r in &records {
        let dest = shown_dest(r);
        let (sent, received) = match &r.event {
            Recorded::Decision(_) => {
                let counts = match refusals.verdict(r) {
                    Some(Verdict::Deny) => &mut denied,
                    _ => &mut allowed,
                };
                *counts.entry(dest).or_default() += 1;
                continue;
            }
            Recorded::Aggregate(a) => {
                *allowed.entry(dest.clone()).or_default() += a.count;
                (a.bytes_sent, a.bytes_received)
            }
            Recorded::Close(c) => (c.bytes_sent, c.bytes_received),
            _ => continue,
        };
        let d = by_dest.entry(dest).or_default();
        d.0 += sent;
        d.1 += received;
        let task = r.task_id().unwrap_or("(none)").to_owned();
        let t = by_task.entry(task).or_default();
        t.0 += sent;
        t.1 += received;
    }
    // A refusal whose allow an aggregate folded: one of the aggregate's requests was denied.
    for r in refusals.folded() {
        let dest = shown_dest(r);
        if let Some(n) = allowed.get_mut(&dest) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                allowed.remove(&dest);
            }
        }
        *denied.entry(dest).or_default() += 1;
    }
    let counted = |m: HashMap<String, u64>| {
        let mut v: Vec<_> = m.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    };
    let flatten = |m: HashMap<String, (u64, u64)>| {
        let mut v: Vec<_> = m.into_iter().map(|(k, (s, r))| (k, s, r)).collect();
        v.sort_by(|a, b| (b.1 + b.2).cmp(&(a.1 + a.2)).then(a.0.cmp(&b.0)));
        v
    };
    Summary {
        denied: counted(denied),
        allowed: counted(allowed),
        bytes_by_destination: flatten(by_dest),
        bytes_by_task: flatten(by_task),
    }
}

/// A destination the policy refused (or, in report-only mode, would have refused), as
/// `sandgate policy suggest` turns it into an allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Learned {
    /// As written in the audit log: a name, a dotted quad or `[v6]`.
    pub host: String,
    /// Every port it was asked for, ascending.
    pub ports: Vec<u16>,
    /// Requests seen.
    pub count: u64,
    /// The tasks that asked, sorted.
    pub tasks: Vec<String>,
    /// A deny entry refused it: an allow entry would change nothing.
    pub denylisted: bool,
}

/// The destinations that only the allowlist kept out: decisions let through in report-only
/// mode (`would_deny`), and with `include_denied` the plain `not_allowlisted` denies too.
/// Sorted by host. Denylisted ones are kept, marked.
pub fn learned<'a>(records: impl IntoIterator<Item = &'a Record>, include_denied: bool) -> Vec<Learned> {
    /// What was seen of one host.
    #[derive(Default)]
    struct Seen<'a> {
        ports: BTreeSet<u16>,
        count: u64,
        tasks: BTreeSet<&'a str>,
        denylisted: bool,
    }
    let mut by_host: BTreeMap<&str, Seen<'_>> = BTreeMap::new();
    for r in records {
        let Recorded::Decision(d) = &r.event else {
            continue;
        };
        let denylisted = match (d.verdict, d.would_deny, d.policy_reason()) {
            (Verdict::Allow, Some(would), _) => would == PolicyReason::Denylisted,
            (Verdict::Deny, _, Some(PolicyReason::NotAllowlisted)) if include_denied => false,
            (Verdict::Deny, _, Some(PolicyReason::Denylisted)) if include_denied => true,
            _ => continue,
        };
        let Some(dest) = &d.dest else {
            continue;
        };
        let seen = by_host.entry(&dest.host).or_default();
        seen.ports.insert(dest.port);
        seen.count += 1;
        seen.tasks.extend(d.requester.task_id.as_deref());
        seen.denylisted |= denylisted;
    }
    by_host
        .into_iter()
        .map(|(host, seen)| Learned {
            host: host.to_owned(),
            ports: seen.ports.into_iter().collect(),
            count: seen.count,
            tasks: seen.tasks.into_iter().map(str::to_owned).collect(),
            denylisted: seen.denylisted,
        })
        .collect()
}

#[cfg(test)]
#[path = "query_tests.rs"]
mod tests;
