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
//! friends), follows no redirect (one would carry the token elsewhere), and speaks plain HTTP
//! only (no TLS: the admin listener is kept on loopback or a private address).
//!
//! Every call is bounded: a connect timeout, a timeout for the whole call, and a limit on the
//! answer's size ([`Limits`]). Failures are typed ([`AdminError`]); their messages are
//! written here and nowhere else. Not here: retries, cookies, streamed answers
//! (`/v1/events`), and any meaning of the answer's JSON beyond parsing it.
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
use ureq::unversioned::transport::{Connector, NextTimeout, TcpConnector};

mod url;

pub use url::{AdminUrl, UrlError, UrlProblem, path_segment};

/// A failed call. The `api` fields are the URL's canonical form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    #[error("admin URL {0}")]
    Url(#[from] UrlError),
    #[error("the token holds a character an HTTP header cannot carry (a line break or a control character)")]
    Token,
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

/// A client of one API with one bearer token. Cheap to clone (the agent is shared).
#[derive(Clone)]
pub struct AdminClient {
    url: AdminUrl,
    api: String,
    /// `Bearer TOKEN`; None for no token (the API answers 401).
    authorization: Option<String>,
    token_ok: bool,
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
        let token = token.trim();
        AdminClient {
            api: url.to_string(),
            url,
            authorization: (!token.is_empty()).then(|| format!("Bearer {token}")),
            // RFC 9110 section 5.5: a field value is visible ASCII, spaces and tabs.
            token_ok: token
                .bytes()
                .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic()),
            limits,
            agent: agent(&limits),
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

    fn check_token(&self) -> Result<(), AdminError> {
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
        let api = self.api.clone();
        match error {
            ureq::Error::Timeout(_) => AdminError::Timeout {
                api,
                after: self.limits.timeout,
            },
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

/// The agent: our resolver, a bare TCP connector, no proxy, no redirects, the limits.
fn agent(limits: &Limits) -> ureq::Agent {
    let config: Config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .max_redirects(0)
        .timeout_global(Some(limits.timeout))
        .timeout_connect(Some(limits.connect_timeout))
        .user_agent(concat!("sandgate/", env!("CARGO_PKG_VERSION")))
        .build();
    ureq::Agent::with_parts(config, ().chain(TcpConnector::default()), LiteralResolver)
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
        if uri.scheme_str() != Some("http") {
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
