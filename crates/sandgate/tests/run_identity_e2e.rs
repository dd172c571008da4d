//! Issue 30: a run carries its orchestrator's identity. `sandgate run --task t-1 --project
//! p-1 --job j-1` is recorded as that task, project and job; the task-scoped entries of the
//! policy it names apply to it and to no other run; the command inside is told its ids; the
//! ids are printed at start unless `--quiet`; an id that is not one is a usage error. The
//! subject (the user by default) and `--agent` are recorded beside them. Real
//! bubblewrap, real curl inside, a loopback origin behind the test DNS server.

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

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;

use common::{read_audit, runtime, sandgate_bin};
use sandbox_support::{base, text};

/// A sandbox policy in allowlist mode naming an EgressPolicy whose one entry is task t-1's.
fn policies(dir: &Path, dns: &DnsServer, port: u16) -> PathBuf {
    std::fs::write(
        dir.join("egress.yaml"),
        format!(
            "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: agents }}\nspec:\n  network:\n    allowlist:\n      - host: \"web.test:{port}\"\n        scope: {{ task: t-1 }}\n"
        ),
    )
    .unwrap();
    let path = dir.join("sandbox.yaml");
    std::fs::write(
        &path,
        format!(
            "{}net:\n  mode: allowlist\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\n  egress_policy: egress.yaml\n",
            base(),
            dns.addr()
        ),
    )
    .unwrap();
    path
}

fn run(policy: &Path, audit: &Path, args: &[&str], script: &str) -> Output {
    Command::new(sandgate_bin())
        .arg("run")
        .arg("--policy")
        .arg(policy)
        .arg("--audit-log")
        .arg(audit)
        .args(args)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_run_named_by_its_orchestrator_is_recorded_and_decided_as_that_task() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let policy = policies(dir.path(), &dns, origin.port());
    let script = format!(
        "echo \"task=$SANDGATE_TASK project=${{SANDGATE_PROJECT:-}} job=${{SANDGATE_JOB:-}} agent=${{SANDGATE_AGENT:-}} run=$SANDGATE_RUN_ID\"; curl -sS -o /dev/null -w 'web=%{{http_code}}\\n' http://web.test:{}/",
        origin.port()
    );

    // Named t-1: the task's entry applies, and the audit says whose request it was.
    let audit = dir.path().join("t-1.jsonl");
    let out = run(
        &policy,
        &audit,
        &[
            "--task",
            "t-1",
            "--project",
            "p-1",
            "--job",
            "j-1",
            "--subject",
            "alice",
            "--agent",
            "mcp:claude-code",
        ],
        &script,
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("web=200"), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("task=t-1 project=p-1 job=j-1 agent=mcp:claude-code run=run-"),
        "{stdout}"
    );
    let start = stderr
        .lines()
        .find(|l| l.starts_with("sandgate: run "))
        .unwrap_or_default();
    assert!(
        start.starts_with("sandgate: run run-")
            && start.ends_with(": task t-1, project p-1, job j-1, agent mcp:claude-code"),
        "{stderr}"
    );
    let events = read_audit(&audit);
    let decision = events.iter().find(|e| e["event"] == "decision").unwrap();
    assert_eq!(decision["decision"], "allow", "{decision}");
    assert_eq!(decision["task_id"], "t-1");
    assert_eq!(decision["project_id"], "p-1");
    assert_eq!(decision["job_id"], "j-1");
    assert_eq!(decision["subject"], "alice");
    assert_eq!(decision["agent"], "mcp:claude-code");
    assert!(
        decision["rule"].as_str().unwrap().contains("[task:t-1]"),
        "{decision}"
    );

    // The attacker: a run that is not t-1 (unnamed, or named another task) cannot use t-1's
    // entry; only an orchestrator that names the run t-1 can.
    for (args, who) in [(&[][..], "run-"), (&["--task", "t-2"][..], "t-2")] {
        let audit = dir.path().join(format!("{who}.jsonl"));
        let out = run(&policy, &audit, args, &script);
        let (stdout, stderr) = text(&out);
        assert!(stdout.contains("web=403"), "{args:?}: {stdout}\n{stderr}");
        let events = read_audit(&audit);
        let decision = events.iter().find(|e| e["event"] == "decision").unwrap();
        assert_eq!(decision["decision"], "deny", "{decision}");
        assert!(
            decision["task_id"].as_str().unwrap().starts_with(who),
            "{decision}"
        );
        assert!(decision["job_id"].is_null(), "{decision}");
        // No --agent: none stated, written as null.
        assert!(decision["agent"].is_null(), "{decision}");
        assert!(decision.as_object().unwrap().contains_key("agent"), "{decision}");
    }

    // --quiet prints no start line.
    let out = run(
        &policy,
        &dir.path().join("quiet.jsonl"),
        &["--quiet", "--task", "t-1"],
        "true",
    );
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("sandgate: run "), "{stderr}");
}

/// Ids follow the policy's rule: anything else is a usage error (64) naming the flag, and
/// nothing runs.
#[test]
fn an_id_that_is_not_one_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let policy = sandbox_support::write_policy(dir.path(), "");
    let marker = dir.path().join("ran");
    for (flag, value) in [
        ("--task", "t 1"),
        ("--project", "p/1"),
        ("--job", ""),
        ("--agent", "claude code"),
        ("--task", &*"t".repeat(129)),
    ] {
        let out = Command::new(sandgate_bin())
            .args(["run", "--policy"])
            .arg(&policy)
            .args([flag, value, "--", "touch"])
            .arg(&marker)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(64), "{flag} {value:?}: {stderr}");
        assert!(stderr.contains(flag), "{stderr}");
        assert!(!marker.exists(), "the command ran");
    }
}

/// The same as an ordinary user (`nobody`), where user namespaces are allowed.
#[test]
fn the_identity_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody(
        "run_identity_e2e",
        "the_identity_suite_passes_as_an_ordinary_user",
        2,
    );
}
