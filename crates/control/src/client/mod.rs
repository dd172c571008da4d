//! The one client of sandgate's local HTTP APIs: the admin API (`/v1`) for `sandgate
//! exceptions` and `sandgate mcp`, and Jupyter Server's REST API for `sandgate jupyter`.
//! Blocking (ureq); an async caller runs it on a blocking thread.
//!
//! It never asks the system resolver (getaddrinfo, /etc/hosts, the search list) for an
//! address. An [`AdminUrl`] names its host by an IP literal (`127.0.0.1`, `[::1]`) or as
//! `localhost`, which stands for 127.0.0.1 and ::1 without a lookup; any other name is refused
//! when the URL is parsed ([`UrlProblem::HostName`]). The agent's resolver (`LiteralResolver`)
//! applies the same rule to every URI ureq would connect to, so nothing the client is asked
//! for reaches a system lookup. The agent has no proxy (ureq would read `HTTP_PROXY` and
//! friends), follows no redirect (one would carry the token elsewhere), and speaks plain HTTP,
//! or TLS for an `https://` URL, verified against the CA it is given and nothing else
//! ([`AdminClient::with_ca`]: a follower of a control plane on another host).
//!
//! Every call is bounded: a connect timeout, a timeout for the whole call, and a limit on the
//! answer's size ([`Limits`]). Failures are typed ([`AdminError`]); their messages are
//! written here and nowhere else. A stream of lines (`/v1/events`) is bounded the same way:
//! in time, per line and in all. Not here: retries, cookies, and any meaning of the
//! answer's JSON beyond parsing it.
//!
//! Only this module builds a `ureq::Agent`: clippy.toml refuses the type and ureq's own
//! constructors (which resolve with getaddrinfo) everywhere else.

#![expect(
    clippy::disallowed_types,
    reason = "the workspace's one ureq agent, whose resolver takes only IP literals and localhost"
)]

use std::fmt;
use std::time::Duration;

use serde_json::Value;
use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{Connector, NextTimeout, RustlsConnector, TcpConnector};

mod url;

pub use url::{AdminUrl, UrlError, UrlProblem, path_segment};

/// A failed call. The `api` fields are the URL's canonical form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    #[error("admin URL {0}")]
    Url(#[from] UrlError),
    #[error("the token holds a character an HTTP header cannot carry (a line break or a control character)")]
    Token,
    /// An `https://` URL without the CA its certificate must chain to, or a CA file that
    /// cannot be read.
    #[error("{0}")]
    Tls(String),
    #[error("cannot reach {api}: {cause}")]
    Unreachable { api: String, cause: String },
    #[error("{api} did not answer within {after:?}")]
    Timeout { api: String, after: Duration },
    #[error("{api} answered {status}: {message}")]
    Refused {
        api: String,
        status: u16,
        message: String,
    },
    #[error("the answer from {api} is over {limit} bytes")]
    TooLarge { api: String, limit: u64 },
    #[error("{api} answered {status} with a body that is not JSON")]
    NotJson { api: String, status: u16 },
}

/// How long a call may take and how much it may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The whole call: connect, send, and read the answer to its end.
    pub timeout: Duration,
    /// Each connection attempt (localhost tries two addresses).
    pub connect_timeout: Duration,
    /// The answer's body, in bytes.
    pub max_body: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_body: 4 << 20,
        }
    }
}

/// The longest line [`AdminClient::stream_lines`] reads.
pub const MAX_LINE: usize = 64 << 10;

/// A client of one API with one bearer token. Cheap to clone (the agent is shared).
#[derive(Clone)]
pub struct AdminClient {
    url: AdminUrl,
    api: String,
    /// `Bearer TOKEN`; None for no token (the API answers 401).
    authorization: Option<String>,
    token_ok: bool,
    /// False for an `https://` URL without a CA: every call fails before connecting.
    tls_ok: bool,
    limits: Limits,
    agent: ureq::Agent,
}

impl fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminClient")
            .field("url", &self.api)
            .field("token", &self.authorization.as_ref().map(|_| "<redacted>"))
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl AdminClient {
    /// A client with the default [`Limits`]. The token is sent as `Authorization: Bearer`
    /// (which Jupyter Server takes too); an empty one is not sent.
    pub fn new(url: AdminUrl, token: &str) -> AdminClient {
        AdminClient::with_limits(url, token, Limits::default())
    }

    pub fn with_limits(url: AdminUrl, token: &str, limits: Limits) -> AdminClient {
        AdminClient::build(url, token, limits, None)
    }

    /// A client of an `https://` URL, verifying the server's certificate against the CA
    /// certificates in `ca` (PEM) and nothing else (no system roots). For an `http://` URL
    /// the CA is not needed and refused, so a mistake cannot pass as TLS.
    pub fn with_ca(
        url: AdminUrl,
        token: &str,
        limits: Limits,
        ca: &std::path::Path,
    ) -> Result<AdminClient, AdminError> {
        if !url.is_tls() {
            return Err(AdminError::Tls(format!(
                "{url}: a CA file is for https:// URLs only"
            )));
        }
        let certs = sandgate_proxy::transport::tls::load_certs(ca)
            .map_err(|e| AdminError::Tls(format!("the CA file: {e}")))?;
        let roots: Vec<ureq::tls::Certificate<'static>> = certs
            .iter()
            .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
            .collect();
        Ok(AdminClient::build(url, token, limits, Some(roots)))
    }

    fn build(
        url: AdminUrl,
        token: &str,
        limits: Limits,
        roots: Option<Vec<ureq::tls::Certificate<'static>>>,
    ) -> AdminClient {
        let token = token.trim();
        let tls_ok = !url.is_tls() || roots.is_some();
        AdminClient {
            api: url.to_string(),
            url,
            authorization: (!token.is_empty()).then(|| format!("Bearer {token}")),
            // RFC 9110 section 5.5: a field value is visible ASCII, spaces and tabs.
            token_ok: token
                .bytes()
                .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic()),
            tls_ok,
            limits,
            agent: agent(&limits, roots),
        }
    }

    pub fn url(&self) -> &AdminUrl {
        &self.url
    }

    /// GET `path` (absolute, already percent-encoded: [`path_segment`]); the JSON of a 2xx
    /// answer (`null` for an empty body).
    pub fn get(&self, path: &str) -> Result<Value, AdminError> {
        self.check_token()?;
        let mut request = self.agent.get(format!("{}{path}", self.api));
        if let Some(auth) = &self.authorization {
            request = request.header("Authorization", auth);
        }
        self.answer(request.call())
    }

    /// POST `body` as JSON to `path`; the JSON of a 2xx answer.
    pub fn post(&self, path: &str, body: &Value) -> Result<Value, AdminError> {
        self.check_token()?;
        let mut request = self
            .agent
            .post(format!("{}{path}", self.api))
            .header("Content-Type", "application/json");
        if let Some(auth) = &self.authorization {
            request = request.header("Authorization", auth);
        }
        self.answer(request.send(body.to_string()))
    }

    /// GET `path` as a stream of lines (server-sent events: `/v1/events`) for at most `for_at_most`,
    /// handing each line, without its end, to `each` until it returns false. A line is at
    /// most [`MAX_LINE`] bytes (a longer one ends the stream as `TooLarge`), the whole
    /// stream at most `max_body` times 16. Returns when the time is up (`Timeout`), the
    /// server ends the stream (`Ok`) or `each` says stop (`Ok`). `opened` is called once the
    /// answer's head has come (for `/v1/events`: the subscription is in place).
    pub fn stream_lines(
        &self,
        path: &str,
        for_at_most: Duration,
        opened: impl FnOnce(),
        mut each: impl FnMut(&str) -> bool,
    ) -> Result<(), AdminError> {
        use std::io::{BufRead, Read};
        self.check_token()?;
        let mut request = self
            .agent
            .get(format!("{}{path}", self.api))
            .header("Accept", "text/event-stream");
        if let Some(auth) = &self.authorization {
            request = request.header("Authorization", auth);
        }
        let request = request.config().timeout_global(Some(for_at_most)).build();
        let mut response = request.call().map_err(|e| self.failed_after(e, for_at_most))?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(self.answer(Ok(response)).err().unwrap_or(AdminError::NotJson {
                api: self.api.clone(),
                status,
            }));
        }
        opened();
        let limit = self.limits.max_body.saturating_mul(16);
        let mut reader = std::io::BufReader::new(response.body_mut().with_config().limit(limit).reader());
        let mut line = Vec::new();
        loop {
            line.clear();
            let read = (&mut reader)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
                .map_err(|e| self.read_failed(e, for_at_most))?;
            if read == 0 {
                return Ok(());
            }
            if line.last() != Some(&b'\n') && line.len() > MAX_LINE {
                return Err(AdminError::TooLarge {
                    api: self.api.clone(),
                    limit: MAX_LINE as u64,
                });
            }
            let text = String::from_utf8_lossy(&line);
            if !each(text.trim_end_matches(['\r', '\n'])) {
                return Ok(());
            }
        }
    }

    fn check_token(&self) -> Result<(), AdminError> {
        if !self.tls_ok {
            return Err(AdminError::Tls(format!(
                "{}: an https:// URL needs the CA file that signed the admin listener's certificate",
                self.api
            )));
        }
        if self.token_ok {
            Ok(())
        } else {
            Err(AdminError::Token)
        }
    }

    fn answer(
        &self,
        sent: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, AdminError> {
        let mut response = sent.map_err(|e| self.failed(e))?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .with_config()
            .limit(self.limits.max_body)
            .read_to_vec()
            .map_err(|e| self.failed(e))?;
        if !(200..300).contains(&status) {
            return Err(AdminError::Refused {
                api: self.api.clone(),
                status,
                message: message_of(&body),
            });
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&body).map_err(|_| AdminError::NotJson {
            api: self.api.clone(),
            status,
        })
    }

    /// Every ureq failure mapped once.
    fn failed(&self, error: ureq::Error) -> AdminError {
        self.failed_after(error, self.limits.timeout)
    }

    /// A body reader's failure: ureq's own errors come through it wrapped in an I/O error.
    fn read_failed(&self, error: std::io::Error, after: Duration) -> AdminError {
        let text = error.to_string();
        if error.kind() == std::io::ErrorKind::TimedOut {
            return AdminError::Timeout {
                api: self.api.clone(),
                after,
            };
        }
        match error.into_inner().map(|inner| inner.downcast::<ureq::Error>()) {
            Some(Ok(wrapped)) => self.failed_after(*wrapped, after),
            Some(Err(other)) => AdminError::Unreachable {
                api: self.api.clone(),
                cause: other.to_string(),
            },
            None => AdminError::Unreachable {
                api: self.api.clone(),
                cause: text,
            },
        }
    }

    /// [`Self::failed`], for a call whose time limit was `after`.
    fn failed_after(&self, error: ureq::Error, after: Duration) -> AdminError {
        let api = self.api.clone();
        match error {
            ureq::Error::Timeout(_) => AdminError::Timeout { api, after },

            ureq::Error::BodyExceedsLimit(limit) => AdminError::TooLarge { api, limit },
            ureq::Error::Io(e) => AdminError::Unreachable {
                api,
                cause: e.to_string(),
            },
            other => AdminError::Unreachable {
                api,
                cause: other.to_string(),
            },
        }
    }
}

/// The API's reason: `{"error": ...}` (sandgate) or `{"message": ...}` (Jupyter), else the
/// body's text; one line, control characters replaced, at most 300 characters.
fn message_of(body: &[u8]) -> String {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let field = json
        .as_ref()
        .and_then(|v| v.get("error").or_else(|| v.get("message")))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let text = field.unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.trim().is_empty() {
        "no message".to_owned()
    } else {
        url::clip(text.trim(), 300)
    }
}

/// The agent: our resolver, a bare TCP connector (and rustls over it, trusting only
/// `roots`, when given), no proxy, no redirects, the limits.
fn agent(limits: &Limits, roots: Option<Vec<ureq::tls::Certificate<'static>>>) -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(
            roots.unwrap_or_default(),
        )))
        .unversioned_rustls_crypto_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .build();
    let config: Config = ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .proxy(None)
        .max_redirects(0)
        .timeout_global(Some(limits.timeout))
        .timeout_connect(Some(limits.connect_timeout))
        .user_agent(concat!("sandgate/", env!("CARGO_PKG_VERSION")))
        .build();
    let connector = ().chain(TcpConnector::default()).chain(RustlsConnector::default());
    ureq::Agent::with_parts(config, connector, LiteralResolver)
}

/// ureq's resolver, replaced: an `http` URI whose host is an IP literal or `localhost`
/// ([`url::literal_addrs`], the rule the URL was parsed by); anything else is an error
/// before any socket is opened or any name looked up.
#[derive(Debug)]
struct LiteralResolver;

impl Resolver for LiteralResolver {
    fn resolve(
        &self,
        uri: &Uri,
        _config: &Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let refused = |why: String| ureq::Error::BadUri(format!("{uri}: {why}"));
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            let scheme = uri.scheme_str().unwrap_or_default().to_owned();
            return Err(refused(UrlProblem::Scheme(scheme).to_string()));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| refused(UrlProblem::Syntax.to_string()))?;
        let port = authority
            .port_u16()
            .ok_or_else(|| refused(UrlProblem::MissingPort.to_string()))?;
        let found =
            url::literal_addrs(authority.host(), port).map_err(|problem| refused(problem.to_string()))?;
        let mut addrs = self.empty();
        for addr in found {
            addrs.push(addr);
        }
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests;
