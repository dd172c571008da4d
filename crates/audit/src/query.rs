//! Reading audit logs back for `sandgate audit` and `sandgate policy suggest`: the current
//! file and its rotated siblings in order, every line through the one reader
//! ([`crate::read`]) into typed records, filters for the common questions, one human line or
//! CSV row per event, and summaries. A line that cannot be read is skipped and reported,
//! never guessed at; a crash can leave at most a torn last line, which is reported as such.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufReader, Seek};
use std::path::{Path, PathBuf};

use sandgate_policy::{PolicyReason, Verdict};

use crate::event::EventKind;
use crate::line::Line;
use crate::read::{Entry, ReadError, Reader};
use crate::record::{Record, Recorded};

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
/// so a log written with `--audit-aggregate-window` sums up the same as one without.
#[derive(Debug, Default)]
pub struct Summary {
    pub denied: Vec<(String, u64)>,
    /// Allowed requests by destination (allow decisions, plus each aggregate's `count`).
    pub allowed: Vec<(String, u64)>,
    pub bytes_by_destination: Vec<(String, u64, u64)>,
    pub bytes_by_task: Vec<(String, u64, u64)>,
}

pub fn summarize<'a>(records: impl IntoIterator<Item = &'a Record>) -> Summary {
    let mut denied: HashMap<String, u64> = HashMap::new();
    let mut allowed: HashMap<String, u64> = HashMap::new();
    let mut by_dest: HashMap<String, (u64, u64)> = HashMap::new();
    let mut by_task: HashMap<String, (u64, u64)> = HashMap::new();
    for r in records {
        let dest = r
            .dest()
            .map_or_else(|| "(no destination)".to_owned(), ToString::to_string);
        let (sent, received) = match &r.event {
            Recorded::Decision(d) => {
                let counts = match d.verdict {
                    Verdict::Deny => &mut denied,
                    Verdict::Allow => &mut allowed,
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
mod tests {
    use super::*;

    /// A record from the fields given, read as any line is.
    fn rec(fields: serde_json::Value) -> Record {
        let mut line = serde_json::json!({
            "schema_version": 1, "created_at": "2026-11-22T10:00:01Z", "request_id": "r-1",
        });
        if let (Some(line), serde_json::Value::Object(more)) = (line.as_object_mut(), fields) {
            line.extend(more);
        }
        Record::parse(&line.to_string()).unwrap()
    }

    #[test]
    fn torn_last_line_is_skipped_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let line = |id: &str| {
            format!(
                "{{\"event\":\"policy_reload\",\"created_at\":\"2026-11-22T10:00:00Z\",\"request_id\":\"{id}\",\"outcome\":\"applied\"}}\n"
            )
        };
        std::fs::write(dir.path().join("audit.jsonl.1"), line("reload-1")).unwrap();
        std::fs::write(&path, format!("{}not json\n{{\"event\":\"clo", line("reload-2"))).unwrap();
        let files = log_files(&path);
        assert_eq!(files.len(), 2);
        let (events, skipped) = read_events(&files).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(
            events[0].record.request_id, "reload-1",
            "rotated files come first"
        );
        assert_eq!(skipped.len(), 2);
        assert!(matches!(skipped[0].error, ReadError::Invalid { line: 2, .. }));
        assert!(matches!(skipped[1].error, ReadError::Torn { line: 3 }));
        assert!(
            skipped[1]
                .to_string()
                .ends_with("audit.jsonl:3: skipped torn last line (incomplete write)")
        );
        let (appended, bad, offset) = read_appended(&path, 0).unwrap();
        assert_eq!(
            (appended.len(), bad.len(), offset),
            (1, 1, line("reload-2").len() as u64 + 9),
            "the partial line is left for later"
        );
        let (again, _, same) = read_appended(&path, offset).unwrap();
        assert_eq!((again.len(), same), (0, offset));
    }

    #[test]
    fn tail_times_are_of_one_width_whatever_the_fraction() {
        let at = |created_at: &str| {
            let r = rec(serde_json::json!({
                "event": "decision", "decision": "deny", "created_at": created_at,
                "destination_host": "a.test", "destination_port": 443,
            }));
            human(&r).split_once(' ').map(|(t, _)| t.to_owned()).unwrap()
        };
        let times = [
            at("2026-11-22T10:00:01Z"),
            at("2026-11-22T10:00:01.25Z"),
            at("2026-11-22T10:00:01.123456789Z"),
        ];
        assert_eq!(
            times,
            [
                "2026-11-22T10:00:01.000Z",
                "2026-11-22T10:00:01.250Z",
                "2026-11-22T10:00:01.123Z"
            ]
        );
    }

    #[test]
    fn aggregates_read_as_the_traffic_they_fold() {
        let agg = rec(serde_json::json!({
            "event": "aggregate", "request_id": "aggregate-1",
            "decision": "allow", "scheme": "connect", "destination_host": "a.test", "destination_port": 443,
            "task_id": "t-1", "count": 3, "bytes_sent": 30, "bytes_received": 300,
            "window_start": "2026-11-22T10:00:00Z",
        }));
        let close = rec(serde_json::json!({
            "event": "close", "destination_host": "a.test", "destination_port": 443,
            "task_id": "t-1", "bytes_sent": 1, "bytes_received": 2, "outcome": "ok",
        }));
        let allow = rec(serde_json::json!({
            "event": "decision", "decision": "allow", "destination_host": "a.test", "destination_port": 443,
        }));
        assert_eq!(
            human(&agg),
            "2026-11-22T10:00:01.000Z aggregate connect a.test:443 count=3 sent=30 received=300 since=2026-11-22T10:00:00Z task=t-1 [aggregate-1]"
        );
        let s = summarize([&agg, &close, &allow]);
        assert_eq!(s.allowed, vec![("a.test:443".to_owned(), 4)]);
        assert_eq!(s.bytes_by_destination, vec![("a.test:443".to_owned(), 31, 302)]);
        assert_eq!(s.bytes_by_task, vec![("t-1".to_owned(), 31, 302)]);
    }

    #[test]
    fn learned_destinations_are_what_only_the_allowlist_kept_out() {
        let d = |host: &str, port: u16, code: &str, would: Option<&str>, task: Option<&str>| {
            rec(serde_json::json!({
                "event": "decision", "decision": if would.is_some() { "allow" } else { "deny" },
                "reason_code": code, "would_deny": would, "destination_host": host,
                "destination_port": port, "task_id": task,
            }))
        };
        let records = [
            d("b.test", 443, "report_only", Some("not_allowlisted"), Some("t-1")),
            d("b.test", 80, "report_only", Some("not_allowlisted"), Some("t-2")),
            d("b.test", 443, "report_only", Some("not_allowlisted"), Some("t-1")),
            d("a.test", 8443, "not_allowlisted", None, None),
            d("evil.test", 443, "report_only", Some("denylisted"), None),
            d("ok.test", 443, "allowlisted", None, None),
            d("guarded.test", 443, "destination_ip_prohibited", None, None),
        ];
        let found = learned(&records, false);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(
            found[0],
            Learned {
                host: "b.test".into(),
                ports: vec![80, 443],
                count: 3,
                tasks: vec!["t-1".into(), "t-2".into()],
                denylisted: false,
            }
        );
        assert!(found[1].denylisted && found[1].host == "evil.test");
        let with_denied = learned(&records, true);
        assert_eq!(with_denied[0].host, "a.test");
        assert_eq!(with_denied.len(), 3);
    }

    #[test]
    fn filters_go_by_the_typed_fields() {
        let entry = |fields| {
            let record = rec(fields);
            let text = serde_json::to_string(&Line::of_record(&record)).unwrap();
            Entry {
                line: 1,
                text,
                record,
            }
        };
        let deny = entry(serde_json::json!({
            "event": "decision", "decision": "deny", "reason_code": "not_allowlisted",
            "destination_host": "api.evil.test", "destination_port": 443, "task_id": "t-1",
        }));
        let agg = entry(
            serde_json::json!({"event": "aggregate", "destination_host": "a.test", "destination_port": 80}),
        );
        let reload = entry(serde_json::json!({"event": "policy_reload", "outcome": "applied"}));
        let f = |f: Filter| {
            [&deny, &agg, &reload]
                .into_iter()
                .filter(|e| f.matches(e))
                .count()
        };
        assert_eq!(f(Filter::default()), 3);
        let allow = Some(Verdict::Allow);
        assert_eq!(
            f(Filter {
                decision: allow,
                ..Filter::default()
            }),
            1,
            "aggregates are allowed traffic"
        );
        let host = Some("*.evil.test".to_owned());
        assert_eq!(
            f(Filter {
                host,
                ..Filter::default()
            }),
            1
        );
        let task = Some("t-1".to_owned());
        assert_eq!(
            f(Filter {
                task,
                ..Filter::default()
            }),
            1
        );
        let events = vec![EventKind::PolicyReload, EventKind::Aggregate];
        assert_eq!(
            f(Filter {
                events,
                ..Filter::default()
            }),
            2
        );
        let grep = Some("\"reason_code\":\"not_allowlisted\"".to_owned());
        assert_eq!(
            f(Filter {
                grep,
                ..Filter::default()
            }),
            1
        );
        let since = "2026-11-22T10:00:02Z".parse().ok();
        assert_eq!(
            f(Filter {
                since,
                ..Filter::default()
            }),
            0
        );
    }

    #[test]
    fn since_and_csv() {
        let now: jiff::Timestamp = "2026-11-22T12:00:00Z".parse().unwrap();
        assert_eq!(
            parse_since("1h", now).unwrap().to_string(),
            "2026-11-22T11:00:00Z"
        );
        assert_eq!(
            parse_since("2026-01-01T00:00:00Z", now).unwrap().to_string(),
            "2026-01-01T00:00:00Z"
        );
        assert!(parse_since("1w", now).is_err());
        assert_eq!(
            parse_since("2026-11-20", now).unwrap().to_string(),
            "2026-11-20T00:00:00Z"
        );
        assert_eq!(
            parse_since("2026-11-20T08:30", now).unwrap().to_string(),
            "2026-11-20T08:30:00Z"
        );
        let e = rec(serde_json::json!({"event": "decision", "decision": "allow", "rule": "allow:a, \"b\""}));
        let row = csv_row(&e);
        assert!(row.contains("\"allow:a, \"\"b\"\"\""), "{row}");
        assert!(row.starts_with("1,decision,2026-11-22T10:00:01Z,r-1,"), "{row}");
    }

    #[test]
    fn the_csv_columns_are_the_written_fields_in_order() {
        let e = rec(serde_json::json!({"event": "policy_reload", "outcome": "applied"}));
        let text = serde_json::to_string(&Line::of_record(&e)).unwrap();
        let mut at = 0;
        for column in CSV_COLUMNS {
            let key = format!("\"{column}\":");
            let found = text.get(at..).and_then(|rest| rest.find(&key));
            assert!(found.is_some(), "{column} missing or out of order in {text}");
            at += found.unwrap_or(0) + key.len();
        }
        assert_eq!(text.matches("\":").count(), CSV_COLUMNS.len(), "{text}");
    }
}
