//! `spec.network` and `spec.resolver` of a policy document: the allow and deny entries with
//! the curated presets added to the allowlist, the internal ranges exempted from the address
//! guard (`allow_ranges`), and the DNS servers the proxy asks.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde_saphyr::Spanned;

use super::checker::Kind;
use super::raw::{RawNetwork, RawResolver};
use super::{Checker, ResolverSpec, checker};
use crate::entry::Entry;
use crate::preset;

/// The allow entries (the presets' last) and the deny entries; an allow entry that a deny
/// entry covers is a warning.
pub(super) fn entries(c: &mut Checker<'_>, net: &RawNetwork, now: i64) -> (Vec<Entry>, Vec<Entry>) {
    let allow: Vec<Entry> = net
        .allowlist
        .iter()
        .filter_map(|e| c.entry(e, "spec.network.allowlist", Kind::Allow, now))
        .collect();
    let deny: Vec<Entry> = net
        .denylist
        .iter()
        .filter_map(|e| c.entry(e, "spec.network.denylist", Kind::Deny, now))
        .collect();
    checker::shadowed(c, "spec.network.allowlist", &allow, &deny);
    let mut allow = allow;
    for name in &net.presets {
        preset_entries(c, name, &mut allow);
    }
    (allow, deny)
}

/// A preset's entries (system scope, port 443), or an error naming the known presets.
fn preset_entries(c: &mut Checker<'_>, name: &Spanned<String>, allow: &mut Vec<Entry>) {
    match preset::entries(&name.value) {
        Some(entries) => allow.extend(entries),
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

/// `spec.network.allow_ranges`: CIDRs, a range with host bits set taken as the network it
/// names, with a warning.
pub(super) fn allow_ranges(c: &mut Checker<'_>, raw: &[Spanned<String>]) -> Vec<IpNet> {
    let mut allow_ranges = Vec::new();
    for r in raw {
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
    allow_ranges
}

/// `spec.resolver`: servers as `IP` (port 53) or `IP:PORT`, and a positive timeout.
pub(super) fn resolver(c: &mut Checker<'_>, r: &Spanned<RawResolver>) -> ResolverSpec {
    let line = r.referenced.line();
    let mut servers = Vec::new();
    for s in &r.value.servers {
        match s
            .parse::<SocketAddr>()
            .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
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
}
