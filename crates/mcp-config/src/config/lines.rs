//! Where an `McpServer` problem is written: `file:line: field: message`, as the policy kinds
//! report theirs. The YAML layer's errors come from the policy crate's reader (the field's
//! dotted path, "required, but missing"), with what to write for a required field of this
//! kind; a problem found after parsing is placed at the line of its field, or of the
//! nearest enclosing one written (a flow map puts several on one line). Pure.

use sandgate_policy::document::{line_of, yaml_error as doc_yaml_error};

/// What to write for each required field, by its dotted path (list items add no step).
const REQUIRED: [(&str, &str); 9] = [
    ("apiVersion", "apiVersion: sandgate.dev/v1"),
    ("kind", "kind: McpServer"),
    ("metadata", "metadata: { name: agent-tools }"),
    ("metadata.name", "name: agent-tools"),
    (
        "spec.task",
        "task: agent-7 (the task every run and egress request is attributed to)",
    ),
    (
        "spec.sandboxes",
        "sandboxes: [ { name: python-offline, policy: sandboxes/python-offline.yaml, gates: { commands: [ python3 ] } } ]",
    ),
    ("spec.sandboxes.name", "name: python-offline"),
    (
        "spec.sandboxes.policy",
        "policy: sandboxes/python-offline.yaml (a SandboxPolicy, docs/sandbox.md)",
    ),
    (
        "spec.egress.admin",
        "admin: \"http://127.0.0.1:9090\" (a sandgate proxy's admin listener)",
    ),
];

/// The YAML layer's error as `file:line: field: message`; a missing required field says
/// what to write.
pub(super) fn yaml_error(e: &serde_saphyr::Error, text: &str, file: &str) -> String {
    let mut found = doc_yaml_error(e, text, file);
    let example = match found.field.as_str() {
        "spec.egress.token_file" => Some("token_file: agent.token (a token of role requester for the task)"),
        field => REQUIRED.iter().find(|(f, _)| *f == field).map(|(_, w)| *w),
    };
    if let Some(example) = example.filter(|_| found.message == "required, but missing") {
        found.message = format!("required, but missing; write {example}");
    }
    found.to_string()
}

/// `message` about `field`, at the line where the field (or the nearest enclosing field) is
/// written: `file:line: field: message`, else `file: field: message`.
pub(super) fn locate(text: &str, file: &str, field: &str, message: &str) -> String {
    match line(text, field) {
        Some(n) => format!("{file}:{n}: {field}: {message}"),
        None => format!("{file}: {field}: {message}"),
    }
}

/// A whole message that starts with its field (`field: message`), located.
pub(super) fn locate_message(text: &str, file: &str, message: &str) -> String {
    match message.split_once(": ") {
        Some((field, rest)) if !field.contains(' ') => locate(text, file, field, rest),
        _ => format!("{file}: {message}"),
    }
}

/// The line (1-based) of `field`: a dotted path, where a list item is `list[i]`
/// (`spec.sandboxes[1].gates.max_seconds`).
fn line(text: &str, field: &str) -> Option<u64> {
    let Some((list, tail)) = field.split_once('[') else {
        return enclosing(text, field);
    };
    let (index, rest) = tail.split_once(']')?;
    let index: usize = index.parse().ok()?;
    let list_line = usize::try_from(line_of(text, list)?).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    let (start, end) = item(&lines, list_line, index)?;
    let mut at = start;
    // Each step of the rest of the path, in order, within the item.
    for key in rest.trim_start_matches('.').split('.').filter(|k| !k.is_empty()) {
        let key = key.split('[').next().unwrap_or(key);
        match (at..end).find(|&n| lines.get(n).is_some_and(|l| has_key(l, key))) {
            Some(n) => at = n,
            None => break,
        }
    }
    Some(at as u64 + 1)
}

/// The line of `field`, else of the nearest enclosing field written on a line of its own.
fn enclosing(text: &str, field: &str) -> Option<u64> {
    let mut path = field;
    loop {
        if let Some(n) = line_of(text, path) {
            return Some(n);
        }
        path = path.rsplit_once('.')?.0;
    }
}

/// Item `index` of the block list whose key is on line `list_line` (1-based): the 0-based
/// range of its lines; a flow list (`[ ... ]`) is its key's line.
fn item(lines: &[&str], list_line: usize, index: usize) -> Option<(usize, usize)> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let key_indent = indent(lines.get(list_line.checked_sub(1)?)?);
    let (mut starts, mut dash, mut end) = (Vec::new(), None, lines.len());
    for (n, l) in lines.iter().enumerate().skip(list_line) {
        let t = l.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let here = indent(l);
        let is_item = t.starts_with("- ") || t == "-";
        if (here <= key_indent && !is_item) || dash.is_some_and(|d| here < d) {
            end = n;
            break;
        }
        if is_item && dash.is_none_or(|d| d == here) {
            dash = Some(here);
            starts.push(n);
        }
    }
    if starts.is_empty() {
        return Some((list_line - 1, list_line));
    }
    let start = *starts.get(index)?;
    Some((start, starts.get(index + 1).copied().unwrap_or(end)))
}

/// Whether `line` writes `key`: as a block key (`key:`, `- key:`) or in a flow map
/// (`{ key: ...`, `, key: ...`).
fn has_key(line: &str, key: &str) -> bool {
    let t = line.trim_start();
    let t = t.strip_prefix("- ").unwrap_or(t);
    let written = format!("{key}:");
    t.starts_with(&written)
        || line.contains(&format!("{{ {written}"))
        || line.contains(&format!(", {written}"))
        || line.contains(&format!("{{{written}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "apiVersion: sandgate.dev/v1
kind: McpServer
metadata: { name: t }
spec:
  task: t-1
  egress: { admin: \"http://127.0.0.1:1\", token_file: a.token }
  sandboxes:
    - name: one
      policy: one.yaml
      gates: { commands: [ python3 ], max_seconds: 0 }
    # a comment
    - name: two
      policy: two.yaml
      gates:
        commands: [ curl ]
        limits:
          memory: 1.5GiB
  max_concurrent_runs: 9
";

    #[test]
    fn a_field_is_placed_at_its_line_or_its_nearest_written_parent() {
        for (field, want) in [
            ("spec.task", Some(5)),
            ("spec.egress.admin", Some(6)),
            ("spec.max_concurrent_runs", Some(18)),
            ("spec.sandboxes[0].gates.max_seconds", Some(10)),
            ("spec.sandboxes[0].policy", Some(9)),
            ("spec.sandboxes[1].name", Some(12)),
            ("spec.sandboxes[1].policy", Some(13)),
            ("spec.sandboxes[1].gates.limits.memory", Some(17)),
            ("spec.sandboxes[1].gates.commands", Some(15)),
            ("spec.sandboxes[2].name", None),
        ] {
            assert_eq!(line(TEXT, field), want, "{field}");
        }
        assert_eq!(
            locate(
                TEXT,
                "m.yaml",
                "spec.sandboxes[1].policy",
                "two.yaml: no such file"
            ),
            "m.yaml:13: spec.sandboxes[1].policy: two.yaml: no such file"
        );
    }

    #[test]
    fn a_missing_required_field_says_what_to_write() {
        #[derive(Debug, serde::Deserialize)]
        #[expect(dead_code, reason = "only whether it parses")]
        struct Spec {
            task: String,
            sandboxes: Vec<String>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[expect(dead_code, reason = "only whether it parses")]
        struct Doc {
            spec: Spec,
        }
        let text = "spec:\n  sandboxes: []\n";
        let Err(e) = serde_saphyr::from_str::<Doc>(text) else {
            unreachable!("parsed without spec.task")
        };
        assert_eq!(
            yaml_error(&e, text, "m.yaml"),
            "m.yaml:2: spec.task: required, but missing; write task: agent-7 (the task every run and egress request is attributed to)"
        );
    }
}
