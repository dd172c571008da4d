//! The links to other proxies, read at start so a bad value stops it with its name:
//! `--upstream-proxy` (an HTTP proxy, a name resolved once through the proxy's own
//! resolver), `--upstream` (central proxies over mutual TLS, with the node's files) and, on
//! a central, a `role: node` listener's TLS files, relative to the policy file.

use std::net::SocketAddr;

use sandgate_policy::{AddressGuard, PolicyFile};
use sandgate_proxy::{Connector, ProxyConfig};

use super::{SettingsError, invalid};
use crate::cli::ProxyArgs;

/// A `role: node` listener's TLS files, relative to the policy file.
pub(crate) fn node_tls_files(
    policy: &std::path::Path,
    tls: &sandgate_policy::document::TlsSpec,
) -> sandgate_proxy::transport::ServerFiles {
    let dir = policy.parent().unwrap_or(std::path::Path::new("."));
    sandgate_proxy::transport::ServerFiles {
        cert: dir.join(&tls.cert),
        key: dir.join(&tls.key),
        client_ca: dir.join(&tls.client_ca),
    }
}

/// A `role: node` listener: its TLS files read now, so a missing or mismatched file stops
/// the start with its name.
pub(super) fn node_listener(
    policy: &std::path::Path,
    tls: &sandgate_policy::document::TlsSpec,
    file: &PolicyFile,
) -> Result<std::sync::Arc<sandgate_proxy::transport::NodeListener>, SettingsError> {
    sandgate_proxy::transport::NodeListener::new(node_tls_files(policy, tls), file.nodes.clone())
        .map(std::sync::Arc::new)
        .map_err(|e| invalid("spec.listeners.tls", &policy.display().to_string(), e))
}

/// Where allowed traffic goes: `--upstream` (central proxies), `--upstream-proxy` (an HTTP
/// proxy) or, with neither, direct. The command line refuses both at once.
pub(super) fn connector(args: &ProxyArgs, config: &ProxyConfig) -> Result<Connector, SettingsError> {
    if let Some(centrals) = centrals(args)? {
        return Ok(Connector::Central(centrals));
    }
    Ok(upstream_proxy(args, config)?.map_or(Connector::Direct, Connector::UpstreamProxy))
}

/// `--upstream https://HOST:PORT` (repeatable) with the node's TLS files, read now.
fn centrals(
    args: &ProxyArgs,
) -> Result<Option<std::sync::Arc<sandgate_proxy::dial::Centrals>>, SettingsError> {
    if args.upstream.is_empty() {
        return Ok(None);
    }
    let (Some(ca), Some(cert), Some(key)) = (&args.upstream_ca, &args.client_cert, &args.client_key) else {
        return Err(invalid(
            "--upstream",
            &args.upstream.join(" "),
            "needs --upstream-ca, --client-cert and --client-key",
        ));
    };
    let files = sandgate_proxy::transport::ClientFiles {
        ca: ca.clone(),
        cert: cert.clone(),
        key: key.clone(),
        http1: args.upstream_transport.as_deref() == Some("http1"),
    };
    use sandgate_proxy::dial::{Centrals, CentralsError};
    match Centrals::from_urls(&args.upstream, files) {
        Ok(c) => Ok(Some(std::sync::Arc::new(c))),
        Err(CentralsError::Url(u, e)) => Err(invalid("--upstream", &u, e)),
        Err(CentralsError::Tls(e)) => Err(invalid("--client-cert", &cert.display().to_string(), e)),
    }
}

/// `--upstream-proxy`: `IP:PORT`, `HOST:PORT` or `http://HOST:PORT[/]`. A name is resolved
/// once, here, through the proxy's own resolver (`config.nameservers`; never getaddrinfo),
/// and the first address is used for as long as the proxy runs.
fn upstream_proxy(args: &ProxyArgs, config: &ProxyConfig) -> Result<Option<SocketAddr>, SettingsError> {
    let Some(value) = args.upstream_proxy.as_deref() else {
        return Ok(None);
    };
    let bad = |why: &str| invalid("--upstream-proxy", value, why);
    let authority = match value.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest.strip_suffix('/').unwrap_or(rest),
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => {
            return Err(bad(
                "TLS to the upstream proxy is not supported; use http://HOST:PORT",
            ));
        }
        Some(_) => return Err(bad("expected IP:PORT, HOST:PORT or http://HOST:PORT")),
        None => value,
    };
    if let Ok(addr) = authority.parse::<SocketAddr>() {
        return Ok(Some(addr));
    }
    let target = sandgate_policy::parse_connect_target(authority)
        .map_err(|e| bad(&format!("expected IP:PORT, HOST:PORT or http://HOST:PORT ({e})")))?;
    let dial = sandgate_proxy::dial::DialConfig {
        nameservers: config.nameservers.clone(),
        dns_timeout: config.limits.dns_timeout,
        connect_timeout: config.limits.connect_timeout,
        guard: AddressGuard::new(Vec::new()),
        connector: Default::default(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| bad(&format!("cannot start a resolver: {e}")))?;
    let ips = runtime.block_on(async {
        let dialer = sandgate_proxy::dial::Dialer::new(&dial, Vec::new()).map_err(|e| e.to_string())?;
        dialer.lookup(&target).await.map_err(|e| e.to_string())
    });
    match ips.as_deref() {
        Ok([first, ..]) => Ok(Some(SocketAddr::new(*first, target.port))),
        Ok([]) => Err(bad("the name has no address")),
        Err(e) => Err(bad(&format!("cannot resolve {}: {e}", target.host))),
    }
}
