//! Credentials the sandbox never holds: a secret bound to one host and one header. The
//! sandboxed code holds a placeholder; the proxy writes the secret into that header of
//! requests to that host only, where it sees them (an intercepted `https://` request), and
//! refuses a request that carries a placeholder anywhere else (another host, another
//! header, a header's name, the method, the path or query, plain HTTP; literally or
//! percent-encoded, as an origin that decodes would read it) as an attempted leak; and, for a credential that
//! asks for it (`inspect_body`), a request body to another host that carries it
//! ([`BodyScan`], as the body streams).
//!
//! Pure: the secret's text comes in resolved (`${env:NAME}` is read by the caller, at
//! load); here it is only held, never printed (`Debug` says `<secret>`).

use std::fmt;
use std::sync::Arc;

use aho_corasick::AhoCorasick;

use crate::host::Host;

/// A secret's text, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn new(text: impl Into<Arc<str>>) -> Secret {
        Secret(text.into())
    }

    /// The text, for the one place it is written: the header of a request to its host.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

/// Where a credential's value comes from, as written: `Bearer ${env:OPENAI_API_KEY}` is the
/// text around one variable of the environment the proxy starts in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueTemplate {
    pub before: String,
    pub env: String,
    pub after: String,
}

impl ValueTemplate {
    /// Reads `value`: exactly one `${env:NAME}` (NAME letters, digits and `_`), and text
    /// around it. A secret written in the file itself is refused: policy files are read by
    /// many and copied around.
    pub fn parse(value: &str) -> Result<ValueTemplate, CredentialError> {
        let (before, rest) = value.split_once("${env:").ok_or(CredentialError::NoEnv)?;
        let (env, after) = rest.split_once('}').ok_or(CredentialError::NoEnv)?;
        let valid = !env.is_empty() && env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(CredentialError::EnvName(env.to_owned()));
        }
        if after.contains("${") || before.contains("${") {
            return Err(CredentialError::NoEnv);
        }
        Ok(ValueTemplate {
            before: before.to_owned(),
            env: env.to_owned(),
            after: after.to_owned(),
        })
    }

    /// The value with the variable's text in place.
    pub fn fill(&self, secret: &str) -> Secret {
        Secret::new(format!("{}{secret}{}", self.before, self.after))
    }
}

/// Why a credential entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error(
        "the value names its secret as ${{env:NAME}} (exactly once): a secret is never written in a policy file"
    )]
    NoEnv,
    #[error("{0:?} is not an environment variable's name (letters, digits and _)")]
    EnvName(String),
    #[error("{0:?}: a placeholder is 8 to 128 of A-Z a-z 0-9 _ -, so it cannot be mistaken for other text")]
    Placeholder(String),
    #[error("{0:?} is not a header name")]
    Header(String),
    #[error("the host is one exact name (no wildcard, no port)")]
    Host,
    #[error("placeholder {0:?} is given twice")]
    Duplicate(String),
    #[error("the placeholders cannot be searched for together: {0}")]
    Search(String),
}

/// One secret bound to a host and a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub host: Host,
    /// Lowercase.
    pub header: String,
    pub value: Secret,
    pub placeholder: String,
    /// Whether request bodies to other hosts are searched for the placeholder.
    pub inspect_body: bool,
    /// `file:line`, for records and messages.
    pub origin: Arc<str>,
}

/// Checks a placeholder and a header name.
pub fn check_names(placeholder: &str, header: &str) -> Result<(), CredentialError> {
    let ok = (8..=128).contains(&placeholder.len())
        && placeholder
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok {
        return Err(CredentialError::Placeholder(placeholder.to_owned()));
    }
    let token = !header.is_empty()
        && header
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Err(CredentialError::Header(header.to_owned()));
    }
    Ok(())
}

/// What a request carried of the placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carried {
    /// No placeholder anywhere.
    Nothing,
    /// Placeholders only where they belong: set these headers (lowercase names) to these
    /// values.
    Swap(Vec<(String, Secret)>),
}

/// A placeholder where it does not belong: where it was seen, and its credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the placeholder of the credential for {host} ({origin}) was sent {where_}")]
pub struct Leak {
    pub host: String,
    pub origin: Arc<str>,
    pub where_: String,
}

/// Every credential in force, and the search for all their placeholders at once.
#[derive(Debug, Clone, Default)]
pub struct BoundSecrets {
    list: Vec<Credential>,
    /// `None` when the list is empty.
    search: Option<Arc<Placeholders>>,
}

impl PartialEq for BoundSecrets {
    fn eq(&self, other: &Self) -> bool {
        self.list == other.list
    }
}

impl Eq for BoundSecrets {}

impl BoundSecrets {
    /// The credentials, with the search for their placeholders built once; an error only
    /// when the placeholders are too many to search for together.
    pub fn new(list: Vec<Credential>) -> Result<BoundSecrets, CredentialError> {
        let search = match list.is_empty() {
            true => None,
            false => Some(Arc::new(Placeholders::build(&list)?)),
        };
        Ok(BoundSecrets { list, search })
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether a secret is bound to `host`: its tunnels must be intercepted.
    pub fn binds(&self, host: &Host) -> bool {
        self.list.iter().any(|c| c.host == *host)
    }

    /// Checks a request to `host` (`seen`: whether the proxy can write into it, an
    /// intercepted `https://` request; plain HTTP is never given a secret) with its method,
    /// request-target (`/path?query`) and header fields (`(name, value)`). The method and
    /// each field's name must hold no placeholder (in any case); the target and values
    /// none literally or percent-decoded, but for the bound header to the bound host. Each
    /// text is searched once for every placeholder, and decoded only if it holds a `%`.
    pub fn check<'a>(
        &self,
        host: &Host,
        seen: bool,
        method: &str,
        target: &str,
        fields: impl Iterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Carried, Leak> {
        let Some(search) = self.search.as_deref() else {
            return Ok(Carried::Nothing);
        };
        let leak = |c: &Credential, where_: String| Leak {
            host: c.host.to_string(),
            origin: c.origin.clone(),
            where_,
        };
        if let Some(c) = self.first(&search.named(method.as_bytes())) {
            return Err(leak(c, format!("as the method of a request to {host}")));
        }
        let (literal, encoded) = search.written(target.as_bytes());
        if let Some(c) = self.first(&literal).or_else(|| self.first(&encoded)) {
            return Err(leak(c, "in the request's path or query".to_owned()));
        }
        let mut swap = Vec::new();
        for (name, value) in fields {
            if let Some(c) = self.first(&search.named(name.as_bytes())) {
                return Err(leak(c, format!("as the name of a header ({name}) to {host}")));
            }
            let (literal, encoded) = search.written(value);
            for (c, (literal, encoded)) in self.list.iter().zip(literal.iter().zip(&encoded)) {
                let here = c.host == *host && name.eq_ignore_ascii_case(&c.header);
                if !literal {
                    // Encoded, it is swapped nowhere, and is only a placeholder in its own
                    // header; anywhere else an origin may decode it (a cookie).
                    if !here && *encoded {
                        return Err(leak(c, format!("in the {name} header to {host}, encoded")));
                    }
                    continue;
                }
                if !here {
                    return Err(leak(c, format!("in the {name} header to {host}")));
                }
                if !seen {
                    return Err(leak(
                        c,
                        format!("to {host} over plain HTTP, where it would travel in the clear"),
                    ));
                }
                swap.push((c.header.clone(), c.value.clone()));
            }
        }
        Ok(match swap.is_empty() {
            true => Carried::Nothing,
            false => Carried::Swap(swap),
        })
    }

    /// The first credential, in the list's order, that `hits` marks.
    fn first(&self, hits: &[bool]) -> Option<&Credential> {
        self.list.iter().zip(hits).find(|(_, hit)| **hit).map(|(c, _)| c)
    }
}

impl BoundSecrets {
    /// The search of a request body sent to `host` for the placeholders of the credentials
    /// that ask for it (`inspect_body`) and are bound to another host; `None` when there is
    /// none to look for.
    pub fn body_scan(&self, host: &Host) -> Option<BodyScan> {
        let search = self.search.clone()?;
        let watched: Vec<bool> = self
            .list
            .iter()
            .map(|c| c.inspect_body && c.host != *host)
            .collect();
        let longest = self
            .list
            .iter()
            .zip(&watched)
            .filter(|(_, w)| **w)
            .map(|(c, _)| c.placeholder.len())
            .max()?;
        Some(BodyScan {
            host: host.to_string(),
            list: self.list.clone(),
            watched,
            search,
            tail: Vec::with_capacity(longest.saturating_sub(1)),
            keep: longest.saturating_sub(1),
        })
    }
}

/// A request body searched as it streams, chunk by chunk: a placeholder split across two
/// chunks is found too (the last bytes of each chunk are kept, one fewer than the longest
/// placeholder), and the chunk that completes it is the one refused, so the whole
/// placeholder never goes on. The placeholder is matched as written: a body is not decoded
/// (`SANDGATE%5FEXAMPLE` in a form passes).
#[derive(Debug, Clone)]
pub struct BodyScan {
    host: String,
    list: Vec<Credential>,
    /// Which of `list` are searched for.
    watched: Vec<bool>,
    search: Arc<Placeholders>,
    tail: Vec<u8>,
    keep: usize,
}

impl BodyScan {
    /// Looks at the next chunk; a leak when a placeholder ends in it.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), Leak> {
        let seam = chunk.get(..self.keep.min(chunk.len())).unwrap_or_default();
        let mut joined = Vec::with_capacity(self.tail.len() + seam.len());
        joined.extend_from_slice(&self.tail);
        joined.extend_from_slice(seam);
        let mut hits = vec![false; self.list.len()];
        self.search.exact(chunk, &mut hits);
        self.search.exact(&joined, &mut hits);
        let found = self
            .list
            .iter()
            .zip(hits.iter().zip(&self.watched))
            .find(|(_, (hit, watched))| **hit && **watched);
        if let Some((c, _)) = found {
            return Err(Leak {
                host: c.host.to_string(),
                origin: c.origin.clone(),
                where_: format!("in the body of a request to {}", self.host),
            });
        }
        // The last `keep` bytes of what has passed, for the next chunk's seam.
        if chunk.len() >= self.keep {
            self.tail.clear();
            self.tail
                .extend_from_slice(chunk.get(chunk.len() - self.keep..).unwrap_or_default());
        } else {
            self.tail.extend_from_slice(chunk);
            let over = self.tail.len().saturating_sub(self.keep);
            self.tail.drain(..over);
        }
        Ok(())
    }
}

/// How many times a path, query or header value is percent-decoded in search of a
/// placeholder: an origin, and a framework behind it, may each decode once.
const DECODE_ROUNDS: usize = 3;

/// Every placeholder, searched for at once (Aho-Corasick): one pass over a text finds each
/// placeholder it holds, however many there are and however the text is made, where a
/// search per placeholder costs a pass each.
#[derive(Debug)]
struct Placeholders {
    /// As written: in values, the target and bodies.
    exact: AhoCorasick,
    /// In any ASCII case: in header names (HTTP/2 writes them lowercase) and the method.
    caseless: AhoCorasick,
}

impl Placeholders {
    fn build(list: &[Credential]) -> Result<Placeholders, CredentialError> {
        let patterns: Vec<&str> = list.iter().map(|c| c.placeholder.as_str()).collect();
        let build = |caseless: bool| {
            AhoCorasick::builder()
                .ascii_case_insensitive(caseless)
                .build(&patterns)
                .map_err(|e| CredentialError::Search(e.to_string()))
        };
        Ok(Placeholders {
            exact: build(false)?,
            caseless: build(true)?,
        })
    }

    /// Which placeholders a name (a header's, the method) holds, in any case.
    fn named(&self, name: &[u8]) -> Vec<bool> {
        let mut hits = vec![false; self.caseless.patterns_len()];
        mark(&self.caseless, name, &mut hits);
        hits
    }

    /// Marks in `hits` the placeholders `text` holds as written.
    fn exact(&self, text: &[u8], hits: &mut [bool]) {
        mark(&self.exact, text, hits);
    }

    /// Which placeholders a value (or the target) holds literally, and which only once
    /// `%XX` (either case) is decoded, once or again up to [`DECODE_ROUNDS`] times (`%255F`
    /// is `%5F`, then `_`). A placeholder is only ASCII letters, digits, `_` and `-`, so no
    /// other spelling (`+` for a space) can make one. Decoded only if it holds a `%`.
    fn written(&self, text: &[u8]) -> (Vec<bool>, Vec<bool>) {
        let mut literal = vec![false; self.exact.patterns_len()];
        let mut encoded = literal.clone();
        self.exact(text, &mut literal);
        let mut current = std::borrow::Cow::Borrowed(text);
        for _ in 0..DECODE_ROUNDS {
            if !current.contains(&b'%') {
                break;
            }
            let next = percent_decode(&current);
            if next == *current {
                break;
            }
            self.exact(&next, &mut encoded);
            current = std::borrow::Cow::Owned(next);
        }
        (literal, encoded)
    }
}

/// Marks in `hits` each pattern of `automaton` found in `text`, overlapping ones included
/// (a placeholder that is part of another's is found too). A search that cannot run marks
/// every pattern: the request is refused rather than let through unread.
fn mark(automaton: &AhoCorasick, text: &[u8], hits: &mut [bool]) {
    #[cfg(test)]
    tests::SEARCHED.with(|n| n.set(n.get() + text.len()));
    match automaton.try_find_overlapping_iter(text) {
        Ok(found) => {
            for m in found {
                if let Some(hit) = hits.get_mut(m.pattern().as_usize()) {
                    *hit = true;
                }
            }
        }
        Err(_) => hits.fill(true),
    }
}

/// `text` with each `%XX` of two hex digits replaced by its byte; anything else kept.
fn percent_decode(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while let Some(&b) = text.get(i) {
        let byte = match (b, text.get(i + 1..i + 3)) {
            (b'%', Some(&[hi, lo])) => hex(hi).zip(hex(lo)).map(|(h, l)| h << 4 | l),
            _ => None,
        };
        match byte {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
#[path = "credential_tests.rs"]
mod tests;
