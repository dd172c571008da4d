//! Request and response heads: parses an HTTP/1.x head (RFC 9112 sections 2-5) with
//! `httparse`, then applies the framing rules a proxy must hold to avoid request smuggling
//! (RFC 9112 section 6.3 and 11.2):
//! - Content-Length together with Transfer-Encoding is refused;
//! - differing or list-valued Content-Length is refused;
//! - a request Transfer-Encoding whose final coding is not `chunked` is refused, as is
//!   Transfer-Encoding in an HTTP/1.0 request;
//! - obs-fold (RFC 9112 section 5.2), bare CR/LF and NUL in fields are refused by httparse;
//! - a second Host header is refused.
//!
//! It also knows the hop-by-hop fields (RFC 9110 section 7.6.1) that must not be forwarded.
//! It does not read sockets: [`parse_request_head`] takes bytes, so the fuzz target and the
//! tests drive it directly.

use super::framing::BodyKind;

/// Most header fields accepted in one head.
pub const MAX_HEADERS: usize = 100;

/// A header field as received: name and raw value bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub value: Vec<u8>,
}

impl Field {
    pub fn is(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name)
    }
}

/// A parsed, framing-checked request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub target: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    pub fields: Vec<Field>,
    pub body: BodyKind,
    /// The client asked to close after this exchange (or is HTTP/1.0 without keep-alive).
    pub close: bool,
}

impl RequestHead {
    pub fn is_connect(&self) -> bool {
        self.method == "CONNECT"
    }
}

/// A parsed response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    pub reason: String,
    pub minor_version: u8,
    pub fields: Vec<Field>,
    pub body: BodyKind,
    pub close: bool,
}

/// Why a head was refused. Request-side variants become 400 (431 for size); response-side
/// ones become 502.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("malformed HTTP head ({0})")]
    Syntax(&'static str),
    #[error("too many header fields")]
    TooManyFields,
    #[error("Content-Length together with Transfer-Encoding")]
    LengthAndChunked,
    #[error("invalid or conflicting Content-Length")]
    BadContentLength,
    #[error("Transfer-Encoding whose final coding is not chunked")]
    BadTransferEncoding,
    #[error("duplicate Host header")]
    DuplicateHost,
    #[error("Host header is not one valid authority")]
    BadHost,
    #[error("HTTP/1.1 request without a Host header")]
    MissingHost,
    #[error("CONNECT request with a body")]
    ConnectBody,
    /// A request body's chunked framing, refused as it streamed (a request's chunk
    /// extensions and trailer section included).
    #[error("bad chunked request body: {0}")]
    Chunked(crate::framing::ChunkError),
}

impl HeadError {
    /// Stable `reason_code` for the audit log.
    pub fn code(&self) -> &'static str {
        match self {
            HeadError::Syntax(_) => "malformed_head",
            HeadError::TooManyFields => "too_many_fields",
            HeadError::LengthAndChunked
            | HeadError::BadContentLength
            | HeadError::BadTransferEncoding
            | HeadError::ConnectBody
            | HeadError::Chunked(_) => "ambiguous_framing",
            HeadError::DuplicateHost => "duplicate_host",
            HeadError::BadHost => "bad_host_field",
            HeadError::MissingHost => "missing_host",
        }
    }
}

fn syntax(err: httparse::Error) -> HeadError {
    match err {
        httparse::Error::TooManyHeaders => HeadError::TooManyFields,
        httparse::Error::HeaderName => HeadError::Syntax("header name"),
        httparse::Error::HeaderValue => HeadError::Syntax("header value"),
        httparse::Error::NewLine => HeadError::Syntax("line ending"),
        httparse::Error::Status => HeadError::Syntax("status"),
        httparse::Error::Token => HeadError::Syntax("method or target"),
        httparse::Error::Version => HeadError::Syntax("version"),
    }
}

fn collect_fields(headers: &[httparse::Header<'_>]) -> Vec<Field> {
    headers
        .iter()
        .map(|h| Field {
            name: h.name.to_owned(),
            value: h.value.to_vec(),
        })
        .collect()
}

/// Parses a request head from the start of `buf`. `Ok(None)` means more bytes are needed;
/// `Ok(Some((head, len)))` gives the head and how many bytes of `buf` it used.
pub fn parse_request_head(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf).map_err(syntax)? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(None),
    };
    let (Some(method), Some(target), Some(minor_version)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Syntax("request line"));
    };
    let fields = collect_fields(req.headers);
    // RFC 9112 section 3.2: 400 for a missing (HTTP/1.1), repeated or invalid Host, before
    // anything else (any DNS query included) happens.
    let mut hosts = fields.iter().filter(|f| f.is("host"));
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => return Err(HeadError::DuplicateHost),
        (Some(host), None) => {
            let valid = std::str::from_utf8(&host.value)
                .is_ok_and(|v| sandgate_policy::parse_host_field(v.trim_matches([' ', '\t'])).is_ok());
            if !valid {
                return Err(HeadError::BadHost);
            }
        }
        (None, _) if minor_version >= 1 => return Err(HeadError::MissingHost),
        (None, _) => {}
    }
    let body = request_body(&fields, minor_version)?;
    if method == "CONNECT" && body != BodyKind::Empty {
        return Err(HeadError::ConnectBody);
    }
    let close = wants_close(&fields, minor_version);
    let head = RequestHead {
        method: method.to_owned(),
        target: target.to_owned(),
        minor_version,
        fields,
        body,
        close,
    };
    Ok(Some((head, len)))
}

/// Parses a response head. `request_method` and the status decide whether a body follows
/// (RFC 9112 section 6.3 rules 1 and 2).
pub fn parse_response_head(
    buf: &[u8],
    request_method: &str,
) -> Result<Option<(ResponseHead, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    let len = match res.parse(buf).map_err(syntax)? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(None),
    };
    let (Some(status), Some(minor_version)) = (res.code, res.version) else {
        return Err(HeadError::Syntax("status line"));
    };
    let reason = res.reason.unwrap_or("").to_owned();
    let mut fields = collect_fields(res.headers);
    let no_body = request_method == "HEAD" || (100..200).contains(&status) || status == 204 || status == 304;
    let body = if no_body {
        BodyKind::Empty
    } else {
        response_body(&mut fields)?
    };
    let close = wants_close(&fields, minor_version) || body == BodyKind::UntilClose;
    let head = ResponseHead {
        status,
        reason,
        minor_version,
        fields,
        body,
        close,
    };
    Ok(Some((head, len)))
}

/// Comma-separated tokens of every field named `name`, lowercased, empty items skipped.
fn tokens<'a>(fields: &'a [Field], name: &'a str) -> impl Iterator<Item = String> + 'a {
    fields
        .iter()
        .filter(move |f| f.is(name))
        .flat_map(|f| f.value.split(|b| *b == b','))
        .map(|t| String::from_utf8_lossy(t.trim_ascii()).to_ascii_lowercase())
        .filter(|t| !t.is_empty())
}

fn wants_close(fields: &[Field], minor_version: u8) -> bool {
    let mut close = false;
    let mut keep_alive = false;
    for token in tokens(fields, "connection") {
        close |= token == "close";
        keep_alive |= token == "keep-alive";
    }
    close || (minor_version == 0 && !keep_alive)
}

/// The Content-Length value, if present: every field must carry the same single decimal.
fn content_length(fields: &[Field]) -> Result<Option<u64>, HeadError> {
    let mut found = None;
    for field in fields.iter().filter(|f| f.is("content-length")) {
        let v = &field.value;
        if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
            return Err(HeadError::BadContentLength);
        }
        let n = std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or(HeadError::BadContentLength)?;
        if found.is_some_and(|prev| prev != n) {
            return Err(HeadError::BadContentLength);
        }
        found = Some(n);
    }
    Ok(found)
}

fn request_body(fields: &[Field], minor_version: u8) -> Result<BodyKind, HeadError> {
    let codings: Vec<String> = tokens(fields, "transfer-encoding").collect();
    let has_te = fields.iter().any(|f| f.is("transfer-encoding"));
    let length = content_length(fields)?;
    if has_te {
        if length.is_some() {
            return Err(HeadError::LengthAndChunked);
        }
        let chunked_count = codings.iter().filter(|c| *c == "chunked").count();
        let final_chunked = codings.last().is_some_and(|c| c == "chunked");
        if minor_version == 0 || !final_chunked || chunked_count != 1 {
            return Err(HeadError::BadTransferEncoding);
        }
        return Ok(BodyKind::Chunked);
    }
    Ok(match length {
        None | Some(0) => BodyKind::Empty,
        Some(n) => BodyKind::Length(n),
    })
}

/// Response framing (RFC 9112 section 6.3 rules 3-7). With both Transfer-Encoding and
/// Content-Length, Transfer-Encoding wins and Content-Length is removed (rule 3).
fn response_body(fields: &mut Vec<Field>) -> Result<BodyKind, HeadError> {
    let has_te = fields.iter().any(|f| f.is("transfer-encoding"));
    if has_te {
        let last = tokens(fields, "transfer-encoding").last();
        fields.retain(|f| !f.is("content-length"));
        return Ok(match last.as_deref() {
            Some("chunked") => BodyKind::Chunked,
            _ => BodyKind::UntilClose,
        });
    }
    Ok(match content_length(fields)? {
        Some(0) => BodyKind::Empty,
        Some(n) => BodyKind::Length(n),
        None => BodyKind::UntilClose,
    })
}

/// Hop-by-hop fields (RFC 9110 section 7.6.1), plus the proxy credentials, which are meant
/// for this hop only. `Transfer-Encoding` is not here: sandgate relays the message body
/// with its framing unchanged, so the field stays true for the next hop.
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
];

/// The node attribution fields (`sandgate-task`, `sandgate-subject`, ...) only a node-local
/// proxy may set, on its own streams to a central one: a client's are dropped, all of this
/// prefix, and `_` too (servers that map `_` to `-` in field names read both as one).
pub fn is_attribution(lower: &str) -> bool {
    lower.starts_with("sandgate-") || lower.starts_with("sandgate_")
}

/// The fields that say where a message's body ends. sandgate relays bodies verbatim, so
/// these go on with the body whatever `Connection` names: dropped, the next hop would read
/// the body as the next message (request smuggling past the decision and the record).
pub const FRAMING: &[&str] = &["content-length", "transfer-encoding"];

/// Fields that ask an origin to read a request as another method (Rails, Express's
/// method-override, Google APIs): dropped from a request whose method a rule judged, so a
/// `POST` allowed to `git-upload-pack` cannot be read as a `DELETE`.
pub const METHOD_OVERRIDES: &[&str] = &["x-http-method-override", "x-http-method", "x-method-override"];

/// Fields to forward: everything but hop-by-hop fields, attribution fields, the fields the
/// Connection header names (never the framing fields), and Host (which the caller sets from
/// the request-target).
///
/// Names are compared without case and without copying them: this runs over every field of
/// every message forwarded, and lowercased copies were a tenth of its allocations.
pub fn end_to_end_fields(fields: &[Field]) -> impl Iterator<Item = &Field> {
    let named: Vec<&[u8]> = fields
        .iter()
        .filter(|f| f.is("connection"))
        .flat_map(|f| f.value.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
        .collect();
    fields.iter().filter(move |f| {
        let name = f.name.as_bytes();
        let any = |list: &[&str]| list.iter().any(|n| name.eq_ignore_ascii_case(n.as_bytes()));
        !f.is("host")
            && !any(HOP_BY_HOP)
            && !is_attribution_name(name)
            && (any(FRAMING) || !named.iter().any(|t| name.eq_ignore_ascii_case(t)))
    })
}

/// [`is_attribution`] for a field name in any case.
fn is_attribution_name(name: &[u8]) -> bool {
    name.get(..9)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"sandgate-") || p.eq_ignore_ascii_case(b"sandgate_"))
}

#[cfg(test)]
#[path = "head_tests.rs"]
mod tests;
