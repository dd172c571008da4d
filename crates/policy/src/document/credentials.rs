//! `credentials`: secrets bound to a host and a header (an EgressPolicy's
//! `spec.network.credentials`, a SandboxPolicy's `net.credentials`), checked as written.
//! Their values are templates (`Bearer ${env:OPENAI_API_KEY}`): [`resolve`] fills them from
//! an environment the caller hands in, so this crate still reads nothing.

use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::checker::Checker;
use super::first_loaded::FirstLoaded;
use super::raw::RawCredential;
use super::{DocError, DocErrors};
use crate::credential::{BoundSecrets, Credential, ValueTemplate, check_names};
use crate::host::Host;

/// One credential, checked, its value not read yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialSpec {
    pub host: Host,
    /// Lowercase.
    pub header: String,
    pub template: ValueTemplate,
    pub placeholder: String,
    /// In a SandboxPolicy: the variable the command gets, holding the placeholder.
    pub env: Option<String>,
    /// `inspect_body: true`: request bodies to other hosts are searched for the placeholder.
    pub inspect_body: bool,
    /// `file:line`.
    pub origin: Arc<str>,
}

/// A list of credentials as written (deserialize it inside the embedding document).
#[derive(Debug, Default, Deserialize)]
#[serde(transparent)]
pub struct CredentialList(Vec<Spanned<RawCredential>>);

/// Validates an embedded list written as the field `field` of `file` (a SandboxPolicy's
/// `net.credentials`, where `env` names the variable that holds the placeholder).
pub fn embedded(list: &CredentialList, field: &str, file: &str) -> Result<Vec<CredentialSpec>, DocErrors> {
    let earlier = FirstLoaded::new();
    let mut c = Checker {
        file,
        errors: Vec::new(),
        warnings: Vec::new(),
        earlier: &earlier,
        loaded: FirstLoaded::new(),
    };
    let specs = specs(&mut c, &list.0, field, true);
    match c.errors.is_empty() {
        true => Ok(specs),
        false => Err(DocErrors(c.errors)),
    }
}

/// Checks each credential, reporting every error; `env_allowed`: the document gives the
/// sandboxed command its environment (a SandboxPolicy).
pub(super) fn specs(
    c: &mut Checker<'_>,
    list: &[Spanned<RawCredential>],
    field: &str,
    env_allowed: bool,
) -> Vec<CredentialSpec> {
    let mut out: Vec<CredentialSpec> = Vec::new();
    for raw in list {
        let line = raw.referenced.line();
        let r = &raw.value;
        let host = match Host::parse(&r.host) {
            Ok(h) if !r.host.contains(['*', ':']) || matches!(h, Host::Ip(_)) => Some(h),
            _ => {
                c.error(
                    line,
                    format!("{field}.host"),
                    format!(
                        "{:?}: the host is one exact name or address (no wildcard, no port)",
                        r.host
                    ),
                );
                None
            }
        };
        let template = ValueTemplate::parse(&r.value)
            .map_err(|e| c.error(line, format!("{field}.value"), e.to_string()))
            .ok();
        let names = check_names(&r.placeholder, &r.header)
            .map_err(|e| {
                let which = match e {
                    crate::credential::CredentialError::Header(_) => "header",
                    _ => "placeholder",
                };
                c.error(line, format!("{field}.{which}"), e.to_string());
            })
            .is_ok();
        let env_ok = match (&r.env, env_allowed) {
            (Some(_), false) => {
                c.error(line, format!("{field}.env"), "the command's environment is a SandboxPolicy's (net.credentials): a proxy's clients set their own");
                false
            }
            (Some(name), true)
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
            {
                c.error(
                    line,
                    format!("{field}.env"),
                    format!("{name:?} is not an environment variable's name"),
                );
                false
            }
            _ => true,
        };
        if out.iter().any(|o| o.placeholder == r.placeholder) {
            c.error(
                line,
                format!("{field}.placeholder"),
                format!("placeholder {:?} is given twice", r.placeholder),
            );
            continue;
        }
        let (Some(host), Some(template), true, true) = (host, template, names, env_ok) else {
            continue;
        };
        out.push(CredentialSpec {
            host,
            header: r.header.to_ascii_lowercase(),
            template,
            placeholder: r.placeholder.clone(),
            env: r.env.clone(),
            inspect_body: r.inspect_body,
            origin: Arc::from(format!("{}:{line}", c.file)),
        });
    }
    out
}

/// The credentials with their secrets, read through `env` (the proxy's environment): an
/// error names each whose variable is unset or empty, or whose secret holds a placeholder.
pub fn resolve(
    specs: &[CredentialSpec],
    env: impl Fn(&str) -> Option<String>,
) -> Result<BoundSecrets, DocErrors> {
    let mut list = Vec::new();
    let mut errors = Vec::new();
    for s in specs {
        let (file, line) = s.origin.rsplit_once(':').unwrap_or((&s.origin, "0"));
        let mut fail = |message: String| {
            errors.push(DocError {
                file: file.to_owned(),
                line: line.parse().unwrap_or(0),
                field: "credentials.value".to_owned(),
                message,
            });
        };
        match env(&s.template.env).filter(|v| !v.is_empty()) {
            None => fail(format!(
                "${{env:{}}} is not set (or empty) where the proxy runs",
                s.template.env
            )),
            Some(secret) if secret.contains(&s.placeholder) => {
                fail(format!(
                    "${{env:{}}} holds the placeholder, not a secret",
                    s.template.env
                ));
            }
            // What a header can carry (RFC 9110 section 5.5: visible ASCII, space and tab);
            // anything else could never be written in, and the placeholder would go on.
            Some(secret)
                if !s
                    .template
                    .fill(&secret)
                    .expose()
                    .bytes()
                    .all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) =>
            {
                fail(format!(
                    "${{env:{}}} holds a character a header cannot carry (a line break, a control or non-ASCII character)",
                    s.template.env
                ));
            }
            Some(secret) => list.push(Credential {
                host: s.host.clone(),
                header: s.header.clone(),
                value: s.template.fill(&secret),
                placeholder: s.placeholder.clone(),
                inspect_body: s.inspect_body,
                origin: s.origin.clone(),
            }),
        }
    }
    if !errors.is_empty() {
        return Err(DocErrors(errors));
    }
    BoundSecrets::new(list).map_err(|e| {
        DocErrors(vec![DocError {
            file: String::new(),
            line: 0,
            field: "credentials".to_owned(),
            message: e.to_string(),
        }])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Net {
        credentials: CredentialList,
    }

    #[test]
    fn credentials_are_checked_and_their_secrets_read_from_the_environment() {
        let text = "credentials:\n  - host: api.openai.com\n    header: Authorization\n    value: \"Bearer ${env:OPENAI_API_KEY}\"\n    placeholder: SANDGATE_OPENAI\n    env: OPENAI_API_KEY\n";
        let net: Net = serde_saphyr::from_str(text).unwrap();
        let specs = embedded(&net.credentials, "net.credentials", "s.yaml").unwrap();
        assert_eq!(specs.len(), 1);
        assert_eq!(
            (specs[0].header.as_str(), &*specs[0].origin),
            ("authorization", "s.yaml:2")
        );
        let bound = resolve(&specs, |name| {
            (name == "OPENAI_API_KEY").then(|| "sk-real".to_owned())
        })
        .unwrap();
        assert!(bound.binds(&Host::parse("api.openai.com").unwrap()));
        let unset = resolve(&specs, |_| None).unwrap_err().to_string();
        assert!(
            unset.contains("s.yaml:2") && unset.contains("OPENAI_API_KEY"),
            "{unset}"
        );
        assert!(!unset.contains("sk-real"));
    }

    #[test]
    fn every_bad_field_is_named() {
        let text = "credentials:\n  - host: \"*.openai.com\"\n    header: \"Bad Header\"\n    value: sk-literal\n    placeholder: short\n";
        let net: Net = serde_saphyr::from_str(text).unwrap();
        let err = embedded(&net.credentials, "net.credentials", "s.yaml")
            .unwrap_err()
            .to_string();
        for field in [
            "net.credentials.host",
            "net.credentials.value",
            "net.credentials.placeholder",
        ] {
            assert!(err.contains(field), "{field}: {err}");
        }
    }
}
