//! Reading a document past its structural errors, so one pass reports every error it can:
//! a tab in the indentation, an unknown field and a key given twice stop the YAML layer at
//! the first of them, which would hide the rest (and every error the conversion finds).
//!
//! Each is reported as `syntax.rs` says it, then taken out of a copy of the text and the
//! copy read again: a tab is expanded to spaces (to the tab stop that reads best: 2, 4 or 8
//! columns), an unknown or repeated key is blanked with the block under it. Lines are
//! blanked, never removed, so every later error keeps its line. A key in a flow collection
//! (`{ host: a, bogus: 1 }`) is not taken out: the errors up to it are reported, and the
//! document is not converted. Pure: text in, the raw document and its errors out.

use serde::de::DeserializeOwned;
use serde_saphyr::Error;

use super::DocError;
use super::syntax::{Shape, parse_error, tab_at, tab_in_indentation};

/// How many keys one document may have taken out before the rest is given up on (each
/// takes out at least one line, so this only bounds the work on a hostile file).
const MAX_RECOVERIES: usize = 100;

/// The tab stops a tab in the indentation is tried at; on a tie the first wins.
const TAB_STOPS: [usize; 3] = [2, 4, 8];

/// The document as `T`, when it can be read once its structural errors are taken out, and
/// those errors (every tab, unknown field and repeated key; or the one error that stopped
/// the reading).
pub(super) fn read<T: DeserializeOwned>(text: &str, file: &str) -> (Option<T>, Vec<DocError>) {
    let first = match serde_saphyr::from_str::<T>(text) {
        Ok(doc) => return (Some(doc), Vec::new()),
        Err(e) => e,
    };
    if tab_in_indentation(text).is_none() {
        return past_keys(text.to_owned(), file, first);
    }
    // The tab is the cause whatever the parser said: each line with one is reported, then
    // the text read with the tabs expanded.
    let mut errors = vec![parse_error(&first, text, file)];
    errors.extend(tab_lines(text).skip(1).map(|line| tab_at(text, file, line)));
    let best = TAB_STOPS
        .iter()
        .filter_map(|&stop| {
            let expanded = expand_tabs(text, stop);
            let read = match serde_saphyr::from_str::<T>(&expanded) {
                Ok(doc) => (Some(doc), Vec::new()),
                Err(e) => past_keys(expanded, file, e),
            };
            match read {
                (Some(doc), found) => Some((doc, found)),
                (None, _) => None,
            }
        })
        .min_by_key(|(_, found)| found.len());
    match best {
        Some((doc, found)) => {
            errors.extend(found);
            (Some(doc), errors)
        }
        None => (None, errors),
    }
}

/// Reads `text` (no tab in its indentation) again and again, each time with the key that
/// stopped the last reading taken out, until it reads or stops on something else.
fn past_keys<T: DeserializeOwned>(
    mut text: String,
    file: &str,
    mut error: Error,
) -> (Option<T>, Vec<DocError>) {
    let mut errors = Vec::new();
    for _ in 0..MAX_RECOVERIES {
        errors.push(parse_error(&error, &text, file));
        let key = match error.without_snippet() {
            Error::SerdeUnknownField { field, .. } => Some(field.clone()),
            Error::DuplicateMappingKey { key, .. } => key.clone(),
            _ => None,
        };
        let line = error.location().map_or(0, |l| l.line());
        let Some(next) = key.and_then(|k| without_key(&text, line, &k)) else {
            return (None, errors);
        };
        text = next;
        error = match serde_saphyr::from_str::<T>(&text) {
            Ok(doc) => return (Some(doc), errors),
            Err(e) => e,
        };
    }
    (None, errors)
}

/// `text` with the key `key` written at the start of line `line` (1-based) blanked, and the
/// block that is its value with it; `None` when that line does not start with that key.
fn without_key(text: &str, line: u64, key: &str) -> Option<String> {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let index = usize::try_from(line).ok()?.checked_sub(1)?;
    let shape = Shape::of(lines.get(index)?)?;
    if shape.key != Some(key) {
        return None;
    }
    let (indent, dash, opens_block) = (shape.indent, shape.dash, shape.opens_block);
    // A list item keeps its dash: the item's other keys, on the lines below, stay its own.
    let dash_only = match dash {
        Some(_) => lines
            .get(index)
            .and_then(|l| l.get(..indent))
            .unwrap_or_default()
            .trim_end()
            .to_owned(),
        None => String::new(),
    };
    *lines.get_mut(index)? = dash_only;
    for l in lines.iter_mut().skip(index + 1) {
        let Some(below) = Shape::of(l) else {
            if !l.trim().is_empty() && !l.trim_start().starts_with('#') {
                break;
            }
            continue;
        };
        let start = below.dash.unwrap_or(below.indent);
        // The value's block: lines right of the key, or a list at the key's own column.
        let inside =
            start > indent || (opens_block && dash.is_none() && start == indent && below.dash.is_some());
        if !inside {
            break;
        }
        l.clear();
    }
    let mut out = lines.join("\n");
    if text.ends_with('\n') {
        out.push('\n');
    }
    Some(out)
}

/// Every line (1-based) whose indentation holds a tab.
fn tab_lines(text: &str) -> impl Iterator<Item = u64> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, l)| tab_in_indentation(l).is_some())
        .map(|(i, _)| i as u64 + 1)
}

/// `text` with each tab in an indentation expanded to the next multiple of `stop` columns.
fn expand_tabs(text: &str, stop: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (indentation, rest) = line.split_at(line.len() - line.trim_start_matches([' ', '\t']).len());
        let mut column = 0;
        for ch in indentation.chars() {
            let width = if ch == '\t' { stop - column % stop } else { 1 };
            column += width;
            out.extend(std::iter::repeat_n(' ', width));
        }
        out.push_str(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code, reason = "only what was read matters")]
    struct Doc {
        a: Inner,
        #[serde(default)]
        list: Vec<Item>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code, reason = "only what was read matters")]
    struct Inner {
        b: Option<Vec<String>>,
        c: Option<u16>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code, reason = "only what was read matters")]
    struct Item {
        host: String,
    }

    fn errors(text: &str) -> (bool, Vec<String>) {
        let (doc, found) = read::<Doc>(text, "p.yaml");
        (doc.is_some(), found.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn every_unknown_field_is_reported_and_the_rest_read() {
        let (read, found) = errors(
            "a:\n  zz: 1\n  b: [x]\n  yy:\n    - deep\n    - deeper\n  c: 3\nlist:\n  - host: h\n    extra: 1\n",
        );
        assert!(read, "{found:?}");
        assert_eq!(
            found,
            [
                "p.yaml:2: a.zz: unknown field; this map takes b, c",
                "p.yaml:4: a.yy: unknown field; this map takes b, c",
                "p.yaml:10: list.extra: unknown field; this map takes host",
            ]
        );
    }

    #[test]
    fn a_list_item_keeps_its_dash_and_its_other_keys() {
        let (read, found) = errors("a: {}\nlist:\n  - extra: 1\n    host: h\n");
        assert!(read, "{found:?}");
        assert_eq!(
            found,
            ["p.yaml:3: list.extra: unknown field; this map takes host"]
        );
    }

    #[test]
    fn a_tab_is_reported_and_what_follows_it_read_at_the_best_tab_stop() {
        let (read, found) = errors("a:\n  b: [x]\n\tc: 3\n  zz: 1\n");
        assert!(read, "{found:?}");
        assert_eq!(
            found,
            [
                "p.yaml:3: a: a tab in the indentation: YAML indents with spaces only; replace the tab with spaces",
                "p.yaml:4: a.zz: unknown field; this map takes b, c",
            ]
        );
    }

    #[test]
    fn what_cannot_be_taken_out_stops_the_reading_with_the_errors_so_far() {
        let (read, found) = errors("a: { b: [x], zz: 1 }\n");
        assert!(!read);
        assert_eq!(found.len(), 1, "{found:?}");
        let (read, found) = errors("a:\n  c: many\n");
        assert!(!read);
        assert!(found[0].starts_with("p.yaml:2: a.c: "), "{found:?}");
    }

    #[test]
    fn tabs_expand_to_the_next_stop_in_the_indentation_only() {
        assert_eq!(expand_tabs("\tx\t1\n \ty\n", 4), "    x\t1\n    y\n");
        assert_eq!(expand_tabs("\t\tz", 2), "    z");
    }
}
