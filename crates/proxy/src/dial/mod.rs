//! The one module that reaches out: DNS resolution, the address guard, and the outbound TCP
//! connect. Nothing else in sandgate opens an outbound socket or asks a resolver anything
//! (clippy's `disallowed-methods` holds that line; see `clippy.toml`).
//!
//! The sequence is fixed: a name the policy allowed is resolved once, through the configured
//! nameservers only (hickory-resolver; never the system's getaddrinfo, never /etc/hosts,
//! never a search domain: names are queried as fully qualified). Every A and AAAA answer is
//! classified; one forbidden answer denies the name. Then the connection goes to the vetted
//! [`SocketAddr`]s and never to the name again, so a DNS answer that changes between check and
//! use (rebinding) cannot reach an address that was not checked. Addresses assigned to the
//! host's own interfaces are refused like loopback (an operator's allow range may name
//! them), and the proxy's own listening and admin ports on any local address are refused
//! always, so it cannot be made to loop into itself or launder one listener's identity
//! through another.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::rr::Name;
use sandgate_policy::{Access, AddrClass, AddressGuard, Host, Prohibited, Target};
use tokio::net::TcpStream;

use crate::metrics::Metrics;
use crate::relay::Upstream;

pub mod central;

pub use central::{Centrals, CentralsError, Hop, UpstreamUrlError};

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
    pub connector: Connector,
}

/// Where allowed traffic goes: one of three, so no two can be configured at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Connector {
    /// To the destinations, resolved and guarded here.
    #[default]
    Direct,
    /// Through this HTTP proxy instead of dialling destinations: no local DNS, and the
    /// upstream proxy applies its own policy and address guard.
    UpstreamProxy(SocketAddr),
    /// To these central proxies over mutual TLS, one HTTP/2 stream each (no local DNS for
    /// destinations; the central decides again and dials).
    Central(Arc<Centrals>),
}

/// Addresses that passed the guard for one target, in the resolver's order; when chained,
/// the upstream proxy's address instead (which vets the destination itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VettedAddrs {
    addrs: Vec<SocketAddr>,
}

impl VettedAddrs {
    /// The first address, reported in the audit log as `resolved_ip`.
    pub fn primary(&self) -> Option<IpAddr> {
        self.addrs.first().map(SocketAddr::ip)
    }

    /// Every vetted address.
    pub fn ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.addrs.iter().map(SocketAddr::ip)
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
    /// No central proxy could be reached; names the last one tried and why.
    #[error("no central proxy is reachable: {0}")]
    CentralUnavailable(String),
}

/// The addresses assigned to this host's interfaces, read from the kernel (getifaddrs) at
/// most once a second, so an address added while the proxy runs is guarded within a second.
#[derive(Debug)]
struct HostAddrs {
    cached: Mutex<(Option<Instant>, Arc<[IpAddr]>)>,
}

/// How long a reading of the host's addresses is used.
const HOST_ADDRS_TTL: Duration = Duration::from_secs(1);

impl HostAddrs {
    fn new() -> HostAddrs {
        HostAddrs {
            cached: Mutex::new((None, Arc::from(Vec::new()))),
        }
    }

    fn current(&self) -> Arc<[IpAddr]> {
        let mut cached = match self.cached.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        if cached.0.is_none_or(|at| at.elapsed() >= HOST_ADDRS_TTL) {
            *cached = (Some(Instant::now()), Arc::from(read_host_addrs()));
        }
        cached.1.clone()
    }
}

#[cfg(target_os = "linux")]
fn read_host_addrs() -> Vec<IpAddr> {
    match nix::ifaddrs::getifaddrs() {
        Ok(addrs) => addrs
            .filter_map(|a| {
                let addr = a.address?;
                addr.as_sockaddr_in()
                    .map(|v4| IpAddr::V4(v4.ip()))
                    .or_else(|| addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
            })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the host's addresses; only loopback is known local");
            Vec::new()
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn read_host_addrs() -> Vec<IpAddr> {
    Vec::new()
}

/// How long the next hop may take: to answer a request, and to take any of what is
/// written to it (a relay that must write before it reads on gives up after `stall`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HopTimes {
    pub answer: Duration,
    pub stall: Duration,
}

/// Resolves, vets and connects. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Dialer {
    resolver: TokioResolver,
    guard: AddressGuard,
    connect_timeout: Duration,
    /// The proxy's listening and admin addresses.
    own_listeners: Vec<SocketAddr>,
    host_addrs: HostAddrs,
    metrics: Option<Arc<Metrics>>,
    connector: Connector,
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
            host_addrs: HostAddrs::new(),
            metrics: None,
            connector: config.connector.clone(),
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
        if let Connector::Central(_) = self.connector {
            // Names are neither resolved nor guarded here: the central proxy does both. An
            // address literal naming one of this proxy's own ports is refused here too, so
            // a central whose ranges reach this host cannot be made to loop back into it.
            if let Host::Ip(ip) = &target.host {
                let addr = SocketAddr::new(*ip, target.port);
                if self.is_own_listener(addr, &self.host_addrs.current()) {
                    return Err(DialError::SelfConnect(*ip));
                }
            }
            return Ok(VettedAddrs { addrs: Vec::new() });
        }
        if let Connector::UpstreamProxy(upstream) = self.connector {
            // The name is never resolved here; the upstream proxy resolves and guards it.
            return Ok(VettedAddrs {
                addrs: vec![upstream],
            });
        }
        let ips = match &target.host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => self.resolve(name.as_str()).await?,
        };
        let host = self.host_addrs.current();
        let addrs: Vec<SocketAddr> = ips.iter().map(|ip| SocketAddr::new(*ip, target.port)).collect();
        // The loop guard first: it holds even where an allow range exempts the address.
        if let Some(own) = addrs.iter().find(|a| self.is_own_listener(**a, &host)) {
            return Err(DialError::SelfConnect(own.ip()));
        }
        self.guard.vet_all(&ips).map_err(DialError::Prohibited)?;
        self.guard
            .vet_not_host(&ips, &host)
            .map_err(DialError::Prohibited)?;
        Ok(VettedAddrs { addrs })
    }

    /// Whether allowed traffic goes through an upstream proxy instead of to destinations.
    pub fn is_chained(&self) -> bool {
        !matches!(self.connector, Connector::Direct)
    }

    /// Whether requests go to a proxy, which takes them in absolute form: an HTTP upstream
    /// proxy, or a central proxy, whose stream of plain HTTP requests it decides and records
    /// request by request.
    pub fn sends_absolute_form(&self) -> bool {
        self.is_chained()
    }

    /// The central proxies, when this is a node-local proxy.
    pub fn centrals(&self) -> Option<&Arc<Centrals>> {
        match &self.connector {
            Connector::Central(c) => Some(c),
            _ => None,
        }
    }

    /// Connects to a vetted destination, ready for the request's bytes: directly, or, when
    /// chained, to the upstream proxy, which for a tunnel is first asked to open it.
    pub(crate) async fn open(
        self: &Arc<Self>,
        vetted: &VettedAddrs,
        target: &Target,
        access: Access,
        identity: &sandgate_policy::Identity,
        times: HopTimes,
    ) -> Result<(Upstream, SocketAddr), DialError> {
        let timeout = times.answer;
        if let Connector::Central(central) = &self.connector {
            return central.open(self, target, access, identity, times).await;
        }
        let (mut stream, addr) = self.connect(vetted).await?;
        // Every tunnel kind (CONNECT and SOCKS5) is opened as a CONNECT upstream; handing a
        // SOCKS5 client the raw connection to the upstream proxy would let it send that
        // proxy requests for any destination.
        if self.is_chained() && access.is_tunnel() {
            self.upstream_tunnel(&mut stream, target, timeout).await?;
        }
        Ok((Upstream::Tcp(stream), addr))
    }

    /// Asks the upstream proxy for a tunnel to `target` on a fresh connection to it
    /// (RFC 9110 section 9.3.6). The answer's head is bounded in size and time.
    async fn upstream_tunnel(
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
        match crate::h1::head::parse_response_head(&head, "CONNECT") {
            Ok(Some((h, _))) if (200..300).contains(&h.status) => Ok(()),
            Ok(Some((h, _))) => Err(DialError::UpstreamRefused(h.status)),
            _ => Err(DialError::UpstreamBroken),
        }
    }

    /// A central proxy's address: its IP, or its name resolved through the configured
    /// nameservers (an operator's setting, not a client's string; the first answer).
    async fn central_addr(&self, hop: &Hop) -> Result<SocketAddr, DialError> {
        let ip = match hop.host.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => *self
                .resolve(&hop.host)
                .await?
                .first()
                .ok_or_else(|| DialError::Dns("no addresses".into()))?,
        };
        Ok(SocketAddr::new(ip, hop.port))
    }

    /// Connects to a central proxy, within the connect timeout.
    async fn connect_central(&self, addr: SocketAddr) -> Result<TcpStream, DialError> {
        connect_one(addr, tokio::time::Instant::now() + self.connect_timeout).await
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

    /// Is `addr` one of the proxy's own ports on an address of this host? Any local address
    /// counts, whatever the listener is bound to: a wildcard listener answers on all of them,
    /// and refusing the rest costs nothing legitimate.
    /// An IPv6 form that carries an IPv4 address counts as it too.
    fn is_own_listener(&self, addr: SocketAddr, host: &[IpAddr]) -> bool {
        let local = sandgate_policy::addr::on_host(addr.ip(), host)
            || sandgate_policy::addr::reached(addr.ip()).any(|ip| {
                ip.is_loopback()
                    || ip.is_unspecified()
                    || self.own_listeners.iter().any(|own| own.ip().to_canonical() == ip)
            });
        local && self.own_listeners.iter().any(|own| own.port() == addr.port())
    }

    /// Connects to the first vetted address that answers, within the connect timeout.
    async fn connect(&self, vetted: &VettedAddrs) -> Result<(TcpStream, SocketAddr), DialError> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let mut last = DialError::ConnectTimeout;
        for addr in &vetted.addrs {
            let started = std::time::Instant::now();
            let attempt = connect_one(*addr, deadline).await;
            if let Some(m) = &self.metrics {
                m.connect_seconds.observe(started.elapsed().as_secs_f64());
            }
            match attempt {
                Ok(stream) => return Ok((stream, *addr)),
                Err(DialError::ConnectTimeout) => return Err(DialError::ConnectTimeout),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// One outbound TCP connect, finished by `deadline`: `Refused`, `Connect` or
/// `ConnectTimeout` when it fails.
async fn connect_one(addr: SocketAddr, deadline: tokio::time::Instant) -> Result<TcpStream, DialError> {
    #[expect(clippy::disallowed_methods, reason = "the one place that dials out")]
    let attempt = tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await;
    match attempt {
        Ok(Ok(stream)) => {
            // Latency matters more than packet count for proxied request/response.
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Err(DialError::Refused),
        Ok(Err(e)) => Err(DialError::Connect(e)),
        Err(_) => Err(DialError::ConnectTimeout),
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

    /// A refusal by the address guard or the loop guard: the request's deny, not an
    /// upstream failure.
    pub fn is_guard_refusal(&self) -> bool {
        matches!(self, DialError::Prohibited(_) | DialError::SelfConnect(_))
    }
}
