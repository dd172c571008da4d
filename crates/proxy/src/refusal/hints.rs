//! What the person reading a refusal can do next, one line each: the allowlist entry that
//! would allow the destination, where the address guard's exemptions go, how to see which
//! rule denied. Worded in the terms of whoever configured the proxy ([`Remedies`]).

use sandgate_policy::{Host, PolicyReason};

use super::Refusal;
use crate::config::Remedies;
use crate::dial::DialError;

impl Refusal {
    /// What the person reading the refusal can do next: the allowlist entry that would
    /// allow the destination, where the guard's exemptions go, how to see which rule denied.
    /// Empty when there is nothing to say beyond the text.
    pub(super) fn next_steps(&self, method: &str, remedies: &Remedies) -> Vec<String> {
        match self {
            Refusal::Policy {
                target,
                reason: PolicyReason::NotAllowlisted,
                ..
            } => {
                // A bare name covers the usual port of its kind (443 for CONNECT, 80 for
                // plain HTTP); anything else is listed with its port.
                let usual = if method == "CONNECT" { 443 } else { 80 };
                let entry = match &target.host {
                    Host::Name(name) if target.port == usual => name.to_string(),
                    _ => target.to_string(),
                };
                vec![format!(
                    "to allow it, add {entry} to the allowlist ({})",
                    remedies.allow_hint.say(&entry)
                )]
            }
            Refusal::Policy {
                target,
                reason: PolicyReason::Denylisted,
                ..
            }
            | Refusal::AddressDenied { target, .. } => vec![format!(
                "a deny rule matches and deny rules always win; sandgate explain --policy FILE {target} names it"
            )],
            Refusal::Policy {
                target,
                reason: PolicyReason::RequestNotAllowed,
                ..
            } => vec![format!(
                "the allow entries for {target} name the methods and paths they allow; sandgate explain --policy FILE --method {method} URL names them"
            )],
            Refusal::Policy {
                reason: PolicyReason::PathNotCanonical,
                ..
            } => vec![
                "the path has an encoded `/` or `\\`, a `.` or `..` segment, an empty segment or another spelling a server may read as a different path; send it in its plain form".to_owned(),
            ],
            Refusal::Policy {
                target,
                reason: PolicyReason::InspectionRequired,
                ..
            } => vec![format!(
                "{target} is allowed only for some methods and paths, and a tunnel hides them; use plain http://, or allow the host without methods or paths"
            )],
            Refusal::Dial {
                error: DialError::Prohibited(p),
                ..
            } => vec![format!(
                "the address guard refuses {} addresses; an internal service needs its range exempted ({})",
                p.class.as_str(),
                remedies.range_hint.say("CIDR")
            )],
            _ => Vec::new(),
        }
    }
}
