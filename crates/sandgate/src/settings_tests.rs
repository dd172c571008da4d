//! Flags, environment and policy files into a proxy configuration; the connection cap
//! against the open-file limit.

use std::collections::HashMap;

use super::*;
use sandgate_proxy::Limits;

#[test]
fn the_connection_cap_fits_the_open_file_limit() {
    let mut l = Limits::default();
    fit_to_fd_limit(&mut l, false, 1024).unwrap();
    assert_eq!(l.max_connections, 384);
    let mut l = Limits::default();
    fit_to_fd_limit(&mut l, false, 1 << 20).unwrap();
    assert_eq!(l.max_connections, 16_384);
    let mut l = Limits {
        max_connections: 5000,
        ..Limits::default()
    };
    let err = fit_to_fd_limit(&mut l, true, 1024).unwrap_err().to_string();
    assert!(
        err.contains("--max-connections") && err.contains("10256 open files"),
        "{err}"
    );
    assert!(err.contains("lower --max-connections to 384"), "{err}");
}
use clap::Parser;

fn config(argv: &[&str], env: &[(&str, &str)]) -> Result<ProxyConfig, SettingsError> {
    let mut full = vec!["sandgate", "proxy"];
    full.extend_from_slice(argv);
    let crate::cli::Command::Proxy(args) = crate::cli::Cli::try_parse_from(full).unwrap().command else {
        panic!("not a proxy command")
    };
    let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    proxy_setup(&args, &env).map(|s| s.config)
}

fn addrs(c: &ProxyConfig) -> Vec<SocketAddr> {
    c.listen.iter().map(|l| l.addr).collect()
}

#[test]
fn defaults() {
    let c = config(&[], &[]).unwrap();
    assert_eq!(addrs(&c), vec!["127.0.0.1:3128".parse().unwrap()]);
    assert!(c.rules.allows_nothing());
    assert_eq!(c.nameservers, Nameservers::System);
    assert_eq!(c.audit, AuditDestination::Stdout);
}

#[test]
fn environment_and_precedence() {
    let c = config(
        &[],
        &[
            ("PROXY_PORT", "8080"),
            ("PROXY_ALLOWLIST", "a.example, b.example"),
        ],
    )
    .unwrap();
    assert_eq!(addrs(&c), vec!["0.0.0.0:8080".parse().unwrap()]);
    assert_eq!(c.rules.len(), (2, 0));
    let c = config(&[], &[("PROXY_PORT", "8080"), ("SANDGATE_LISTEN", "127.0.0.1:9")]).unwrap();
    assert_eq!(addrs(&c), vec!["127.0.0.1:9".parse().unwrap()]);
    let c = config(
        &["--listen", "[::1]:7", "--allow", "c.example"],
        &[
            ("SANDGATE_LISTEN", "127.0.0.1:9"),
            ("SANDGATE_ALLOW", "a.example,b.example"),
        ],
    )
    .unwrap();
    assert_eq!(addrs(&c), vec!["[::1]:7".parse().unwrap()]);
    assert_eq!(c.rules.len(), (1, 0));
    let c = config(
        &[
            "--allow",
            "a.example,b.example",
            "--allow",
            "c.example",
            "--deny",
            "x.example",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(c.rules.len(), (3, 1));
}

#[test]
fn bad_values_name_the_source_and_value() {
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case<'_>] = &[
        (&["--allow", "*.com"], &[], "--allow value \"*.com\""),
        (&["--deny", "a b"], &[], "--deny value \"a b\""),
        (
            &[],
            &[("PROXY_ALLOWLIST", "ok.example,127.1")],
            "PROXY_ALLOWLIST value \"127.1\"",
        ),
        (
            &["--listen", "localhost:3128"],
            &[],
            "--listen value \"localhost:3128\"",
        ),
        (&[], &[("PROXY_PORT", "0")], "PROXY_PORT value \"0\""),
        (&["--dns-server", "dns.example"], &[], "--dns-server value"),
        (&["--allow-range", "10.0.0.0/33"], &[], "--allow-range value"),
        (&["--connect-timeout", "0"], &[], "--connect-timeout value"),
    ];
    for (argv, env, want) in cases {
        let err = config(argv, env).unwrap_err().to_string();
        assert!(err.contains(want), "{argv:?} {env:?}: {err}");
    }
}

#[test]
fn dns_servers_and_ranges() {
    let c = config(
        &[
            "--dns-server",
            "127.0.0.1:5353,10.0.0.2",
            "--allow-range",
            "10.20.1.1/16,192.0.2.1",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(
        c.nameservers,
        Nameservers::Explicit(vec![
            "127.0.0.1:5353".parse().unwrap(),
            "10.0.0.2:53".parse().unwrap()
        ])
    );
    let ranges: Vec<String> = c.guard.allow_ranges().iter().map(|r| r.to_string()).collect();
    assert_eq!(ranges, ["10.20.0.0/16", "192.0.2.1/32"]);
}

fn setup(argv: &[&str], env: &[(&str, &str)]) -> ProxySetup {
    let mut full = vec!["sandgate", "proxy"];
    full.extend_from_slice(argv);
    let crate::cli::Command::Proxy(args) = crate::cli::Cli::try_parse_from(full).unwrap().command else {
        panic!("not a proxy command")
    };
    let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    proxy_setup(&args, &env).unwrap()
}

/// The design's aa-proxy variable is the allowlist, with one note naming sandgate's own
/// name; set but empty, it still allows nothing (aa-proxy's empty meant "no filter").
#[test]
fn the_designs_allowlist_variable_is_an_alias_with_a_note() {
    let s = setup(
        &[],
        &[(
            "AA_PROXY_NETWORK_ALLOWLIST",
            "api.openai.com,*.anthropic.com,*.googleapis.com",
        )],
    );
    assert_eq!(s.config.rules.len(), (3, 0));
    let notes: Vec<&String> = s
        .warnings
        .iter()
        .filter(|w| w.contains("AA_PROXY_NETWORK_ALLOWLIST"))
        .collect();
    assert_eq!(notes.len(), 1, "{:?}", s.warnings);
    assert!(
        notes[0].contains("read as SANDGATE_ALLOW, sandgate's own name"),
        "{notes:?}"
    );
    for empty in ["", " , "] {
        let s = setup(&[], &[("AA_PROXY_NETWORK_ALLOWLIST", empty)]);
        assert!(s.config.rules.allows_nothing(), "{empty:?} opened the proxy");
        assert!(
            s.warnings
                .iter()
                .any(|w| w.contains("set but empty") && w.contains("default deny")),
            "{:?}",
            s.warnings
        );
    }
    // With the other names: every set variable adds; a flag wins over all of them.
    let s = setup(
        &[],
        &[
            ("SANDGATE_ALLOW", "a.example"),
            ("PROXY_ALLOWLIST", "b.example"),
            ("AA_PROXY_NETWORK_ALLOWLIST", "c.example"),
        ],
    );
    assert_eq!(s.config.rules.len(), (3, 0));
    let s = setup(
        &["--allow", "d.example"],
        &[("AA_PROXY_NETWORK_ALLOWLIST", "c.example")],
    );
    assert_eq!(s.config.rules.len(), (1, 0));
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("AA_PROXY_NETWORK_ALLOWLIST is ignored")),
        "{:?}",
        s.warnings
    );
    // A bad pattern names the variable it came from.
    let err = config(&[], &[("AA_PROXY_NETWORK_ALLOWLIST", "ok.example,*.com")])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("AA_PROXY_NETWORK_ALLOWLIST value \"*.com\""),
        "{err}"
    );
}

/// An environment-only sidecar names its internal ranges, resolvers, policy file and audit
/// log; a flag wins over each; a bad value names the variable.
#[test]
fn ranges_resolvers_policy_and_audit_log_from_the_environment() {
    let c = config(
        &[],
        &[
            ("SANDGATE_ALLOW_RANGE", "192.168.1.0/24, 10.1.2.3"),
            ("SANDGATE_DNS_SERVER", "10.0.0.2,10.0.0.3:5353"),
            ("SANDGATE_AUDIT_LOG", "/var/log/sandgate/audit.jsonl"),
        ],
    )
    .unwrap();
    let ranges: Vec<String> = c.guard.allow_ranges().iter().map(|r| r.to_string()).collect();
    assert_eq!(ranges, ["192.168.1.0/24", "10.1.2.3/32"]);
    assert_eq!(
        c.nameservers,
        Nameservers::Explicit(vec![
            "10.0.0.2:53".parse().unwrap(),
            "10.0.0.3:5353".parse().unwrap()
        ])
    );
    assert_eq!(
        c.audit,
        AuditDestination::File("/var/log/sandgate/audit.jsonl".into())
    );
    let c = config(
        &[
            "--allow-range",
            "172.16.0.0/12",
            "--dns-server",
            "10.9.9.9",
            "--audit-log",
            "-",
        ],
        &[
            ("SANDGATE_ALLOW_RANGE", "192.168.1.0/24"),
            ("SANDGATE_DNS_SERVER", "10.0.0.2"),
            ("SANDGATE_AUDIT_LOG", "/x"),
        ],
    )
    .unwrap();
    let ranges: Vec<String> = c.guard.allow_ranges().iter().map(|r| r.to_string()).collect();
    assert_eq!(ranges, ["172.16.0.0/12"]);
    assert_eq!(
        c.nameservers,
        Nameservers::Explicit(vec!["10.9.9.9:53".parse().unwrap()])
    );
    assert_eq!(c.audit, AuditDestination::Stdout);
    // Set but empty (a compose file's `${VAR:-}`): unset.
    let c = config(
        &[],
        &[
            ("SANDGATE_ALLOW_RANGE", ""),
            ("SANDGATE_DNS_SERVER", " "),
            ("SANDGATE_AUDIT_LOG", ""),
            ("SANDGATE_POLICY", ""),
        ],
    )
    .unwrap();
    assert!(c.guard.allow_ranges().is_empty());
    assert_eq!(c.nameservers, Nameservers::System);
    assert_eq!(c.audit, AuditDestination::Stdout);
    for (var, value) in [
        ("SANDGATE_ALLOW_RANGE", "10.0.0.0/33"),
        ("SANDGATE_DNS_SERVER", "dns.example"),
    ] {
        let err = config(&[], &[(var, value)]).unwrap_err().to_string();
        assert!(err.contains(&format!("{var} value {value:?}")), "{err}");
    }
    // The policy file: read from the variable, its errors naming the file.
    let err = config(&[], &[("SANDGATE_POLICY", "/nonexistent/sandgate-policy.yaml")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/sandgate-policy.yaml"), "{err}");
}

/// The environment wins over the file's resolver, as the flag does.
#[test]
fn the_resolver_variable_wins_over_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.yaml");
    std::fs::write(
        &path,
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: r }\nspec:\n  resolver: { servers: [ \"10.0.0.53\" ] }\n  listeners:\n    - listen: 127.0.0.1:0\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let c = config(&[], &[("SANDGATE_POLICY", p)]).unwrap();
    assert_eq!(
        c.nameservers,
        Nameservers::Explicit(vec!["10.0.0.53:53".parse().unwrap()])
    );
    let c = config(
        &[],
        &[("SANDGATE_POLICY", p), ("SANDGATE_DNS_SERVER", "10.0.0.2")],
    )
    .unwrap();
    assert_eq!(
        c.nameservers,
        Nameservers::Explicit(vec!["10.0.0.2:53".parse().unwrap()])
    );
}

/// SANDGATE_ADMIN_LISTEN (the image's loopback admin listener) opens one when neither the
/// flag nor the file names one, and moves neither's.
#[test]
fn the_admin_listener_variable_ranks_below_the_flag_and_the_file() {
    let env = [("SANDGATE_ADMIN_LISTEN", "127.0.0.1:9090")];
    let at = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
    assert_eq!(config(&[], &env).unwrap().metrics_listen, at("127.0.0.1:9090"));
    assert_eq!(config(&[], &[]).unwrap().metrics_listen, None);
    assert_eq!(
        config(&["--admin-listen", "127.0.0.1:9191"], &env)
            .unwrap()
            .metrics_listen,
        at("127.0.0.1:9191")
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.yaml");
    std::fs::write(
        &path,
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: a }\nspec:\n  admin: { listen: 127.0.0.1:9292 }\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let c = config(&["--policy", p], &env).unwrap();
    assert_eq!(c.metrics_listen, at("127.0.0.1:9292"));
    let err = config(&[], &[("SANDGATE_ADMIN_LISTEN", "9090")])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("SANDGATE_ADMIN_LISTEN") && err.contains("\"9090\""),
        "{err}"
    );
}

/// An admin listener off loopback is warned about, unless something is said to guard it.
#[test]
fn an_admin_listener_off_loopback_is_warned_about_unless_guarded() {
    let warned = |s: &ProxySetup| {
        s.warnings
            .iter()
            .any(|w| w.contains("admin listener 0.0.0.0:9090 is not on loopback"))
    };
    let open = setup(&["--admin-listen", "0.0.0.0:9090"], &[]);
    assert!(warned(&open), "{:?}", open.warnings);
    assert!(open.warnings.iter().any(|w| w.contains("--admin-guarded-by")));
    let guarded = setup(
        &[
            "--admin-listen",
            "0.0.0.0:9090",
            "--admin-guarded-by",
            "NetworkPolicy sandgate-node-local",
        ],
        &[],
    );
    assert!(!warned(&guarded), "{:?}", guarded.warnings);
    let loopback = setup(&["--admin-listen", "127.0.0.1:9090"], &[]);
    assert!(loopback.warnings.is_empty(), "{:?}", loopback.warnings);
}

/// With no --policy and no SANDGATE_POLICY, ./sandgate.yaml (else /etc/sandgate/policy.yaml)
/// is read when there; named, it is not looked for.
#[test]
fn a_policy_file_in_the_working_directory_is_found_when_none_is_named() {
    struct Here(HashMap<String, String>);
    impl Env for Here {
        fn get(&self, key: &str) -> Option<String> {
            self.0.get(key).cloned()
        }
        fn exists(&self, path: &std::path::Path) -> bool {
            path == std::path::Path::new(crate::settings::discovery::LOCAL_POLICY)
        }
    }
    let parse = |argv: &[&str]| {
        let mut full = vec!["sandgate", "proxy"];
        full.extend_from_slice(argv);
        let crate::cli::Command::Proxy(args) = crate::cli::Cli::try_parse_from(full).unwrap().command else {
            panic!("not a proxy command")
        };
        args
    };
    // Found: loading ./sandgate.yaml is attempted (the unit tests' directory has none, so
    // the error names it).
    let err = proxy_setup(&parse(&[]), &Here(HashMap::new()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("./sandgate.yaml"), "{err}");
    // Named by the flag or the variable: not looked for.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.yaml");
    std::fs::write(
        &path,
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: n }\nspec: {}\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    assert!(proxy_setup(&parse(&["--policy", p]), &Here(HashMap::new())).is_ok());
    let named = Here(HashMap::from([("SANDGATE_POLICY".to_owned(), p.to_owned())]));
    assert!(proxy_setup(&parse(&[]), &named).is_ok());
}
