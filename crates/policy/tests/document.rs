//! Policy files: the documented example parses, every error names file, line and field,
//! scopes add up, expiry is exact to the second, deny wins, presets expand.

#![allow(clippy::indexing_slicing, clippy::unwrap_used, reason = "tests")]

use sandgate_policy::{Access, Context, Ruleset, Scope, Verdict, parse_connect_target, parse_policy};

const NOW: i64 = 1_800_000_000;

fn doc_example() -> String {
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/policy.md")).unwrap();
    let start = md.find("```yaml\n").unwrap() + "```yaml\n".len();
    let end = md[start..].find("```").unwrap() + start;
    md[start..end].to_owned()
}

fn decide(rules: &Ruleset, target: &str, task: Option<&str>, project: Option<&str>, now: i64) -> Verdict {
    let t = parse_connect_target(target).unwrap();
    rules
        .decide(&t, Access::Connect, &Context { task, project, now })
        .verdict
}

#[test]
fn the_documented_example_parses() {
    let file = parse_policy(&doc_example(), "policy.yaml", NOW).unwrap();
    assert_eq!(file.name, "prod-egress");
    assert_eq!(
        file.allow.len(),
        4 + 2,
        "four entries and the python-packages preset"
    );
    assert_eq!(file.deny.len(), 1);
    assert_eq!(file.listeners.len(), 2);
    assert_eq!(file.listeners[1].task.as_deref(), Some("t-123"));
    assert_eq!(file.allow[2].scope, Scope::Task("t-123".into()));
    assert_eq!(&*file.allow[2].origin, "policy.yaml:12");
    assert_eq!(file.allow[3].expires_at, Some(NOW + 3600));
}

#[test]
fn scopes_add_up_and_deny_wins() {
    let file = parse_policy(&doc_example(), "policy.yaml", NOW).unwrap();
    let rules = Ruleset::from_parts(&[], &[], Some(&file));
    // System entries apply to everyone.
    assert_eq!(
        decide(&rules, "api.openai.com:443", None, None, NOW),
        Verdict::Allow
    );
    assert_eq!(
        decide(&rules, "api.openai.com:443", Some("t-9"), None, NOW),
        Verdict::Allow
    );
    // Task entries only to that task, on top of the system ones.
    assert_eq!(
        decide(&rules, "pypi.org:443", Some("t-123"), None, NOW),
        Verdict::Allow,
        "preset and task both allow"
    );
    let t = parse_connect_target("registry.internal.example:8443").unwrap();
    let for_project = Context {
        task: None,
        project: Some("p-9"),
        now: NOW,
    };
    assert_eq!(
        rules.decide(&t, Access::Connect, &for_project).verdict,
        Verdict::Allow
    );
    assert_eq!(
        rules.decide(&t, Access::Connect, &Context::system(NOW)).verdict,
        Verdict::Deny
    );
    // The wildcard deny beats every allow.
    let mut with_star =
        Ruleset::from_parts(&[sandgate_policy::Pattern::parse("*").unwrap()], &[], Some(&file));
    assert_eq!(
        decide(&with_star, "x.evil.example:443", None, None, NOW),
        Verdict::Deny
    );
    with_star.allow(sandgate_policy::Pattern::parse("x.evil.example").unwrap());
    assert_eq!(
        decide(&with_star, "x.evil.example:443", None, None, NOW),
        Verdict::Deny
    );
}

#[test]
fn expiry_is_exact_to_the_second() {
    let text = "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: t }\nspec:\n  network:\n    allowlist:\n      - host: brief.example\n        ttl_seconds: 10\n      - host: dated.example\n        expires_at: 2027-01-01T00:00:00Z\n";
    let file = parse_policy(text, "p.yaml", NOW).unwrap();
    let rules = Ruleset::from_parts(&[], &[], Some(&file));
    assert_eq!(
        decide(&rules, "brief.example:443", None, None, NOW + 9),
        Verdict::Allow
    );
    assert_eq!(
        decide(&rules, "brief.example:443", None, None, NOW + 10),
        Verdict::Deny,
        "now >= expires_at is expired"
    );
    let at = 1_798_761_600; // 2027-01-01T00:00:00Z
    assert_eq!(
        decide(&rules, "dated.example:443", None, None, at - 1),
        Verdict::Allow
    );
    assert_eq!(decide(&rules, "dated.example:443", None, None, at), Verdict::Deny);
}

#[test]
fn ports_replace_the_default_ports() {
    let text = "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: t }\nspec:\n  network:\n    allowlist:\n      - host: a.example\n        ports: [8443, 9443]\n";
    let rules = Ruleset::from_parts(&[], &[], Some(&parse_policy(text, "p.yaml", NOW).unwrap()));
    assert_eq!(decide(&rules, "a.example:8443", None, None, NOW), Verdict::Allow);
    assert_eq!(decide(&rules, "a.example:9443", None, None, NOW), Verdict::Allow);
    assert_eq!(decide(&rules, "a.example:443", None, None, NOW), Verdict::Deny);
}

#[test]
fn every_error_names_file_line_and_field() {
    let text = "apiVersion: sandgate.dev/v1
kind: EgressPolicy
metadata: { name: bad }
spec:
  network:
    allowlist:
      - ok.example
      - \"*.com\"
      - host: a.example
        ports: [0, 70000]
      - host: b.example
        ttl_seconds: 0
    presets: [ no-such-preset ]
    allow_ranges: [ 10.0.0.0/33 ]
";
    let errors = parse_policy(text, "bad.yaml", NOW).unwrap_err().to_string();
    for want in [
        "bad.yaml:8: spec.network.allowlist.host: \"*.com\"",
        "bad.yaml:9: spec.network.allowlist.ports: port 0 out of range",
        "bad.yaml:9: spec.network.allowlist.ports: port 70000 out of range",
        "bad.yaml:11: spec.network.allowlist.ttl_seconds: must be positive",
        "bad.yaml:13: spec.network.presets: unknown preset",
        "bad.yaml:14: spec.network.allow_ranges:",
    ] {
        assert!(errors.contains(want), "missing {want:?} in:\n{errors}");
    }
    // A scope with an unknown key is refused with its line.
    let err = parse_policy("apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: x }\nspec:\n  network:\n    allowlist:\n      - host: c.example\n        scope: { team: x }\n", "s.yaml", NOW)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("s.yaml:8:") && err.contains("team"), "{err}");
    // Unknown fields are refused with their line.
    let err = parse_policy(
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: x }\nspec:\n  netwrk: {}\n",
        "u.yaml",
        NOW,
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("u.yaml:5:") && err.contains("netwrk"), "{err}");
    let err = parse_policy(
        "apiVersion: v2\nkind: EgressPolicy\nmetadata: { name: x }\n",
        "v.yaml",
        NOW,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("v.yaml:1: apiVersion"), "{err}");
}

fn doc(spec: &str) -> String {
    format!("apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: t }}\nspec:\n{spec}")
}

#[test]
fn exceptions_and_admin_tokens_parse_and_refuse_what_they_must() {
    let hash = sandgate_policy::auth::secret_hash("tok");
    let text = doc(&format!(
        "  exceptions:\n    - scope: {{ project: p-1 }}\n    - scope: {{ task: t-9 }}\n      ports: [ 443, 8443 ]\n      max_ttl_seconds: 3600\n\
         \x20 admin:\n    listen: 127.0.0.1:9099\n    tokens:\n      - {{ name: agent, role: requester, secret_sha256: {hash}, tasks: [ t-1 ] }}\n\
         \x20     - {{ name: alice, role: approver, secret_sha256: {hash} }}\n"
    ));
    let file = parse_policy(&text, "p.yaml", NOW).unwrap();
    assert_eq!(file.exceptions.enabled.len(), 2);
    assert_eq!(file.exceptions.enabled[1].ports, [443, 8443]);
    let bounds = file.exceptions.bounds_for("t-1", Some("p-1")).unwrap();
    assert_eq!(
        (bounds.max_ttl_seconds, bounds.ports.clone()),
        (900, vec![80, 443])
    );
    assert!(file.exceptions.bounds_for("t-1", None).is_none(), "default deny");
    assert_eq!(file.admin.listen, Some("127.0.0.1:9099".parse().unwrap()));
    assert_eq!(file.admin.tokens.len(), 2);
    // A node's runs by prefix, for exceptions and for who may ask.
    let runs = doc(&format!(
        "  exceptions:\n    - scope: {{ task: \"node-a:*\" }}\n\
         \x20 admin:\n    tokens:\n      - {{ name: platform, role: requester, secret_sha256: {hash}, tasks: [ \"node-a:*\" ] }}\n"
    ));
    let file = parse_policy(&runs, "p.yaml", NOW).unwrap();
    assert!(file.exceptions.bounds_for("node-a:run-1-ab", None).is_some());
    assert!(file.exceptions.bounds_for("node-b:run-1-ab", None).is_none());
    assert_eq!(file.admin.tokens[0].tasks, ["node-a:*"]);
    for (spec, want) in [
        (
            "  exceptions:\n    - scope: system\n",
            "never enabled for everyone",
        ),
        (
            "  exceptions:\n    - { scope: { task: t }, max_ttl_seconds: 0 }\n",
            "max_ttl_seconds",
        ),
        (
            "  exceptions:\n    - { scope: { task: t }, ports: [ 70000 ] }\n",
            "not a port",
        ),
        (
            "  admin:\n    tokens:\n      - { name: x, role: root, secret_sha256_file: f }\n",
            "use requester, approver, viewer or follower",
        ),
        (
            "  admin:\n    tokens:\n      - { name: x, role: requester, secret_sha256_file: f }\n",
            "names the tasks",
        ),
        ("  admin:\n    listen: nowhere\n", "spec.admin.listen"),
        // Patterns: a prefix, never everyone, and a `*` only at the end.
        (
            "  exceptions:\n    - scope: { task: \"*\" }\n",
            "`*` alone names every task",
        ),
        (
            "  exceptions:\n    - scope: { task: \"node-*-a\" }\n",
            "may only end a pattern",
        ),
        (
            "  exceptions:\n    - scope: { project: \"p-*\" }\n",
            "spec.exceptions.scope.project",
        ),
        (
            "  admin:\n    tokens:\n      - { name: x, role: requester, secret_sha256_file: f, tasks: [ \"*\" ] }\n",
            "spec.admin.tokens.tasks: \"*\"",
        ),
        // An allowlist entry is for one task exactly; spec.nodes takes `*` only at the end.
        (
            "  network:\n    allowlist:\n      - { host: a.example, scope: { task: \"node-a:*\" } }\n",
            "names one task or project exactly",
        ),
        (
            "  nodes:\n    - { name: node-a, tasks: [ \"run-*-a\" ] }\n",
            "spec.nodes.tasks: \"run-*-a\"",
        ),
    ] {
        let err = parse_policy(&doc(spec), "p.yaml", NOW).unwrap_err().to_string();
        assert!(err.contains(want), "{spec:?}: {err}");
    }
}

/// Attack: a node whose task pattern reaches into another node's runs could claim them and
/// use their exceptions. With IPv6 addresses as node names, `fd00::1:*` (the documented
/// `NAME:*`) names the runs of `fd00::1:5` too; a loose prefix (`node-a*`) names those of
/// `node-ab`. Each is refused at load, naming both nodes; `*` alone (any task, on purpose)
/// and each node's own `NAME:*` load. Before the check all three policies loaded and node
/// `fd00::1` vouched for `fd00::1:5:run-1`.
#[test]
fn a_node_pattern_that_names_another_nodes_runs_is_refused() {
    for (nodes, want) in [
        (
            "    - { name: \"fd00::1\", tasks: [ \"fd00::1:*\" ] }\n    - { name: \"fd00::1:5\", tasks: [ \"fd00::1:5:*\" ] }\n",
            "node fd00::1: \"fd00::1:*\" also names runs of node fd00::1:5 (whose ids start \"fd00::1:5:\"); a node may vouch only for its own runs (IPv6 addresses",
        ),
        (
            "    - { name: node-a, tasks: [ \"node-a*\" ] }\n    - { name: node-ab, tasks: [ \"node-ab:*\" ] }\n",
            "node node-a: \"node-a*\" also names runs of node node-ab",
        ),
        (
            "    - { name: node-a, tasks: [ \"node-b:run-7\" ] }\n    - { name: node-b, tasks: [ \"node-b:*\" ] }\n",
            "node node-a: \"node-b:run-7\" also names runs of node node-b",
        ),
    ] {
        let text = doc(&format!("  nodes:\n{nodes}"));
        let err = parse_policy(&text, "p.yaml", NOW).unwrap_err().to_string();
        assert!(err.contains(want), "{nodes:?}: {err}");
    }
    let fine = doc(
        "  nodes:\n    - { name: node-a, tasks: [ \"node-a:*\", ci-7 ] }\n    - { name: node-ab, tasks: [ \"node-ab:*\" ] }\n    - { name: hub, tasks: [ \"*\" ] }\n    - { name: \"fd00::1\", tasks: [ \"fd00::1:*\" ] }\n",
    );
    let file = parse_policy(&fine, "p.yaml", NOW).expect("each node's own runs");
    let a = file.nodes.find(Some("node-a")).expect("node-a");
    assert!(a.vouches(Some("node-a:run-1"), None).is_ok());
    assert!(a.vouches(Some("node-ab:run-1"), None).is_err());
}

#[test]
fn tunnel_settings_parse_and_bad_values_name_their_field() {
    let head = "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {name: t}\nspec:\n  network:\n";
    let file = parse_policy(&format!("{head}    allowlist: []\n"), "p.yaml", NOW).unwrap();
    assert_eq!(file.tunnels, sandgate_policy::TunnelRules::default());
    let text = format!(
        "{head}    tunnels:\n      sni: off\n      missing_sni: allow\n      tls_only: [443, 8443]\n      first_bytes_timeout_ms: 2500\n"
    );
    let t = parse_policy(&text, "p.yaml", NOW).unwrap().tunnels;
    assert_eq!(t.sni, sandgate_policy::tunnel::SniMode::Off);
    assert!(t.allow_missing_sni);
    assert!(t.tls_only(8443) && t.tls_only(443) && !t.tls_only(22));
    assert_eq!(t.first_bytes_timeout_ms, 2500);
    let all = format!("{head}    tunnels: {{tls_only: true}}\n");
    assert!(parse_policy(&all, "p.yaml", NOW).unwrap().tunnels.tls_only(22));
    let bad = format!(
        "{head}    tunnels:\n      sni: maybe\n      missing_sni: sometimes\n      tls_only: [0, 70000]\n      first_bytes_timeout_ms: 0\n"
    );
    let errors = parse_policy(&bad, "p.yaml", NOW).unwrap_err().to_string();
    for want in [
        "p.yaml:7: spec.network.tunnels.sni: \"maybe\": use must_match or off",
        "p.yaml:8: spec.network.tunnels.missing_sni: \"sometimes\"",
        "spec.network.tunnels.tls_only: 0 is not a port",
        "spec.network.tunnels.tls_only: 70000 is not a port",
        "p.yaml:10: spec.network.tunnels.first_bytes_timeout_ms: 0",
    ] {
        assert!(errors.contains(want), "{want} in\n{errors}");
    }
    let unknown = format!("{head}    tunnels: {{sni_check: off}}\n");
    assert!(parse_policy(&unknown, "p.yaml", NOW).is_err());
}

#[test]
fn what_parses_but_cannot_be_meant_is_a_warning_naming_its_line() {
    let text = "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {name: t}\nspec:\n  network:\n    allowlist:\n      - host: old.example\n        expires_at: 2020-01-01T00:00:00Z\n      - both.example\n      - host: port.example\n        ports: [8443]\n      - a.wide.example\n    denylist: [ both.example, \"port.example:443\", \"*.wide.example\" ]\n    allow_ranges: [ 10.1.2.3/8 ]\n";
    let file = parse_policy(text, "p.yaml", NOW).unwrap();
    let warnings: Vec<String> = file.warnings.iter().map(|w| w.as_warning()).collect();
    let want = [
        "p.yaml:7: warning: spec.network.allowlist.expires_at: 2020-01-01T00:00:00Z has passed",
        "p.yaml:9: warning: spec.network.allowlist: both.example is also denied (deny entry both.example, line 13)",
        "p.yaml:12: warning: spec.network.allowlist: a.wide.example is also denied (deny entry *.wide.example, line 13)",
        "p.yaml:14: warning: spec.network.allow_ranges: 10.1.2.3/8 has host bits set; it means 10.0.0.0/8",
    ];
    for w in want {
        assert!(
            warnings.iter().any(|have| have.starts_with(w)),
            "{w} in {warnings:#?}"
        );
    }
    assert_eq!(
        warnings.len(),
        want.len(),
        "port.example:8443 is not denied: {warnings:#?}"
    );
    assert_eq!(file.allow_ranges[0].to_string(), "10.0.0.0/8");
}

#[test]
fn listeners_that_cannot_all_be_bound_are_an_error() {
    let head = "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {name: t}\nspec:\n";
    let err = |spec: &str| {
        parse_policy(&format!("{head}{spec}"), "p.yaml", NOW)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err("  listeners:\n    - listen: 127.0.0.1:3128\n    - listen: 127.0.0.1:3128\n      task: t-1\n"),
        "p.yaml:7: spec.listeners.listen: 127.0.0.1:3128 overlaps 127.0.0.1:3128 (line 6): both cannot be bound; give each listener its own address or port"
    );
    assert!(
        err("  listeners:\n    - listen: 0.0.0.0:3128\n    - listen: 127.0.0.1:3128\n")
            .contains("overlaps 0.0.0.0:3128")
    );
    assert!(
        err("  listeners:\n    - listen: 127.0.0.1:9090\n  admin:\n    listen: 127.0.0.1:9090\n")
            .contains("p.yaml:8: spec.admin.listen")
    );
    let fine = "  listeners:\n    - listen: 127.0.0.1:3128\n    - listen: 127.0.0.1:3129\n    - listen: 127.0.0.2:3128\n    - listen: 127.0.0.1:0\n    - listen: 127.0.0.1:0\n    - listen: \"[::1]:3128\"\n";
    assert!(parse_policy(&format!("{head}{fine}"), "p.yaml", NOW).is_ok());
    use sandgate_policy::binds_overlap;
    let a = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
    assert!(binds_overlap(a("[::]:80"), a("127.0.0.1:80")));
    assert!(!binds_overlap(a("0.0.0.0:80"), a("[::1]:80")));
}

#[test]
fn listener_and_credential_ids_are_ids() {
    let head = "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {name: t}\nspec:\n";
    let parse = |spec: &str| parse_policy(&format!("{head}{spec}"), "p.yaml", NOW);
    let file =
        parse("  listeners:\n    - listen: 127.0.0.1:0\n      task: t-1\n      subject: ci-bot\n").unwrap();
    assert_eq!(file.listeners[0].subject.as_deref(), Some("ci-bot"));
    // What a node would forward and a central refuse, or the audit would hold unescaped:
    // refused at load, naming the field.
    for (spec, field) in [
        (
            "  listeners:\n    - listen: 127.0.0.1:0\n      task: \"a b\"\n",
            "spec.listeners.task",
        ),
        (
            "  listeners:\n    - listen: 127.0.0.1:0\n      project: p/1\n",
            "spec.listeners.project",
        ),
        (
            "  listeners:\n    - listen: 127.0.0.1:0\n      job: \"\"\n",
            "spec.listeners.job",
        ),
        (
            "  listeners:\n    - listen: 127.0.0.1:0\n      subject: \"x\\r\\ny\"\n",
            "spec.listeners.subject",
        ),
        (
            "  listeners:\n    - listen: 127.0.0.1:0\n      auth: basic\n  auth:\n    tasks:\n      - task: \"t 1\"\n        secret_sha256: \"0000000000000000000000000000000000000000000000000000000000000000\"\n",
            "spec.auth.tasks.task",
        ),
    ] {
        let err = parse(spec).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains(field) && err.contains("1 to 128"), "{spec}: {err}");
    }
}

#[test]
fn a_url_where_a_host_belongs_says_which_host() {
    let text = "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {name: t}\nspec:\n  network:\n    allowlist: [ \"https://pypi.org/simple/\" ]\n";
    let err = parse_policy(text, "p.yaml", NOW).unwrap_err().to_string();
    assert_eq!(
        err,
        "p.yaml:6: spec.network.allowlist.host: \"https://pypi.org/simple/\": a host, not a URL: write 'pypi.org'"
    );
}
