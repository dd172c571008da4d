//! Flags, environment and policy files into a proxy configuration; the connection cap
//! against the open-file limit.

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
