//! The sandbox policy's `net.exceptions`: the control plane whose approved exceptions the
//! run's own proxy follows (`sandgate run` starts the follower, through the binary's
//! `run::Follow`), for the run's task and within the bounds written here. Pure.

use serde::Deserialize;

use super::PolicyError;

/// `net.exceptions`: the control plane whose approved exceptions the run's own proxy
/// follows, for the run's task, within these bounds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExceptions {
    from: String,
    token_file: std::path::PathBuf,
    #[serde(default)]
    ca: Option<std::path::PathBuf>,
    #[serde(default)]
    ports: Option<Vec<u16>>,
    #[serde(default)]
    max_ttl_seconds: Option<u32>,
}

/// `net.exceptions`, validated: the run's own proxy follows the control plane at `from`
/// (its admin URL: plain HTTP on loopback), reading with the token in `token_file`, and
/// applies the approved exceptions of the run's task on `ports` for at most
/// `max_ttl_seconds` (the run's bounds; a wider approval there applies nowhere here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionsFeed {
    pub from: String,
    /// As written; [`crate::run::load_policy`] makes a relative one relative to the
    /// policy file's directory.
    pub token_file: std::path::PathBuf,
    /// For an `https://` control plane: the CA its certificate must chain to (relative like
    /// `token_file`).
    pub ca: Option<std::path::PathBuf>,
    pub ports: Vec<u16>,
    pub max_ttl_seconds: u32,
}

/// `net.exceptions`: only where the run has a proxy of its own (with an upstream, the
/// upstream decides, and it is there that exceptions must apply); an `http://` URL (the
/// rest of its checks, loopback only among them, at run start where the control plane's
/// client parses it); a token file; ports that are ports; a TTL of at least a second.
pub(super) fn feed(raw: &RawExceptions, own_proxy: bool) -> Result<ExceptionsFeed, PolicyError> {
    if !own_proxy {
        return Err(PolicyError(
            "net.exceptions needs the run's own proxy (net.mode allowlist, or proxy without net.proxy.upstream); with an upstream proxy, exceptions apply where that proxy decides: make it host or follow the control plane".to_owned(),
        ));
    }
    if !(raw.from.starts_with("http://") || raw.from.starts_with("https://")) {
        return Err(PolicyError(format!(
            "net.exceptions.from: {:?}: the control plane's admin URL, http://127.0.0.1:PORT (or https://IP:PORT with net.exceptions.ca)",
            raw.from
        )));
    }
    if raw.from.starts_with("https://") && raw.ca.is_none() {
        return Err(PolicyError(
            "net.exceptions.ca: an https:// control plane needs the CA that signed its certificate"
                .to_owned(),
        ));
    }
    if raw.token_file.as_os_str().is_empty() {
        return Err(PolicyError(
            "net.exceptions.token_file: an empty path (a file holding a follower token of that control plane)".to_owned(),
        ));
    }
    let ports = raw
        .ports
        .clone()
        .unwrap_or_else(|| sandgate_policy::exception::DEFAULT_PORTS.to_vec());
    if ports.is_empty() || ports.contains(&0) {
        return Err(PolicyError(
            "net.exceptions.ports: at least one port, none of them 0".to_owned(),
        ));
    }
    let max_ttl_seconds = raw
        .max_ttl_seconds
        .unwrap_or(sandgate_policy::exception::DEFAULT_MAX_TTL);
    if max_ttl_seconds == 0 {
        return Err(PolicyError(
            "net.exceptions.max_ttl_seconds: at least 1".to_owned(),
        ));
    }
    Ok(ExceptionsFeed {
        from: raw.from.clone(),
        token_file: raw.token_file.clone(),
        ca: raw.ca.clone(),
        ports,
        max_ttl_seconds,
    })
}
