//! Table tests of policy parsing: parameters, a full policy, and every refusal naming its
//! field, with the final network mode (the `--net` override) applied before the checks.

use super::*;
use crate::paths;
use std::path::Path;

fn params(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Every path exists and is its own canonical form.
fn as_written(p: &Path) -> std::io::Result<PathBuf> {
    Ok(paths::lexical(p))
}

fn parse_ok(text: &str) -> SandboxPolicy {
    parse(text, &params(&[]), &as_written, None).unwrap()
}

fn parse_err(text: &str, net: Option<NetMode>) -> String {
    parse(text, &params(&[]), &as_written, net).unwrap_err().0
}

#[test]
fn parameters_fill_and_unknown_ones_fail() {
    assert_eq!(substitute("a ${X} b", &params(&[("X", "1")])).unwrap(), "a 1 b");
    assert!(
        substitute("${Y}", &params(&[]))
            .unwrap_err()
            .0
            .contains("--param Y=VALUE")
    );
    assert!(substitute("${Y", &params(&[])).is_err());
}

/// A value is pasted into the YAML text: one that could end its scalar and add entries
/// (another writable path, say) is refused, however it got there (a workspace name an agent
/// chose, a --param).
#[test]
fn parameter_values_cannot_rewrite_the_policy() {
    let policy = "fs:\n  write_paths: [ \"${W}\" ]\n";
    for evil in [
        "/srv/work/x\", \"/etc",
        "/srv/work/x\n  - /etc",
        "/srv/work/x ] \n  read_paths: [ /",
        "/srv/work/x#",
        "/srv/work/x: y",
        "- /etc",
        "",
    ] {
        let err = parse(policy, &params(&[("W", evil)]), &as_written, None)
            .unwrap_err()
            .0;
        assert!(err.contains("parameter W"), "{evil:?}: {err}");
    }
    let ok = parse(
        policy,
        &params(&[("W", "/srv/work/project-1.2_a")]),
        &as_written,
        None,
    )
    .unwrap();
    assert_eq!(ok.write_paths, [PathBuf::from("/srv/work/project-1.2_a")]);
}

#[test]
fn a_full_policy_parses() {
    let text = "env:\n  set: { HOME: /work }\n  passthrough: [ LANG, OPENAI_API_KEY, LC_* ]\n\
                fs:\n  read_paths: [ /usr, \"${PROJECT}\" ]\n  write_paths: [ \"${PROJECT}/out\" ]\n  tmp: private\n\
                net:\n  mode: allowlist\n  allow_domains: [ api.openai.com, \"*.pythonhosted.org\" ]\n  presets: [ python-packages ]\n\
                platform:\n  bwrap: { unshare: { pid: true, ipc: false }, devices: [ null, urandom ] }\n  seatbelt: { extra_allow: {} }\n  seccomp: { allow_unix_sockets: true }\n";
    let p = parse(text, &params(&[("PROJECT", "/srv/p")]), &as_written, None).unwrap();
    assert_eq!(p.net, NetMode::Allowlist);
    // The two domains as patterns, the preset's two hosts as entries on 443.
    assert_eq!(p.allow.len(), 2);
    let preset: Vec<String> = p
        .allow_entries
        .iter()
        .map(|e| format!("{}:{:?}", e.pattern, e.ports))
        .collect();
    assert_eq!(
        preset,
        ["pypi.org:Some([443])", "files.pythonhosted.org:Some([443])"]
    );
    assert_eq!(p.read_paths, [PathBuf::from("/usr"), PathBuf::from("/srv/p")]);
    assert_eq!(p.write_paths, [PathBuf::from("/srv/p/out")]);
    assert!(p.unshare_pid && !p.unshare_ipc);
    assert!(p.allow_unix_sockets);
    assert_eq!(p.proxy_port, 3128);
    assert_eq!(p.socks_port, Some(1080));
    assert!(!parse_ok("net:\n  mode: none\n").allow_unix_sockets);
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (
            "fs:\n  read_paths: [ usr ]\n",
            "fs.read_paths: \"usr\" is not an absolute path",
        ),
        ("net:\n  mode: sideways\n", "net mode \"sideways\""),
        (
            "net:\n  mode: allowlist\n  allow_domains: [ \"*.com\" ]\n",
            "net.allow_domains: \"*.com\"",
        ),
        (
            "net:\n  mode: none\n  allow_domains: [ a.example ]\n",
            "need net.mode allowlist",
        ),
        (
            "net:\n  mode: none\n  loopback_ports: [ 5432 ]\n",
            "needs net.mode loopback, allowlist, or proxy without net.proxy.upstream",
        ),
        (
            "fs:\n  allow_read_all: true\nnet:\n  mode: allowlist\n",
            "Unix sockets",
        ),
        (
            "fs:\n  allow_read_all: true\nnet:\n  mode: none\n",
            "Unix sockets",
        ),
        ("fs:\n  read_paths: [ /run/user ]\n", "Unix sockets"),
        ("fs:\n  bogus: 1\n", "bogus"),
        (
            "platform:\n  seatbelt: { extra_allow: { network: true } }\n",
            "seatbelt",
        ),
        ("platform:\n  seccomp: { allow_tiocsti: true }\n", "allow_tiocsti"),
        (
            "env:\n  passthrough: [ \"*\" ]\n",
            "env.passthrough: \"*\" would pass the whole host environment",
        ),
        (
            "env:\n  passthrough: [ LANG, \"**\" ]\n",
            "env.passthrough: \"**\"",
        ),
    ];
    for (text, want) in cases {
        let err = parse_err(text, None);
        assert!(err.contains(want), "{text:?}: {err}");
    }
    let missing = parse(
        "fs:\n  read_paths: [ /nope ]\n",
        &params(&[]),
        &|p| {
            if p == Path::new("/nope") {
                Err(std::io::ErrorKind::NotFound.into())
            } else {
                Ok(p.to_path_buf())
            }
        },
        None,
    );
    assert!(missing.unwrap_err().0.contains("\"/nope\" does not exist"));
}

#[test]
fn socket_directories_are_refused_in_every_spelling_and_through_symlinks() {
    let host = |p: &Path| -> std::io::Result<PathBuf> {
        let clean = paths::lexical(p);
        Ok(match clean.to_str() {
            Some("/var/../tmp") => "/tmp".into(),
            Some("/home/u/link") => "/run/user/1000".into(),
            Some("/var/run") => "/run".into(),
            _ => clean,
        })
    };
    for spelling in [
        "//tmp",
        "/tmp/.",
        "/var/../tmp",
        "/home/u/link",
        "/var/run",
        "/run/",
    ] {
        for field in ["read_paths", "write_paths"] {
            let text = format!("fs:\n  {field}: [ \"{spelling}\" ]\n");
            let err = parse(&text, &params(&[]), &host, None).unwrap_err().0;
            assert!(
                err.starts_with(&format!("fs.{field}: \"{spelling}\""))
                    && err.contains("may hold host Unix sockets"),
                "{spelling}: {err}"
            );
        }
        let text = format!("platform:\n  bwrap: {{ ro_bind: [ \"{spelling}\" ] }}\n");
        assert!(parse(&text, &params(&[]), &host, None).is_err(), "{spelling}");
        // With the host's network anyway, binding them is the operator's call.
        let text = format!("fs:\n  read_paths: [ \"{spelling}\" ]\nnet:\n  mode: all\n");
        assert!(parse(&text, &params(&[]), &host, None).is_ok(), "{spelling}");
    }
}

#[test]
fn checks_see_the_command_line_network_mode() {
    let all_read = "fs:\n  allow_read_all: true\nnet:\n  mode: all\n";
    assert!(parse(all_read, &params(&[]), &as_written, None).is_ok());
    assert!(parse_err(all_read, Some(NetMode::None)).contains("Unix sockets"));
    let run_dir = "fs:\n  read_paths: [ /run ]\nnet:\n  mode: all\n";
    assert!(parse_err(run_dir, Some(NetMode::Allowlist)).contains("may hold host Unix sockets"));
    let ports = "net:\n  mode: loopback\n  loopback_ports: [ 5432 ]\n";
    let p = parse(ports, &params(&[]), &as_written, Some(NetMode::Allowlist)).unwrap();
    assert_eq!(p.net, NetMode::Allowlist);
    assert_eq!(p.loopback_ports, [5432]);
}

#[test]
fn no_pid_namespace_only_with_the_hosts_network() {
    let text =
        |mode: &str| format!("net:\n  mode: {mode}\nplatform:\n  bwrap: {{ unshare: {{ pid: false }} }}\n");
    for mode in ["none", "loopback", "allowlist"] {
        let err = parse_err(&text(mode), None);
        assert!(
            err.starts_with("platform.bwrap.unshare.pid: false needs net.mode all"),
            "{mode}: {err}"
        );
    }
    assert!(!parse_ok(&text("all")).unshare_pid);
    assert!(parse_err(&text("all"), Some(NetMode::None)).contains("unshare.pid"));
}

#[test]
fn symlinked_paths_are_bound_at_their_target_with_an_alias() {
    let host = |p: &Path| -> std::io::Result<PathBuf> {
        let clean = paths::lexical(p);
        Ok(match clean.to_str() {
            Some("/lib") => "/usr/lib".into(),
            _ => clean,
        })
    };
    let p = parse("fs:\n  read_paths: [ /usr, /lib ]\n", &params(&[]), &host, None).unwrap();
    assert_eq!(p.read_paths, [PathBuf::from("/usr"), PathBuf::from("/usr/lib")]);
    assert_eq!(
        p.aliases,
        [Alias {
            at: "/lib".into(),
            target: "/usr/lib".into()
        }]
    );
}

#[test]
fn the_socks5_port_is_loopback_and_its_own() {
    let net = |proxy: &str, ports: &str| {
        format!("net:\n  mode: allowlist\n  loopback_ports: [ {ports} ]\n  proxy: {{ {proxy} }}\n")
    };
    let p = parse_ok(&net("socks_listen: \"127.0.0.1:9050\"", ""));
    assert_eq!((p.proxy_port, p.socks_port), (3128, Some(9050)));
    assert_eq!(
        parse_ok(&net("socks_listen: \"[::1]:0\"", "")).socks_port,
        Some(1080)
    );
    let cases = [
        (
            net("socks_listen: \"0.0.0.0:1080\"", ""),
            "net.proxy.socks_listen: \"0.0.0.0:1080\" must be a loopback address",
        ),
        (
            net("socks_listen: \"localhost:1080\"", ""),
            "net.proxy.socks_listen: \"localhost:1080\" is not IP:PORT",
        ),
        (
            net("socks_listen: \"127.0.0.1:3128\"", ""),
            "net.proxy.socks_listen: port 3128 is also the HTTP proxy's (net.proxy.listen)",
        ),
        (
            net("listen: \"127.0.0.1:1080\"", ""),
            "net.proxy.socks_listen: port 1080 is also the HTTP proxy's",
        ),
        (
            net("socks_listen: \"127.0.0.1:1080\"", "1080"),
            "net.loopback_ports: 1080 is the SOCKS5 port (net.proxy.socks_listen)",
        ),
        (
            net("listen: \"127.0.0.1:8080\"", "8080"),
            "net.loopback_ports: 8080 is the HTTP proxy's port (net.proxy.listen)",
        ),
    ];
    for (text, want) in cases {
        let err = parse_err(&text, None);
        assert!(err.contains(want), "{text:?}: {err}");
    }
    // Without the proxy there is no SOCKS5 port to collide with.
    let p = parse_ok("net:\n  mode: loopback\n  loopback_ports: [ 1080, 3128 ]\n");
    assert_eq!(
        (p.loopback_ports.as_slice(), p.socks_port),
        (&[1080, 3128][..], None)
    );
    // Chained too (each SOCKS5 tunnel is a CONNECT to the upstream proxy).
    let chained = "net:\n  mode: proxy\n  proxy: { upstream: \"10.0.0.1:3128\" }\n";
    assert_eq!(parse_ok(chained).socks_port, Some(1080));
    let chained =
        "net:\n  mode: proxy\n  proxy: { upstream: \"10.0.0.1:3128\", socks_listen: \"127.0.0.1:9050\" }\n";
    assert_eq!(parse_ok(chained).socks_port, Some(9050));
}

/// A tmpfs over a path that does not exist is made on bwrap's own root; inside a bound path
/// it is refused (nothing there to hide, and bwrap would make the directory in the host's
/// tree). One that exists is taken at its canonical place, to be ordered after its bind.
#[test]
fn tmpfs_paths_are_canonical_and_a_missing_one_inside_a_bind_is_refused() {
    let resolve = |p: &Path| -> std::io::Result<PathBuf> {
        match p.to_str() {
            Some("/home/u/.ssh-missing" | "/scratch") => Err(std::io::ErrorKind::NotFound.into()),
            Some("/home/link/.ssh") => Ok(PathBuf::from("/home/u/.ssh")),
            _ => Ok(p.to_path_buf()),
        }
    };
    let parse_with = |text: &str| parse(text, &params(&[]), &resolve, None);
    let p = parse_with(
        "fs:\n  read_paths: [ /home/u ]\nplatform:\n  bwrap: { tmpfs: [ /home/link/.ssh, /scratch ] }\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        p.extra_tmpfs,
        [PathBuf::from("/home/u/.ssh"), PathBuf::from("/scratch")]
    );
    let err = parse_with(
        "fs:\n  read_paths: [ /home/u ]\nplatform:\n  bwrap: { tmpfs: [ /home/u/.ssh-missing ] }\n",
    )
    .unwrap_err()
    .0;
    assert!(
        err.contains("platform.bwrap.tmpfs") && err.contains("inside the bound path /home/u"),
        "{err}"
    );
    let err = parse_with("platform:\n  bwrap: { tmpfs: [ relative ] }\n")
        .unwrap_err()
        .0;
    assert!(err.contains("not an absolute path"), "{err}");
}
