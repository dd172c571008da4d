//! Table tests of the `net` section: the design's `net.mode: proxy` without an upstream, an
//! upstream proxy by address or by name, `platform.bwrap.unshare.net`, and the command
//! line's `--net` setting the section aside with one note.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::paths;
use crate::policy::{NetMode, SandboxPolicy, parse};

/// Every path exists and is its own canonical form.
fn as_written(p: &Path) -> std::io::Result<PathBuf> {
    Ok(paths::lexical(p))
}

fn parse_ok(text: &str) -> SandboxPolicy {
    parse(text, &BTreeMap::new(), &as_written, None).unwrap()
}

fn parse_err(text: &str, net: Option<NetMode>) -> String {
    parse(text, &BTreeMap::new(), &as_written, net).unwrap_err().0
}

/// `--net MODE` wins: the policy's network fields that do not apply to MODE are set aside,
/// and one note (a warning line) names them all. Fields of other sections still count.
#[test]
fn the_command_line_network_mode_wins_over_the_policys_network_fields() {
    let full = "net:\n  mode: proxy\n  allow_domains: [ api.openai.com ]\n  allowlist: [ pypi.org ]\n  denylist: [ evil.example ]\n  presets: [ python-packages ]\n  allow_ranges: [ 10.0.0.0/8 ]\n  egress_policy: agents.yaml\n  resolver: { servers: [ \"10.0.0.2:53\" ] }\n  loopback_ports: [ 5432 ]\n  proxy: { upstream: \"10.0.0.1:3128\" }\n";
    let all_fields = "net.allow_domains, net.allowlist, net.denylist, net.presets, net.allow_ranges, net.egress_policy, net.resolver, net.proxy";
    let cases = [
        (NetMode::None, format!("{all_fields}, net.loopback_ports")),
        (NetMode::All, format!("{all_fields}, net.loopback_ports")),
        (NetMode::Loopback, all_fields.to_owned()),
        (NetMode::Allowlist, "net.proxy.upstream".to_owned()),
    ];
    for (mode, ignored) in cases {
        let p = parse(full, &BTreeMap::new(), &as_written, Some(mode))
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_eq!(p.net, mode);
        let notes: Vec<&String> = p.warnings.iter().filter(|w| w.contains("note:")).collect();
        assert_eq!(
            notes,
            [&format!(
                "policy: note: --net {} wins over the policy's network fields; ignoring {ignored}",
                mode.name()
            )],
            "{mode:?}"
        );
        assert!(p.egress_policy.is_none() || mode.proxied(), "{mode:?}");
        assert!(p.upstream_proxy.is_none(), "{mode:?}");
        assert_eq!(p.resolver_servers.is_empty(), !mode.proxied(), "{mode:?}");
    }
    // Nothing to set aside, no note; the same mode as the policy's, none either.
    let plain = "net:\n  mode: allowlist\n  allow_domains: [ a.example ]\n";
    for mode in [Some(NetMode::Allowlist), Some(NetMode::Proxy), None] {
        let p = parse(plain, &BTreeMap::new(), &as_written, mode).unwrap();
        assert!(
            p.warnings.iter().all(|w| !w.contains("note:")),
            "{mode:?}: {:?}",
            p.warnings
        );
    }
    assert!(
        parse(plain, &BTreeMap::new(), &as_written, Some(NetMode::None))
            .unwrap()
            .allow
            .is_empty()
    );
    // The design's unshare.net, where it disagrees with the flag.
    let shared = "platform:\n  bwrap: { unshare: { net: false } }\n";
    let p = parse(shared, &BTreeMap::new(), &as_written, Some(NetMode::None)).unwrap();
    assert_eq!(p.net, NetMode::None);
    assert!(
        p.warnings
            .iter()
            .any(|w| w.ends_with("ignoring platform.bwrap.unshare.net")),
        "{:?}",
        p.warnings
    );
    // Without the flag, the policy's own contradictions stay errors.
    assert!(
        parse_err("net:\n  mode: none\n  allow_domains: [ a.example ]\n", None)
            .contains("need net.mode allowlist")
    );
}

/// The design's `net.mode: proxy` with `proxy: { listen: 127.0.0.1:0, upstream: null }` is
/// a proxy the runner manages, filtering by `allow_domains`: allowlist mode exactly.
#[test]
fn proxy_mode_without_an_upstream_is_the_runs_own_filtering_proxy() {
    let design = "net:\n  mode: proxy\n  allow_domains: [ api.openai.com ]\n  proxy: { listen: 127.0.0.1:0, upstream: null }\n";
    let p = parse_ok(design);
    let allowlist = parse_ok("net:\n  mode: allowlist\n  allow_domains: [ api.openai.com ]\n");
    assert_eq!(p.net, NetMode::Proxy);
    assert!(p.net.proxied());
    assert_eq!(
        (p.upstream_proxy, &p.upstream_proxy_name, &p.central),
        (None, &None, &None)
    );
    assert_eq!(
        (&p.allow, p.proxy_port, p.socks_port, p.all_proxy_http),
        (
            &allowlist.allow,
            allowlist.proxy_port,
            allowlist.socks_port,
            allowlist.all_proxy_http
        )
    );
    // A port listed twice is bridged once, in the order first listed.
    let p = parse_ok("net:\n  mode: loopback\n  loopback_ports: [ 6379, 5432, 6379 ]\n");
    assert_eq!(p.loopback_ports, [6379, 5432]);
    // No key at all is the same; loopback ports bridge in as in allowlist mode.
    let p = parse_ok("net:\n  mode: proxy\n  loopback_ports: [ 5432 ]\n");
    assert_eq!(
        (p.upstream_proxy, p.loopback_ports.as_slice()),
        (None, &[5432][..])
    );
    assert!(
        parse_err(
            "net:\n  mode: proxy\n  loopback_ports: [ 5432 ]\n  proxy: { upstream: \"10.0.0.1:3128\" }\n",
            None
        )
        .contains("net.loopback_ports needs")
    );
}

/// `upstream: HOST:PORT` is kept as a name for the run to resolve; an address is taken as it
/// is; anything else names the field.
#[test]
fn an_upstream_proxy_is_an_address_or_a_name_to_resolve_at_run_start() {
    let up = |u: &str| format!("net:\n  mode: proxy\n  proxy: {{ upstream: \"{u}\" }}\n");
    let p = parse_ok(&up("10.0.0.1:3128"));
    assert_eq!(p.upstream_proxy, Some("10.0.0.1:3128".parse().unwrap()));
    assert_eq!(p.upstream_proxy_name, None);
    let p = parse_ok(&up("[fd00::1]:8080"));
    assert_eq!(p.upstream_proxy, Some("[fd00::1]:8080".parse().unwrap()));
    let p = parse_ok(&up("proxy.corp.example:3128"));
    assert_eq!(p.upstream_proxy, None);
    assert_eq!(
        p.upstream_proxy_name,
        Some(sandgate_policy::parse_connect_target("proxy.corp.example:3128").unwrap())
    );
    for bad in [
        "proxy.corp.example",
        "127.1:3128",
        "a b:1",
        "http://x:1",
        ":3128",
        "x:99999",
    ] {
        let err = parse_err(&up(bad), None);
        assert!(
            err.starts_with(&format!("net.proxy.upstream: {bad:?} is not IP:PORT, HOST:PORT")),
            "{bad}: {err}"
        );
    }
    let err = parse_err(
        "net:\n  mode: allowlist\n  proxy: { upstream: \"10.0.0.1:3128\" }\n",
        None,
    );
    assert!(err.contains("net.proxy.upstream needs net.mode proxy"), "{err}");
}

/// The design's `platform.bwrap.unshare.net`: false is the host's network, true a network
/// namespace of the sandbox's own; it decides the mode when `net.mode` is not written, and
/// must agree with it when it is.
#[test]
fn unshare_net_is_the_designs_spelling_of_the_network_mode() {
    let text = |mode: &str, net: &str| {
        format!("{mode}platform:\n  bwrap: {{ unshare: {{ net: {net}, pid: true, ipc: true }} }}\n")
    };
    let cases = [
        ("", "true", NetMode::None),
        ("", "false", NetMode::All),
        ("net:\n  mode: all\n", "false", NetMode::All),
        ("net:\n  mode: loopback\n", "true", NetMode::Loopback),
        ("net:\n  mode: allowlist\n", "true", NetMode::Allowlist),
        ("net:\n  mode: proxy\n", "true", NetMode::Proxy),
    ];
    for (mode, net, want) in cases {
        assert_eq!(parse_ok(&text(mode, net)).net, want, "{mode} {net}");
    }
    let err = parse_err(&text("net:\n  mode: all\n", "true"), None);
    assert!(err.starts_with("platform.bwrap.unshare.net: true"), "{err}");
    for mode in ["none", "loopback", "allowlist", "proxy"] {
        let err = parse_err(&text(&format!("net:\n  mode: {mode}\n"), "false"), None);
        assert!(
            err.starts_with(
                "platform.bwrap.unshare.net: false is the host's network (net.mode all), but net.mode is"
            ),
            "{mode}: {err}"
        );
    }
    let err = parse_err("platform:\n  bwrap:\n    unshare:\n      mount: true\n", None);
    assert!(
        err.ends_with("platform.bwrap.unshare.mount: unknown field; this map takes net, pid, ipc"),
        "{err}"
    );
}
