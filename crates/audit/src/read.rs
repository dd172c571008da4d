//! The one reader of the audit trail: bytes in, one typed [`Entry`] or one [`ReadError`] per
//! line out, each with its line number. Every reader (`sandgate audit`, `policy suggest`,
//! the run summary, the MCP runner) goes through here and [`crate::record`].
//!
//! Lines are bounded: one longer than the limit ([`MAX_LINE_BYTES`]) is skipped to its
//! newline and reported, so neither a corrupt file nor a huge field can make a reader hold
//! more than the limit, and the next line is read as usual. A last line without a newline is
//! [`ReadError::Torn`] (a crash cut the write short, or the writer has not finished it) and
//! is not counted in [`Reader::offset`], so a reader that follows the file reads it again
//! once it is whole. Blank lines are skipped. Nothing here panics on any input.
//!
//! A line is one JSON object because the writer serialises every value with serde_json,
//! which escapes newlines and quotes inside strings: a host name from a client cannot end a
//! line or add a field.

use std::io::{self, BufRead};

use crate::record::{Invalid, Record};

/// Longest line read (1 MiB). The longest lines written are a rejected policy reload's list
/// of errors; a decision is a few hundred bytes.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// A line read as an event.
#[derive(Debug, Clone)]
pub struct Entry {
    /// 1-based, counting blank lines, as an editor shows it.
    pub line: usize,
    /// The line as written, without its newline (passed on unchanged by `tail --json` and
    /// JSON-lines exports).
    pub text: String,
    pub record: Record,
}

/// A line that is not an event, or a failure to read at all.
#[derive(Debug)]
pub enum ReadError {
    /// The line is not JSON, or not an event this version can read.
    Invalid { line: usize, cause: Invalid },
    /// Longer than the limit; skipped to its newline.
    TooLong { line: usize, limit: usize },
    /// The input ends inside this line (no newline).
    Torn { line: usize },
    /// Not UTF-8.
    NotUtf8 { line: usize },
    /// Reading failed; nothing more is read.
    Io(io::Error),
}

impl ReadError {
    /// The line it is about (`None` for an I/O failure).
    pub fn line(&self) -> Option<usize> {
        match self {
            ReadError::Invalid { line, .. }
            | ReadError::TooLong { line, .. }
            | ReadError::Torn { line }
            | ReadError::NotUtf8 { line } => Some(*line),
            ReadError::Io(_) => None,
        }
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Invalid { line, cause } => write!(f, "line {line}: {cause}"),
            ReadError::TooLong { line, limit } => write!(f, "line {line}: longer than {limit} bytes"),
            ReadError::Torn { line } => write!(f, "line {line}: no newline (incomplete write)"),
            ReadError::NotUtf8 { line } => write!(f, "line {line}: not UTF-8"),
            ReadError::Io(e) => write!(f, "cannot read: {e}"),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Invalid { cause, .. } => Some(cause),
            ReadError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Reads entries from `inner`, one per line.
#[derive(Debug)]
pub struct Reader<R> {
    inner: R,
    limit: usize,
    line: usize,
    offset: u64,
    buf: Vec<u8>,
    done: bool,
}

/// One line's bytes, or why there are none.
enum Next {
    Line,
    TooLong,
    Torn,
    End,
}

impl<R: BufRead> Reader<R> {
    pub fn new(inner: R) -> Reader<R> {
        Reader::with_limit(inner, MAX_LINE_BYTES)
    }

    /// A reader whose lines may be at most `limit` bytes (without the newline).
    pub fn with_limit(inner: R, limit: usize) -> Reader<R> {
        Reader {
            inner,
            limit,
            line: 0,
            offset: 0,
            buf: Vec::new(),
            done: false,
        }
    }

    /// Bytes of whole lines read so far: where to resume for lines appended later.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads to the next newline into `buf`, keeping at most `limit` bytes.
    fn next_line(&mut self) -> io::Result<Next> {
        self.buf.clear();
        let mut over = false;
        let mut taken = 0u64;
        loop {
            let available = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if available.is_empty() {
                return Ok(if taken == 0 { Next::End } else { Next::Torn });
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let (part, used) = match newline.and_then(|i| available.split_at_checked(i)) {
                Some((part, _)) => (part, part.len() + 1),
                None => (available, available.len()),
            };
            if !over && self.buf.len() + part.len() <= self.limit {
                self.buf.extend_from_slice(part);
            } else {
                over = true;
                self.buf.clear();
            }
            self.inner.consume(used);
            taken += used as u64;
            if newline.is_some() {
                self.offset += taken;
                return Ok(if over { Next::TooLong } else { Next::Line });
            }
        }
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = Result<Entry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            let next = match self.next_line() {
                Ok(next) => next,
                Err(e) => {
                    self.done = true;
                    return Some(Err(ReadError::Io(e)));
                }
            };
            self.line += 1;
            let line = self.line;
            match next {
                Next::End => self.done = true,
                Next::Torn => {
                    self.done = true;
                    return Some(Err(ReadError::Torn { line }));
                }
                Next::TooLong => {
                    return Some(Err(ReadError::TooLong {
                        line,
                        limit: self.limit,
                    }));
                }
                Next::Line => {
                    let bytes = self.buf.strip_suffix(b"\r").unwrap_or(&self.buf);
                    if bytes.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    let Ok(text) = std::str::from_utf8(bytes) else {
                        return Some(Err(ReadError::NotUtf8 { line }));
                    };
                    return Some(match Record::parse(text) {
                        Ok(record) => Ok(Entry {
                            line,
                            text: text.to_owned(),
                            record,
                        }),
                        Err(cause) => Err(ReadError::Invalid { line, cause }),
                    });
                }
            }
        }
        None
    }
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
