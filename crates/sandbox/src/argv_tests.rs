//! The bwrap command line for each mode, checked as text.

use super::*;
use std::collections::BTreeMap;

fn policy(text: &str) -> SandboxPolicy {
    crate::policy::parse(text, &BTreeMap::new(), &|p| Ok(crate::paths::lexical(p)), None).unwrap()
}

fn facts() -> RunFacts {
    RunFacts {
        sandgate_exe: "/opt/sandgate".into(),
        bridge_dir: Some("/tmp/sg-1/bridge".into()),
        dns_files: vec![("/run/resolv/stub.conf".into(), "/etc/resolv.conf".into())],
        command: vec!["curl".into(), "https://a.example/".into()],
    }
}

fn joined(v: &[OsString]) -> String {
    v.iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn allowlist_mode_routes_through_the_init_and_the_bridge() {
    let p = policy(
        "fs:\n  read_paths: [ /usr ]\n  write_paths: [ /srv/out ]\nnet:\n  mode: allowlist\n  allow_domains: [ a.example ]\n",
    );
    let s = joined(&bwrap_argv(&p, &facts()));
    assert!(
        s.starts_with(
            "bwrap --die-with-parent --unshare-user --unshare-uts --unshare-cgroup-try --cap-drop ALL"
        ),
        "{s}"
    );
    assert!(s.contains("--unshare-net"));
    assert!(s.contains("--proc /proc --dev /dev --tmpfs /tmp --ro-bind /usr /usr --bind /srv/out /srv/out"));
    assert!(
        s.contains(
            "--ro-bind /tmp/sg-1/bridge /run/sandgate --ro-bind /opt/sandgate /run/sandgate-init --remount-ro / --as-pid-1"
        ),
        "{s}"
    );
    assert!(
        !s.contains("--setenv") && !s.contains("--clearenv") && !s.contains("HTTP_PROXY"),
        "{s}"
    );
    assert!(s.ends_with(
        "-- /run/sandgate-init sandbox-init --forward 127.0.0.1:3128=/run/sandgate/proxy.sock --forward 127.0.0.1:1080=/run/sandgate/socks.sock -- /run/sandgate-init sandbox-exec -- curl https://a.example/"
    ), "{s}");
}

#[test]
fn the_socks5_port_has_its_own_forward_in_the_proxied_modes() {
    let ports = policy(
        "net:\n  mode: allowlist\n  loopback_ports: [ 5432 ]\n  allow_domains: [ a.example ]\n  proxy: { listen: \"127.0.0.1:8080\", socks_listen: \"127.0.0.1:9050\" }\n",
    );
    let s = joined(&bwrap_argv(&ports, &facts()));
    assert!(
        s.contains(
            "sandbox-init --forward 127.0.0.1:8080=/run/sandgate/proxy.sock --forward 127.0.0.1:9050=/run/sandgate/socks.sock --forward 127.0.0.1:5432=/run/sandgate/port-5432.sock --"
        ),
        "{s}"
    );
    // Chained too: the run's proxy asks the upstream proxy for each SOCKS5 tunnel.
    let chained = policy(
        "net:\n  mode: proxy\n  proxy: { upstream: \"10.0.0.1:3128\" }\n  allow_domains: [ a.example ]\n",
    );
    let s = joined(&bwrap_argv(&chained, &facts()));
    assert!(
        s.contains(
            "sandbox-init --forward 127.0.0.1:3128=/run/sandgate/proxy.sock --forward 127.0.0.1:1080=/run/sandgate/socks.sock -- "
        ),
        "{s}"
    );
}

#[test]
fn none_and_all_modes_start_the_command_through_the_filter_step() {
    let s = joined(&bwrap_argv(&policy("net:\n  mode: none\n"), &facts()));
    assert!(s.contains("--unshare-net") && !s.contains("sandbox-init") && !s.contains("/run/sandgate "));
    assert!(!s.contains("socks.sock"), "{s}");
    assert!(s.contains("--ro-bind /opt/sandgate /run/sandgate-init"), "{s}");
    assert!(
        s.ends_with("-- /run/sandgate-init sandbox-exec -- curl https://a.example/"),
        "{s}"
    );
    assert!(
        !s.contains("resolv"),
        "no DNS files without the host's network: {s}"
    );
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: all\nfs:\n  read_paths: [ /usr ]\n"),
        &facts(),
    ));
    assert!(!s.contains("--unshare-net"));
    assert!(
        s.contains("--ro-bind /run/resolv/stub.conf /etc/resolv.conf"),
        "{s}"
    );
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: all\nfs:\n  allow_read_all: true\n"),
        &facts(),
    ));
    assert!(s.contains("--ro-bind / /") && !s.contains("resolv"), "{s}");
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: all\nfs:\n  allow_write_all: true\n"),
        &facts(),
    ));
    assert!(s.contains("--bind / /") && !s.contains("--remount-ro"), "{s}");
}

#[test]
fn unix_sockets_opt_in_reaches_the_filter_step() {
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: none\nplatform:\n  seccomp: { allow_unix_sockets: true }\n"),
        &facts(),
    ));
    assert!(
        s.ends_with("sandbox-exec --allow-unix-sockets -- curl https://a.example/"),
        "{s}"
    );
}

#[test]
fn loopback_ports_are_forwarded_by_the_init() {
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: loopback\n  loopback_ports: [ 5432 ]\n"),
        &facts(),
    ));
    assert!(
        s.contains("--unshare-net") && !s.contains("HTTP_PROXY") && !s.contains("socks.sock"),
        "{s}"
    );
    assert!(
        s.ends_with("sandbox-init --forward 127.0.0.1:5432=/run/sandgate/port-5432.sock -- /run/sandgate-init sandbox-exec -- curl https://a.example/"),
        "{s}"
    );
}

#[test]
fn nothing_of_the_host_unless_listed() {
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: none\nfs:\n  tmp: none\n"),
        &facts(),
    ));
    assert!(!s.contains("--bind") && !s.contains("--tmpfs"), "{s}");
    assert_eq!(s.matches("--ro-bind").count(), 1, "only the sandgate binary: {s}");
}

#[test]
fn aliases_become_symlinks_unless_a_bind_already_shows_them() {
    let mut p = policy("fs:\n  read_paths: [ /usr ]\n");
    p.read_paths.push("/usr/lib".into());
    p.read_paths.push("/usr/lib/x86_64-linux-gnu".into());
    p.aliases = vec![
        crate::paths::Alias {
            at: "/lib".into(),
            target: "/usr/lib".into(),
        },
        crate::paths::Alias {
            at: "/lib/x86_64-linux-gnu".into(),
            target: "/usr/lib/x86_64-linux-gnu".into(),
        },
        crate::paths::Alias {
            at: "/usr/lib64".into(),
            target: "/usr/lib".into(),
        },
    ];
    let s = joined(&bwrap_argv(&p, &facts()));
    assert!(s.contains("--symlink /usr/lib /lib"), "{s}");
    assert_eq!(
        s.matches("--ro-bind /usr").count(),
        1,
        "binds under /usr are covered: {s}"
    );
    assert_eq!(s.matches("--symlink").count(), 1, "{s}");
}
