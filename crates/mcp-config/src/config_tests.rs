use std::path::Path;

use super::*;

fn unwrap<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| unreachable!("{e}"))
}

/// A directory with a requester token and the policies `policies` (name, `net:` value).
fn setup(policies: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = unwrap(tempfile::tempdir());
    unwrap(std::fs::write(dir.path().join("agent.token"), "tok\n"));
    for (name, net) in policies {
        unwrap(std::fs::write(
            dir.path().join(format!("{name}.yaml")),
            format!(
                "apiVersion: sandgate.dev/v1\nkind: SandboxPolicy\nfs:\n  write_paths: [ \"${{WORKSPACE}}\" ]\nnet: {net}\n"
            ),
        ));
    }
    dir
}

fn config_text(egress: bool, sandboxes: &[&str]) -> String {
    let mut text =
        "apiVersion: sandgate.dev/v1\nkind: McpServer\nmetadata: { name: agent-tools }\nspec:\n  task: t-1\n"
            .to_owned();
    if egress {
        text.push_str("  egress: { admin: \"http://127.0.0.1:9090\", token_file: agent.token }\n");
    }
    text.push_str("  sandboxes:\n");
    for s in sandboxes {
        text.push_str(&format!(
            "    - name: {s}\n      policy: {s}.yaml\n      gates: {{ commands: [ curl ], network: true }}\n"
        ));
    }
    text
}

#[test]
fn egress_with_a_sandbox_no_approval_reaches_is_refused_naming_it_and_the_setting() {
    let dir = setup(&[
        ("web", "{ mode: allowlist, allow_domains: [ a.test ] }"),
        (
            "other",
            "{ mode: allowlist, allow_domains: [ a.test ], exceptions: { from: \"http://127.0.0.1:9999\", token_file: f.token } }",
        ),
        (
            "followed",
            "{ mode: allowlist, allow_domains: [ a.test ], exceptions: { from: \"http://localhost:9090/\", token_file: f.token } }",
        ),
        ("offline", "{ mode: none }"),
    ]);
    let text = config_text(true, &["web", "other", "followed", "offline"]);
    let Err(ConfigError(errors)) = parse(&text, "mcp.yaml", dir.path(), Some(Path::new("/state"))) else {
        unreachable!("started with sandboxes no approval reaches")
    };
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors[0].starts_with("mcp.yaml:9: spec.sandboxes[0].policy: sandbox \"web\" (")
            && errors[0]
                .contains("net.mode allowlist: the run's own proxy decides and follows no control plane")
            && errors[0].contains(
                "add to the policy net.exceptions: { from: \"http://127.0.0.1:9090\", token_file: FILE }"
            ),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].starts_with("mcp.yaml:12: spec.sandboxes[1].policy: sandbox \"other\"")
            && errors[1].contains("net.exceptions.from is \"http://127.0.0.1:9999\""),
        "{}",
        errors[1]
    );
    // Without spec.egress the server files nothing, and starts.
    let text = config_text(false, &["web", "other", "followed", "offline"]);
    let config = unwrap(parse(&text, "mcp.yaml", dir.path(), Some(Path::new("/state"))));
    assert_eq!(config.sandboxes.len(), 4);
    // The follower token is one of the server's own files.
    assert!(
        config
            .own_files
            .iter()
            .any(|f| f.what == "the follower token of sandbox \"followed\""),
        "{:?}",
        config.own_files
    );
}

#[test]
fn the_audit_log_defaults_to_the_state_directory_and_paths_are_never_expanded() {
    let dir = setup(&[("offline", "{ mode: none }")]);
    let text = config_text(false, &["offline"]);
    let config = unwrap(parse(
        &text,
        "mcp.yaml",
        dir.path(),
        Some(Path::new("/state/sandgate")),
    ));
    assert_eq!(
        config.audit_log,
        Path::new("/state/sandgate/mcp/agent-tools.jsonl")
    );
    assert!(config.audit_log_default);
    assert!(config.sandboxes[0].start_in_workspace);
    assert_eq!(
        state_dir(Some("/x/state"), Some("/home/u")),
        Some(PathBuf::from("/x/state/sandgate"))
    );
    assert_eq!(
        state_dir(Some("relative"), Some("/home/u")),
        Some(PathBuf::from("/home/u/.local/state/sandgate"))
    );
    assert_eq!(state_dir(None, None), None);
    let Err(ConfigError(errors)) = parse(&text, "mcp.yaml", dir.path(), None) else {
        unreachable!("no state directory, no audit log")
    };
    assert!(
        errors[0].contains("spec.audit_log: not given, and neither XDG_STATE_HOME nor HOME"),
        "{errors:?}"
    );
    let text = text.replace("  task: t-1\n", "  task: t-1\n  audit_log: ~/mcp.jsonl\n");
    let Err(ConfigError(errors)) = parse(&text, "mcp.yaml", dir.path(), None) else {
        unreachable!("a ~ path taken")
    };
    assert_eq!(
        errors,
        [
            "mcp.yaml:6: spec.audit_log: \"~/mcp.jsonl\": paths here are not expanded (no ~, no $VARIABLES); write an absolute path or one relative to this file"
        ]
    );
}

/// `gates.tweaks`: read with the gates' own ceilings, each problem at its field; a network
/// a person may grant lets a policy with a network start behind `network: false`.
#[test]
fn tweak_bounds_are_read_within_the_gates_ceilings() {
    let dir = setup(&[("web", "{ mode: allowlist, allow_domains: [ a.test ] }")]);
    unwrap(std::fs::create_dir(dir.path().join("big")));
    let text = |tweaks: &str| {
        format!(
            "apiVersion: sandgate.dev/v1\nkind: McpServer\nmetadata: {{ name: a }}\nspec:\n  task: t-1\n  sandboxes:\n    - name: web\n      policy: web.yaml\n      gates: {{ commands: [ curl ], network: false{tweaks} }}\n"
        )
    };
    let parsed = |t: &str| parse(&text(t), "mcp.yaml", dir.path(), Some(Path::new("/state")));
    let Err(ConfigError(errors)) = parsed("") else {
        unreachable!("a network the gates keep off, with no tweak to grant it")
    };
    assert!(errors[0].contains("gates.network"), "{errors:#?}");
    let config = unwrap(parsed(
        ", tweaks: { network: true, max_seconds: 600, max_output_bytes: 1048576, workspaces: [ big ] }",
    ));
    let bounds = config.sandboxes[0].gates.tweaks.clone();
    let big = unwrap(std::fs::canonicalize(dir.path().join("big")));
    assert_eq!(
        bounds,
        Some(TweakBounds {
            max_seconds: Some(600),
            max_output_bytes: Some(1 << 20),
            network: true,
            workspaces: vec![big],
        })
    );
    let Err(ConfigError(errors)) =
        parsed(", tweaks: { network: true, max_seconds: 3601, max_output_bytes: 0, workspaces: [ nope ] }")
    else {
        unreachable!("bounds beyond the ceilings")
    };
    let text = errors.join("\n");
    for field in [
        "gates.tweaks.max_seconds",
        "gates.tweaks.max_output_bytes",
        "gates.tweaks.workspaces",
    ] {
        assert!(text.contains(field), "{field}: {text}");
    }
    assert!(
        parsed(", tweaks: { network: true, hosts: [ a ] }").is_err(),
        "unknown fields refused"
    );
}

/// As an attacker, in a sandbox whose runs share the host's PID namespace: a run granted
/// the network by a tweak starts a daemon in a session of its own, which the stop at the
/// tweak's end would not reach, and keeps the network. Such a sandbox takes no tweaks.
#[test]
fn a_sandbox_without_its_own_pid_namespace_takes_no_tweaks() {
    let dir = setup(&[("web", "{ mode: all }")]);
    let policy = dir.path().join("web.yaml");
    let text = unwrap(std::fs::read_to_string(&policy));
    let shared = format!("{text}platform:\n  bwrap: {{ unshare: {{ pid: false }} }}\n");
    unwrap(std::fs::write(&policy, shared));
    let config = "apiVersion: sandgate.dev/v1\nkind: McpServer\nmetadata: { name: a }\nspec:\n  task: t-1\n  sandboxes:\n    - name: web\n      policy: web.yaml\n      gates: { commands: [ curl ], network: true, tweaks: { max_seconds: 600 } }\n";
    let Err(ConfigError(errors)) = parse(config, "mcp.yaml", dir.path(), Some(Path::new("/state"))) else {
        unreachable!("tweaks for a sandbox whose runs share the PID namespace")
    };
    assert!(
        errors
            .iter()
            .any(|e| e.contains("gates.tweaks") && e.contains("unshare.pid: false")),
        "{errors:#?}"
    );
    // The same sandbox without tweaks starts.
    let plain = config.replace(", tweaks: { max_seconds: 600 }", "");
    unwrap(parse(&plain, "mcp.yaml", dir.path(), Some(Path::new("/state"))));
}

/// Runs at once with workspaces: once refused (one run could swap a directory of another's
/// workspace path for a symlink between its check and its bind), now allowed, since
/// `sandgate run` binds only what it opened at the canonical path the gates checked
/// (crates/sandbox `run/sources.rs`; the attack itself in tests/sandbox_escape_e2e.rs).
#[test]
fn runs_at_once_may_take_workspaces() {
    let dir = setup(&[("offline", "{ mode: none }")]);
    let work = dir.path().join("work");
    unwrap(std::fs::create_dir(&work));
    let text = config_text(false, &["offline"])
        .replace(
            "  task: t-1\n",
            "  task: t-1\n  max_concurrent_runs: 2\n  audit_log: /state/mcp.jsonl\n",
        )
        .replace(
            "network: true }",
            &format!("network: true, workspaces: [ \"{}\" ] }}", work.display()),
        );
    let config = unwrap(parse(&text, "mcp.yaml", dir.path(), None));
    assert_eq!(config.max_concurrent_runs, 2);
    assert_eq!(config.sandboxes[0].gates.all_workspaces().count(), 1);
}
