//! The proxy's configuration, as a typed value that can only hold valid settings. The CLI
//! (or a test) builds it; nothing here reads the environment or files.

use std::borrow::Cow;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandgate_policy::{AddressGuard, Ruleset};

use crate::audit::AuditDestination;
use crate::dial::Nameservers;

/// Bounds on what one client may cost.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request head accepted (431 beyond it).
    pub max_head_bytes: usize,
    /// Time for a whole request head to arrive once the client starts sending (408 after)
    /// and, on a kept-alive connection, for the next one to start (then closed quietly).
    pub head_timeout: Duration,
    /// Time to establish the upstream TCP connection (504 after).
    pub connect_timeout: Duration,
    /// Time for DNS answers (504 after).
    pub dns_timeout: Duration,
    /// Time for the upstream's response head once the request is sent (504 after).
    pub response_timeout: Duration,
    /// A body relay that moves no byte this long is abandoned.
    pub body_idle_timeout: Duration,
    /// A tunnel that moves no byte either way this long is closed.
    pub tunnel_idle_timeout: Duration,
    /// Client connections served at once by the whole proxy; beyond it, 503.
    pub max_connections: usize,
    /// Connections one listener may hold, an HTTP/1 and a SOCKS5 listener of one tenant
    /// counting as one (`None`: the whole cap with one listener, else an equal share but at
    /// least a quarter of the cap).
    pub max_connections_per_listener: Option<usize>,
    /// Connections one client address may hold on each listener (an HTTP/1 and a SOCKS5
    /// listener of one tenant counting as one, `server/pools.rs`): `Some(n)` is a hard cap;
    /// `None` is a share of a quarter of the cap, which a client may go past while a reserve
    /// stays free for others (see `admission`).
    pub max_connections_per_client: Option<usize>,
    /// After SIGTERM, how long in-flight work may take before it is cut.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head_bytes: 16 * 1024,
            head_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            dns_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(60),
            body_idle_timeout: Duration::from_secs(60),
            tunnel_idle_timeout: Duration::from_secs(900),
            max_connections: 16_384,
            max_connections_per_listener: None,
            max_connections_per_client: None,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl Limits {
    /// The limit of each of `listeners` listeners (pools of listeners: see `server/pools.rs`).
    pub fn per_listener(&self, listeners: usize) -> usize {
        self.max_connections_per_listener.unwrap_or(match listeners {
            0 | 1 => self.max_connections,
            n => (self.max_connections / n).max(self.max_connections / 4).max(1),
        })
    }

    /// Each client address's share: the hard cap when set, else the default share.
    pub fn per_client(&self) -> usize {
        self.max_connections_per_client
            .unwrap_or((self.max_connections / 4).max(1))
    }
}

/// Who the traffic arriving on a listener belongs to. A sandbox gets its own listener and so
/// its own identity without holding any secret.
pub use sandgate_policy::Identity;

/// The source addresses allowed to connect to a listener. The sandbox runner registers the
/// local address of each bridge connection before it connects, so its proxy serves its own
/// sandbox only: any other local process is closed on at once, before a byte is read.
#[derive(Debug, Clone, Default)]
pub struct PeerFilter(Arc<Mutex<HashSet<SocketAddr>>>);

impl PeerFilter {
    pub fn new() -> PeerFilter {
        PeerFilter::default()
    }

    /// Whether `other` is this very filter (a clone of it), not one equal by content.
    pub(crate) fn same(&self, other: &PeerFilter) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    pub fn allow(&self, addr: SocketAddr) {
        if let Ok(mut set) = self.0.lock() {
            set.insert(addr);
        }
    }

    pub fn forget(&self, addr: SocketAddr) {
        if let Ok(mut set) = self.0.lock() {
            set.remove(&addr);
        }
    }

    pub fn permits(&self, addr: SocketAddr) -> bool {
        self.0.lock().is_ok_and(|set| set.contains(&addr))
    }
}

impl PartialEq for PeerFilter {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for PeerFilter {}

/// What a listener speaks, with what that needs: a combination that means nothing (a node
/// listener that asks for passwords, SOCKS5 over mutual TLS) cannot be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontEnd {
    /// HTTP/1.1 forward proxy: absolute-form requests and CONNECT. `require_auth`: requests
    /// must carry task credentials (`Proxy-Authorization: Basic`); the task and project then
    /// come from the credentials.
    Http1 { require_auth: bool },
    /// SOCKS5 (RFC 1928), CONNECT only; with `require_auth`, an RFC 1929 login as task
    /// credentials.
    Socks5 { require_auth: bool },
    /// A central proxy's listener for node-local proxies (`role: node`): mutual TLS and
    /// HTTP/2 streams; the identity comes from each stream, vouched for by its node.
    Node(Arc<crate::transport::NodeListener>),
}

impl FrontEnd {
    /// The role the start-up log names it by.
    pub fn role(&self) -> &'static str {
        match self {
            FrontEnd::Http1 { .. } => "proxy",
            FrontEnd::Socks5 { .. } => "socks5",
            FrontEnd::Node(_) => "node",
        }
    }

    /// Whether requests must carry task credentials.
    pub fn require_auth(&self) -> bool {
        match self {
            FrontEnd::Http1 { require_auth } | FrontEnd::Socks5 { require_auth } => *require_auth,
            FrontEnd::Node(_) => false,
        }
    }
}

/// One address to listen on, and the identity of what arrives there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub addr: SocketAddr,
    pub identity: Identity,
    /// When set, only these peers are served (the sandbox runner's bridge).
    pub peers: Option<PeerFilter>,
    pub front_end: FrontEnd,
}

impl Listener {
    /// A plain HTTP/1 listener whose traffic has no task or project (system entries only).
    pub fn system(addr: SocketAddr) -> Listener {
        Listener {
            addr,
            identity: Identity::default(),
            peers: None,
            front_end: FrontEnd::Http1 { require_auth: false },
        }
    }
}

/// Everything [`crate::Proxy::bind`] needs.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub listen: Vec<Listener>,
    pub rules: Ruleset,
    pub guard: AddressGuard,
    pub nameservers: Nameservers,
    pub audit: AuditDestination,
    pub limits: Limits,
    /// Rotation and fsync of a file audit log.
    pub audit_options: crate::audit::AuditOptions,
    /// Where allowed traffic goes: direct, an upstream HTTP proxy (`--upstream-proxy`), or
    /// central proxies (`--upstream https://...`).
    pub connector: crate::dial::Connector,
    /// The admin listener serving `/metrics`, if any.
    pub metrics_listen: Option<SocketAddr>,
    /// How a refusal says the fix, in the words of whoever configured the proxy.
    pub remedies: Remedies,
}

/// How a refusal's body says the fix, in the terms of whoever set the proxy up: `sandgate
/// proxy` is configured by an `EgressPolicy` and its flags ([`Remedies::default`]), a
/// sandboxed run by its `SandboxPolicy` and `sandgate run`'s flags. Plain words given by the
/// caller; this crate knows no caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remedies {
    /// Where an allowlist entry goes, and the flag that adds one.
    pub allow_hint: Setting,
    /// Where a range exempt from the address guard goes, and the flag that adds one.
    pub range_hint: Setting,
    /// The audit log that records the refused request: named beside its request id, so
    /// `sandgate explain --request-id ID --audit-log PATH` finds it wherever it is kept.
    pub audit_log: Option<PathBuf>,
}

/// A setting in the configuration's own words: the field (`spec.network.allowlist`) and,
/// when there is one, the command-line flag that does the same (`--allow`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub field: Cow<'static, str>,
    pub flag: Option<Cow<'static, str>>,
}

impl Setting {
    /// `field, or FLAG VALUE` (`field` alone without a flag), for a hint's parentheses.
    pub fn say(&self, value: &str) -> String {
        match &self.flag {
            Some(flag) => format!("{}, or {flag} {value}", self.field),
            None => self.field.to_string(),
        }
    }
}

impl Default for Remedies {
    /// `sandgate proxy`'s words: the `EgressPolicy` fields and the proxy's flags; the audit
    /// log unnamed (the proxy's own `--audit-log`, which `explain` is told the same way).
    fn default() -> Remedies {
        Remedies {
            allow_hint: Setting {
                field: Cow::Borrowed("spec.network.allowlist"),
                flag: Some(Cow::Borrowed("--allow")),
            },
            range_hint: Setting {
                field: Cow::Borrowed("spec.network.allow_ranges"),
                flag: Some(Cow::Borrowed("--allow-range")),
            },
            audit_log: None,
        }
    }
}
