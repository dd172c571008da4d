//! Policy files: the YAML `EgressPolicy` document, parsed and validated into a [`PolicyFile`]
//! that cannot hold an invalid value. See docs/policy.md for the schema.
//!
//! Parsing is pure: it takes the text, the file name for messages, and the current time (for
//! `ttl_seconds`); reading the file is the caller's job. Unknown fields, bad patterns, bad
//! CIDRs, ports out of range and non-positive TTLs are errors; every error found is reported,
//! each as `file:line: field: message`.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use ipnet::IpNet;

mod checker;
mod control;
mod embedded;
mod nodes;
mod raw;
mod syntax;

use checker::Checker;
pub use embedded::{Entries, EntryList, entries};
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

use raw::*;

use crate::pattern::Pattern;
use crate::preset;

/// The only `apiVersion` understood.
pub const API_VERSION: &str = "sandgate.dev/v1";
/// The only `kind` understood.
pub const KIND: &str = "EgressPolicy";

/// Who an entry applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every request.
    System,
    /// Requests attributed to this project.
    Project(String),
    /// Requests attributed to this task.
    Task(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::System => f.write_str("system"),
            Scope::Project(p) => write!(f, "project:{p}"),
            Scope::Task(t) => write!(f, "task:{t}"),
        }
    }
}

/// One allow or deny entry, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub pattern: Pattern,
    /// Exactly these ports (replaces the pattern's default ports).
    pub ports: Option<Vec<u16>>,
    pub scope: Scope,
    /// Unix seconds; the entry is absent from this second on (`now >= expires_at`).
    pub expires_at: Option<i64>,
    pub created_by: Option<String>,
    pub reason: Option<String>,
    /// Where it came from: `file:line`, `preset:NAME` or `flag`.
    pub origin: Arc<str>,
}

impl Entry {
    /// A system-scope entry given on the command line.
    pub fn from_flag(pattern: Pattern) -> Entry {
        Entry {
            pattern,
            ports: None,
            scope: Scope::System,
            expires_at: None,
            created_by: None,
            reason: None,
            origin: Arc::from("flag"),
        }
    }
}

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
    /// The node-local proxies a `role: node` listener serves (`spec.nodes`).
    pub nodes: crate::node::Nodes,
    /// What is valid but probably not meant (an expired entry, a CIDR with host bits, a
    /// host both allowed and denied): `check-config` and the proxy print them.
    pub warnings: Vec<DocError>,
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

/// Parses and validates a policy file. `now` (Unix seconds) anchors `ttl_seconds`.
pub fn parse_policy(text: &str, file: &str, now: i64) -> Result<PolicyFile, DocErrors> {
    let raw: RawDoc =
        serde_saphyr::from_str(text).map_err(|e| DocErrors(vec![syntax::parse_error(&e, text, file)]))?;
    let mut c = Checker {
        file,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    if raw.api_version.value != API_VERSION {
        c.error(
            raw.api_version.referenced.line(),
            "apiVersion",
            format!("expected {API_VERSION:?}"),
        );
    }
    if raw.kind.value != KIND {
        c.error(raw.kind.referenced.line(), "kind", format!("expected {KIND:?}"));
    }
    let _ = &raw.metadata.labels;
    let net = &raw.spec.network;
    let allow: Vec<Entry> = net
        .allowlist
        .iter()
        .filter_map(|e| c.entry(e, "spec.network.allowlist", now))
        .collect();
    let deny: Vec<Entry> = net
        .denylist
        .iter()
        .filter_map(|e| c.entry(e, "spec.network.denylist", now))
        .collect();
    checker::shadowed(&mut c, "spec.network.allowlist", &allow, &deny);
    let mut allow = allow;
    for name in &net.presets {
        match preset::hosts(&name.value) {
            Some(hosts) => allow.extend(hosts.iter().filter_map(|h| {
                Pattern::parse(h).ok().map(|pattern| Entry {
                    pattern,
                    ports: Some(vec![443]),
                    scope: Scope::System,
                    expires_at: None,
                    created_by: None,
                    reason: Some(format!("preset {}", name.value)),
                    origin: Arc::from(format!("preset:{}", name.value)),
                })
            })),
            None => c.error(
                name.referenced.line(),
                "spec.network.presets",
                format!(
                    "unknown preset {:?} (known: {})",
                    name.value,
                    preset::NAMES.join(", ")
                ),
            ),
        }
    }
    let mut allow_ranges = Vec::new();
    for r in &net.allow_ranges {
        match r.value.parse::<IpNet>() {
            Ok(net) if net != net.trunc() => {
                c.warn(
                    r.referenced.line(),
                    "spec.network.allow_ranges",
                    format!(
                        "{} has host bits set; it means {} (write that)",
                        r.value,
                        net.trunc()
                    ),
                );
                allow_ranges.push(net.trunc());
            }
            Ok(net) => allow_ranges.push(net.trunc()),
            Err(_) => c.error(
                r.referenced.line(),
                "spec.network.allow_ranges",
                format!("{:?} is not a CIDR", r.value),
            ),
        }
    }
    let resolver = raw.spec.resolver.as_ref().map(|r| {
        let line = r.referenced.line();
        let mut servers = Vec::new();
        for s in &r.value.servers {
            match s
                .parse::<SocketAddr>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
            {
                Ok(addr) => servers.push(addr),
                Err(_) => c.error(
                    line,
                    "spec.resolver.servers",
                    format!("{s:?} is not IP or IP:PORT"),
                ),
            }
        }
        let timeout_ms = match r.value.timeout_ms {
            Some(ms) if ms <= 0 => {
                c.error(
                    line,
                    "spec.resolver.timeout_ms",
                    format!("must be positive, got {ms}"),
                );
                None
            }
            other => other.map(|ms| ms as u64),
        };
        ResolverSpec { servers, timeout_ms }
    });
    let mut listeners = Vec::new();
    // Every address the file binds, with its line and field: two that overlap cannot both
    // be bound, and that is known before binding.
    let mut binds: Vec<(SocketAddr, u64, &str)> = Vec::new();
    for l in &raw.spec.listeners {
        let line = l.referenced.line();
        let require_auth = match l.value.auth.as_deref() {
            None | Some("none") => false,
            Some("basic") => true,
            Some(other) => {
                c.error(
                    line,
                    "spec.listeners.auth",
                    format!("{other:?}: use basic or none"),
                );
                false
            }
        };
        for (value, field) in [
            (&l.value.task, "spec.listeners.task"),
            (&l.value.project, "spec.listeners.project"),
            (&l.value.job, "spec.listeners.job"),
            (&l.value.subject, "spec.listeners.subject"),
        ] {
            if let Some(v) = value.as_deref().filter(|v| !crate::ids::valid(v)) {
                c.error(line, field, format!("{v:?}: {}", crate::ids::ID_RULE));
            }
        }
        if require_auth && l.value.task.is_some() {
            c.error(
                line,
                "spec.listeners.task",
                "a listener takes its task from credentials (auth: basic) or from `task`, not both",
            );
        }
        // A credential's identity comes only from its own record: a listener-wide project
        // would let a task with none pick a project's scope by choosing the listener.
        if require_auth && l.value.project.is_some() {
            c.error(
                line,
                "spec.listeners.project",
                "an auth: basic listener takes the project from each task's credential (spec.auth.tasks[].project), not from the listener",
            );
        }
        let socks5 = match l.value.protocol.as_deref() {
            None | Some("http") => false,
            Some("socks5") => true,
            Some(other) => {
                c.error(
                    line,
                    "spec.listeners.protocol",
                    format!("{other:?}: use http or socks5"),
                );
                false
            }
        };
        let node_tls = nodes::listener_role(&mut c, line, &l.value);
        match l.value.listen.parse::<SocketAddr>() {
            Ok(listen) => {
                binds.push((listen, line, "spec.listeners.listen"));
                listeners.push(ListenerSpec {
                    listen,
                    task: l.value.task.clone(),
                    project: l.value.project.clone(),
                    job: l.value.job.clone(),
                    subject: l.value.subject.clone(),
                    require_auth,
                    socks5,
                    node_tls,
                });
            }
            Err(_) => c.error(
                line,
                "spec.listeners.listen",
                format!("{:?} is not IP:PORT", l.value.listen),
            ),
        }
    }
    let mut task_secrets = Vec::new();
    for t in raw.spec.auth.iter().flat_map(|a| a.tasks.iter()) {
        let line = t.referenced.line();
        let secret = match (&t.value.secret_sha256, &t.value.secret_sha256_file) {
            (Some(hex), None) => match crate::auth::TaskCredential::from_hex(t.value.task.clone(), None, hex)
            {
                Ok(_) => Some(SecretSource::Inline(hex.clone())),
                Err(e) => {
                    c.error(line, "spec.auth.tasks.secret_sha256", e.to_string());
                    None
                }
            },
            (None, Some(path)) => Some(SecretSource::File(path.clone())),
            _ => {
                c.error(
                    line,
                    "spec.auth.tasks",
                    "give exactly one of secret_sha256 or secret_sha256_file",
                );
                None
            }
        };
        if !crate::ids::valid(&t.value.task) {
            let m = format!("{:?}: {}", t.value.task, crate::ids::ID_RULE);
            c.error(line, "spec.auth.tasks.task", m);
        }
        if let Some(p) = t.value.project.as_deref().filter(|p| !crate::ids::valid(p)) {
            c.error(
                line,
                "spec.auth.tasks.project",
                format!("{p:?}: {}", crate::ids::ID_RULE),
            );
        }
        if let Some(secret) = secret {
            task_secrets.push(TaskSecretSpec {
                task: t.value.task.clone(),
                project: t.value.project.clone(),
                secret,
                origin: format!("{file}:{line}"),
            });
        }
    }
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
    for (i, (addr, line, field)) in binds.iter().enumerate() {
        if let Some((other, other_line, _)) = binds.iter().take(i).find(|(a, _, _)| binds_overlap(*a, *addr))
        {
            c.error(
                *line,
                *field,
                format!("{addr} overlaps {other} (line {other_line}): both cannot be bound; give each listener its own address or port"),
            );
        }
    }
    if !c.errors.is_empty() {
        return Err(DocErrors(c.errors));
    }
    Ok(PolicyFile {
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
        nodes,
    })
}
