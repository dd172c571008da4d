//! A request's path brought to the one spelling rules are matched against
//! ([`CanonicalPath`]), and every spelling a server might read as another path refused
//! ([`PathError`]): the parent module says which and why.

/// A request's path in the one spelling rules are matched against: decoded segments, the
/// query removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalPath {
    pub(super) segments: Vec<String>,
}

/// Why a request's path was not read (the request is then refused where a path rule applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path does not start with `/`")]
    NotAbsolute,
    #[error("the path has an encoded `/` or `\\`, or a raw `\\`")]
    Separator,
    #[error("the path has a `.` or `..` segment")]
    DotSegment,
    #[error("the path has an empty segment (`//`)")]
    EmptySegment,
    #[error("the path has invalid percent-encoding")]
    Encoding,
    #[error("the path has a control character")]
    Control,
    #[error("the path is not UTF-8 once decoded")]
    Utf8,
    #[error("the path has a character a server may read as `.`, `/`, `\\`, `?` or `#`")]
    Lookalike,
    #[error("the path has a `;` (path parameters, which servers drop)")]
    Parameter,
    #[error("the path has an encoded `?` or `#`, or a raw `#`")]
    Delimiter,
}

impl PathError {
    pub(super) fn why(self) -> &'static str {
        match self {
            PathError::NotAbsolute => "not absolute",
            PathError::Separator => "an encoded `/` or `\\`, or a `\\`, is never matched",
            PathError::DotSegment => "a `.` or `..` segment is never matched",
            PathError::EmptySegment => "an empty segment is never matched",
            PathError::Encoding => "invalid percent-encoding",
            PathError::Control => "a control character",
            PathError::Utf8 => "not UTF-8 once decoded",
            PathError::Lookalike => "a character a server may read as `.`, `/`, `\\`, `?` or `#`",
            PathError::Parameter => "a `;` (path parameters) is never matched",
            PathError::Delimiter => "an encoded `?` or `#`, or a `#`, is never matched",
        }
    }
}

impl CanonicalPath {
    /// The path of an origin-form request-target (`/a/b?q`).
    pub fn parse(target: &str) -> Result<CanonicalPath, PathError> {
        let path = target.split_once('?').map_or(target, |(p, _)| p);
        let rest = path.strip_prefix('/').ok_or(PathError::NotAbsolute)?;
        let raw: Vec<&str> = rest.split('/').collect();
        let last = raw.len() - 1;
        let mut segments = Vec::with_capacity(raw.len());
        for (i, seg) in raw.iter().enumerate() {
            if seg.is_empty() && i != last {
                return Err(PathError::EmptySegment);
            }
            segments.push(decode_segment(seg)?);
        }
        Ok(CanonicalPath { segments })
    }

    /// The path as matched: its decoded segments joined by `/`.
    pub fn decoded(&self) -> String {
        format!("/{}", self.segments.join("/"))
    }
}

/// Every code point whose compatibility form (NFKC) contains `.`, `/`, `\`, `?`, `#`, `%`
/// or `;` (as Python's `unicodedata` lists them, for Unicode 14): a server
/// that normalises Unicode would read a segment of them as a dot segment, split it, end the
/// path at it, decode it again (`％3F` is `%3F`, then `?`) or drop what follows as path
/// parameters. Sorted, for a binary search.
pub(super) const LOOKALIKES: &[char] = &[
    '\u{037E}',
    '\u{2024}',
    '\u{2025}',
    '\u{2026}',
    '\u{2047}',
    '\u{2048}',
    '\u{2049}',
    '\u{2100}',
    '\u{2101}',
    '\u{2105}',
    '\u{2106}',
    '\u{2488}',
    '\u{2489}',
    '\u{248A}',
    '\u{248B}',
    '\u{248C}',
    '\u{248D}',
    '\u{248E}',
    '\u{248F}',
    '\u{2490}',
    '\u{2491}',
    '\u{2492}',
    '\u{2493}',
    '\u{2494}',
    '\u{2495}',
    '\u{2496}',
    '\u{2497}',
    '\u{2498}',
    '\u{2499}',
    '\u{249A}',
    '\u{249B}',
    '\u{33C2}',
    '\u{33C7}',
    '\u{33D8}',
    '\u{FE14}',
    '\u{FE16}',
    '\u{FE19}',
    '\u{FE30}',
    '\u{FE52}',
    '\u{FE54}',
    '\u{FE56}',
    '\u{FE5F}',
    '\u{FE68}',
    '\u{FE6A}',
    '\u{FF03}',
    '\u{FF05}',
    '\u{FF0E}',
    '\u{FF0F}',
    '\u{FF1B}',
    '\u{FF1F}',
    '\u{FF3C}',
    '\u{1F100}',
];

/// One segment, percent-decoded and checked.
pub(super) fn decode_segment(seg: &str) -> Result<String, PathError> {
    if seg.contains('\\') {
        return Err(PathError::Separator);
    }
    let raw = seg.as_bytes();
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while let Some(&b) = raw.get(i) {
        if b == b'%' {
            let hex = raw.get(i + 1..i + 3).ok_or(PathError::Encoding)?;
            let text = std::str::from_utf8(hex).map_err(|_| PathError::Encoding)?;
            let byte = u8::from_str_radix(text, 16).map_err(|_| PathError::Encoding)?;
            if !text.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(PathError::Encoding);
            }
            out.push(byte);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    if out.iter().any(|&b| b == b'/' || b == b'\\') {
        return Err(PathError::Separator);
    }
    if out.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err(PathError::Control);
    }
    // A `?` or `#` inside a segment came encoded (`%3F`) or, for `#`, raw: an origin that
    // decodes before it splits off the query (CVE-2024-38474) ends the path there, so
    // `/files/secret.key%3F.tar.gz` is `/files/secret.key` to it.
    if out.iter().any(|&b| b == b'?' || b == b'#') {
        return Err(PathError::Delimiter);
    }
    let text = String::from_utf8(out).map_err(|_| PathError::Utf8)?;
    // C1 controls (U+0080 to U+009F), which some servers strip as whitespace.
    if text.chars().any(char::is_control) {
        return Err(PathError::Control);
    }
    if text.chars().any(|c| LOOKALIKES.binary_search(&c).is_ok()) {
        return Err(PathError::Lookalike);
    }
    // `..;x` is `..` to Tomcat, and `.. ` or `.. .` to a server that trims the segment
    // (Windows drops trailing dots and spaces too).
    let head = text.split(';').next().unwrap_or("").trim();
    let dots_and_spaces = !text.is_empty() && text.chars().all(|c| c == '.' || c.is_whitespace());
    if head == "." || head == ".." || dots_and_spaces {
        return Err(PathError::DotSegment);
    }
    // `;` starts path parameters, which servers drop (`app.jsp;.txt` is `app.jsp` to
    // Tomcat); a decoded `%` is a second encoding a server may decode again (`%252e`).
    if text.contains(';') {
        return Err(PathError::Parameter);
    }
    if text.contains('%') {
        return Err(PathError::Encoding);
    }
    Ok(text)
}
