//! `net.proxy.upstream: HOST:PORT`: the upstream proxy's name, resolved once at run start
//! through the run's own resolver (the proxy crate's `Dialer`, hickory, asking
//! `net.resolver.servers`, else a named EgressPolicy's resolver, else the nameservers of
//! `/etc/resolv.conf` as hickory reads them), never getaddrinfo. The first address is used
//! for the whole run, as `sandgate proxy --upstream-proxy NAME` does.
//!
//! The one function of the policy module that does I/O; parsing stays pure, and
//! `check-config` does not resolve.

use std::net::SocketAddr;

use sandgate_policy::AddressGuard;
use sandgate_proxy::Nameservers;
use sandgate_proxy::dial::{DialConfig, Dialer};

use super::SandboxPolicy;
use crate::error::RunError;

/// The run's nameservers: `net.resolver.servers`, else those of the EgressPolicy that
/// `net.egress_policy` names (read into `policy.egress` by then), else the host's.
pub fn nameservers(policy: &SandboxPolicy) -> Result<Nameservers, RunError> {
    let mut servers = policy
        .resolver_servers
        .iter()
        .map(|s| {
            s.parse::<SocketAddr>()
                .map_err(|_| RunError::Usage(format!("net.resolver.servers: {s:?} is not IP:PORT")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        servers.extend(
            policy
                .egress
                .as_deref()
                .and_then(|f| f.resolver.as_ref())
                .iter()
                .flat_map(|r| r.servers.iter().copied()),
        );
    }
    Ok(if servers.is_empty() {
        Nameservers::System
    } else {
        Nameservers::Explicit(servers)
    })
}

/// Fills `upstream_proxy` from `upstream_proxy_name`, when the policy has a name: a name
/// with no address, or no answer, stops the run before anything starts (exit 69).
pub async fn resolve(mut policy: SandboxPolicy) -> Result<SandboxPolicy, RunError> {
    let Some(target) = policy.upstream_proxy_name.clone() else {
        return Ok(policy);
    };
    let limits = sandgate_proxy::Limits::default();
    let dial = DialConfig {
        nameservers: nameservers(&policy)?,
        dns_timeout: limits.dns_timeout,
        connect_timeout: limits.connect_timeout,
        // The upstream proxy is the operator's choice, often on a private address: as for
        // `--upstream-proxy`, it is not vetted by the destinations' guard.
        guard: AddressGuard::new(Vec::new()),
        connector: Default::default(),
    };
    let failed = |why: String| {
        RunError::Unavailable(format!(
            "net.proxy.upstream: cannot resolve {}: {why}",
            target.host
        ))
    };
    let dialer = Dialer::new(&dial, Vec::new()).map_err(|e| failed(e.to_string()))?;
    let ips = dialer.lookup(&target).await.map_err(|e| failed(e.to_string()))?;
    let first = ips
        .first()
        .ok_or_else(|| failed("the name has no address".to_owned()))?;
    policy.upstream_proxy = Some(SocketAddr::new(*first, target.port));
    tracing::debug!(upstream = %target, addr = %SocketAddr::new(*first, target.port), "upstream proxy resolved");
    Ok(policy)
}
