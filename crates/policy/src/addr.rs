//! Address classification for the address guard (SSRF and DNS-rebinding defence).
//!
//! Every address a name resolves to, and every IP literal a client names, is classified here
//! against the IANA special-purpose address registries:
//! - IPv4: <https://www.iana.org/assignments/iana-ipv4-special-registry/> (RFC 6890),
//! - IPv6: <https://www.iana.org/assignments/iana-ipv6-special-registry/> (RFC 6890),
//!
//! plus the IPv6 address-space registry (everything outside 2000::/3 is unassigned or
//! special) and the cloud metadata endpoints. IPv6 forms that carry an IPv4 address
//! (IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo) are classified as the IPv4 they carry:
//! `::ffff:127.0.0.1` is loopback, whatever `Ipv6Addr::is_loopback` says.
//!
//! Only [`AddrClass::Public`] may be dialled, unless an operator exempts a range with
//! `--allow-range` ([`AddressGuard`]). Pure: no I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::Serialize;

/// What an address is, for the guard's purposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AddrClass {
    Public,
    Unspecified,
    ThisNetwork,
    Private,
    SharedCgnat,
    Loopback,
    LinkLocal,
    Metadata,
    ProtocolAssignments,
    Documentation,
    Benchmarking,
    Multicast,
    Broadcast,
    Reserved,
    UniqueLocal,
    SiteLocal,
    Discard,
    Nat64LocalUse,
    Deprecated6to4Relay,
    /// Assigned to one of this host's own interfaces (whatever its range): reaching it
    /// reaches the host itself, the proxy's own listeners included.
    HostAddress,
}

impl AddrClass {
    pub fn is_public(self) -> bool {
        self == AddrClass::Public
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AddrClass::Public => "public",
            AddrClass::Unspecified => "unspecified",
            AddrClass::ThisNetwork => "this_network",
            AddrClass::Private => "private",
            AddrClass::SharedCgnat => "shared_cgnat",
            AddrClass::Loopback => "loopback",
            AddrClass::LinkLocal => "link_local",
            AddrClass::Metadata => "cloud_metadata",
            AddrClass::ProtocolAssignments => "ietf_protocol_assignments",
            AddrClass::Documentation => "documentation",
            AddrClass::Benchmarking => "benchmarking",
            AddrClass::Multicast => "multicast",
            AddrClass::Broadcast => "broadcast",
            AddrClass::Reserved => "reserved",
            AddrClass::UniqueLocal => "unique_local",
            AddrClass::SiteLocal => "site_local",
            AddrClass::Discard => "discard_only",
            AddrClass::Nat64LocalUse => "nat64_local_use",
            AddrClass::Deprecated6to4Relay => "deprecated_6to4_relay",
            AddrClass::HostAddress => "host_address",
        }
    }
}

/// IPv4 special-purpose blocks, most specific first where they overlap.
/// `(network, prefix length, class)`, each with the RFC that assigns it.
const V4_BLOCKS: &[(u32, u8, AddrClass)] = &[
    // Cloud metadata endpoints. AWS/GCP/Azure/OpenStack IMDS 169.254.169.254 (inside
    // link-local, listed for the clearer reason), Azure WireServer 168.63.129.16 (a public
    // address that answers only inside Azure), Alibaba Cloud 100.100.100.200 (inside CGNAT).
    (u32::from_be_bytes([169, 254, 169, 254]), 32, AddrClass::Metadata),
    (u32::from_be_bytes([168, 63, 129, 16]), 32, AddrClass::Metadata),
    (u32::from_be_bytes([100, 100, 100, 200]), 32, AddrClass::Metadata),
    // 0.0.0.0/32 "this host" (RFC 1122 section 3.2.1.3), within 0.0.0.0/8 "this network".
    (0, 32, AddrClass::Unspecified),
    (0, 8, AddrClass::ThisNetwork),
    // RFC 1918 private-use.
    (u32::from_be_bytes([10, 0, 0, 0]), 8, AddrClass::Private),
    (u32::from_be_bytes([172, 16, 0, 0]), 12, AddrClass::Private),
    (u32::from_be_bytes([192, 168, 0, 0]), 16, AddrClass::Private),
    // RFC 6598 shared address space (carrier-grade NAT).
    (u32::from_be_bytes([100, 64, 0, 0]), 10, AddrClass::SharedCgnat),
    // RFC 1122 section 3.2.1.3 loopback.
    (u32::from_be_bytes([127, 0, 0, 0]), 8, AddrClass::Loopback),
    // RFC 3927 link-local.
    (u32::from_be_bytes([169, 254, 0, 0]), 16, AddrClass::LinkLocal),
    // RFC 6890 section 2.2.2 IETF protocol assignments (includes DS-Lite, RFC 7335 and the
    // NAT64 discovery addresses).
    (
        u32::from_be_bytes([192, 0, 0, 0]),
        24,
        AddrClass::ProtocolAssignments,
    ),
    // RFC 5737 documentation (TEST-NET-1, -2, -3).
    (u32::from_be_bytes([192, 0, 2, 0]), 24, AddrClass::Documentation),
    (
        u32::from_be_bytes([198, 51, 100, 0]),
        24,
        AddrClass::Documentation,
    ),
    (u32::from_be_bytes([203, 0, 113, 0]), 24, AddrClass::Documentation),
    // RFC 7526 deprecated 6to4 relay anycast.
    (
        u32::from_be_bytes([192, 88, 99, 0]),
        24,
        AddrClass::Deprecated6to4Relay,
    ),
    // RFC 2544 benchmarking.
    (u32::from_be_bytes([198, 18, 0, 0]), 15, AddrClass::Benchmarking),
    // RFC 5771 multicast.
    (u32::from_be_bytes([224, 0, 0, 0]), 4, AddrClass::Multicast),
    // RFC 919 / RFC 8190 limited broadcast, inside RFC 1112 section 4 reserved 240.0.0.0/4.
    (u32::MAX, 32, AddrClass::Broadcast),
    (u32::from_be_bytes([240, 0, 0, 0]), 4, AddrClass::Reserved),
];

/// IPv6 special-purpose blocks that do not embed IPv4, most specific first.
const V6_BLOCKS: &[(u128, u8, AddrClass)] = &[
    // RFC 4291 section 2.5.2 unspecified, 2.5.3 loopback.
    (0, 128, AddrClass::Unspecified),
    (1, 128, AddrClass::Loopback),
    // AWS IMDS over IPv6, fd00:ec2::254 (inside unique-local; listed for the clearer reason).
    (
        0xfd00_0ec2_0000_0000_0000_0000_0000_0254,
        128,
        AddrClass::Metadata,
    ),
    // RFC 8215 local-use NAT64 prefix: operator-defined translation, never globally routed.
    (
        0x0064_ff9b_0001_0000_0000_0000_0000_0000,
        48,
        AddrClass::Nat64LocalUse,
    ),
    // RFC 6666 discard-only prefix.
    (0x0100_0000_0000_0000_0000_0000_0000_0000, 64, AddrClass::Discard),
    // RFC 3849 documentation, RFC 5180 benchmarking, within RFC 2928 IETF protocol
    // assignments 2001::/23 (Teredo 2001::/32 is handled before this table).
    (
        0x2001_0db8_0000_0000_0000_0000_0000_0000,
        32,
        AddrClass::Documentation,
    ),
    (
        0x2001_0002_0000_0000_0000_0000_0000_0000,
        48,
        AddrClass::Benchmarking,
    ),
    (
        0x2001_0000_0000_0000_0000_0000_0000_0000,
        23,
        AddrClass::ProtocolAssignments,
    ),
    // RFC 9637 documentation.
    (
        0x3fff_0000_0000_0000_0000_0000_0000_0000,
        20,
        AddrClass::Documentation,
    ),
    // RFC 9602 SRv6 SIDs: not globally reachable.
    (0x5f00_0000_0000_0000_0000_0000_0000_0000, 16, AddrClass::Reserved),
    // RFC 4193 unique-local.
    (
        0xfc00_0000_0000_0000_0000_0000_0000_0000,
        7,
        AddrClass::UniqueLocal,
    ),
    // RFC 4291 section 2.5.6 link-local.
    (
        0xfe80_0000_0000_0000_0000_0000_0000_0000,
        10,
        AddrClass::LinkLocal,
    ),
    // RFC 3879 deprecated site-local.
    (
        0xfec0_0000_0000_0000_0000_0000_0000_0000,
        10,
        AddrClass::SiteLocal,
    ),
    // RFC 4291 section 2.7 multicast.
    (0xff00_0000_0000_0000_0000_0000_0000_0000, 8, AddrClass::Multicast),
];

fn in_v4(addr: u32, net: u32, prefix: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    addr & mask == net & mask
}

fn in_v6(addr: u128, net: u128, prefix: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
    addr & mask == net & mask
}

/// Classifies an IPv4 address.
pub fn classify_v4(ip: Ipv4Addr) -> AddrClass {
    let bits = u32::from(ip);
    V4_BLOCKS
        .iter()
        .find(|(net, prefix, _)| in_v4(bits, *net, *prefix))
        .map_or(AddrClass::Public, |(_, _, class)| *class)
}

/// The IPv4 addresses an IPv6 address carries, if it is one of the embedding forms.
/// Teredo carries two (server and client), so this returns up to two.
pub fn embedded_v4(ip: Ipv6Addr) -> Option<(Ipv4Addr, Option<Ipv4Addr>)> {
    let bits = u128::from(ip);
    let low32 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    // RFC 4291 section 2.5.5.2 IPv4-mapped ::ffff:0:0/96.
    if in_v6(bits, 0xffff_0000_0000, 96) {
        return Some((low32, None));
    }
    // RFC 4291 section 2.5.5.1 IPv4-compatible ::/96 (deprecated); :: and ::1 excluded.
    if in_v6(bits, 0, 96) && bits > 1 {
        return Some((low32, None));
    }
    // RFC 6052 well-known NAT64 prefix 64:ff9b::/96.
    if in_v6(bits, 0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96) {
        return Some((low32, None));
    }
    // RFC 8215 local-use NAT64 64:ff9b:1::/48: the operator chooses the prefix length; the
    // common /96 layout puts the IPv4 in the low 32 bits.
    if in_v6(bits, 0x0064_ff9b_0001_0000_0000_0000_0000_0000, 48) {
        return Some((low32, None));
    }
    // RFC 3056 6to4 2002::/16: the IPv4 is bits 16..48.
    if in_v6(bits, 0x2002_0000_0000_0000_0000_0000_0000_0000, 16) {
        return Some((Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32), None));
    }
    // RFC 4380 Teredo 2001::/32: server IPv4 in bits 32..64, client IPv4 inverted in the low
    // 32 bits.
    if in_v6(bits, 0x2001_0000_0000_0000_0000_0000_0000_0000, 32) {
        let server = Ipv4Addr::from(((bits >> 64) & 0xffff_ffff) as u32);
        let client = Ipv4Addr::from(!((bits & 0xffff_ffff) as u32));
        return Some((server, Some(client)));
    }
    None
}

/// The addresses a connection to `ip` may end at: `ip` itself (an IPv4-mapped form as its
/// IPv4) and each IPv4 an embedding form carries, where a NAT64, 6to4 or Teredo gateway
/// delivers it. A rule about an IPv4 address holds for each of these.
pub fn reached(ip: IpAddr) -> impl Iterator<Item = IpAddr> {
    let canonical = ip.to_canonical();
    let (first, second) = match canonical {
        IpAddr::V6(v6) => embedded_v4(v6).map_or((None, None), |(a, b)| (Some(a), b)),
        IpAddr::V4(_) => (None, None),
    };
    std::iter::once(canonical).chain([first, second].into_iter().flatten().map(IpAddr::V4))
}

/// Does a connection to `ip` end at one of `host`'s addresses (this host's interfaces, read
/// by the caller)? IPv6 forms that carry an IPv4 address count as it too ([`reached`]).
pub fn on_host(ip: IpAddr, host: &[IpAddr]) -> bool {
    reached(ip).any(|r| host.iter().any(|h| h.to_canonical() == r))
}

/// Classifies an IPv6 address; embedding forms take the class of the IPv4 they carry.
pub fn classify_v6(ip: Ipv6Addr) -> AddrClass {
    let bits = u128::from(ip);
    if let Some((first, second)) = embedded_v4(ip) {
        let worst = [Some(first), second]
            .into_iter()
            .flatten()
            .map(classify_v4)
            .find(|c| !c.is_public());
        return match worst {
            Some(class) => class,
            None if in_v6(bits, 0x0064_ff9b_0001_0000_0000_0000_0000_0000, 48) => AddrClass::Nat64LocalUse,
            None => AddrClass::Public,
        };
    }
    if let Some((_, _, class)) = V6_BLOCKS.iter().find(|(net, p, _)| in_v6(bits, *net, *p)) {
        return *class;
    }
    // RFC 4291 / IANA IPv6 address space: only 2000::/3 is allocated global unicast.
    if in_v6(bits, 0x2000_0000_0000_0000_0000_0000_0000_0000, 3) {
        AddrClass::Public
    } else {
        AddrClass::Reserved
    }
}

/// Classifies any address.
pub fn classify(ip: IpAddr) -> AddrClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// An address the guard refused, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prohibited {
    pub ip: IpAddr,
    pub class: AddrClass,
}

/// The address guard: public addresses pass, as do addresses inside an operator's
/// `--allow-range`. For an embedding IPv6 form, the carried IPv4 is checked against the
/// ranges too, so `::ffff:10.1.2.3` is exempt exactly when `10.1.2.3` is.
#[derive(Debug, Clone, Default)]
pub struct AddressGuard {
    allow_ranges: Vec<IpNet>,
}

impl AddressGuard {
    pub fn new(allow_ranges: Vec<IpNet>) -> AddressGuard {
        AddressGuard { allow_ranges }
    }

    pub fn allow_ranges(&self) -> &[IpNet] {
        &self.allow_ranges
    }

    fn exempt(&self, ip: IpAddr) -> bool {
        let direct = self.allow_ranges.iter().any(|net| net.contains(&ip));
        let carried = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).is_some_and(|(a, b)| {
                let all = [Some(a), b].into_iter().flatten();
                all.map(IpAddr::V4)
                    .all(|v4| self.allow_ranges.iter().any(|net| net.contains(&v4)))
            }),
            IpAddr::V4(_) => false,
        };
        direct || carried
    }

    /// Checks one address.
    pub fn check(&self, ip: IpAddr) -> Result<(), Prohibited> {
        let class = classify(ip);
        if class.is_public() || self.exempt(ip) {
            Ok(())
        } else {
            Err(Prohibited { ip, class })
        }
    }

    /// Checks every answer: one forbidden address denies the whole name (a name that
    /// resolves to a public and a private address is how rebinding attacks start).
    /// An empty answer set is not vetted.
    pub fn vet_all(&self, ips: &[IpAddr]) -> Result<(), Prohibited> {
        ips.iter().try_for_each(|ip| self.check(*ip))
    }

    /// Refuses addresses assigned to this host's own interfaces (`host`, read from the
    /// system by the caller) unless an allow range names them. A public address on the
    /// host's own NIC passes [`check`](Self::check), yet leads back into the host: to a
    /// proxy listening on a wildcard address, its admin port, any local service.
    /// IPv6 forms that carry an IPv4 address compare as it too ([`reached`]).
    pub fn vet_not_host(&self, ips: &[IpAddr], host: &[IpAddr]) -> Result<(), Prohibited> {
        for ip in ips {
            if on_host(*ip, host) && !self.exempt(*ip) {
                return Err(Prohibited {
                    ip: *ip,
                    class: AddrClass::HostAddress,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "addr_tests.rs"]
mod tests;
