//! Policy files: the YAML `EgressPolicy` document, parsed and validated into a [`PolicyFile`]
//! that cannot hold an invalid value. See docs/policy.md for the schema.
//!
//! Parsing is pure: it takes the text, the file name for messages, and the current time (for
//! `ttl_seconds`); reading the file is the caller's job. Unknown fields, bad patterns, bad
//! CIDRs, ports out of range and non-positive TTLs are errors; every error found is reported,
//! each as `file:line: field: message`, structural ones (a tab, an unknown field) with the
//! rest: `recovery.rs` reads the document past them.
//!
//! The design's policy form (`apiVersion: agent-assembly.dev/v1alpha1`, `kind:
//! GovernancePolicy`, whose `spec.network.allowlist` is a list of patterns) is read as an
//! EgressPolicy, with a warning naming sandgate's own form ([`GOVERNANCE_KIND`]).
//!
//! A TTL counts from when its entry was first loaded: [`parse_policy_since`] takes the record
//! of the version in force ([`FirstLoaded`], `first_loaded.rs`), so a reload renews nothing.
//!
//! [`parse_policy`] converts the document section by section: `network.rs` the entries,
//! presets, `allow_ranges` and the resolver; `listeners.rs` the listeners, the task
//! credentials and overlapping binds; `checker.rs` each entry and the tunnel rules;
//! `nodes.rs` `spec.nodes`; `control.rs` `spec.exceptions` and `spec.admin`. The entry model
//! it produces ([`Entry`], [`Scope`]) is [`crate::entry`]'s, re-exported here.

use std::fmt;
use std::net::SocketAddr;

use ipnet::IpNet;

mod checker;
mod control;
pub mod credentials;
mod embedded;
mod first_loaded;
mod listeners;
mod network;
mod nodes;
mod raw;
mod recovery;
mod syntax;

use checker::Checker;
pub use embedded::{Entries, EntryList, entries};
pub use first_loaded::FirstLoaded;
pub use nodes::TlsSpec;

/// The `file:line: field: message` error for a document the YAML layer refused, for any
/// policy document (the sandbox policy's too): a tab in the indentation named as such, the
/// field's dotted path, the parser's message in the file's terms.
pub fn yaml_error(e: &serde_saphyr::Error, text: &str, file: &str) -> DocError {
    syntax::parse_error(e, text, file)
}

/// The line (1-based) where the key at dotted path `field` is written in a block-style
/// YAML document, so a check made after parsing can say `file:line: field: message` too.
pub fn line_of(text: &str, field: &str) -> Option<u64> {
    syntax::line_of(text, field)
}

use raw::RawDoc;

pub use crate::entry::{Entry, Scope};

/// sandgate's own `apiVersion`.
pub const API_VERSION: &str = "sandgate.dev/v1";
/// sandgate's own `kind`.
pub const KIND: &str = "EgressPolicy";
/// The design's `apiVersion` (agent-assembly's policy DSL), read as [`API_VERSION`] with
/// [`GOVERNANCE_KIND`].
pub const GOVERNANCE_API_VERSION: &str = "agent-assembly.dev/v1alpha1";
/// The design's `kind`: its `spec.network.allowlist` is read as an EgressPolicy's.
pub const GOVERNANCE_KIND: &str = "GovernancePolicy";

/// A listener declared in the file, with the identity of everything that arrives on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerSpec {
    pub listen: SocketAddr,
    pub task: Option<String>,
    pub project: Option<String>,
    pub job: Option<String>,
    /// Who starts what arrives here (recorded; forwarded to a central proxy).
    pub subject: Option<String>,
    /// Requests must carry task credentials (`auth: basic`); the task comes from them.
    pub require_auth: bool,
    /// `socks5` for a SOCKS5 listener (credentials as its RFC 1929 login); HTTP otherwise.
    pub socks5: bool,
    /// `role: node`: a central proxy's listener for node-local proxies (mutual TLS, HTTP/2
    /// streams), with its TLS files.
    pub node_tls: Option<TlsSpec>,
}

/// Where a task's secret hash is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// The hex SHA-256, in the file.
    Inline(String),
    /// A file holding the hex SHA-256 (relative paths are relative to the policy file).
    File(String),
}

/// A task's credential as declared; the loader reads referenced files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSecretSpec {
    pub task: String,
    pub project: Option<String>,
    pub secret: SecretSource,
    /// `file:line`, for errors found while loading.
    pub origin: String,
}

/// Resolver settings from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolverSpec {
    pub servers: Vec<SocketAddr>,
    pub timeout_ms: Option<u64>,
}

/// A validated policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFile {
    pub name: String,
    pub version: Option<String>,
    pub allow: Vec<Entry>,
    pub deny: Vec<Entry>,
    pub allow_ranges: Vec<IpNet>,
    pub resolver: Option<ResolverSpec>,
    pub listeners: Vec<ListenerSpec>,
    pub task_secrets: Vec<TaskSecretSpec>,
    /// Who may request exceptions, within which bounds (default: nobody).
    pub exceptions: crate::exception::ExceptionPolicy,
    pub admin: AdminSpec,
    /// What tunnels may carry (`spec.network.tunnels`).
    pub tunnels: crate::tunnel::TunnelRules,
    /// Secrets bound to a host and a header (`spec.network.credentials`), their values not
    /// read yet.
    pub credentials: Vec<credentials::CredentialSpec>,
    /// The node-local proxies a `role: node` listener serves (`spec.nodes`).
    pub nodes: crate::node::Nodes,
    /// What is valid but probably not meant (an expired entry, a CIDR with host bits, a
    /// host both allowed and denied, the design's form read as sandgate's): `check-config`
    /// and the proxy print them.
    pub warnings: Vec<DocError>,
    /// When each entry with a `ttl_seconds` was first loaded: what the next reload's TTLs
    /// count from ([`parse_policy_since`]).
    pub first_loaded: FirstLoaded,
}

/// `spec.admin`: where the admin API listens and who may use it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminSpec {
    pub listen: Option<SocketAddr>,
    pub tokens: Vec<TokenSpec>,
}

/// One admin API bearer token (only its SHA-256 is kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSpec {
    pub name: String,
    pub role: crate::auth::Role,
    pub secret: SecretSource,
    pub tasks: Vec<String>,
    pub origin: String,
}

/// One problem found in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocError {
    pub file: String,
    pub line: u64,
    pub field: String,
    pub message: String,
}

impl DocError {
    /// The line for a warning: `file:line: warning: field: message`.
    pub fn as_warning(&self) -> String {
        if self.field.is_empty() {
            format!("{}:{}: warning: {}", self.file, self.line, self.message)
        } else {
            format!(
                "{}:{}: warning: {}: {}",
                self.file, self.line, self.field, self.message
            )
        }
    }
}

impl fmt::Display for DocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}:{}: {}", self.file, self.line, self.message)
        } else {
            write!(f, "{}:{}: {}: {}", self.file, self.line, self.field, self.message)
        }
    }
}

/// Every problem found in a file (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DocErrors(pub Vec<DocError>);

impl fmt::Display for DocErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&lines.join("\n"))
    }
}

/// Whether listening on `a` and on `b` at once must fail with "address in use": the same
/// port (not 0, which picks a free one) on the same address, or on an unspecified address
/// (`0.0.0.0` or `[::]`) that covers the other. `[::]` is taken to cover IPv4 too, as on a
/// default dual-stack Linux.
pub fn binds_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() != b.port() || a.port() == 0 {
        return false;
    }
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    let covers = |wide: std::net::IpAddr, other: std::net::IpAddr| {
        wide.is_unspecified() && (wide.is_ipv6() || other.is_ipv4())
    };
    x == y || covers(x, y) || covers(y, x)
}

/// Parses and validates a policy file read for the first time. `now` (Unix seconds) anchors
/// `ttl_seconds`.
pub fn parse_policy(text: &str, file: &str, now: i64) -> Result<PolicyFile, DocErrors> {
    parse_policy_since(text, file, now, &FirstLoaded::new())
}

/// Parses and validates a policy file read again: each `ttl_seconds` counts from when its
/// entry was first loaded as `earlier` (the version in force's
/// [`PolicyFile::first_loaded`]) records it, and from `now` for an entry it does not know.
pub fn parse_policy_since(
    text: &str,
    file: &str,
    now: i64,
    earlier: &FirstLoaded,
) -> Result<PolicyFile, DocErrors> {
    // Structural errors (a tab, an unknown field, a key given twice) are reported with
    // everything the conversion finds in the rest of the document.
    let (raw, structural) = recovery::read::<RawDoc>(text, file);
    let Some(raw) = raw else {
        return Err(DocErrors(structural));
    };
    let mut c = Checker {
        file,
        errors: structural,
        warnings: Vec::new(),
        earlier,
        loaded: FirstLoaded::new(),
    };
    header(&mut c, &raw);
    let _ = &raw.metadata.labels;
    let net = &raw.spec.network;
    let (allow, deny) = network::entries(&mut c, net, now);
    let allow_ranges = network::allow_ranges(&mut c, &net.allow_ranges);
    let resolver = raw.spec.resolver.as_ref().map(|r| network::resolver(&mut c, r));
    // Every address the file binds, with its line and field: two that overlap cannot both
    // be bound, and that is known before binding.
    let mut binds = Vec::new();
    let listeners = listeners::listeners(&mut c, &raw.spec.listeners, &mut binds);
    let task_secrets = listeners::task_secrets(&mut c, raw.spec.auth.as_ref(), file);
    if listeners.iter().any(|l| l.require_auth) && task_secrets.is_empty() {
        c.error(
            0,
            "spec.auth.tasks",
            "a listener requires credentials but no task has any",
        );
    }
    let tunnels = net
        .tunnels
        .as_ref()
        .map(|t| checker::tunnels(&mut c, t))
        .unwrap_or_default();
    let credentials = credentials::specs(&mut c, &net.credentials, "spec.network.credentials", false);
    let node_listeners = raw
        .spec
        .listeners
        .iter()
        .any(|l| l.value.role.as_deref() == Some("node"));
    let nodes = nodes::nodes(&mut c, &raw.spec.nodes, node_listeners);
    let exceptions = control::exception_policy(&mut c, &raw.spec.exceptions);
    let admin = control::admin_spec(&mut c, raw.spec.admin.as_ref(), file);
    if let (Some(addr), Some(raw_admin)) = (admin.listen, raw.spec.admin.as_ref()) {
        binds.push((addr, raw_admin.referenced.line(), "spec.admin.listen"));
    }
    listeners::overlapping_binds(&mut c, &binds);
    if !c.errors.is_empty() {
        return Err(DocErrors(c.errors));
    }
    if raw.kind.value == GOVERNANCE_KIND && allow.is_empty() {
        c.warn(
            raw.kind.referenced.line(),
            "spec.network.allowlist",
            "empty: sandgate denies every request (default deny), where an empty allowlist meant no filter to aa-proxy",
        );
    }
    Ok(PolicyFile {
        first_loaded: c.loaded,
        warnings: c.warnings,
        name: raw.metadata.name,
        version: raw.metadata.version,
        allow,
        deny,
        allow_ranges,
        resolver,
        listeners,
        task_secrets,
        exceptions,
        admin,
        tunnels,
        credentials,
        nodes,
    })
}

/// The document's `apiVersion` and `kind`: sandgate's own, or the design's pair (read as
/// sandgate's, with a warning that names it).
fn header(c: &mut Checker<'_>, raw: &RawDoc) {
    let (api_version, kind) = (raw.api_version.value.as_str(), raw.kind.value.as_str());
    if kind == GOVERNANCE_KIND {
        if api_version == GOVERNANCE_API_VERSION {
            c.warn(
                raw.kind.referenced.line(),
                "kind",
                format!(
                    "{GOVERNANCE_API_VERSION} {GOVERNANCE_KIND} is read as sandgate's own form, apiVersion: {API_VERSION}, kind: {KIND} (docs/policy.md)"
                ),
            );
        } else {
            c.error(
                raw.api_version.referenced.line(),
                "apiVersion",
                format!("expected {GOVERNANCE_API_VERSION:?} with kind {GOVERNANCE_KIND} (or {API_VERSION:?} with kind {KIND})"),
            );
        }
        return;
    }
    if api_version != API_VERSION {
        c.error(
            raw.api_version.referenced.line(),
            "apiVersion",
            format!("expected {API_VERSION:?}"),
        );
    }
    if kind != KIND {
        c.error(raw.kind.referenced.line(), "kind", format!("expected {KIND:?}"));
    }
}
