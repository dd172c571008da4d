//! `sandgate init` (issue 11): a commented starter policy of either kind that `check-config`
//! passes and that runs: an EgressPolicy under `sandgate proxy` with curl through it, a
//! SandboxPolicy for a Python script in a virtual environment (its interpreter, libraries
//! and `sys.path` found on this machine) and for an ELF program, run by `sandgate run`. An
//! existing file is never replaced without `--force`; `-o -` writes to stdout. A program path
//! full of YAML's special characters stays one quoted path and adds nothing to the policy.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{ProxyProcess, sandgate_bin, status_of};

/// `sandgate ARGS` in `cwd` with PATH `path`: (exit code, stdout, stderr).
fn sandgate_in(cwd: &Path, path: &str, args: &[&str]) -> (i32, String, String) {
    common::outcome(
        Command::new(sandgate_bin())
            .args(args)
            .current_dir(cwd)
            .env("PATH", path)
            .env("XDG_STATE_HOME", cwd),
    )
}

/// `s` in single quotes, as a shell reads it back.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

#[test]
fn the_egress_starter_passes_check_config_and_runs_under_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = sandgate_in(dir.path(), PATH, &["init", "--preset", "python-packages"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.is_empty());
    assert!(
        err.contains("wrote policy.yaml; check it with: sandgate check-config policy.yaml"),
        "{err}"
    );
    let text = std::fs::read_to_string(dir.path().join("policy.yaml")).unwrap();
    assert!(
        text.contains("kind: EgressPolicy") && text.contains("presets: [\"python-packages\"]"),
        "{text}"
    );
    assert!(
        text.lines().filter(|l| l.trim_start().starts_with('#')).count() >= 8,
        "commented: {text}"
    );
    let (code, out, err) = sandgate_in(dir.path(), PATH, &["check-config", "policy.yaml"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("ok: starter (2 allow, 0 deny entries, 0 listeners)"),
        "{out}"
    );
    assert!(err.is_empty(), "no warning: {err}");

    // Never replaced without --force, not even through a symlink; -o - is stdout.
    let before = text.clone();
    let (code, _, err) = sandgate_in(dir.path(), PATH, &["init", "--name", "other"]);
    assert_eq!(code, 64);
    assert!(
        err.contains("policy.yaml exists: pass --force to replace it"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("policy.yaml")).unwrap(),
        before
    );
    let target = dir.path().join("elsewhere.txt");
    std::fs::write(&target, "keep me").unwrap();
    std::os::unix::fs::symlink(&target, dir.path().join("link.yaml")).unwrap();
    let (code, _, _) = sandgate_in(dir.path(), PATH, &["init", "-o", "link.yaml"]);
    assert_eq!(code, 64);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    let (code, _, err) = sandgate_in(dir.path(), PATH, &["init", "--name", "other", "--force"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read_to_string(dir.path().join("policy.yaml"))
            .unwrap()
            .contains("name: \"other\"")
    );
    let (code, out, _) = sandgate_in(dir.path(), PATH, &["init", "-o", "-"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("# A starter EgressPolicy"), "{out}");
    let (code, _, err) = sandgate_in(dir.path(), PATH, &["init", "--preset", "nope", "-o", "-"]);
    assert_eq!(code, 64);
    assert!(
        err.contains("--preset \"nope\": no such preset (known: python-packages"),
        "{err}"
    );

    // It runs: the proxy starts with it and refuses what it does not list.
    let policy = dir.path().join("policy.yaml");
    let p = ProxyProcess::start(&["--policy", policy.to_str().unwrap()]);
    let reply = common::raw(
        p.addr,
        b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org\r\n\r\n",
    );
    assert_eq!(status_of(&reply), 403, "{reply}");
}

#[test]
fn a_sandbox_starter_for_a_python_script_in_a_venv_runs_it() {
    let python = common::python();
    let venv_bin = Path::new(&python).parent().unwrap().to_str().unwrap().to_owned();
    let dir = tempfile::tempdir().unwrap();
    // The script imports a package only the venv has, and says which Python runs it.
    std::fs::write(
        dir.path().join("agent.py"),
        "import sys, prometheus_client\nprint('agent ok', sys.prefix != sys.base_prefix)\n",
    )
    .unwrap();
    let path = format!("{venv_bin}:{PATH}");
    let (code, _, err) = sandgate_in(dir.path(), &path, &["init", "--for", "python3 agent.py"]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(dir.path().join("sandbox.yaml")).unwrap();
    assert!(
        text.contains("kind: SandboxPolicy") && text.contains("mode: none"),
        "{text}"
    );
    assert!(text.contains("# For: python3 agent.py"), "{text}");
    let (code, out, err) = sandgate_in(dir.path(), &path, &["check-config", "sandbox.yaml"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok: starter (SandboxPolicy: net mode none"), "{out}");
    assert!(err.is_empty(), "no warning: {err}");
    let (code, out, err) = sandgate_in(
        dir.path(),
        &path,
        &["run", "--policy", "sandbox.yaml", "--", "python3", "agent.py"],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{text}");
    assert_eq!(out, "agent ok True\n", "{err}");

    // With a preset: allowlist mode through the run's proxy, which refuses the rest.
    let (code, _, err) = sandgate_in(
        dir.path(),
        &path,
        &[
            "init",
            "--for",
            "python3 agent.py",
            "--preset",
            "python-packages",
            "-o",
            "net.yaml",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = sandgate_in(dir.path(), &path, &["check-config", "net.yaml"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("net mode allowlist"), "{out}");
    let probe = "import urllib.request, urllib.error\ntry:\n    urllib.request.urlopen('http://example.org/', timeout=10)\nexcept urllib.error.HTTPError as e:\n    print('refused', e.code)\n";
    let (code, out, err) = sandgate_in(
        dir.path(),
        &path,
        &["run", "--policy", "net.yaml", "--", "python3", "-c", probe],
    );
    assert_eq!((code, out.as_str()), (0, "refused 403\n"), "{err}");
    assert!(
        err.contains("sandgate: blocked example.org:80 (not allowlisted"),
        "{err}"
    );
}

#[test]
fn a_sandbox_starter_for_an_elf_program_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = sandgate_in(dir.path(), PATH, &["init", "--for", "curl --version", "-o", "-"]);
    assert_eq!(code, 0, "{err}");
    std::fs::write(dir.path().join("curl.yaml"), &out).unwrap();
    // curl's own directory and its libraries' (libcurl and the loader) are there.
    assert!(out.contains("- \"/usr/bin\""), "{out}");
    assert!(
        out.contains("- \"/lib64\"") || !Path::new("/lib64").exists(),
        "{out}"
    );
    let (code, out, err) = sandgate_in(
        dir.path(),
        PATH,
        &["run", "--policy", "curl.yaml", "--", "curl", "--version"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("curl "), "{out}");
    // A program that is not there is named.
    let (code, _, err) = sandgate_in(dir.path(), PATH, &["init", "--for", "no-such-tool x", "-o", "-"]);
    assert_eq!(code, 64);
    assert!(
        err.contains("--for: \"no-such-tool\" is not on PATH (give its path)"),
        "{err}"
    );
    let (code, _, err) = sandgate_in(
        dir.path(),
        PATH,
        &["init", "--kind", "egress", "--for", "curl", "-o", "-"],
    );
    assert_eq!(code, 64);
    assert!(err.contains("--for describes a sandboxed command"), "{err}");
}

/// Attacker: the program lives under a directory whose name is YAML's special characters,
/// a `${NAME}` the sandbox policy would substitute, and a quote; `--name` tries to end its
/// scalar. The starter must hold that exact path as one read path, and nothing else:
/// check-config reads network mode none, and the program runs from exactly that directory.
#[test]
fn odd_characters_in_the_program_path_cannot_add_to_the_policy() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let odd = dir
        .path()
        .join("we\"ird'${HOME}#:[x]{y},&*!|>%@`\\-net:{mode:all}");
    std::fs::create_dir(&odd).unwrap();
    let program = odd.join("agent");
    std::fs::write(&program, "#!/bin/sh\necho agent ran\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let for_command = format!("{} --flag", shell_quote(program.to_str().unwrap()));
    let (code, out, err) = sandgate_in(
        dir.path(),
        PATH,
        &[
            "init",
            "--for",
            &for_command,
            "--name",
            "n\"\nnet: {mode: all}\n#",
            "-o",
            "-",
        ],
    );
    assert_eq!(code, 0, "{err}");
    std::fs::write(dir.path().join("odd.yaml"), &out).unwrap();
    // The only keys at the top level are the five of a sandbox policy's document.
    let top: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with([' ', '#']) && !l.is_empty())
        .collect();
    assert_eq!(
        top,
        [
            "apiVersion: sandgate.dev/v1",
            "kind: SandboxPolicy",
            "metadata:",
            "env:",
            "fs:",
            "net:"
        ],
        "{out}"
    );
    let (code, stdout, err) = sandgate_in(dir.path(), PATH, &["check-config", "odd.yaml"]);
    assert_eq!(code, 0, "{err}\n{out}");
    assert!(stdout.contains("(SandboxPolicy: net mode none"), "{stdout}");
    let (code, stdout, err) = sandgate_in(
        dir.path(),
        PATH,
        &["run", "--policy", "odd.yaml", "--", program.to_str().unwrap()],
    );
    assert_eq!((code, stdout.as_str()), (0, "agent ran\n"), "{err}\n{out}");
    // In the sandbox the directory is there by its exact name, and its parent's other
    // entries are not.
    std::fs::write(dir.path().join("secret.txt"), "no").unwrap();
    let (_, stdout, _) = sandgate_in(
        dir.path(),
        PATH,
        &[
            "run",
            "--policy",
            "odd.yaml",
            "--",
            "/bin/sh",
            "-c",
            &format!("ls -a '{}'", dir.path().display()),
        ],
    );
    assert!(!stdout.contains("secret.txt"), "{stdout}");

    // Quoted in --for, a path may hold blanks and a line break: still one read path.
    let broken = dir.path().join("two words\nnet: {mode: all}\n#");
    std::fs::create_dir(&broken).unwrap();
    let program = broken.join("agent");
    std::fs::write(&program, "#!/bin/sh\necho agent ran\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let for_command = shell_quote(program.to_str().unwrap());
    let (code, out, err) = sandgate_in(
        dir.path(),
        PATH,
        &["init", "--for", &for_command, "-o", "broken.yaml"],
    );
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(dir.path().join("broken.yaml")).unwrap();
    assert!(!text.lines().any(|l| l.starts_with("net: {")), "{text}");
    let (code, stdout, err) = sandgate_in(dir.path(), PATH, &["check-config", "broken.yaml"]);
    assert_eq!(code, 0, "{err}\n{text}");
    assert!(stdout.contains("(SandboxPolicy: net mode none"), "{stdout}");
    let (code, stdout, err) = sandgate_in(
        dir.path(),
        PATH,
        &["run", "--policy", "broken.yaml", "--", program.to_str().unwrap()],
    );
    assert_eq!(
        (code, stdout.as_str()),
        (0, "agent ran\n"),
        "{err}\n{out}\n{text}"
    );
}
