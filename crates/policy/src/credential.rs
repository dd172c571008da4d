//! Credentials the sandbox never holds: a secret bound to one host and one header. The
//! sandboxed code holds a placeholder; the proxy writes the secret into that header of
//! requests to that host only, where it sees them (an intercepted `https://` request), and
//! refuses a request that carries a placeholder anywhere else (another host, another
//! header, the path or query, plain HTTP; literally or percent-encoded, as an origin that
//! decodes would read it) as an attempted leak; and, for a credential that
//! asks for it (`inspect_body`), a request body to another host that carries it
//! ([`BodyScan`], as the body streams).
//!
//! Pure: the secret's text comes in resolved (`${env:NAME}` is read by the caller, at
//! load); here it is only held, never printed (`Debug` says `<secret>`).

use std::fmt;
use std::sync::Arc;

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

/// Every credential in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BoundSecrets {
    list: Vec<Credential>,
}

impl BoundSecrets {
    pub fn new(list: Vec<Credential>) -> BoundSecrets {
        BoundSecrets { list }
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether a secret is bound to `host`: its tunnels must be intercepted.
    pub fn binds(&self, host: &Host) -> bool {
        self.list.iter().any(|c| c.host == *host)
    }

    /// Checks a request to `host` (`seen`: whether the proxy can write into it, an
    /// intercepted `https://` request; plain HTTP is never given a secret) with its
    /// request-target (`/path?query`) and header fields (`(name, value)`).
    pub fn check<'a>(
        &self,
        host: &Host,
        seen: bool,
        target: &str,
        fields: impl Iterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Carried, Leak> {
        if self.list.is_empty() {
            return Ok(Carried::Nothing);
        }
        let leak = |c: &Credential, where_: String| Leak {
            host: c.host.to_string(),
            origin: c.origin.clone(),
            where_,
        };
        let placeholder = |c: &&Credential| carries(target.as_bytes(), c.placeholder.as_bytes());
        if let Some(c) = self.list.iter().find(placeholder) {
            return Err(leak(c, "in the request's path or query".to_owned()));
        }
        let mut swap = Vec::new();
        for (name, value) in fields {
            for c in &self.list {
                let here = c.host == *host && name.eq_ignore_ascii_case(&c.header);
                if !contains(value, c.placeholder.as_bytes()) {
                    // Encoded, it is swapped nowhere, and is only a placeholder in its own
                    // header; anywhere else an origin may decode it (a cookie).
                    if !here && carries(value, c.placeholder.as_bytes()) {
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
}

impl BoundSecrets {
    /// The search of a request body sent to `host` for the placeholders of the credentials
    /// that ask for it (`inspect_body`) and are bound to another host; `None` when there is
    /// none to look for.
    pub fn body_scan(&self, host: &Host) -> Option<BodyScan> {
        let watched: Vec<Credential> = self
            .list
            .iter()
            .filter(|c| c.inspect_body && c.host != *host)
            .cloned()
            .collect();
        let longest = watched.iter().map(|c| c.placeholder.len()).max()?;
        Some(BodyScan {
            host: host.to_string(),
            watched,
            tail: Vec::with_capacity(longest.saturating_sub(1)),
            keep: longest.saturating_sub(1),
        })
    }
}

/// A request body searched as it streams, chunk by chunk: a placeholder split across two
/// chunks is found too (the last bytes of each chunk are kept, one fewer than the longest
/// placeholder), and the chunk that completes it is the one refused, so the whole
/// placeholder never goes on.
#[derive(Debug, Clone)]
pub struct BodyScan {
    host: String,
    watched: Vec<Credential>,
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
        if let Some(c) = self.watched.iter().find(|c| {
            let needle = c.placeholder.as_bytes();
            contains(chunk, needle) || contains(&joined, needle)
        }) {
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

/// Whether `text` carries `needle` literally, or once `%XX` (either case) is decoded, once
/// or again up to [`DECODE_ROUNDS`] times (`%255F` is `%5F`, then `_`). A placeholder is
/// only ASCII letters, digits, `_` and `-`, so no other spelling (`+` for a space) can
/// make one.
fn carries(text: &[u8], needle: &[u8]) -> bool {
    if contains(text, needle) {
        return true;
    }
    let mut current = text.to_vec();
    for _ in 0..DECODE_ROUNDS {
        if !current.contains(&b'%') {
            return false;
        }
        let next = percent_decode(&current);
        if next == current {
            return false;
        }
        if contains(&next, needle) {
            return true;
        }
        current = next;
    }
    false
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

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
#[path = "credential_tests.rs"]
mod tests;
