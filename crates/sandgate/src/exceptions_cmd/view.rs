//! What `sandgate exceptions` prints for people: a table with headers (`list`, and the one
//! exception a request or a decision returns) and every field on a line of its own
//! (`show`). `--json` prints the API's answer instead and never comes here.
//!
//! Everything shown comes from the API and, through it, from whoever filed the request: a
//! reason can hold line breaks, terminal escapes or bidirectional overrides. Those are shown
//! escaped (`\n`, `\u{1b}`), so a request cannot redraw the approver's terminal, add a
//! line to the table, or make one host read as another. Times are RFC 3339 as the API writes
//! them; Unix seconds from an older control plane are shown the same way.

use sandgate_policy::exception::BelowHost;
use serde_json::Value;

/// The columns of the table, the reason last: it is the one cut to fit.
const HEADERS: [&str; 9] = [
    "ID",
    "STATE",
    "TASK",
    "HOSTS",
    "PORTS",
    "TTL",
    "EXPIRES",
    "REQUESTED BY",
    "REASON",
];

/// The reason's width when the terminal's is unknown (no `COLUMNS`).
pub const REASON_WIDTH: usize = 40;
/// The reason keeps at least this many characters however narrow the terminal.
const MIN_REASON: usize = 16;

/// The fields of an exception in the order `show` prints them; any others the API adds
/// follow, by name.
const FIELDS: [&str; 17] = [
    "id",
    "state",
    "task_id",
    "project_id",
    "hosts",
    "ports",
    "methods",
    "paths",
    "read_only",
    "ttl_seconds",
    "reason",
    "requested_by",
    "requested_at",
    "decided_by",
    "decided_at",
    "note",
    "expires_at",
];

/// The table of `list`: a header line and one line per exception. With `columns` (the
/// terminal's width) the reason is cut to what is left of it, otherwise to
/// [`REASON_WIDTH`]; cut text ends in `…`.
pub fn table(list: &[Value], columns: Option<usize>) -> String {
    let rows: Vec<[String; 9]> = list.iter().map(row).collect();
    let mut widths = HEADERS.map(|h| h.chars().count());
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let before_reason: usize = widths.iter().take(8).map(|w| w + 2).sum();
    let reason_width = columns.map_or(REASON_WIDTH, |c| c.saturating_sub(before_reason).max(MIN_REASON));
    let mut out = String::new();
    let header = HEADERS.map(str::to_owned);
    for r in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, w)) in r.iter().zip(widths).enumerate() {
            if i == HEADERS.len() - 1 {
                line.push_str(&cut(cell, reason_width));
            } else {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', w + 2 - cell.chars().count()));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// One exception's cells, in [`HEADERS`]' order.
fn row(e: &Value) -> [String; 9] {
    let text = |k: &str| match e.get(k) {
        Some(Value::String(s)) if !s.is_empty() => clean(s),
        _ => "-".to_owned(),
    };
    let ttl = e
        .get("ttl_seconds")
        .and_then(Value::as_u64)
        .map_or_else(|| "-".to_owned(), duration);
    let expires = e
        .get("expires_at")
        .and_then(time)
        .unwrap_or_else(|| "-".to_owned());
    // Methods and paths, when it has them, beside its hosts: `a.test [GET /org/**]`.
    let below = serde_json::from_value::<BelowHost>(e.clone())
        .ok()
        .filter(|b| !b.is_everything())
        .map_or_else(String::new, |b| format!(" [{}]", clean(&b.to_string())));
    [
        text("id"),
        text("state"),
        text("task_id"),
        tweak(e).unwrap_or_else(|| list(e.get("hosts"), ",") + &below),
        list(e.get("ports"), ","),
        ttl,
        expires,
        text("requested_by"),
        text("reason"),
    ]
}

/// A tweak's terms on one line (`tweak sandbox=web max_seconds=600 network`), for the
/// hosts column and `show`; `None` for an exception of hosts.
fn tweak(e: &Value) -> Option<String> {
    let t: sandgate_policy::exception::Tweak = serde_json::from_value(e.get("tweak")?.clone()).ok()?;
    Some(format!("tweak {}", clean(&t.to_string())))
}

/// `show`: every field as `field: value`, one per line, nothing cut.
pub fn fields(e: &Value) -> String {
    let Some(object) = e.as_object() else {
        return format!("{}\n", clean(&e.to_string()));
    };
    let mut rest: Vec<&String> = object.keys().filter(|k| !FIELDS.contains(&k.as_str())).collect();
    rest.sort();
    let keys = FIELDS.iter().copied().chain(rest.into_iter().map(String::as_str));
    let mut out = String::new();
    for (key, v) in keys.filter_map(|k| object.get(k).map(|v| (k, v))) {
        let shown = match v {
            Value::Null => "-".to_owned(),
            Value::String(s) if s.is_empty() => "-".to_owned(),
            Value::Number(_) if key.ends_with("_at") => time(v).unwrap_or_else(|| v.to_string()),
            Value::Array(_) => list(Some(v), ", "),
            Value::Object(_) if key == "tweak" => tweak(e).unwrap_or_else(|| clean(&v.to_string())),
            Value::String(s) => clean(s),
            other => clean(&other.to_string()),
        };
        out.push_str(&format!("{}: {shown}\n", clean(key)));
    }
    out
}

/// A time as RFC 3339, from the API's text or an older API's Unix seconds.
fn time(v: &Value) -> Option<String> {
    sandgate_policy::rfc3339::deserialize(v)
        .ok()
        .and_then(sandgate_policy::rfc3339::format)
}

/// The items of an array, joined; `-` for none.
fn list(v: Option<&Value>, sep: &str) -> String {
    let items: Vec<String> = v
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
        .map(|s| clean(&s))
        .collect();
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(sep)
    }
}

/// Seconds as people say them: `90s`, `5m`, `1h30m`.
pub fn duration(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    for (n, unit) in [(h, 'h'), (m, 'm'), (s, 's')] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    if out.is_empty() { "0s".to_owned() } else { out }
}

/// `text` with control characters and bidirectional formatting characters escaped.
pub fn clean(text: &str) -> String {
    // Unicode's bidirectional embeddings, overrides, isolates and marks (UAX #9): they
    // reorder what follows on the terminal ("Trojan Source", CVE-2021-42574).
    let bidi =
        |c: char| matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || bidi(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// At most `max` characters of `text`, the last an ellipsis when it was cut; whole
/// characters only, so UTF-8 is never split.
pub fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
