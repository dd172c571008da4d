use super::*;

#[test]
fn the_hosts_own_addresses_are_refused_unless_a_range_names_them() {
    let host: Vec<IpAddr> = vec!["8.8.8.8".parse().unwrap(), "2001:4860::1".parse().unwrap()];
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let guard = AddressGuard::new(vec![]);
    // The NAT64 form: a gateway would deliver it to this host's own IPv4 address.
    for refused in ["8.8.8.8", "::ffff:8.8.8.8", "2001:4860::1", "64:ff9b::808:808"] {
        let err = guard
            .vet_not_host(&[ip("1.1.1.1"), ip(refused)], &host)
            .unwrap_err();
        assert_eq!(err.class, AddrClass::HostAddress, "{refused}");
    }
    assert!(guard.vet_not_host(&[ip("8.8.4.4")], &host).is_ok());
    let exempt = AddressGuard::new(vec!["8.8.8.0/24".parse().unwrap()]);
    assert!(exempt.vet_not_host(&[ip("8.8.8.8")], &host).is_ok());
}

fn c(s: &str) -> AddrClass {
    classify(s.parse().unwrap())
}

#[test]
fn ipv4_table() {
    let cases = [
        ("0.0.0.0", AddrClass::Unspecified),
        ("0.1.2.3", AddrClass::ThisNetwork),
        ("10.0.0.1", AddrClass::Private),
        ("172.16.0.1", AddrClass::Private),
        ("172.31.255.255", AddrClass::Private),
        ("172.32.0.1", AddrClass::Public),
        ("192.168.1.1", AddrClass::Private),
        ("100.64.0.1", AddrClass::SharedCgnat),
        ("100.127.255.255", AddrClass::SharedCgnat),
        ("100.128.0.1", AddrClass::Public),
        ("100.100.100.200", AddrClass::Metadata),
        ("127.0.0.1", AddrClass::Loopback),
        ("127.255.255.254", AddrClass::Loopback),
        ("169.254.169.254", AddrClass::Metadata),
        ("169.254.1.1", AddrClass::LinkLocal),
        ("168.63.129.16", AddrClass::Metadata),
        ("192.0.0.8", AddrClass::ProtocolAssignments),
        ("192.0.2.1", AddrClass::Documentation),
        ("198.51.100.1", AddrClass::Documentation),
        ("203.0.113.1", AddrClass::Documentation),
        ("192.88.99.1", AddrClass::Deprecated6to4Relay),
        ("198.18.0.1", AddrClass::Benchmarking),
        ("198.19.255.255", AddrClass::Benchmarking),
        ("198.20.0.1", AddrClass::Public),
        ("224.0.0.1", AddrClass::Multicast),
        ("239.255.255.255", AddrClass::Multicast),
        ("240.0.0.1", AddrClass::Reserved),
        ("255.255.255.255", AddrClass::Broadcast),
        ("8.8.8.8", AddrClass::Public),
        ("1.1.1.1", AddrClass::Public),
    ];
    for (ip, want) in cases {
        assert_eq!(c(ip), want, "{ip}");
    }
}

#[test]
fn ipv6_table() {
    let cases = [
        ("::", AddrClass::Unspecified),
        ("::1", AddrClass::Loopback),
        ("::ffff:127.0.0.1", AddrClass::Loopback),
        ("::ffff:10.0.0.1", AddrClass::Private),
        ("::ffff:169.254.169.254", AddrClass::Metadata),
        ("::ffff:8.8.8.8", AddrClass::Public),
        ("::127.0.0.1", AddrClass::Loopback),
        ("::8.8.8.8", AddrClass::Public),
        ("64:ff9b::10.0.0.1", AddrClass::Private),
        ("64:ff9b::8.8.8.8", AddrClass::Public),
        ("64:ff9b:1::192.168.0.1", AddrClass::Private),
        ("64:ff9b:1::8.8.8.8", AddrClass::Nat64LocalUse),
        ("2002:7f00:1::", AddrClass::Loopback),
        ("2002:a9fe:a9fe::1", AddrClass::Metadata),
        ("2002:0808:0808::1", AddrClass::Public),
        // Teredo: server 65.54.227.120, client 192.168.1.1 inverted (3f57:fefe).
        ("2001:0:4136:e378:8000:63bf:3f57:fefe", AddrClass::Private),
        // Teredo with a loopback server.
        ("2001:0:7f00:1::", AddrClass::Loopback),
        ("2001:db8::1", AddrClass::Documentation),
        ("3fff::1", AddrClass::Documentation),
        ("2001:2::1", AddrClass::Benchmarking),
        ("2001:10::1", AddrClass::ProtocolAssignments),
        ("100::1", AddrClass::Discard),
        ("5f00::1", AddrClass::Reserved),
        ("fc00::1", AddrClass::UniqueLocal),
        ("fd12:3456::1", AddrClass::UniqueLocal),
        ("fd00:ec2::254", AddrClass::Metadata),
        ("fe80::1", AddrClass::LinkLocal),
        ("febf::1", AddrClass::LinkLocal),
        ("fec0::1", AddrClass::SiteLocal),
        ("ff02::1", AddrClass::Multicast),
        ("4000::1", AddrClass::Reserved),
        ("::2:0:0:1", AddrClass::Reserved),
        ("2606:4700::1111", AddrClass::Public),
        ("2a00:1450::1", AddrClass::Public),
    ];
    for (ip, want) in cases {
        assert_eq!(c(ip), want, "{ip}");
    }
}

#[test]
fn guard_refuses_one_bad_answer_among_many() {
    let guard = AddressGuard::default();
    let ips: Vec<IpAddr> = vec!["8.8.8.8".parse().unwrap(), "10.0.0.1".parse().unwrap()];
    let err = guard.vet_all(&ips).unwrap_err();
    assert_eq!(err.class, AddrClass::Private);
    assert!(guard.vet_all(&ips[..1]).is_ok());
}

#[test]
fn allow_range_exempts_including_mapped_forms() {
    let guard = AddressGuard::new(vec!["10.20.0.0/16".parse().unwrap()]);
    assert!(guard.check("10.20.1.2".parse().unwrap()).is_ok());
    assert!(guard.check("::ffff:10.20.1.2".parse().unwrap()).is_ok());
    assert!(guard.check("10.21.1.2".parse().unwrap()).is_err());
    assert!(guard.check("::ffff:10.21.1.2".parse().unwrap()).is_err());
}
