//! Reading audit logs back: the current file and its rotated siblings in order, every line
//! parsed, filters for the common questions, and summaries. A line that is not valid JSON is
//! skipped and reported, never guessed at; a crash can leave at most a torn last line, which
//! is reported as such.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// A line that could not be read as an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub file: PathBuf,
    pub line: usize,
    /// True when it is the last line of its file and has no newline (a torn write).
    pub torn: bool,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.torn {
            "torn last line (incomplete write)"
        } else {
            "malformed line"
        };
        write!(f, "{}:{}: skipped {what}", self.file.display(), self.line)
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

/// Reads every event of `files` in order. Unreadable lines are skipped and reported.
pub fn read_events(files: &[PathBuf]) -> std::io::Result<(Vec<Value>, Vec<Skipped>)> {
    let (lines, skipped) = read_lines(files)?;
    Ok((lines.into_iter().map(|(_, v)| v).collect(), skipped))
}

/// An event as written (its line, without the newline) and as parsed.
pub type LineEvent = (String, Value);

/// As [`read_events`], keeping each event's line as written (for `tail --json` and JSON
/// lines exports, which pass lines through unchanged).
pub fn read_lines(files: &[PathBuf]) -> std::io::Result<(Vec<LineEvent>, Vec<Skipped>)> {
    let mut events = Vec::new();
    let mut skipped = Vec::new();
    for file in files {
        let mut text = String::new();
        std::fs::File::open(file)?.read_to_string(&mut text)?;
        let ends_clean = text.ends_with('\n') || text.is_empty();
        let count = text.lines().count();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Value>(line) {
                Ok(v) if v.is_object() => events.push((line.to_owned(), v)),
                _ => skipped.push(Skipped {
                    file: file.clone(),
                    line: i + 1,
                    torn: i + 1 == count && !ends_clean,
                }),
            }
        }
    }
    Ok((events, skipped))
}

/// Reads complete lines appended to `file` after byte `offset`, each as written and parsed;
/// returns the new offset. A partial last line is left for the next call. Used by `audit
/// tail --follow`.
pub fn read_appended(file: &Path, offset: u64) -> std::io::Result<(Vec<LineEvent>, u64)> {
    let mut f = std::fs::File::open(file)?;
    let len = f.metadata()?.len();
    // The file was rotated or truncated: start again from its beginning.
    let start = if len < offset { 0 } else { offset };
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(start))?;
    let mut reader = BufReader::new(f);
    let mut events = Vec::new();
    let mut pos = start;
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line)?;
        if n == 0 || !line.ends_with('\n') {
            break;
        }
        pos += n as u64;
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            events.push((line.trim_end().to_owned(), v));
        }
    }
    Ok((events, pos))
}

/// Which events to show.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only events at or after this time.
    pub since: Option<jiff::Timestamp>,
    pub decision: Option<String>,
    pub task: Option<String>,
    /// Destination host, exact or as a `*.suffix` wildcard.
    pub host: Option<String>,
    /// Substring anywhere in the event's JSON.
    pub grep: Option<String>,
    /// Event kinds (`decision`, `close`, `policy_reload`); empty means all.
    pub events: Vec<String>,
}

impl Filter {
    pub fn matches(&self, e: &Value) -> bool {
        let str_of = |k: &str| e.get(k).and_then(Value::as_str);
        if let Some(since) = self.since {
            let at = str_of("created_at").and_then(|t| t.parse::<jiff::Timestamp>().ok());
            if at.is_none_or(|at| at < since) {
                return false;
            }
        }
        if self
            .decision
            .as_deref()
            .is_some_and(|d| str_of("decision") != Some(d))
        {
            return false;
        }
        if self.task.as_deref().is_some_and(|t| str_of("task_id") != Some(t)) {
            return false;
        }
        if let Some(host) = &self.host {
            let have = str_of("destination_host").unwrap_or("");
            let ok = match host.strip_prefix("*.") {
                Some(suffix) => have.ends_with(&format!(".{suffix}")),
                None => have.eq_ignore_ascii_case(host),
            };
            if !ok {
                return false;
            }
        }
        if !self.events.is_empty() && !self.events.iter().any(|k| str_of("event") == Some(k)) {
            return false;
        }
        if let Some(g) = &self.grep
            && !e.to_string().contains(g.as_str())
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
pub fn human(e: &Value) -> String {
    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("-").to_owned();
    let n = |k: &str| {
        e.get(k)
            .and_then(Value::as_u64)
            .map_or("-".to_owned(), |v| v.to_string())
    };
    let dest = match (
        e.get("destination_host").and_then(Value::as_str),
        e.get("destination_port").and_then(Value::as_u64),
    ) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        _ => "-".to_owned(),
    };
    let task = e
        .get("task_id")
        .and_then(Value::as_str)
        .map(|t| format!(" task={t}"))
        .unwrap_or_default();
    match e.get("event").and_then(Value::as_str) {
        Some("decision") => format!(
            "{} {:5} {} {dest} {}{task} [{}]",
            s("created_at"),
            s("decision"),
            s("method"),
            s("reason_code"),
            s("request_id")
        ),
        Some("close") => format!(
            "{} close {} {dest} {} sent={} received={} {}ms{task} [{}]",
            s("created_at"),
            s("method"),
            s("outcome"),
            n("bytes_sent"),
            n("bytes_received"),
            n("duration_ms"),
            s("request_id")
        ),
        Some("aggregate") => format!(
            "{} aggregate {} {dest} count={} sent={} received={} since={}{task} [{}]",
            s("created_at"),
            s("scheme"),
            n("count"),
            n("bytes_sent"),
            n("bytes_received"),
            s("window_start"),
            s("request_id")
        ),
        _ => format!(
            "{} {} {} {}",
            s("created_at"),
            s("event"),
            s("outcome"),
            s("detail")
        ),
    }
}

/// The columns of `audit export --format csv`, in order.
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
];

/// One CSV record (RFC 4180 quoting).
pub fn csv_row(e: &Value) -> String {
    CSV_COLUMNS
        .iter()
        .map(|k| {
            let cell = match e.get(*k) {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
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

pub fn summarize(events: &[Value]) -> Summary {
    let mut denied: HashMap<String, u64> = HashMap::new();
    let mut allowed: HashMap<String, u64> = HashMap::new();
    let mut by_dest: HashMap<String, (u64, u64)> = HashMap::new();
    let mut by_task: HashMap<String, (u64, u64)> = HashMap::new();
    for e in events {
        let dest = match (
            e.get("destination_host").and_then(Value::as_str),
            e.get("destination_port").and_then(Value::as_u64),
        ) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            _ => "(no destination)".to_owned(),
        };
        let event = e.get("event").and_then(Value::as_str);
        match event {
            Some("decision") if e.get("decision").and_then(Value::as_str) == Some("deny") => {
                *denied.entry(dest).or_default() += 1;
            }
            Some("decision") if e.get("decision").and_then(Value::as_str) == Some("allow") => {
                *allowed.entry(dest).or_default() += 1;
            }
            Some("close" | "aggregate") => {
                if event == Some("aggregate") {
                    let n = e.get("count").and_then(Value::as_u64).unwrap_or(0);
                    *allowed.entry(dest.clone()).or_default() += n;
                }
                let sent = e.get("bytes_sent").and_then(Value::as_u64).unwrap_or(0);
                let recv = e.get("bytes_received").and_then(Value::as_u64).unwrap_or(0);
                let d = by_dest.entry(dest).or_default();
                d.0 += sent;
                d.1 += recv;
                let task = e
                    .get("task_id")
                    .and_then(Value::as_str)
                    .unwrap_or("(none)")
                    .to_owned();
                let t = by_task.entry(task).or_default();
                t.0 += sent;
                t.1 += recv;
            }
            _ => {}
        }
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
/// mode (`reason_code: report_only`), and with `include_denied` the plain
/// `not_allowlisted` denies too. Sorted by host. Denylisted ones are kept, marked.
pub fn learned(events: &[Value], include_denied: bool) -> Vec<Learned> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut by_host: BTreeMap<String, (BTreeSet<u16>, u64, BTreeSet<String>, bool)> = BTreeMap::new();
    for e in events {
        let str_of = |k: &str| e.get(k).and_then(Value::as_str);
        if str_of("event") != Some("decision") {
            continue;
        }
        let (code, detail) = (str_of("reason_code"), str_of("detail").unwrap_or(""));
        let denylisted = match code {
            Some("report_only") => detail.ends_with("denylisted"),
            Some("not_allowlisted") if include_denied => false,
            Some("denylisted") if include_denied => true,
            _ => continue,
        };
        let (Some(host), Some(port)) = (
            str_of("destination_host"),
            e.get("destination_port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok()),
        ) else {
            continue;
        };
        let entry = by_host.entry(host.to_owned()).or_default();
        entry.0.insert(port);
        entry.1 += 1;
        if let Some(task) = str_of("task_id") {
            entry.2.insert(task.to_owned());
        }
        entry.3 |= denylisted;
    }
    by_host
        .into_iter()
        .map(|(host, (ports, count, tasks, denylisted))| Learned {
            host,
            ports: ports.into_iter().collect(),
            count,
            tasks: tasks.into_iter().collect(),
            denylisted,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_last_line_is_skipped_and_reported() {
        let dir = std::env::temp_dir().join(format!("sandgate-aq-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.jsonl");
        std::fs::write(dir.join("audit.jsonl.1"), "{\"event\":\"decision\",\"n\":1}\n").unwrap();
        std::fs::write(
            &path,
            "{\"event\":\"decision\",\"n\":2}\nnot json\n{\"event\":\"clo",
        )
        .unwrap();
        let files = log_files(&path);
        assert_eq!(files.len(), 2);
        let (events, skipped) = read_events(&files).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["n"], 1, "rotated files come first");
        assert_eq!(skipped.len(), 2);
        assert!(!skipped[0].torn && skipped[0].line == 2);
        assert!(skipped[1].torn && skipped[1].line == 3);
        let (appended, offset) = read_appended(&path, 0).unwrap();
        assert_eq!(
            (appended.len(), offset),
            (1, 36),
            "the partial line is left for later"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn aggregates_read_as_the_traffic_they_fold() {
        let agg = serde_json::json!({
            "event": "aggregate", "created_at": "2026-11-22T10:00:01Z", "request_id": "aggregate-1",
            "decision": "allow", "scheme": "connect", "destination_host": "a.test", "destination_port": 443,
            "task_id": "t-1", "count": 3, "bytes_sent": 30, "bytes_received": 300,
            "window_start": "2026-11-22T10:00:00Z",
        });
        let close = serde_json::json!({
            "event": "close", "destination_host": "a.test", "destination_port": 443,
            "task_id": "t-1", "bytes_sent": 1, "bytes_received": 2, "outcome": "ok",
        });
        let allow = serde_json::json!({
            "event": "decision", "decision": "allow", "destination_host": "a.test", "destination_port": 443,
        });
        let line = human(&agg);
        assert_eq!(
            line,
            "2026-11-22T10:00:01Z aggregate connect a.test:443 count=3 sent=30 received=300 since=2026-11-22T10:00:00Z task=t-1 [aggregate-1]"
        );
        let s = summarize(&[agg, close, allow]);
        assert_eq!(s.allowed, vec![("a.test:443".to_owned(), 4)]);
        assert_eq!(s.bytes_by_destination, vec![("a.test:443".to_owned(), 31, 302)]);
        assert_eq!(s.bytes_by_task, vec![("t-1".to_owned(), 31, 302)]);
    }

    #[test]
    fn learned_destinations_are_what_only_the_allowlist_kept_out() {
        let d = |host: &str, port: u16, code: &str, detail: Option<&str>, task: Option<&str>| {
            serde_json::json!({
                "event": "decision", "decision": if code == "report_only" { "allow" } else { "deny" },
                "reason_code": code, "detail": detail, "destination_host": host,
                "destination_port": port, "task_id": task,
            })
        };
        let events = vec![
            d(
                "b.test",
                443,
                "report_only",
                Some("would deny: not_allowlisted"),
                Some("t-1"),
            ),
            d(
                "b.test",
                80,
                "report_only",
                Some("would deny: not_allowlisted"),
                Some("t-2"),
            ),
            d(
                "b.test",
                443,
                "report_only",
                Some("would deny: not_allowlisted"),
                Some("t-1"),
            ),
            d("a.test", 8443, "not_allowlisted", None, None),
            d(
                "evil.test",
                443,
                "report_only",
                Some("would deny: denylisted"),
                None,
            ),
            d("ok.test", 443, "allowlisted", None, None),
            d("guarded.test", 443, "destination_ip_prohibited", None, None),
        ];
        let found = learned(&events, false);
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
        let with_denied = learned(&events, true);
        assert_eq!(with_denied[0].host, "a.test");
        assert_eq!(with_denied.len(), 3);
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
        let e: Value = serde_json::json!({"event": "decision", "rule": "allow:a, \"b\""});
        assert!(csv_row(&e).contains("\"allow:a, \"\"b\"\"\""));
    }
}
