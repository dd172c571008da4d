//! Message body framing (RFC 9112 sections 6 and 7.1).
//!
//! sandgate forwards bodies verbatim, chunk framing included; it only needs to know where a
//! message ends so that the next message on a kept-alive connection starts in the right place.
//! [`ChunkedScanner`] finds that end without copying or changing a byte. It is strict where
//! leniency enables smuggling: CRLF only (no bare LF), hex sizes of at most 15 digits, and
//! bounded chunk extensions and trailers. A request's body ([`ChunkedScanner::for_request`])
//! may carry neither: they would reach the origin unread by the placeholder search, and
//! real clients send neither. Pure: no I/O.

/// How the end of a message body is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// No body.
    Empty,
    /// Exactly this many bytes (Content-Length).
    Length(u64),
    /// Chunked transfer coding; ends with the last chunk and trailer section.
    Chunked,
    /// Response only: the body runs until the server closes the connection.
    UntilClose,
}

/// Longest chunk-size line extension accepted.
const MAX_EXTENSION: usize = 4096;
/// Largest trailer section accepted.
const MAX_TRAILERS: usize = 16 * 1024;
/// Hex digits in a chunk size: 15 keeps the value below 2^60, far from overflow.
const MAX_SIZE_DIGITS: u32 = 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Size { value: u64, digits: u32 },
    Extension { len: usize, value: u64 },
    SizeLf { value: u64 },
    Data(u64),
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf,
    FinalLf,
    Done,
}

/// Why a chunked body was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("invalid chunk size")]
    BadSize,
    #[error("chunk extension too long")]
    ExtensionTooLong,
    #[error("missing CRLF in chunked body")]
    BadLineEnding,
    #[error("trailer section too large")]
    TrailersTooLarge,
    /// A request's chunk extension (`5;name=value`): refused, not relayed unread.
    #[error("a request's chunk extensions are refused")]
    Extension,
    /// A request's trailer section: refused, not relayed unread.
    #[error("a request's trailer section is refused (its fields belong in the head)")]
    Trailers,
}

/// Incremental scanner over a chunked body.
#[derive(Debug, Clone)]
pub struct ChunkedScanner {
    state: State,
    trailer_bytes: usize,
    /// A request's body: chunk extensions and a trailer section are refused.
    request: bool,
}

impl Default for ChunkedScanner {
    fn default() -> Self {
        ChunkedScanner {
            state: State::Size { value: 0, digits: 0 },
            trailer_bytes: 0,
            request: false,
        }
    }
}

impl ChunkedScanner {
    /// A scanner for a response's body: extensions and trailers pass, bounded.
    pub fn new() -> Self {
        Self::default()
    }

    /// A scanner for a request's body, which refuses chunk extensions
    /// ([`ChunkError::Extension`]) and a trailer section ([`ChunkError::Trailers`]).
    pub fn for_request() -> Self {
        ChunkedScanner {
            request: true,
            ..Self::default()
        }
    }

    /// True once the last chunk and the trailer section have been seen.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Scans `input` and returns how many of its bytes belong to the body. Stops at the end
    /// of the body: bytes after it belong to the next message.
    pub fn feed(&mut self, input: &[u8]) -> Result<usize, ChunkError> {
        self.feed_with(input, |_| {})
    }

    /// As [`ChunkedScanner::feed`], handing each run of chunk data (the body without its
    /// framing) to `data` as it passes.
    pub fn feed_with(&mut self, input: &[u8], mut data: impl FnMut(&[u8])) -> Result<usize, ChunkError> {
        let mut used = 0;
        while used < input.len() && self.state != State::Done {
            if let State::Data(left) = self.state {
                let avail = (input.len() - used) as u64;
                let take = left.min(avail);
                data(input.get(used..used + take as usize).unwrap_or_default());
                used += take as usize;
                self.state = if take == left {
                    State::DataCr
                } else {
                    State::Data(left - take)
                };
                continue;
            }
            let Some(&byte) = input.get(used) else { break };
            self.step(byte)?;
            used += 1;
        }
        Ok(used)
    }

    fn step(&mut self, byte: u8) -> Result<(), ChunkError> {
        self.state = match self.state {
            State::Size { value, digits } => match byte {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    if digits >= MAX_SIZE_DIGITS {
                        return Err(ChunkError::BadSize);
                    }
                    let nibble = u64::from((byte as char).to_digit(16).unwrap_or(0));
                    State::Size {
                        value: (value << 4) | nibble,
                        digits: digits + 1,
                    }
                }
                _ if digits == 0 => return Err(ChunkError::BadSize),
                b'\r' => State::SizeLf { value },
                b';' | b' ' | b'\t' if self.request => return Err(ChunkError::Extension),
                b';' | b' ' | b'\t' => State::Extension { len: 1, value },
                _ => return Err(ChunkError::BadSize),
            },
            State::Extension { len, value } => match byte {
                b'\r' => State::SizeLf { value },
                b'\n' | 0 => return Err(ChunkError::BadLineEnding),
                _ if len >= MAX_EXTENSION => return Err(ChunkError::ExtensionTooLong),
                _ => State::Extension { len: len + 1, value },
            },
            State::SizeLf { value } => match byte {
                b'\n' if value == 0 => State::TrailerStart,
                b'\n' => State::Data(value),
                _ => return Err(ChunkError::BadLineEnding),
            },
            State::DataCr => expect(byte, b'\r', State::DataLf)?,
            State::DataLf => expect(byte, b'\n', State::Size { value: 0, digits: 0 })?,
            State::TrailerStart => match byte {
                b'\r' => State::FinalLf,
                b'\n' | 0 => return Err(ChunkError::BadLineEnding),
                _ if self.request => return Err(ChunkError::Trailers),
                _ => self.trailer_byte()?,
            },
            State::TrailerLine => match byte {
                b'\r' => State::TrailerLf,
                b'\n' | 0 => return Err(ChunkError::BadLineEnding),
                _ => self.trailer_byte()?,
            },
            State::TrailerLf => expect(byte, b'\n', State::TrailerStart)?,
            State::FinalLf => expect(byte, b'\n', State::Done)?,
            State::Data(_) | State::Done => self.state,
        };
        Ok(())
    }

    fn trailer_byte(&mut self) -> Result<State, ChunkError> {
        self.trailer_bytes += 1;
        if self.trailer_bytes > MAX_TRAILERS {
            return Err(ChunkError::TrailersTooLarge);
        }
        Ok(State::TrailerLine)
    }
}

fn expect(byte: u8, want: u8, next: State) -> Result<State, ChunkError> {
    if byte == want {
        Ok(next)
    } else {
        Err(ChunkError::BadLineEnding)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(input: &[u8]) -> Result<(usize, bool), ChunkError> {
        let mut s = ChunkedScanner::new();
        let used = s.feed(input)?;
        Ok((used, s.is_done()))
    }

    #[test]
    fn finds_the_end_of_a_body() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        assert_eq!(scan_all(body), Ok((body.len() - 4, true)));
        assert_eq!(scan_all(b"0\r\n\r\n"), Ok((5, true)));
        assert_eq!(scan_all(b"A\r\n0123456789\r\n0\r\n\r\n"), Ok((20, true)));
    }

    #[test]
    fn byte_at_a_time_equals_all_at_once() {
        let body = b"3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nT: v\r\n\r\n";
        let mut s = ChunkedScanner::new();
        for b in body.iter() {
            assert_eq!(s.feed(std::slice::from_ref(b)), Ok(1));
        }
        assert!(s.is_done());
    }

    #[test]
    fn refuses_smuggling_shapes() {
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloX\r\n",
            b"\r\n",
            b"-5\r\n",
            b"0x5\r\n",
            b"1000000000000000\r\n",
            b"0\r\n\n",
            b"0\r\nX: 1\n\r\n",
        ] {
            assert!(scan_all(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn bounded_extension_and_trailers() {
        let mut long_ext = b"1;".to_vec();
        long_ext.extend(std::iter::repeat_n(b'x', MAX_EXTENSION + 1));
        assert_eq!(scan_all(&long_ext), Err(ChunkError::ExtensionTooLong));
        let mut long_trailer = b"0\r\n".to_vec();
        long_trailer.extend(std::iter::repeat_n(b'x', MAX_TRAILERS + 1));
        assert_eq!(scan_all(&long_trailer), Err(ChunkError::TrailersTooLarge));
    }

    #[test]
    fn a_requests_extensions_and_trailers_are_refused() {
        let request = |input: &[u8]| {
            let mut s = ChunkedScanner::for_request();
            s.feed(input).map(|used| (used, s.is_done()))
        };
        assert_eq!(request(b"5\r\nhello\r\n0\r\n\r\nNEXT"), Ok((15, true)));
        for ext in [&b"5;x=SANDGATE_EXAMPLE\r\n"[..], b"5 ;x\r\n", b"0;x\r\n\r\n"] {
            assert_eq!(request(ext), Err(ChunkError::Extension), "{ext:?}");
        }
        let trailer = b"5\r\nhello\r\n0\r\nSANDGATE_EXAMPLE: 1\r\n\r\n";
        assert_eq!(request(trailer), Err(ChunkError::Trailers));
        // A response's pass, as before.
        assert_eq!(scan_all(trailer), Ok((trailer.len(), true)));
        assert_eq!(scan_all(b"0;x\r\n\r\n"), Ok((7, true)));
    }
}
