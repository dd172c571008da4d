//! Where a policy error inside a YAML flow collection written on one line points
//! (`net: { mode: allowlist, allow_domains: 5 }`). The document layer
//! (`sandgate_policy::document`) reads field paths from the indentation, a line at a time, so
//! every error on such a line named the line's own key (`net`), and a check made after
//! parsing found no line for `net.allow_domains` at all. Here the keys of the flow mappings
//! on one line are read with the columns they cover: [`yaml_error`] takes the parser's
//! column to the key it falls in, [`line_of`] finds a key written inside one.
//!
//! As in the document layer, list items add no step (`net.allowlist.ports`). A flow
//! collection that spans several lines is left to the document layer, which reads each of
//! its lines that starts with a key as a block line. Pure: text in, paths out.

use sandgate_policy::document::DocError;
use serde_saphyr::Error;

/// One key of a flow mapping: its path from the line's first flow collection, and the
/// columns (1-based, in characters, inclusive) its key and its whole entry cover.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FlowKey {
    path: Vec<String>,
    key: (usize, usize),
    entry: (usize, usize),
}

/// A flow collection being read.
enum Frame {
    Seq,
    /// A mapping, with the key of the entry being read (once its `:` is seen) and where that
    /// key starts.
    Map {
        key: Option<String>,
        text: String,
        start: Option<usize>,
        key_end: usize,
    },
}

/// The keys of the flow mappings on `line`, from its first `{` or `[` outside quotes and
/// comments to where that collection closes.
fn flow_keys(line: &str) -> Vec<FlowKey> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let column = i + 1;
        match c {
            '"' | '\'' => {
                let end = quoted_end(&chars, i);
                if let Some(Frame::Map {
                    key: None,
                    text,
                    start,
                    ..
                }) = stack.last_mut()
                {
                    start.get_or_insert(column);
                    text.extend(chars.get(i + 1..end).unwrap_or_default());
                }
                i = end + 1;
                continue;
            }
            '#' if i == 0 || chars.get(i - 1).is_some_and(|p| p.is_whitespace()) => break,
            '{' => stack.push(Frame::Map {
                key: None,
                text: String::new(),
                start: None,
                key_end: 0,
            }),
            '[' => stack.push(Frame::Seq),
            '}' | ']' | ',' if !stack.is_empty() => {
                close_entry(&stack, column - 1, &mut out);
                if c == ',' {
                    if let Some(Frame::Map { key, text, start, .. }) = stack.last_mut() {
                        (*key, *start) = (None, None);
                        text.clear();
                    }
                } else {
                    stack.pop();
                    if stack.is_empty() {
                        break;
                    }
                }
            }
            ':' if chars
                .get(i + 1)
                .is_none_or(|n| n.is_whitespace() || ",}]".contains(*n)) =>
            {
                if let Some(Frame::Map {
                    key, text, key_end, ..
                }) = stack.last_mut()
                    && key.is_none()
                {
                    *key = Some(text.trim().to_owned());
                    *key_end = column - 1;
                }
            }
            _ => {
                if let Some(Frame::Map {
                    key: None,
                    text,
                    start,
                    ..
                }) = stack.last_mut()
                {
                    if !c.is_whitespace() {
                        start.get_or_insert(column);
                    }
                    text.push(c);
                }
            }
        }
        i += 1;
    }
    out
}

/// The index of the quote that closes the string opening at `open` (`''` inside single
/// quotes, `\"` inside double ones, stand for the quote itself); the last index if none.
fn quoted_end(chars: &[char], open: usize) -> usize {
    let quote = chars.get(open).copied().unwrap_or('"');
    let mut i = open + 1;
    while let Some(&c) = chars.get(i) {
        match c {
            '\\' if quote == '"' => i += 1,
            '\'' if quote == '\'' && chars.get(i + 1) == Some(&'\'') => i += 1,
            c if c == quote => return i,
            _ => {}
        }
        i += 1;
    }
    chars.len().saturating_sub(1)
}

/// Records the entry the innermost mapping is reading, if it has a key, ending at `end`.
fn close_entry(stack: &[Frame], end: usize, out: &mut Vec<FlowKey>) {
    let Some(Frame::Map {
        key: Some(_),
        start: Some(start),
        key_end,
        ..
    }) = stack.last()
    else {
        return;
    };
    let path = stack
        .iter()
        .filter_map(|f| match f {
            Frame::Map { key: Some(k), .. } => Some(k.clone()),
            _ => None,
        })
        .collect();
    out.push(FlowKey {
        path,
        key: (*start, *key_end),
        entry: (*start, end),
    });
}

/// The innermost key on `line` whose entry holds `column`, with whether the column is on
/// the key itself.
fn key_at(line: &str, column: usize) -> Option<(Vec<String>, bool)> {
    flow_keys(line)
        .into_iter()
        .filter(|k| (k.entry.0..=k.entry.1).contains(&column))
        .max_by_key(|k| k.path.len())
        .map(|k| {
            let on_key = (k.key.0..=k.key.1).contains(&column);
            (k.path, on_key)
        })
}

/// The document layer's error for a policy the parser refused, with the field path carried
/// into the flow mapping the parser's column is in.
pub(crate) fn yaml_error(e: &Error, text: &str, file: &str) -> DocError {
    let mut found = sandgate_policy::document::yaml_error(e, text, file);
    let Some(at) = e.location() else {
        return found;
    };
    let line = text.lines().nth((at.line() as usize).saturating_sub(1));
    let Some((mut inside, on_key)) = line.and_then(|l| key_at(l, at.column() as usize)) else {
        return found;
    };
    // The document layer named the line's own path (`at`), with the field after it for
    // an unknown or a missing field.
    let named = match e.without_snippet() {
        Error::SerdeUnknownField { field, .. } => {
            if inside.last() == Some(field) {
                inside.pop();
            }
            Some(field.clone())
        }
        Error::SerdeMissingField { field, .. } => {
            // At a key of the map that lacks it: that key is a sibling.
            if on_key {
                inside.pop();
            }
            Some((*field).to_owned())
        }
        _ => None,
    };
    let block = match &named {
        Some(field) if found.field == *field => "",
        Some(field) => found
            .field
            .strip_suffix(field.as_str())
            .map_or(found.field.as_str(), |p| p.trim_end_matches('.')),
        None => found.field.as_str(),
    };
    let steps = std::iter::once(block.to_owned())
        .chain(inside)
        .chain(named)
        .filter(|s| !s.is_empty());
    found.field = steps.collect::<Vec<_>>().join(".");
    found
}

/// The first line (1-based) where the key at dotted path `field` is written: as the
/// document layer finds it, else inside a flow mapping on the line of one of its parents.
pub(crate) fn line_of(text: &str, field: &str) -> Option<u64> {
    if let Some(line) = sandgate_policy::document::line_of(text, field) {
        return Some(line);
    }
    let steps: Vec<&str> = field.split('.').collect();
    (1..steps.len()).rev().find_map(|split| {
        let (parent, rest) = steps.split_at(split);
        let line = sandgate_policy::document::line_of(text, &parent.join("."))?;
        let written = text.lines().nth(usize::try_from(line).ok()?.checked_sub(1)?)?;
        flow_keys(written)
            .iter()
            .any(|k| k.path.iter().map(String::as_str).eq(rest.iter().copied()))
            .then_some(line)
    })
}

#[cfg(test)]
#[path = "flow_tests.rs"]
mod tests;
