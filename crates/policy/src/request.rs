//! Rules below the host name: which methods and paths an allow entry lets through, and the
//! path grammar they are written in.
//!
//! An allow entry may carry [`RequestRules`]: a list of methods (or `read_only`: GET, HEAD
//! and OPTIONS) and a list of path patterns. Such an entry allows only the requests it
//! names, so it can be applied only where each request is seen (plain HTTP, or a tunnel the
//! proxy terminates); a blind tunnel to it is refused.
//!
//! A pattern and a request's path are compared segment by segment, after both are brought to
//! one spelling ([`CanonicalPath`]): the query is cut off, each segment percent-decoded, and
//! every spelling a server might read as another path is refused rather than guessed at: an
//! encoded `/` or `\`, a raw `\`, an encoded `?` or `#` (or a raw `#`: an origin that decodes
//! before it splits off the query ends the path there), a `.` or `..` segment (however
//! encoded, or followed by `;` as Tomcat reads `..;`), an empty segment (`//`, except a
//! trailing slash), a control character, invalid percent-encoding or UTF-8, and the
//! compatibility forms of `.`, `/`, `\`, `?` and `#` (a fullwidth `．`) that a server
//! normalising Unicode would turn into them. Matching is
//! case-sensitive, as paths are (RFC 3986): a rule for `/myorg/` does not admit `/MyOrg/`,
//! even where the server would read both as one, which refuses more and never less.
//!
//! The grammar of a pattern: it starts with `/`; each segment is a literal, `*` (exactly one
//! non-empty segment), `**` (any number of segments, none included) or a literal with `*`s in
//! it (any run of characters within the segment). A trailing slash is a segment of its own:
//! `/a/b` does not match `/a/b/`, `/a/b/**` matches both.

use std::fmt;

mod canonical;

use canonical::decode_segment;
pub use canonical::{CanonicalPath, PathError};

/// Methods a read-only entry allows.
pub const READ_ONLY_METHODS: &[&str] = &["GET", "HEAD", "OPTIONS"];

/// The longest path pattern accepted, in bytes.
const MAX_PATTERN: usize = 1024;

/// What an entry allows below the host: `None` in a field places no limit on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRules {
    methods: Option<Vec<String>>,
    paths: Option<Vec<PathPattern>>,
    read_only: bool,
}

/// Why a `methods`, `paths` or `read_only` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RulesError {
    #[error("{0:?} is not a method: a method is an uppercase token, as clients send it (GET, POST)")]
    Method(String),
    #[error("an empty list allows nothing; leave the field out instead")]
    Empty,
    #[error("give `read_only` or `methods`, not both")]
    ReadOnlyAndMethods,
    #[error("{pattern:?}: {why}")]
    Path { pattern: String, why: &'static str },
}

impl RequestRules {
    /// Rules from an entry's fields; `Ok(None)` when it has none (the entry allows every
    /// request to its host).
    pub fn new(
        methods: Option<&[String]>,
        paths: Option<&[String]>,
        read_only: bool,
    ) -> Result<Option<RequestRules>, RulesError> {
        if read_only && methods.is_some() {
            return Err(RulesError::ReadOnlyAndMethods);
        }
        if methods.is_some_and(<[String]>::is_empty) || paths.is_some_and(<[String]>::is_empty) {
            return Err(RulesError::Empty);
        }
        let methods = match (methods, read_only) {
            (Some(list), _) => Some(list.iter().map(|m| method(m)).collect::<Result<Vec<_>, _>>()?),
            (None, true) => Some(READ_ONLY_METHODS.iter().map(|m| (*m).to_owned()).collect()),
            (None, false) => None,
        };
        let paths = paths
            .map(|list| {
                list.iter()
                    .map(|p| PathPattern::parse(p))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        if methods.is_none() && paths.is_none() {
            return Ok(None);
        }
        Ok(Some(RequestRules {
            methods,
            paths,
            read_only,
        }))
    }

    /// Does a request with `method` for `path` pass?
    pub fn allows(&self, method: &str, path: &CanonicalPath) -> bool {
        self.methods
            .as_ref()
            .is_none_or(|m| m.iter().any(|x| x == method))
            && self
                .paths
                .as_ref()
                .is_none_or(|p| p.iter().any(|x| x.matches(path)))
    }

    /// Does it limit paths?
    pub fn has_paths(&self) -> bool {
        self.paths.is_some()
    }

    /// Does a request with `method` pass whatever its path (no path rules)? For requests
    /// whose path cannot be read canonically.
    pub fn allows_any_path(&self, method: &str) -> bool {
        self.paths.is_none()
            && self
                .methods
                .as_ref()
                .is_none_or(|m| m.iter().any(|x| x == method))
    }
}

impl fmt::Display for RequestRules {
    /// `read-only`, `GET,HEAD`, `/a/**`, or `POST /a/*/x`: for a rule's label.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        match (&self.methods, self.read_only) {
            (_, true) => parts.push("read-only".to_owned()),
            (Some(m), false) => parts.push(m.join(",")),
            (None, false) => {}
        }
        if let Some(p) = &self.paths {
            parts.push(p.iter().map(|p| p.text.as_str()).collect::<Vec<_>>().join(","));
        }
        f.write_str(&parts.join(" "))
    }
}

/// Whether a request's method and path say all a rule needs to judge it: not a CONNECT (a
/// tunnel inside has no path, and its upgrade would carry anything), not a TRACE or TRACK
/// (an echo of the request), and no body on a GET, HEAD or OPTIONS (an origin that ignores
/// its length reads it as a second request that no rule decided).
pub fn judgeable(method: &str, has_body: bool) -> bool {
    match method {
        "CONNECT" | "TRACE" | "TRACK" => false,
        "GET" | "HEAD" | "OPTIONS" => !has_body,
        _ => true,
    }
}

/// A method as a rule names it: an uppercase token.
fn method(m: &str) -> Result<String, RulesError> {
    let ok = !m.is_empty()
        && m.len() <= 32
        && m.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    ok.then(|| m.to_owned())
        .ok_or_else(|| RulesError::Method(m.to_owned()))
}

/// A path pattern (the grammar is in the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// Exactly one non-empty segment.
    One,
    /// Zero or more segments.
    Any,
    /// A literal with `*`s: the parts between them, in order.
    Glob(Vec<String>),
}

impl PathPattern {
    pub fn parse(text: &str) -> Result<PathPattern, RulesError> {
        let err = |why| RulesError::Path {
            pattern: text.to_owned(),
            why,
        };
        if text.len() > MAX_PATTERN {
            return Err(err("longer than 1024 bytes"));
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(err("a path pattern starts with `/`"));
        };
        if text.contains(['?', '#']) {
            return Err(err("a path pattern has no query or fragment"));
        }
        let raw: Vec<&str> = rest.split('/').collect();
        let last = raw.len() - 1;
        let mut segments = Vec::with_capacity(raw.len());
        for (i, seg) in raw.iter().enumerate() {
            let segment = match *seg {
                "**" => Segment::Any,
                "*" => Segment::One,
                s if s.contains("**") => return Err(err("`**` stands for whole segments only")),
                s if s.contains('*') => Segment::Glob(
                    s.split('*')
                        .map(|part| decode_segment(part).map_err(|e| err(e.why())))
                        .collect::<Result<_, _>>()?,
                ),
                // A trailing slash: the empty last segment.
                "" if i == last => Segment::Literal(String::new()),
                "" => return Err(err("an empty segment (`//`) matches no request")),
                s => Segment::Literal(decode_segment(s).map_err(|e| err(e.why()))?),
            };
            segments.push(segment);
        }
        Ok(PathPattern {
            text: text.to_owned(),
            segments,
        })
    }

    /// Does `path` match?
    pub fn matches(&self, path: &CanonicalPath) -> bool {
        match_from(&self.segments, &path.segments)
    }

    /// Does `outer` match every path this pattern matches? Sound, not complete: a `true`
    /// is always right, and a pair it cannot prove (two different globs) reads as `false`,
    /// so an approval that narrows by it never widens.
    pub fn within(&self, outer: &PathPattern) -> bool {
        contained(&self.segments, &outer.segments)
    }
}

/// `inner ⊆ outer`, segment by segment: an outer `**` takes any run of inner segments, an
/// outer `*` any one that is never empty, a glob a literal it matches or the same glob.
fn contained(inner: &[Segment], outer: &[Segment]) -> bool {
    match outer.split_first() {
        None => inner.is_empty(),
        Some((Segment::Any, rest)) => {
            (0..=inner.len()).any(|skip| inner.get(skip..).is_some_and(|tail| contained(tail, rest)))
        }
        Some((o, rest)) => match inner.split_first() {
            Some((i, tail)) => segment_within(i, o) && contained(tail, rest),
            None => false,
        },
    }
}

fn segment_within(inner: &Segment, outer: &Segment) -> bool {
    match (inner, outer) {
        (Segment::Any, _) => false,
        (i, o) if i == o => true,
        (Segment::Literal(text), o) => seg_matches(o, text),
        (Segment::One | Segment::Glob(_), Segment::One) => true,
        _ => false,
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Segment matching with `**` backtracking: O(pattern × path) at worst, since each `**`
/// tries each remaining position once per call and patterns are short.
fn match_from(pattern: &[Segment], path: &[String]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((Segment::Any, rest)) => {
            (0..=path.len()).any(|skip| path.get(skip..).is_some_and(|tail| match_from(rest, tail)))
        }
        Some((seg, rest)) => match path.split_first() {
            Some((first, tail)) => seg_matches(seg, first) && match_from(rest, tail),
            None => false,
        },
    }
}

fn seg_matches(seg: &Segment, text: &str) -> bool {
    match seg {
        Segment::Literal(l) => l == text,
        Segment::One => !text.is_empty(),
        Segment::Any => true,
        Segment::Glob(parts) => !text.is_empty() && glob(parts, text),
    }
}

/// `parts` joined by `*` matches `text`: the first part is a prefix, the last a suffix, the
/// rest found in order between them (greedy leftmost is exact for a single-`*` alphabet).
fn glob(parts: &[String], text: &str) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return true;
    };
    let Some(mut rest) = text.strip_prefix(first.as_str()) else {
        return false;
    };
    if parts.len() == 1 {
        return rest.is_empty();
    }
    for middle in parts.get(1..parts.len() - 1).unwrap_or_default() {
        match rest
            .find(middle.as_str())
            .and_then(|at| rest.get(at + middle.len()..))
        {
            Some(after) => rest = after,
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last.as_str())
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
