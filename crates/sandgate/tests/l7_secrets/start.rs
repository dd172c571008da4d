//! A secret is read from the environment at start and at each reload, never from the file:
//! with its variable unset, empty, or holding the placeholder itself, `sandgate proxy` does
//! not start (exit 64, the credential's `file:line` and the variable named, no CA written),
//! a reload that adds such a credential is rejected and the file in force stays, and
//! `sandgate run` refuses with a usage error before the command starts.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandgate_testkit::dns::Zone;

use super::sandboxed::{Binding, sandbox_policy};
use super::{PLACEHOLDER, SECRET_VAR, credential, credential_lines, secret, secrets_policy};
use crate::common::world::{World, base_args, strs};
use crate::common::{ProxyProcess, exit_of, read_audit, sandgate_bin};
use crate::l7::entry;
use crate::l7::wire;
use crate::sandbox_support::{run_command, text};

#[test]
fn a_proxy_does_not_start_without_its_secret_and_names_the_credential() {
    let dir = tempfile::tempdir().unwrap();
    let (policy, text) = secrets_policy(
        dir.path(),
        &entry("cred.test", 443, &[]),
        &credential("cred.test", SECRET_VAR, PLACEHOLDER),
    );
    let line = format!("policy.yaml:{}", credential_lines(&text)[0]);
    let ca_file = dir.path().join("intercept-ca.pem");
    let holds_placeholder = format!("x{PLACEHOLDER}x");
    // (the variable's value, or none, and what the error must say of it)
    let cases = [
        (None, "is not set"),
        (Some(""), "is not set"),
        (Some(holds_placeholder.as_str()), "holds the placeholder"),
    ];
    for (value, says) in cases {
        let mut command = Command::new(sandgate_bin());
        command
            .args(["proxy", "--listen", "127.0.0.1:0", "--policy"])
            .arg(&policy)
            .arg("--intercept-ca-cert")
            .arg(&ca_file)
            .arg("--audit-log")
            .arg(dir.path().join("audit.jsonl"))
            .env_remove(SECRET_VAR)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(value) = value {
            command.env(SECRET_VAR, value);
        }
        let child = command.spawn().unwrap();
        let (status, stderr) = exit_of(child, Duration::from_secs(20), "the proxy ran without its secret");
        assert_eq!(status.code(), Some(64), "{value:?}: {stderr}");
        assert!(
            stderr.contains(&line) && stderr.contains(SECRET_VAR) && stderr.contains(says),
            "{value:?}: {stderr}"
        );
        assert!(
            !ca_file.exists(),
            "a CA was written for a proxy that did not start"
        );
    }
}

#[test]
fn a_reload_adding_a_credential_whose_secret_is_unset_is_rejected_and_the_file_in_force_stays() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("open.test", &["127.0.0.1"])
            .with("new.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let open = entry("open.test", port, &[]);
    let first = credential("cred.test", SECRET_VAR, PLACEHOLDER);
    let (policy, _) = secrets_policy(dir.path(), &open, &first);
    let mut command = Command::new(sandgate_bin());
    command.env(SECRET_VAR, secret()).env_remove("L7_UNSET_KEY");
    let mut args = base_args(&dns);
    args.extend(["--policy".to_owned(), policy.to_str().unwrap().to_owned()]);
    let p = ProxyProcess::start_with(command, &strs(&args));
    let get = |host: &str| {
        let authority = format!("{host}:{port}");
        wire::once(p.addr, "GET", &format!("http://{authority}/x"), &authority).status
    };
    assert_eq!((get("open.test"), get("new.test")), (200, 403));

    // The new file allows new.test, and binds a second secret the proxy was never given.
    let entries = open + &entry("new.test", port, &[]);
    let second = credential("new.test", "L7_UNSET_KEY", "SANDGATE_L7_UNSET");
    let (_, text) = secrets_policy(dir.path(), &entries, &(first + &second));
    let line = format!("policy.yaml:{}", credential_lines(&text)[1]);
    let hup = Command::new("kill")
        .args(["-HUP", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let reload = loop {
        let reloads: Vec<_> = read_audit(&p.audit_path)
            .into_iter()
            .filter(|e| e["event"] == "policy_reload")
            .collect();
        if let Some(r) = reloads.into_iter().next() {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "no reload within 10 s:\n{}",
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_ne!(reload["outcome"], "applied", "{reload:#}");
    let said = reload.to_string();
    assert!(
        said.contains(&line) && said.contains("L7_UNSET_KEY"),
        "{reload:#}"
    );
    let logged = p.log_line("reload rejected").unwrap_or_else(|| p.log_text());
    assert!(
        logged.contains(&line) && logged.contains("L7_UNSET_KEY"),
        "{logged}"
    );
    assert_eq!(get("new.test"), 403, "the rejected file took effect");
    assert_eq!(get("open.test"), 200);
}

/// In either place a SandboxPolicy binds a secret: its own `net.credentials`, or the
/// EgressPolicy its `net.egress_policy` names.
#[test]
fn a_run_without_its_secret_is_refused_before_the_command_starts() {
    for binding in [Binding::EgressFile, Binding::Embedded] {
        let dir = tempfile::tempdir().unwrap();
        let policy = sandbox_policy(dir.path(), binding, "127.0.0.1:9", 443);
        let (file, field) = match binding {
            Binding::Embedded => ("sandbox.yaml", "net.credentials"),
            Binding::EgressFile => ("policy.yaml", "credentials"),
        };
        let written = std::fs::read_to_string(dir.path().join(file)).unwrap();
        let line = format!("{file}:{}", credential_lines(&written)[0]);
        let out = run_command(&policy, &[], &["sh", "-c", "echo RAN"])
            .env_remove(SECRET_VAR)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(64), "{binding:?}: {stdout}\n{stderr}");
        assert!(!stdout.contains("RAN"), "{binding:?}: the command ran: {stdout}");
        assert!(
            stderr.contains(field) && stderr.contains(&line) && stderr.contains(SECRET_VAR),
            "{binding:?}: {stderr}"
        );
    }
}
