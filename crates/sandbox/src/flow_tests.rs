//! Flow mappings on one line: their keys, the parser's errors inside them, and a field's
//! line; then the same through `sandgate run`'s and `check-config`'s loading of a policy.

use super::*;

#[test]
fn the_keys_of_a_flow_mapping_cover_their_entries() {
    let line = "net: { mode: \"a, {b\", proxy: { listen: 127.0.0.1:0 }, ports: [ 1, 2 ] } # {x: y}";
    let keys: Vec<(String, (usize, usize))> = flow_keys(line)
        .into_iter()
        .map(|k| (k.path.join("."), k.entry))
        .collect();
    assert_eq!(
        keys,
        [
            ("mode".to_owned(), (8, 20)),
            ("proxy.listen".to_owned(), (32, 51)),
            ("proxy".to_owned(), (23, 52)),
            ("ports".to_owned(), (55, 70)),
        ]
    );
    // No flow collection: nothing (a quoted bracket is a string).
    assert_eq!(flow_keys("  allow_domains: \"[x]\""), []);
    assert_eq!(flow_keys("- a.example"), []);
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "only the errors matter")]
struct Doc {
    net: Net,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "only the errors matter")]
struct Net {
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    allow_domains: Vec<String>,
    #[serde(default)]
    loopback_ports: Vec<u16>,
    #[serde(default)]
    proxy: Option<Proxy>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "only the errors matter")]
struct Proxy {
    listen: String,
    #[serde(default)]
    port: Option<u16>,
}

fn err(text: &str) -> String {
    let e = serde_saphyr::from_str::<Doc>(text).unwrap_err();
    yaml_error(&e, text, "p.yaml").to_string()
}

#[test]
fn an_error_inside_a_flow_mapping_names_the_key_it_is_under() {
    let at = |text: &str| {
        let e = err(text);
        e.split(": ").take(2).collect::<Vec<_>>().join(": ")
    };
    let cases = [
        (
            "net: { mode: allowlist, allow_domains: 5 }\n",
            "p.yaml:1: net.allow_domains",
        ),
        (
            "net: { allow_domains: [ x ], loopback_ports: [ abc ] }\n",
            "p.yaml:1: net.loopback_ports",
        ),
        ("net: { mode: [ a ] }\n", "p.yaml:1: net.mode"),
        (
            "net: { proxy: { listen: x, port: abc } }\n",
            "p.yaml:1: net.proxy.port",
        ),
        (
            "net: { proxy: { listen: x, bogus: 1 } }\n",
            "p.yaml:1: net.proxy.bogus",
        ),
        ("net: { mode: allowlist, bogus: 1 }\n", "p.yaml:1: net.bogus"),
        ("net: { proxy: { port: 1 } }\n", "p.yaml:1: net.proxy.listen"),
        ("net: { proxy: {} }\n", "p.yaml:1: net.proxy.listen"),
        (
            "net:   {   \"mode\": allowlist, 'allow_domains': 5 }\n",
            "p.yaml:1: net.allow_domains",
        ),
        (
            "net: { mode: \"é, {x\", allow_domains: 5 }\n",
            "p.yaml:1: net.allow_domains",
        ),
        // Block style and a flow mapping over several lines, as the document layer reads them.
        ("net:\n  allow_domains: 5\n", "p.yaml:2: net.allow_domains"),
        (
            "net: {mode: allowlist,\n  allow_domains: 5}\n",
            "p.yaml:2: net.allow_domains",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(at(text), want, "{text:?}: {}", err(text));
    }
    assert_eq!(
        err("net: { proxy: { listen: x, bogus: 1 } }\n"),
        "p.yaml:1: net.proxy.bogus: unknown field; this map takes listen, port"
    );
}

#[test]
fn a_field_written_inside_a_flow_mapping_has_its_line() {
    let text =
        "fs:\n  read_paths: [ /usr ]\nnet: { mode: allowlist, allow_domains: [ 5 ], proxy: { listen: x } }\n";
    assert_eq!(line_of(text, "fs.read_paths"), Some(2));
    assert_eq!(line_of(text, "net.allow_domains"), Some(3));
    assert_eq!(line_of(text, "net.proxy.listen"), Some(3));
    assert_eq!(line_of(text, "net.proxy"), Some(3));
    assert_eq!(line_of(text, "net.resolver"), None);
    assert_eq!(line_of(text, "fs.allow_domains"), None);
}

/// The whole way `sandgate run` and `check-config` read a policy file (`load_policy`).
#[test]
fn a_policy_file_names_the_field_and_line_inside_a_flow_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.yaml");
    let load = |net: &str| {
        let text =
            format!("apiVersion: sandgate.dev/v1\nkind: SandboxPolicy\nfs:\n  read_paths: [ / ]\n{net}");
        std::fs::write(&path, text).unwrap();
        let opts = crate::run::RunOptions {
            policy_path: path.clone(),
            ..Default::default()
        };
        match crate::run::load_policy(&opts) {
            Err(crate::run::RunError::Usage(m)) => m,
            other => panic!("{net}: {other:?}"),
        }
    };
    let file = path.display();
    // A value of the wrong type: the parser's error.
    assert_eq!(
        load("net: { mode: allowlist, allow_domains: 5 }\n"),
        format!("{file}:5: net.allow_domains: expected sequence start")
    );
    // A value the policy refuses after parsing.
    let refused = load("net: { mode: allowlist, allow_domains: [ 5 ] }\n");
    assert!(
        refused.starts_with(&format!("{file}:5: net.allow_domains: \"5\": ")),
        "{refused}"
    );
}
