//! Issue 34, output for CI: `check-config --json` for each kind, every error of a file in one
//! pass (a tab no longer hides the rest), and `sandgate run --summary-json FILE` after a
//! real run in allowlist mode, each parsed with serde_json and checked field by field.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and the shared test code connects to its own loopback fixtures"
)]

mod common;
mod sandbox_support;

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;

use common::runtime;
use sandbox_support::{allowlist, run, text, write_policy};

/// `sandgate check-config --json FILE`: its exit status, stdout as JSON, stderr.
fn check_json(file: &Path) -> (Option<i32>, Value, String) {
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(common::sandgate_bin())
        .arg("check-config")
        .arg("--json")
        .arg(file)
        .env("XDG_STATE_HOME", state.path())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    (out.status.code(), json, stderr)
}

/// `(line, field, message)` of each problem of a `check-config --json` report, checking
/// each names `file` and has `severity`.
fn problems(report: &Value, file: &str, severity: &str) -> Vec<(u64, String, String)> {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["file"], file, "{p}");
            assert_eq!(p["severity"], severity, "{p}");
            (
                p["line"].as_u64().unwrap_or(0),
                p["field"].as_str().unwrap_or("").to_owned(),
                p["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The five errors of the issue: a tab, an unknown field, a URL as a host, `*.com` and a
/// port of 70000. Each used to hide the ones after it; all five are found in one run.
const FIVE_ERRORS: &str = "apiVersion: sandgate.dev/v1
kind: EgressPolicy
metadata:
  name: five
\tversion: \"1\"
spec:
  network:
    allowlist:
      - https://api.example.com/v1
      - \"*.com\"
      - host: example.org
        ports: [70000]
    colour: blue
";

#[test]
fn check_config_json_lists_all_five_errors_of_a_file_with_their_lines() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("five.yaml");
    std::fs::write(&file, FIVE_ERRORS).unwrap();
    let name = file.to_str().unwrap();
    let (code, report, stderr) = check_json(&file);
    assert_eq!(code, Some(64), "{report}\n{stderr}");
    assert_eq!(report["file"], name);
    assert_eq!(report["kind"], "EgressPolicy");
    assert_eq!(report["name"], Value::Null);
    assert_eq!(report["ok"], false);
    assert_eq!(report["exit_status"], 64);
    assert_eq!(
        (report["errors"].as_u64(), report["warnings"].as_u64()),
        (Some(5), Some(0)),
        "{report}"
    );
    let mut found = problems(&report, name, "error");
    found.sort();
    let want: Vec<(u64, &str, &str)> = vec![
        (
            5,
            "metadata",
            "a tab in the indentation: YAML indents with spaces only; replace the tab with spaces",
        ),
        (
            9,
            "spec.network.allowlist.host",
            "\"https://api.example.com/v1\": ",
        ),
        (10, "spec.network.allowlist.host", "\"*.com\": "),
        (
            11,
            "spec.network.allowlist.ports",
            "port 70000 out of range 1-65535",
        ),
        (13, "spec.network.colour", "unknown field; this map takes "),
    ];
    assert_eq!(found.len(), want.len(), "{found:#?}");
    for ((line, field, message), (want_line, want_field, want_start)) in found.iter().zip(&want) {
        assert_eq!((*line, field.as_str()), (*want_line, *want_field), "{found:#?}");
        assert!(message.starts_with(want_start), "{message:?} for {want_start:?}");
    }
    assert!(found[1].2.contains("a host, not a URL"), "{found:#?}");

    // The text output says the same five, one line each, as before --json.
    let out = Command::new(common::sandgate_bin())
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(stdout, "");
    for (line, field, _) in &want {
        assert!(
            stderr.contains(&format!("{name}:{line}: {field}: ")),
            "{line}: {stderr}"
        );
    }
    assert_eq!(stderr.lines().count(), 5, "{stderr}");
}

#[test]
fn check_config_json_reports_a_good_file_and_its_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ok.yaml");
    std::fs::write(
        &file,
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: fine }\nspec:\n  network:\n    allowlist:\n      - host: old.example\n        expires_at: \"2001-01-01T00:00:00Z\"\n",
    )
    .unwrap();
    let name = file.to_str().unwrap();
    let (code, report, _) = check_json(&file);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["ok"], true);
    assert_eq!(report["name"], "fine");
    assert_eq!(report["exit_status"], 0);
    assert_eq!(
        (report["errors"].as_u64(), report["warnings"].as_u64()),
        (Some(0), Some(1)),
        "{report}"
    );
    let found = problems(&report, name, "warning");
    assert_eq!(
        (found[0].0, found[0].1.as_str()),
        (7, "spec.network.allowlist.expires_at"),
        "{found:?}"
    );
    assert!(
        found[0].2.starts_with("2001-01-01T00:00:00Z has passed"),
        "{found:?}"
    );
}

#[test]
fn check_config_json_reports_a_sandbox_policys_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sandbox.yaml");
    std::fs::write(
        &file,
        "apiVersion: sandgate.dev/v1\nkind: SandboxPolicy\nfs:\n  read_paths: [ /usr ]\n  tmp: shared\n",
    )
    .unwrap();
    let name = file.to_str().unwrap();
    let (code, report, stderr) = check_json(&file);
    assert_eq!(code, Some(64), "{report}\n{stderr}");
    assert_eq!(report["kind"], "SandboxPolicy");
    assert_eq!(report["ok"], false);
    assert_eq!(
        problems(&report, name, "error"),
        [(
            5,
            "fs.tmp".to_owned(),
            "\"shared\": use private or none".to_owned()
        )]
    );
}

#[test]
fn check_config_json_reports_an_mcp_servers_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("offline.yaml"),
        format!("{}net:\n  mode: none\n", sandbox_support::base()),
    )
    .unwrap();
    let file = dir.path().join("mcp.yaml");
    std::fs::write(
        &file,
        "apiVersion: sandgate.dev/v1\nkind: McpServer\nmetadata: { name: t }\nspec:\n  audit_log: audit.jsonl\n  sandboxes:\n    - name: offline\n      description: no network\n      policy: offline.yaml\n      gates: { commands: [ python3 ], max_seconds: 20, max_output_bytes: 4096 }\n",
    )
    .unwrap();
    let name = file.to_str().unwrap();
    let (code, report, stderr) = check_json(&file);
    assert_eq!(code, Some(64), "{report}\n{stderr}");
    assert_eq!(report["kind"], "McpServer");
    let found = problems(&report, name, "error");
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!((found[0].0, found[0].1.as_str()), (6, "spec.task"), "{found:#?}");
    assert!(
        found[0]
            .2
            .starts_with("required, but missing; write task: agent-7"),
        "{found:#?}"
    );
}

#[test]
fn run_summary_json_says_what_the_text_summary_says_with_the_runs_ids() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("denied.test", &["127.0.0.1"]),
    ));
    let dir = tempfile::tempdir().unwrap();
    let port = origin.port();
    let policy = write_policy(
        dir.path(),
        &allowlist(dns.addr(), &[format!("allowed.test:{port}")]),
    );
    let audit = dir.path().join("audit.jsonl");
    let summary = dir.path().join("summary.json");
    let script = format!(
        "curl -sS -o /dev/null -w 'allowed=%{{http_code}}\\n' http://allowed.test:{port}/ci\n\
         curl -sS -o /dev/null -w 'denied=%{{http_code}}\\n' http://denied.test:{port}/\n\
         exit 3\n"
    );
    let out = run(
        &policy,
        &[
            "--audit-log",
            audit.to_str().unwrap(),
            "--summary-json",
            summary.to_str().unwrap(),
            "--task",
            "t-ci",
            "--project",
            "p-ci",
            "--subject",
            "ci-bot",
            "--agent",
            "ci-agent",
        ],
        &["sh", "-c", &script],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("allowed=200") && stdout.contains("denied=403"),
        "{stdout}\n{stderr}"
    );
    let written = std::fs::read_to_string(&summary).unwrap_or_else(|e| panic!("{e}\n{stderr}"));
    let s: Value = serde_json::from_str(&written).unwrap();
    assert_eq!(s["version"], 1);
    let run_id = s["ids"]["run"].as_str().unwrap();
    assert!(run_id.starts_with("run-"), "{s}");
    assert_eq!(s["ids"]["task"], "t-ci");
    assert_eq!(s["ids"]["project"], "p-ci");
    assert_eq!(s["ids"]["job"], Value::Null);
    assert_eq!(s["ids"]["subject"], "ci-bot");
    assert_eq!(s["ids"]["agent"], "ci-agent", "{s}");
    assert_eq!(s["net_mode"], "allowlist");
    assert_eq!(s["exit_status"], 3);
    assert_eq!(
        (s["allowed"].as_u64(), s["learned"].as_u64(), s["denied"].as_u64()),
        (Some(1), Some(0), Some(1)),
        "{s}"
    );
    assert!(s["bytes_sent"].as_u64().unwrap() > 0, "{s}");
    assert!(s["bytes_received"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(
        s["blocked"],
        json!([{"destination": format!("denied.test:{port}"), "reason": "not_allowlisted", "count": 1}])
    );
    assert_eq!(s["failed"], json!([]));
    assert_eq!(s["audit_log"], audit.to_str().unwrap());
    assert_eq!(s["skipped_lines"], json!([]));
    // The text on stderr renders the same summary.
    assert!(
        stderr.contains(&format!("blocked: denied.test:{port} (not allowlisted), once")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "sandgate: 1 allowed, 1 denied, {} bytes sent, {} bytes received; audit log: {}",
            s["bytes_sent"],
            s["bytes_received"],
            audit.display()
        )),
        "{stderr}"
    );
    // The run's requests are recorded under the ids the summary gives.
    let log = std::fs::read_to_string(&audit).unwrap();
    let events: Vec<Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(
        events.iter().any(|e| e["event"] == "decision")
            && events
                .iter()
                .filter(|e| e["event"] == "decision")
                .all(|e| e["task_id"] == "t-ci"),
        "{log}"
    );

    // A directory that is not there is refused before anything runs.
    let out = run(
        &policy,
        &[
            "--summary-json",
            dir.path().join("no/such/summary.json").to_str().unwrap(),
        ],
        &["true"],
    );
    assert_eq!(out.status.code(), Some(64), "{}", text(&out).1);
}
