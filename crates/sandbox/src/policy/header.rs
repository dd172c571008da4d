//! A policy document's header: `apiVersion` and `kind`, both naming a sandbox policy or
//! neither (the first form, still read, with a warning and the one command that fixes it);
//! which kind any policy document is (`check-config` dispatches on it); and what a run given
//! the proxy's `EgressPolicy` is told. Pure.

use serde::Deserialize;

use super::{PolicyError, Raw};

/// The `apiVersion` a sandbox policy names (the same as an `EgressPolicy`'s).
pub const API_VERSION: &str = sandgate_policy::document::API_VERSION;
/// The `kind` of a sandbox policy.
pub const KIND: &str = "SandboxPolicy";
/// What a file of the first form (no `apiVersion` and `kind`) is told.
pub const DEPRECATED_FORM: &str = "warning: no apiVersion and kind: read as a SandboxPolicy; this form is deprecated: add the two lines `apiVersion: sandgate.dev/v1` and `kind: SandboxPolicy` at the top";

/// The deprecation warning for `file`, with the one command that fixes it.
pub(super) fn deprecated(file: &str) -> String {
    let quoted = format!("'{}'", file.replace('\'', "'\\''"));
    format!(
        "{file}: {DEPRECATED_FORM}: sed -i '1i apiVersion: sandgate.dev/v1\\nkind: SandboxPolicy' {quoted}"
    )
}

/// What a run given the proxy's policy is told.
pub(super) const EGRESS_KIND: &str = "kind: EgressPolicy is the proxy's policy (sandgate proxy --policy); sandgate run takes a SandboxPolicy, whose net.egress_policy may name this file (sandgate init --kind sandbox writes one)";

/// Just enough of any policy document to say which kind it is.
#[derive(Deserialize)]
pub(super) struct Peek {
    #[serde(default)]
    pub(super) kind: Option<String>,
    #[serde(default)]
    env: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    fs: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    net: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    platform: Option<serde::de::IgnoredAny>,
}

/// The `kind` a policy document names: its `kind`, or [`KIND`] for a document without one
/// but with a section only a sandbox policy has (the first form); `None` when it names none
/// (or is not YAML). `check-config` dispatches on it. A tab in the indentation, which
/// stops the YAML layer, is read as spaces here: the kind is still the file's, and its
/// own checker names the tab.
pub fn document_kind(text: &str) -> Option<String> {
    let k = serde_saphyr::from_str::<Peek>(text)
        .or_else(|_| serde_saphyr::from_str::<Peek>(&text.replace('\t', "  ")))
        .ok()?;
    match k.kind {
        Some(kind) => Some(kind),
        None if k.env.is_some() || k.fs.is_some() || k.net.is_some() || k.platform.is_some() => {
            Some(KIND.to_owned())
        }
        None => None,
    }
}

/// Checks `apiVersion` and `kind`: both, naming a sandbox policy, or neither (the first
/// form, still read, with a warning saying what to add).
pub(super) fn header(raw: &Raw) -> Result<Vec<String>, PolicyError> {
    let _ = raw.metadata.as_ref().map(|m| (&m.version, &m.labels));
    match (raw.api_version.as_deref(), raw.kind.as_deref()) {
        (None, None) => Ok(vec![DEPRECATED_FORM.to_owned()]),
        (Some(API_VERSION), Some(KIND)) => Ok(Vec::new()),
        (_, Some("EgressPolicy")) => Err(PolicyError(EGRESS_KIND.to_owned())),
        (Some(API_VERSION), Some(other)) => Err(PolicyError(format!("kind: {other:?}: expected {KIND:?}"))),
        (Some(other), Some(_)) => Err(PolicyError(format!(
            "apiVersion: {other:?}: expected {API_VERSION:?}"
        ))),
        (None, Some(_)) => Err(PolicyError(format!(
            "apiVersion: missing: add `apiVersion: {API_VERSION}`"
        ))),
        (Some(_), None) => Err(PolicyError(format!("kind: missing: add `kind: {KIND}`"))),
    }
}
