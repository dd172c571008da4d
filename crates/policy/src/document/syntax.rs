//! Errors of the YAML layer said in the document's own terms: `file:line: field: message`
//! with the field's dotted path (the parser reports a line and column only), messages that
//! say what to change rather than the parser library's advice to its own callers, and a tab
//! in the indentation named as such (YAML indents with spaces; parsers report a tab as
//! whatever it broke further on). Pure: text in, [`DocError`] out.

use serde_saphyr::{Error, MessageFormatter, UserMessageFormatter};

use super::DocError;

/// The first line (1-based) whose indentation holds a tab, if any.
pub(super) fn tab_in_indentation(text: &str) -> Option<u64> {
    text.lines()
        .position(|l| {
            let indent = l.len() - l.trim_start_matches([' ', '\t']).len();
            l[..indent].contains('\t') && !l.trim().is_empty()
        })
        .map(|i| i as u64 + 1)
}

/// The error a document the YAML layer refused gets: a tab in the indentation first (the
/// cause whatever the parser said), else the parser's error at its line with the field
/// path there.
pub(super) fn parse_error(e: &Error, text: &str, file: &str) -> DocError {
    if let Some(line) = tab_in_indentation(text) {
        return tab_at(text, file, line);
    }
    let line = e.location().map_or(0, |l| l.line());
    let at = field_at(text, line);
    let join = |leaf: &str| {
        if at.is_empty() {
            leaf.to_owned()
        } else {
            format!("{at}.{leaf}")
        }
    };
    let (field, message) = match e.without_snippet() {
        Error::SerdeUnknownField { field, expected, .. } => {
            // `at` ends with the unknown key itself when it starts the line.
            let parent = at
                .strip_suffix(field.as_str())
                .map_or(at.as_str(), |p| p.trim_end_matches('.'));
            let path = if parent.is_empty() {
                field.clone()
            } else {
                format!("{parent}.{field}")
            };
            let message = if expected.is_empty() {
                "unknown field: this map takes no fields".to_owned()
            } else {
                format!("unknown field; this map takes {}", expected.join(", "))
            };
            (path, message)
        }
        Error::DuplicateMappingKey { key, .. } => (
            at.clone(),
            match key {
                Some(k) => format!("{k:?} appears twice in the same map; give it once (merge the two)"),
                None => "a key appears twice in the same map; give it once (merge the two)".to_owned(),
            },
        ),
        Error::SerdeMissingField { field, .. } => {
            // The parser points into the map that lacks the field: at a key of it (then
            // that key is a sibling of the missing field), or right of the key, at the
            // value that is the map (`metadata: {}`).
            let column = e.location().map_or(0, |l| l.column()) as usize;
            let sibling = text
                .lines()
                .nth((line as usize).saturating_sub(1))
                .and_then(Shape::of)
                .is_some_and(|s| s.key.is_some() && column <= s.indent + 1);
            let path = match (sibling, at.rsplit_once('.')) {
                (true, Some((parent, _))) => format!("{parent}.{field}"),
                (true, None) => (*field).to_owned(),
                (false, _) => join(field),
            };
            (path, "required, but missing".to_owned())
        }
        other => (
            at.clone(),
            UserMessageFormatter.format_message(other).into_owned(),
        ),
    };
    DocError {
        file: file.to_owned(),
        line,
        field,
        message,
    }
}

/// The error for a tab in the indentation of `line` (1-based), named by the block it is in.
pub(super) fn tab_at(text: &str, file: &str, line: u64) -> DocError {
    DocError {
        file: file.to_owned(),
        line,
        field: enclosing(text, line),
        message: "a tab in the indentation: YAML indents with spaces only; replace the tab with spaces"
            .to_owned(),
    }
}

/// The dotted path of the key on `line` (1-based) of a block-style YAML document: its own
/// key (when the line starts with one) after the keys of the maps that enclose it. List
/// items add no step (`spec.network.allowlist.host`, as the checker names fields). Comments,
/// blank lines and flow collections on one line are read as they look; anything cleverer
/// (anchors, multi-line flow) gives a shorter path, never a wrong line.
pub(super) fn field_at(text: &str, line: u64) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let Some(index) = (line as usize).checked_sub(1) else {
        return String::new();
    };
    let (Some(here), Some(above)) = (lines.get(index).and_then(|l| Shape::of(l)), lines.get(..index)) else {
        return String::new();
    };
    let mut path = Vec::new();
    if let Some(key) = here.key {
        path.push(key);
    }
    // The indentation an enclosing line must be left of.
    let mut bound = here.dash.unwrap_or(here.indent);
    for l in above.iter().rev() {
        let Some(shape) = Shape::of(l) else { continue };
        if bound == 0 {
            break;
        }
        if shape.indent < bound {
            if let Some(key) = shape.key {
                path.push(key);
            }
            bound = shape.dash.unwrap_or(shape.indent);
        } else if shape.dash.is_some_and(|d| d < bound) {
            // The list item whose map holds this line: the list itself is further up.
            bound = shape.dash.unwrap_or(0);
        }
    }
    path.reverse();
    path.join(".")
}

/// The first line (1-based) whose key is `field` (a dotted path as [`field_at`] reads it),
/// looking at the first [`LINE_OF_LIMIT`] lines only.
pub(super) fn line_of(text: &str, field: &str) -> Option<u64> {
    let lines = text.lines().count().min(LINE_OF_LIMIT) as u64;
    (1..=lines).find(|&line| field_at(text, line) == field)
}

/// How far [`line_of`] looks (each step reads the lines above it).
const LINE_OF_LIMIT: usize = 2000;

/// The path of the block a line (one whose indentation cannot be read, a tab's) belongs
/// to, judged by the line before it: the key that line opens, or else that line's map.
fn enclosing(text: &str, line: u64) -> String {
    let before = text
        .lines()
        .take((line as usize).saturating_sub(1))
        .enumerate()
        .filter(|(_, l)| Shape::of(l).is_some())
        .last();
    let Some((i, prev)) = before else {
        return String::new();
    };
    let path = field_at(text, i as u64 + 1);
    if Shape::of(prev).is_some_and(|s| s.opens_block) {
        return path;
    }
    match path.rsplit_once('.') {
        Some((parent, _)) => parent.to_owned(),
        None => String::new(),
    }
}

/// What a line looks like: where its content starts, the list dash before it, its key.
pub(super) struct Shape<'a> {
    /// Column of the first character after any `- `.
    pub(super) indent: usize,
    /// Column of the list dash, if the line is a list item.
    pub(super) dash: Option<usize>,
    pub(super) key: Option<&'a str>,
    /// The line is `key:` with its value on the lines below.
    pub(super) opens_block: bool,
}

impl<'a> Shape<'a> {
    pub(super) fn of(line: &'a str) -> Option<Shape<'a>> {
        let body = line.trim_start_matches(' ');
        if body.is_empty() || body.starts_with('#') || body.starts_with("---") {
            return None;
        }
        let mut indent = line.len() - body.len();
        let mut dash = None;
        let mut rest = body;
        while let Some(after) = rest
            .strip_prefix("- ")
            .or(if rest == "-" { Some("") } else { None })
        {
            dash.get_or_insert(indent);
            let trimmed = after.trim_start_matches(' ');
            indent += rest.len() - trimmed.len();
            rest = trimmed;
        }
        let key = rest
            .split_once(':')
            .filter(|(k, v)| v.is_empty() || v.starts_with(' ') && !k.starts_with(['{', '[', '"', '\'']))
            .map(|(k, _)| k.trim())
            .filter(|k| !k.is_empty() && !k.contains(' '));
        let value = rest.split_once(':').map_or("", |(_, v)| v.trim());
        Some(Shape {
            indent,
            dash,
            key,
            opens_block: key.is_some() && value.is_empty(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "apiVersion: sandgate.dev/v1
kind: EgressPolicy
metadata: { name: t }
spec:
  # the network
  network:
    allowlist:
      - a.example
      - host: b.example
        ports: [443]
    bogus: 1
  listeners:
    - listen: 127.0.0.1:3128
      task: t-1
";

    #[test]
    fn paths_follow_the_indentation_and_skip_list_items() {
        let want = [
            (1, "apiVersion"),
            (3, "metadata"),
            (6, "spec.network"),
            (7, "spec.network.allowlist"),
            (8, "spec.network.allowlist"),
            (9, "spec.network.allowlist.host"),
            (10, "spec.network.allowlist.ports"),
            (11, "spec.network.bogus"),
            (13, "spec.listeners.listen"),
            (14, "spec.listeners.task"),
            (99, ""),
        ];
        for (line, path) in want {
            assert_eq!(field_at(DOC, line), path, "line {line}");
        }
    }

    #[test]
    fn the_parsers_errors_say_what_to_change_with_the_field_and_line_once() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code, reason = "only the errors matter")]
        struct Doc {
            a: Inner,
        }
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code, reason = "only the errors matter")]
        struct Inner {
            b: Option<Vec<String>>,
            c: Option<u16>,
        }
        let err = |text: &str| {
            let e = serde_saphyr::from_str::<Doc>(text).unwrap_err();
            parse_error(&e, text, "p.yaml").to_string()
        };
        assert_eq!(
            err("a:\n  b: [x]\n  zz: 1\n"),
            "p.yaml:3: a.zz: unknown field; this map takes b, c"
        );
        let dup = err("a:\n  b: [x]\n  b: [y]\n");
        assert_eq!(
            dup,
            "p.yaml:3: a.b: \"b\" appears twice in the same map; give it once (merge the two)"
        );
        assert!(!dup.contains("DuplicateKeyPolicy"));
        assert_eq!(
            err("a:\n  b:\n\t- x\n"),
            "p.yaml:3: a.b: a tab in the indentation: YAML indents with spaces only; replace the tab with spaces"
        );
        let wrong = err("a:\n  c: many\n");
        assert!(wrong.starts_with("p.yaml:2: a.c: "), "{wrong}");
        assert!(!wrong.contains("line 2"), "the line once: {wrong}");
        assert_eq!(err("x: 1\n"), "p.yaml:1: x: unknown field; this map takes a");
        assert_eq!(err("a:\n  c: 1\nz: 2\n").split(": ").nth(1), Some("z"));
    }
}
