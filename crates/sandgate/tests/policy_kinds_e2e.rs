//! One policy language (issue 11): `apiVersion`/`kind` on both documents, one
//! `check-config` for either kind with errors as `file:line: field: message`, the first
//! sandbox form still read with a warning that says what to add, a sandbox policy's network
//! section taking the EgressPolicy entry model (ports, expiry, deny entries, reasons) in a
//! real run with curl, or naming an EgressPolicy file (refused when it configures what only
//! a shared proxy has), and every example in docs/ passing the check.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;
mod sandbox_support;

use std::path::Path;
use std::process::{Command, Stdio};

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;

use common::{read_audit, runtime, sandgate_bin};
use sandbox_support::{base, text};

/// `sandgate ARGS`: (exit code, stdout, stderr).
fn sandgate(args: &[&str]) -> (i32, String, String) {
    common::outcome(
        Command::new(sandgate_bin())
            .args(args)
            .env("XDG_STATE_HOME", std::env::temp_dir()),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

const HEADER: &str = "apiVersion: sandgate.dev/v1\nkind: SandboxPolicy\n";

#[test]
fn check_config_reads_either_kind_and_says_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let egress = write(
        d,
        "egress.yaml",
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: e }\nspec:\n  network:\n    allowlist: [ pypi.org ]\n",
    );
    let (code, out, err) = sandgate(&["check-config", &egress]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok: e (1 allow, 0 deny entries"), "{out}");

    let body = base().replacen(HEADER, "", 1);
    let new = write(d, "new.yaml", &format!("{HEADER}metadata: {{ name: s }}\n{body}"));
    let (code, out, err) = sandgate(&["check-config", &new]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok: s (SandboxPolicy: net mode none"), "{out}");
    assert!(err.is_empty(), "{err}");

    // The first form: read, with a warning naming the two lines to add; adding them is all
    // it takes.
    let old = write(d, "old.yaml", &body);
    let (code, _, err) = sandgate(&["check-config", &old]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!("{old}: warning: no apiVersion and kind: read as a SandboxPolicy; this form is deprecated: add the two lines `apiVersion: sandgate.dev/v1` and `kind: SandboxPolicy` at the top")),
        "{err}"
    );
    // The warning ends with the one command that fixes the file; after it, no warning.
    let fix = err.lines().find_map(|l| l.split_once("at the top: ")).unwrap().1;
    assert!(fix.starts_with("sed -i '1i "), "{fix}");
    let fixed = d.join("fixed.yaml");
    std::fs::copy(&old, &fixed).unwrap();
    let fix = fix.replace(&old, fixed.to_str().unwrap());
    assert!(
        Command::new("sh").args(["-c", &fix]).status().unwrap().success(),
        "{fix}"
    );
    let (code, _, err) = sandgate(&["check-config", fixed.to_str().unwrap()]);
    assert_eq!((code, err.as_str()), (0, ""), "{fix}");
    assert!(std::fs::read_to_string(&fixed).unwrap().starts_with(HEADER));
    let (code, _, err) = sandgate(&["run", "--policy", &old, "--", "true"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("this form is deprecated"), "{err}");

    // Errors in the one style, each on its line.
    let cases = [
        ("fs:\n\tread_paths: []\n", 4, "fs: a tab in the indentation"),
        (
            "net:\n  mdoe: none\n",
            4,
            "net.mdoe: unknown field; this map takes mode,",
        ),
        (
            "net:\n  mode: allowlist\n  allowlist:\n    - host: https://x.test\n",
            6,
            "net.allowlist.host: \"https://x.test\": a host, not a URL: write 'x.test'",
        ),
        (
            "net:\n  mode: allowlist\n  allowlist:\n    - host: x.test\n      ports: [ 0 ]\n",
            6,
            "net.allowlist.ports: port 0 out of range 1-65535",
        ),
        // Checks made after parsing find their field's line too.
        (
            "fs:\n  read_paths: [ /usr ]\n  tmp: shared\n",
            5,
            "fs.tmp: \"shared\": use private or none",
        ),
        (
            "fs:\n  read_paths:\n    - /usr\n    - /no/such/dir\n",
            4,
            "fs.read_paths: \"/no/such/dir\"",
        ),
    ];
    for (i, (text, line, want)) in cases.into_iter().enumerate() {
        let f = write(d, &format!("bad{i}.yaml"), &format!("{HEADER}{text}"));
        let (code, _, err) = sandgate(&["check-config", &f]);
        assert_eq!(code, 64, "{text}: {err}");
        assert!(err.contains(&format!("{f}:{line}: {want}")), "{text}: {err}");
    }
    let other = write(
        d,
        "other.yaml",
        "apiVersion: sandgate.dev/v1\nkind: NetworkPolicy\n",
    );
    let (code, _, err) = sandgate(&["check-config", &other]);
    assert_eq!(code, 64);
    assert!(
        err.contains(&format!("{other}: kind: \"NetworkPolicy\": check-config reads EgressPolicy (sandgate proxy), SandboxPolicy (sandgate run) and McpServer (sandgate mcp)")),
        "{err}"
    );
    // A parameter is given to check-config as to run.
    let param = write(
        d,
        "param.yaml",
        &format!("{HEADER}{body}  write_paths: [ \"${{OUT}}\" ]\n"),
    );
    let (code, _, err) = sandgate(&["check-config", &param]);
    assert_eq!(code, 64);
    assert!(
        err.contains("parameter ${OUT} is not set (use --param OUT=VALUE)"),
        "{err}"
    );
    let out_dir = d.join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let (code, _, err) = sandgate(&[
        "check-config",
        &param,
        "--param",
        &format!("OUT={}", out_dir.display()),
    ]);
    assert_eq!(code, 0, "{err}");
    // run refuses the proxy's document and says what to do.
    let (code, _, err) = sandgate(&["run", "--policy", &egress, "--", "true"]);
    assert_eq!(code, 64);
    assert!(err.contains("kind: EgressPolicy is the proxy's policy (sandgate proxy --policy); sandgate run takes a SandboxPolicy, whose net.egress_policy may name this file"), "{err}");
}

#[test]
fn a_sandbox_network_section_takes_the_egress_entry_model() {
    let rt = runtime();
    let a = rt.block_on(Origin::http());
    let b = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("api.test", &["127.0.0.1"])
            .with("old.test", &["127.0.0.1"])
            .with("bad.api.test", &["127.0.0.1"]),
    ));
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (a.port(), b.port());
    let policy = write(
        dir.path(),
        "p.yaml",
        &format!(
            "{}net:\n  mode: allowlist\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\n  allowlist:\n    - host: api.test\n      ports: [ {pa} ]\n      reason: the model API\n      created_by: platform-team\n      expires_at: 2099-01-01T00:00:00Z\n    - host: \"*.api.test\"\n      ports: [ {pa} ]\n    - host: old.test\n      ports: [ {pa} ]\n      expires_at: 2001-01-01T00:00:00Z\n  denylist: [ bad.api.test ]\n",
            base(),
            dns.addr()
        ),
    );
    let audit = dir.path().join("audit.jsonl");
    let script = format!(
        "for u in http://api.test:{pa}/ http://api.test:{pb}/ http://old.test:{pa}/ http://bad.api.test:{pa}/; do curl -s -o /dev/null -w \"$u %{{http_code}}\\n\" $u; done"
    );
    let out = Command::new(sandgate_bin())
        .args([
            "run",
            "--policy",
            &policy,
            "--audit-log",
            audit.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for want in [
        format!("http://api.test:{pa}/ 200"),
        format!("http://api.test:{pb}/ 403"),
        format!("http://old.test:{pa}/ 403"),
        format!("http://bad.api.test:{pa}/ 403"),
    ] {
        assert!(stdout.contains(&want), "missing {want}:\n{stdout}\n{stderr}");
    }
    assert!(
        stderr.contains(&format!(
            "{policy}:19: warning: net.allowlist.expires_at: 2001-01-01T00:00:00Z has passed"
        )),
        "{stderr}"
    );
    let events = read_audit(&audit);
    let allowed = events.iter().find(|e| e["decision"] == "allow").unwrap();
    assert!(
        allowed["rule"]
            .as_str()
            .unwrap()
            .contains(&format!("{policy}:12")),
        "{allowed}"
    );
    assert!(
        events.iter().any(|e| e["reason_code"] == "denylisted"),
        "{events:#?}"
    );
}

#[test]
fn a_named_egress_policy_must_be_a_network_section_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "shared.yaml",
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: s }\nspec:\n  network:\n    allowlist: [ pypi.org ]\n  listeners:\n    - listen: 127.0.0.1:3128\n",
    );
    let body = base();
    let sandbox = write(
        d,
        "sandbox.yaml",
        &format!("{body}net:\n  mode: allowlist\n  egress_policy: shared.yaml\n"),
    );
    let (code, _, err) = sandgate(&["check-config", &sandbox]);
    assert_eq!(code, 64);
    assert!(
        err.contains("spec.listeners configures a shared proxy and means nothing to a run's own proxy"),
        "{err}"
    );
    let (code, _, err) = sandgate(&["run", "--policy", &sandbox, "--", "true"]);
    assert_eq!(code, 64, "{err}");
    let missing = write(
        d,
        "missing.yaml",
        &format!("{body}net:\n  mode: allowlist\n  egress_policy: nope.yaml\n"),
    );
    let (code, _, err) = sandgate(&["check-config", &missing]);
    assert_eq!(code, 64);
    assert!(err.contains("net.egress_policy: cannot read"), "{err}");
    let offline = write(
        d,
        "offline.yaml",
        &format!("{body}net:\n  mode: none\n  egress_policy: shared.yaml\n"),
    );
    let (code, _, err) = sandgate(&["check-config", &offline]);
    assert_eq!(code, 64);
    assert!(err.contains("need net.mode allowlist"), "{err}");
}

#[test]
fn every_example_in_docs_passes_check_config_without_a_warning() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/examples/sandboxes");
    let workspace = tempfile::tempdir().unwrap();
    let mut seen = 0;
    for entry in std::fs::read_dir(examples).unwrap() {
        let path = entry.unwrap().path();
        let (code, out, err) = sandgate(&[
            "check-config",
            path.to_str().unwrap(),
            "--param",
            &format!("WORKSPACE={}", workspace.path().display()),
        ]);
        assert_eq!((code, err.as_str()), (0, ""), "{}: {out}", path.display());
        assert!(out.contains("(SandboxPolicy:"), "{out}");
        seen += 1;
    }
    assert!(seen >= 2);
}

#[test]
fn the_sandbox_policy_documented_in_docs_sandbox_md_passes_check_config() {
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/sandbox.md")).unwrap();
    let section = md.split("\n## The policy\n").nth(1).unwrap();
    let start = section.find("```yaml\n").unwrap() + "```yaml\n".len();
    let example = &section[start..start + section[start..].find("```").unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join("out")).unwrap();
    // The EgressPolicy it names, beside it.
    write(
        dir.path(),
        "agents.yaml",
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: agents }\nspec:\n  network:\n    allowlist: [ api.openai.com ]\n",
    );
    let policy = write(dir.path(), "sandbox.yaml", example);
    let (code, out, err) = sandgate(&[
        "check-config",
        &policy,
        "--param",
        &format!("PROJECT={}", project.display()),
    ]);
    assert_eq!((code, err.as_str()), (0, ""), "{out}\n{example}");
    assert!(
        out.contains("ok: agent (SandboxPolicy: net mode allowlist"),
        "{out}"
    );
}
