//! What `sandgate run` prints instead of running under its macOS backend: `--print-profile
//! seatbelt` (the profile and, last, a sandbox-exec command line to run it by hand) and
//! `--print-argv` where the seatbelt backend is chosen (`SANDGATE_SANDBOX_EXEC` names a
//! stand-in here, which is never started). Both command lines must read back through a
//! POSIX shell as exactly the argv sandbox-exec would get. The run itself under a stand-in
//! is `seatbelt_e2e.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and the shared harness connects to its own loopback fixtures"
)]

mod common;
mod sandbox_support;

use std::path::Path;
use std::process::{Command, Stdio};

use sandbox_support::{text, write_policy};

#[test]
fn print_profile_prints_a_command_line_a_shell_reads_back() {
    let work = tempfile::tempdir().unwrap();
    let spaced = work.path().join("my project");
    std::fs::create_dir(&spaced).unwrap();
    let policy = write_policy(
        work.path(),
        &format!("  write_paths: [ \"{}\" ]\n", spaced.display()),
    );
    let command = ["python3", "-c", "print('it''s $HOME')", "a b"];
    let out = Command::new(common::sandgate_bin())
        .args(["run", "--policy"])
        .arg(&policy)
        .args(["--print-profile", "seatbelt", "--"])
        .args(command)
        .env_remove("SANDGATE_SANDBOX_EXEC")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(";; run with: "))
        .unwrap_or_else(|| panic!("no command line:\n{stdout}"));
    // The shell splits it back into exactly the argv sandbox-exec is to get.
    let words = shell_words(line);
    assert_eq!(
        &words[..3],
        ["/usr/bin/sandbox-exec", "-f", "PROFILE.sb"],
        "{line}"
    );
    assert!(words.contains(&write_0(&spaced)), "{words:?}");
    let dashes = words.iter().position(|w| *w == "--").unwrap();
    assert_eq!(&words[dashes + 1..], command, "{line}");
}

/// The words a POSIX shell reads in `line`.
fn shell_words(line: &str) -> Vec<String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("printf '%s\\n' {line}"))
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The `-D` parameter naming `dir`, the policy's first write path.
fn write_0(dir: &Path) -> String {
    format!("WRITE_0={}", std::fs::canonicalize(dir).unwrap().display())
}

#[test]
fn print_argv_under_seatbelt_prints_the_sandbox_exec_command_line_it_would_run() {
    use std::os::unix::fs::PermissionsExt;
    let work = tempfile::tempdir().unwrap();
    // A stand-in that would leave a mark if it were started.
    let stand_in = work.path().join("sandbox-exec");
    let started = work.path().join("started");
    std::fs::write(&stand_in, format!("#!/bin/sh\ntouch '{}'\n", started.display())).unwrap();
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
    let spaced = work.path().join("my project");
    std::fs::create_dir(&spaced).unwrap();
    let policy = write_policy(
        work.path(),
        &format!("  write_paths: [ \"{}\" ]\n", spaced.display()),
    );
    let command = ["sh", "-c", "echo 'it''s' \"$HOME\"", "a b"];
    let out = Command::new(common::sandgate_bin())
        .args(["run", "--print-argv", "--policy"])
        .arg(&policy)
        .arg("--")
        .args(command)
        .env("SANDGATE_SANDBOX_EXEC", &stand_in)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let words = shell_words(stdout.trim_end());
    assert_eq!(words[0], stand_in.display().to_string(), "{stdout}");
    assert_eq!(words[1], "-f", "{stdout}");
    assert!(
        words[2].ends_with("/profile.sb") && words[2].contains("sandgate-run-"),
        "{stdout}"
    );
    assert!(words.contains(&write_0(&spaced)), "{words:?}");
    let dashes = words.iter().position(|w| w == "--").unwrap();
    assert_eq!(&words[dashes + 1..], command, "{stdout}");
    assert!(
        stderr.contains("sandbox-exec's environment (values not shown)"),
        "{stderr}"
    );
    // Printed, not run.
    assert!(!started.exists());
}

/// An intercepting policy: both printers show the CA's two files as a run has them, read
/// and protected (they printed neither before the run wrote the files under Seatbelt).
#[test]
fn both_printers_show_an_intercepting_runs_ca_files_read_and_protected() {
    let work = tempfile::tempdir().unwrap();
    let stand_in = work.path().join("sandbox-exec");
    std::fs::write(&stand_in, "#!/bin/sh\nexit 99\n").unwrap();
    let policy = write_policy(
        work.path(),
        "net:\n  mode: allowlist\n  allowlist:\n    - host: ro.example\n      read_only: true\n",
    );
    let print = |args: &[&str], exec: Option<&Path>| {
        let mut cmd = Command::new(common::sandgate_bin());
        cmd.args(["run", "--policy"])
            .arg(&policy)
            .args(args)
            .args(["--", "true"]);
        match exec {
            Some(e) => cmd.env("SANDGATE_SANDBOX_EXEC", e),
            None => cmd.env_remove("SANDGATE_SANDBOX_EXEC"),
        };
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stderr}");
        stdout
    };
    let argv = print(&["--print-argv"], Some(&stand_in));
    let profile = print(&["--print-profile", "seatbelt"], None);
    for (printed, line) in [
        (&argv, argv.trim_end().to_owned()),
        (
            &profile,
            profile
                .lines()
                .find_map(|l| l.strip_prefix(";; run with: "))
                .unwrap()
                .to_owned(),
        ),
    ] {
        let words = shell_words(&line);
        let value = |name: &str| {
            words
                .iter()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name}: {line}"))
                .to_owned()
        };
        let (cert, bundle) = (value("CA_0"), value("CA_1"));
        assert!(
            cert.ends_with("/ca.pem") && bundle.ends_with("/ca-bundle.pem"),
            "{line}"
        );
        for ca in [&cert, &bundle] {
            assert!(
                words
                    .iter()
                    .any(|w| w.starts_with("PROTECT_") && w.ends_with(&format!("={ca}"))),
                "{line}"
            );
        }
        if printed == &argv {
            // Beside the profile, in the run's state directory.
            let dir = words[2].trim_end_matches("/profile.sb");
            assert_eq!(cert, format!("{dir}/ca.pem"), "{line}");
        } else {
            assert!(
                printed.contains("(allow file-read* (literal (param \"CA_1\")))"),
                "{printed}"
            );
        }
    }
}
