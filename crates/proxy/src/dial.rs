//! The one module that reaches out: DNS resolution, the address guard, and the outbound TCP
//! connect. Nothing else in sandgate opens an outbound socket or asks a resolver anything
//! (clippy's `disallowed-methods` holds that line; see `clippy.toml`).
//!
//! The sequence is fixed: a name the policy allowed is resolved once, through the configured
//! nameservers only (hickory-resolver; never the system's getaddrinfo, never /etc/hosts,
//! never a search domain: names are queried as fully qualified). Every A and AAAA answer is
//! classified; one forbidden answer denies the name. Then the connection goes to the vetted
//! [`SocketAddr`]s and never to the name again, so a DNS answer that changes between check and
//! use (rebinding) cannot reach an address that was not checked. The proxy's own listening
//! addresses are refused too, so it cannot be made to loop into itself.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::rr::Name;
use sandgate_policy::{AddrClass, AddressGuard, Host, Prohibited, Target};
use tokio::net::TcpStream;

use crate::metrics::Metrics;

/// Where DNS questions go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Nameservers {
    /// The nameservers of /etc/resolv.conf, read by hickory (not by glibc).
    System,
    /// Exactly these servers, over UDP with TCP fallback.
    Explicit(Vec<SocketAddr>),
}

/// Settings for [`Dialer::new`].
#[derive(Debug, Clone)]
pub struct DialConfig {
    pub nameservers: Nameservers,
    pub dns_timeout: Duration,
    pub connect_timeout: Duration,
    pub guard: AddressGuard,
    /// Send allowed traffic through this HTTP proxy instead of dialling destinations: no
    /// local DNS, and the upstream proxy applies its own policy and address guard.
    pub upstream_proxy: Option<SocketAddr>,
}

/// Addresses that passed the guard for one target, in the resolver's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VettedAddrs {
    addrs: Vec<SocketAddr>,
}

impl VettedAddrs {
    /// The first address, reported in the audit log as `resolved_ip`.
    pub fn primary(&self) -> Option<IpAddr> {
        self.addrs.first().map(SocketAddr::ip)
    }
}

/// Why a destination could not be vetted or reached. `Prohibited` is a policy outcome
/// (403); the others are upstream failures (502/504).
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("address {} is {}", .0.ip, .0.class.as_str())]
    Prohibited(Prohibited),
    #[error("address {0} is this proxy's own listener")]
    SelfConnect(IpAddr),
    #[error("DNS lookup failed: {0}")]
    Dns(String),
    #[error("DNS lookup timed out")]
    DnsTimeout,
    #[error("connection refused")]
    Refused,
    #[error("connect timed out")]
    ConnectTimeout,
    #[error("connect failed: {0}")]
    Connect(std::io::Error),
    #[error("the upstream proxy answered CONNECT with {0}")]
    UpstreamRefused(u16),
    #[error("the upstream proxy sent no usable answer to CONNECT")]
    UpstreamBroken,
}

/// Resolves, vets and connects. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Dialer {
    resolver: TokioResolver,
    guard: AddressGuard,
    connect_timeout: Duration,
    own_listeners: Vec<SocketAddr>,
    metrics: Option<Arc<Metrics>>,
    upstream_proxy: Option<SocketAddr>,
}

impl Dialer {
    /// Builds the resolver. Fails only when the system configuration cannot be read.
    pub fn new(config: &DialConfig, own_listeners: Vec<SocketAddr>) -> Result<Dialer, NetError> {
        let resolver_config = match &config.nameservers {
            Nameservers::System => hickory_resolver::system_conf::read_system_conf()?.0,
            Nameservers::Explicit(servers) => {
                let servers = servers.iter().map(|addr| {
                    let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
                    for conn in &mut ns.connections {
                        conn.port = addr.port();
                    }
                    ns
                });
                ResolverConfig::from_parts(None, Vec::new(), servers.collect())
            }
        };
        let mut builder =
            TokioResolver::builder_with_config(resolver_config, TokioRuntimeProvider::default());
        let opts: &mut ResolverOpts = builder.options_mut();
        opts.use_hosts_file = ResolveHosts::Never;
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.timeout = config.dns_timeout;
        opts.attempts = 1;
        opts.ndots = 0;
        Ok(Dialer {
            resolver: builder.build()?,
            guard: config.guard.clone(),
            connect_timeout: config.connect_timeout,
            own_listeners,
            metrics: None,
            upstream_proxy: config.upstream_proxy,
        })
    }

    /// Where to report DNS and connect latencies.
    pub fn set_metrics(&mut self, metrics: Arc<Metrics>) {
        self.metrics = Some(metrics);
    }

    /// The address guard in force.
    pub fn guard(&self) -> &AddressGuard {
        &self.guard
    }

    /// Resolves `target` (IP literals are not looked up) and vets every address.
    pub async fn vet(&self, target: &Target) -> Result<VettedAddrs, DialError> {
        if let Some(upstream) = self.upstream_proxy {
            // The name is never resolved here; the upstream proxy resolves and guards it.
            return Ok(VettedAddrs {
                addrs: vec![upstream],
            });
        }
        let ips = match &target.host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => self.resolve(name.as_str()).await?,
        };
        self.guard.vet_all(&ips).map_err(DialError::Prohibited)?;
        let addrs: Vec<SocketAddr> = ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, target.port))
            .collect();
        if let Some(own) = addrs.iter().find(|a| self.is_own_listener(**a)) {
            return Err(DialError::SelfConnect(own.ip()));
        }
        Ok(VettedAddrs { addrs })
    }

    /// The upstream proxy, when traffic is chained through one.
    pub fn upstream_proxy(&self) -> Option<SocketAddr> {
        self.upstream_proxy
    }

    /// Asks the upstream proxy for a tunnel to `target` on a fresh connection to it
    /// (RFC 9110 section 9.3.6). The answer's head is bounded in size and time.
    pub async fn upstream_tunnel(
        &self,
        stream: &mut TcpStream,
        target: &Target,
        timeout: Duration,
    ) -> Result<(), DialError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(DialError::Connect)?;
        let mut head = Vec::with_capacity(256);
        let mut byte = [0u8; 1];
        let read_head = async {
            // Byte at a time: nothing after the head may be consumed, it belongs to the tunnel.
            while !head.ends_with(b"\r\n\r\n") {
                if head.len() > 16 * 1024 || stream.read(&mut byte).await.map_err(DialError::Connect)? == 0 {
                    return Err(DialError::UpstreamBroken);
                }
                head.extend_from_slice(&byte);
            }
            Ok(())
        };
        tokio::time::timeout(timeout, read_head)
            .await
            .map_err(|_| DialError::UpstreamBroken)??;
        match crate::head::parse_response_head(&head, "CONNECT") {
            Ok(Some((h, _))) if (200..300).contains(&h.status) => Ok(()),
            Ok(Some((h, _))) => Err(DialError::UpstreamRefused(h.status)),
            _ => Err(DialError::UpstreamBroken),
        }
    }

    /// Every address `target` resolves to, unvetted (for `explain --resolve`).
    pub async fn lookup(&self, target: &Target) -> Result<Vec<IpAddr>, DialError> {
        match &target.host {
            Host::Ip(ip) => Ok(vec![*ip]),
            Host::Name(name) => self.resolve(name.as_str()).await,
        }
    }

    async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, DialError> {
        let mut fqdn = Name::from_ascii(name).map_err(|e| DialError::Dns(e.to_string()))?;
        fqdn.set_fqdn(true);
        let started = std::time::Instant::now();
        let lookup = self.resolver.lookup_ip(fqdn).await;
        if let Some(m) = &self.metrics {
            m.dns_seconds.observe(started.elapsed().as_secs_f64());
        }
        let lookup = lookup.map_err(|e| match e {
            NetError::Timeout => DialError::DnsTimeout,
            NetError::Dns(DnsError::NoRecordsFound(nr)) => DialError::Dns(nr.response_code.to_string()),
            other => DialError::Dns(other.to_string()),
        })?;
        let ips: Vec<IpAddr> = lookup.iter().collect();
        if ips.is_empty() {
            return Err(DialError::Dns("no addresses".to_owned()));
        }
        Ok(ips)
    }

    fn is_own_listener(&self, addr: SocketAddr) -> bool {
        self.own_listeners.iter().any(|own| {
            own.port() == addr.port()
                && (own.ip() == addr.ip()
                    || (own.ip().is_unspecified() && (addr.ip().is_loopback() || addr.ip().is_unspecified())))
        })
    }

    /// Connects to the first vetted address that answers, within the connect timeout.
    pub async fn connect(&self, vetted: &VettedAddrs) -> Result<(TcpStream, SocketAddr), DialError> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let mut last = DialError::ConnectTimeout;
        for addr in &vetted.addrs {
            let started = std::time::Instant::now();
            #[expect(clippy::disallowed_methods, reason = "the one place that dials out")]
            let attempt = tokio::time::timeout_at(deadline, TcpStream::connect(*addr)).await;
            if let Some(m) = &self.metrics {
                m.connect_seconds.observe(started.elapsed().as_secs_f64());
            }
            match attempt {
                Ok(Ok(stream)) => {
                    // Latency matters more than packet count for proxied request/response.
                    let _ = stream.set_nodelay(true);
                    return Ok((stream, *addr));
                }
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    last = DialError::Refused;
                }
                Ok(Err(e)) => last = DialError::Connect(e),
                Err(_) => return Err(DialError::ConnectTimeout),
            }
        }
        Err(last)
    }
}

impl DialError {
    /// The address class for a guard refusal, for the audit log.
    pub fn prohibited_class(&self) -> Option<AddrClass> {
        match self {
            DialError::Prohibited(p) => Some(p.class),
            _ => None,
        }
    }
}
