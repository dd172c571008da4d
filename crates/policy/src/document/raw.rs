//! The raw, serde-facing shape of an `EgressPolicy` document: `deny_unknown_fields`
//! everywhere, `Spanned` where an error must name a line, and visitors for the short forms
//! (an entry as a bare string, a scope as `system`). `mod.rs` converts it into a
//! [`super::PolicyFile`] that cannot hold an invalid value.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_saphyr::Spanned;

use crate::entry::Scope;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDoc {
    #[serde(rename = "apiVersion")]
    pub(super) api_version: Spanned<String>,
    pub(super) kind: Spanned<String>,
    pub(super) metadata: RawMeta,
    #[serde(default)]
    pub(super) spec: RawSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMeta {
    pub(super) name: String,
    #[serde(default)]
    pub(super) version: Option<String>,
    #[serde(default)]
    pub(super) labels: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSpec {
    #[serde(default)]
    pub(super) network: RawNetwork,
    #[serde(default)]
    pub(super) resolver: Option<Spanned<RawResolver>>,
    #[serde(default)]
    pub(super) listeners: Vec<Spanned<RawListener>>,
    #[serde(default)]
    pub(super) auth: Option<RawAuth>,
    #[serde(default)]
    pub(super) exceptions: Vec<Spanned<RawExceptions>>,
    #[serde(default)]
    pub(super) admin: Option<Spanned<RawAdmin>>,
    #[serde(default)]
    pub(super) nodes: Vec<Spanned<RawNode>>,
}

/// `spec.exceptions[]`: a scope for which tasks may request exceptions, with its bounds.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExceptions {
    pub(super) scope: RawScope,
    #[serde(default)]
    pub(super) ports: Option<Vec<i64>>,
    #[serde(default)]
    pub(super) max_ttl_seconds: Option<i64>,
}

/// `spec.admin`: the admin listener and its bearer tokens.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    #[serde(default)]
    pub(super) listen: Option<String>,
    #[serde(default)]
    pub(super) tokens: Vec<Spanned<RawToken>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawToken {
    pub(super) name: String,
    pub(super) role: String,
    #[serde(default)]
    pub(super) secret_sha256: Option<String>,
    #[serde(default)]
    pub(super) secret_sha256_file: Option<String>,
    /// For `requester` tokens: the tasks it may ask for.
    #[serde(default)]
    pub(super) tasks: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuth {
    #[serde(default)]
    pub(super) tasks: Vec<Spanned<RawTaskSecret>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTaskSecret {
    pub(super) task: String,
    #[serde(default)]
    pub(super) project: Option<String>,
    #[serde(default)]
    pub(super) secret_sha256: Option<String>,
    #[serde(default)]
    pub(super) secret_sha256_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNetwork {
    #[serde(default)]
    pub(super) allowlist: Vec<Spanned<RawEntry>>,
    #[serde(default)]
    pub(super) denylist: Vec<Spanned<RawEntry>>,
    #[serde(default)]
    pub(super) presets: Vec<Spanned<String>>,
    #[serde(default)]
    pub(super) allow_ranges: Vec<Spanned<String>>,
    #[serde(default)]
    pub(super) tunnels: Option<Spanned<RawTunnels>>,
    /// Secrets bound to a host and a header (`credentials.rs`).
    #[serde(default)]
    pub(super) credentials: Vec<Spanned<RawCredential>>,
}

/// One credential as written: where its secret goes, where it comes from, and the
/// placeholder the sandboxed code holds instead (and, in a SandboxPolicy, the variable that
/// holds it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCredential {
    pub(super) host: String,
    pub(super) header: String,
    pub(super) value: String,
    pub(super) placeholder: String,
    #[serde(default)]
    pub(super) env: Option<String>,
    /// Also look for the placeholder in request bodies to other hosts.
    #[serde(default)]
    pub(super) inspect_body: bool,
}

/// `spec.network.tunnels`: what CONNECT and SOCKS5 tunnels may carry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTunnels {
    #[serde(default)]
    pub(super) sni: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) missing_sni: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) tls_only: Option<Spanned<RawTlsOnly>>,
    #[serde(default)]
    pub(super) first_bytes_timeout_ms: Option<Spanned<i64>>,
}

/// `tls_only`: `true`, `false`, or a list of ports.
#[derive(Debug)]
pub(super) enum RawTlsOnly {
    All,
    Never,
    Ports(Vec<i64>),
}

impl<'de> Deserialize<'de> for RawTlsOnly {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TlsOnlyVisitor;
        impl<'de> Visitor<'de> for TlsOnlyVisitor {
            type Value = RawTlsOnly;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false, or a list of ports")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawTlsOnly, E> {
                Ok(if v { RawTlsOnly::All } else { RawTlsOnly::Never })
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<RawTlsOnly, A::Error> {
                let mut ports = Vec::new();
                while let Some(p) = seq.next_element::<i64>()? {
                    ports.push(p);
                }
                Ok(RawTlsOnly::Ports(ports))
            }
        }
        d.deserialize_any(TlsOnlyVisitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawResolver {
    #[serde(default)]
    pub(super) servers: Vec<String>,
    #[serde(default)]
    pub(super) timeout_ms: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListener {
    pub(super) listen: String,
    #[serde(default)]
    pub(super) task: Option<String>,
    #[serde(default)]
    pub(super) project: Option<String>,
    #[serde(default)]
    pub(super) job: Option<String>,
    #[serde(default)]
    pub(super) subject: Option<String>,
    #[serde(default)]
    pub(super) auth: Option<String>,
    #[serde(default)]
    pub(super) protocol: Option<String>,
    /// `node`: a central proxy's listener for node-local proxies (mutual TLS, HTTP/2).
    #[serde(default)]
    pub(super) role: Option<String>,
    #[serde(default)]
    pub(super) tls: Option<RawTls>,
}

/// `spec.listeners[].tls`: the listener's certificate and key, and the CA its clients'
/// certificates must chain to (PEM files; relative paths are relative to the policy file).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert: String,
    pub(super) key: String,
    pub(super) client_ca: String,
}

/// `spec.nodes[]`: a node-local proxy, by its certificate name, and whom it may vouch for.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNode {
    pub(super) name: String,
    #[serde(default)]
    pub(super) projects: Vec<String>,
    #[serde(default)]
    pub(super) tasks: Vec<String>,
}

/// An entry: a bare pattern string, or a map with `host` and the optional fields.
#[derive(Debug)]
pub(super) struct RawEntry(pub(super) RawEntryFull);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEntryFull {
    pub(super) host: String,
    #[serde(default)]
    pub(super) ports: Option<Vec<i64>>,
    #[serde(default)]
    pub(super) scope: Option<RawScope>,
    #[serde(default)]
    pub(super) ttl_seconds: Option<i64>,
    #[serde(default)]
    pub(super) expires_at: Option<String>,
    #[serde(default)]
    pub(super) created_by: Option<String>,
    #[serde(default)]
    pub(super) reason: Option<String>,
    /// The methods an allow entry allows (issue 33).
    #[serde(default)]
    pub(super) methods: Option<Vec<String>>,
    /// The path patterns an allow entry allows.
    #[serde(default)]
    pub(super) paths: Option<Vec<String>>,
    /// GET, HEAD and OPTIONS only.
    #[serde(default)]
    pub(super) read_only: bool,
}

impl<'de> Deserialize<'de> for RawEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = RawEntry;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a pattern string or a map with `host`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawEntry, E> {
                Ok(RawEntry(RawEntryFull {
                    host: v.to_owned(),
                    ..RawEntryFull::default()
                }))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawEntry, A::Error> {
                RawEntryFull::deserialize(de::value::MapAccessDeserializer::new(map)).map(RawEntry)
            }
        }
        d.deserialize_any(EntryVisitor)
    }
}

/// `system`, or a map with exactly one of `project` / `task`.
#[derive(Debug)]
pub(super) struct RawScope(pub(super) Result<Scope, String>);

impl<'de> Deserialize<'de> for RawScope {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Map {
            #[serde(default)]
            project: Option<String>,
            #[serde(default)]
            task: Option<String>,
        }
        struct ScopeVisitor;
        impl<'de> Visitor<'de> for ScopeVisitor {
            type Value = RawScope;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`system`, `{ project: ID }` or `{ task: ID }`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawScope, E> {
                match v {
                    "system" => Ok(RawScope(Ok(Scope::System))),
                    other => Ok(RawScope(Err(format!(
                        "unknown scope {other:?} (use system, project or task)"
                    )))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawScope, A::Error> {
                let m = Map::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RawScope(match (m.project, m.task) {
                    (Some(p), None) if !p.is_empty() => Ok(Scope::Project(p)),
                    (None, Some(t)) if !t.is_empty() => Ok(Scope::Task(t)),
                    (None, None) => Ok(Scope::System),
                    _ => Err("give exactly one non-empty `project` or `task`".to_owned()),
                }))
            }
        }
        d.deserialize_any(ScopeVisitor)
    }
}
