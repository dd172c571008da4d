//! The sandbox's first program: `sandgate-init` where it is installed beside `sandgate`,
//! else `sandgate` itself; in every net mode either way PID 1 is under the filter, not
//! dumpable, and cannot be rewritten from inside. An init from another build refuses to run
//! anything.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and the shared test helpers connect to loopback fixtures"
)]

mod common;
mod sandbox_support;

use std::process::{Command, Stdio};

use sandbox_support::{state_home, text, write_policy};

/// Inside: the size of the program at /run/sandgate-init, PID 1's command line and filter
/// mode, and whether that program or PID 1's memory opens for writing.
const INSIDE: &str = r#"
import os
print("size", os.stat("/run/sandgate-init").st_size)
print("pid1", open("/proc/1/cmdline", "rb").read().split(b"\0")[1].decode())
status = open("/proc/1/status").read()
print("seccomp", [l.split()[1] for l in status.splitlines() if l.startswith("Seccomp:")][0])
for path in ("/run/sandgate-init", "/proc/1/mem"):
    try:
        os.close(os.open(path, os.O_RDWR))
        print("OPENED", path)
    except OSError as e:
        print("refused", path, e.errno)
"#;

/// Runs [`INSIDE`] with `sandgate` in every net mode that starts an init differently
/// (none; all; allowlist, whose init holds the proxy's bridges); returns each stdout.
fn inside_with(sandgate: &std::path::Path) -> Vec<(String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let mut shown = Vec::new();
    for net in ["none", "all", "allowlist\n  allow_domains: [ a.example ]"] {
        let policy = write_policy(dir.path(), &format!("net:\n  mode: {net}\n"));
        let out = Command::new(sandgate)
            .args(["run", "--quiet", "--policy"])
            .arg(&policy)
            .args(["--", "python3", "-c", INSIDE])
            .env("XDG_STATE_HOME", state_home())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{net}: {stdout}\n{stderr}");
        shown.push((net.to_owned(), stdout));
    }
    shown
}

fn size(path: impl AsRef<std::path::Path>) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// The `sandgate-init` beside the binary under test (placed there as installed when the
/// tests rerun as `nobody`).
fn small_init() -> std::path::PathBuf {
    std::path::Path::new(&common::sandgate_bin()).with_file_name("sandgate-init")
}

fn assert_confined(net: &str, stdout: &str, first: u64) {
    assert!(
        stdout.contains(&format!("size {first}\n")),
        "{net}: another init ran:\n{stdout}"
    );
    assert!(stdout.contains("pid1 sandbox-init"), "{net}: {stdout}");
    assert!(
        stdout.contains("seccomp 2"),
        "{net}: PID 1 is not filtered:\n{stdout}"
    );
    assert!(!stdout.contains("OPENED"), "{net}: {stdout}");
    // ETXTBSY (it runs) or EROFS (a read-only bind): either way not for writing.
    assert!(stdout.contains("refused /run/sandgate-init "), "{net}: {stdout}");
    assert!(stdout.contains("refused /proc/1/mem 13"), "{net}: {stdout}");
}

/// A `sandgate-init` that loads no filter: it skips to the command after `--`, says so and
/// runs it (what an attacker would plant).
const UNFILTERED_INIT: &[u8] =
    b"#!/bin/sh\nwhile [ \"$1\" != -- ]; do shift; done; shift; echo PLANTED; exec \"$@\"\n";

/// Both binaries placed as installed, in a directory only their owner writes (whatever the
/// build directory's modes under the tester's umask); `init` replaces `sandgate-init`.
fn installed(init: Option<&[u8]>) -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sandgate = dir.path().join("sandgate");
    common::place_binary(common::sandgate_bin(), &sandgate);
    let beside = dir.path().join("sandgate-init");
    match init {
        Some(bytes) => std::fs::write(&beside, bytes).unwrap(),
        None => std::fs::copy(small_init(), &beside).map(drop).unwrap(),
    }
    std::fs::set_permissions(&beside, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, sandgate)
}

/// Installed as built: `sandgate-init` beside `sandgate` is the program that runs first.
#[test]
fn the_small_init_beside_sandgate_is_pid_1_and_confined_in_every_mode() {
    let small = size(small_init());
    assert!(small < size(common::sandgate_bin()) / 2);
    let (_dir, sandgate) = installed(None);
    for (net, stdout) in inside_with(&sandgate) {
        assert_confined(&net, &stdout, small);
    }
}

/// A `sandgate-init` left from another build (here this build's with its identity
/// rewritten, as an older one would carry another) holds no sandbox: the run fails, names
/// the cause, and the command does not run.
#[test]
fn a_run_with_an_init_of_another_build_runs_nothing_and_says_why() {
    let mut stale = std::fs::read(small_init()).unwrap();
    let build = sandgate_sandbox::steps::BUILD.as_bytes();
    let mut found = 0;
    for at in 0..stale.len().saturating_sub(build.len()) {
        if &stale[at..at + build.len()] == build {
            stale[at..at + build.len()].copy_from_slice(b"0123456789abcdef");
            found += 1;
        }
    }
    assert!(found > 0, "the build identity is not in the binary");
    let (dir, sandgate) = installed(Some(&stale));
    let witness = dir.path().join("ran");
    let policy = write_policy(dir.path(), "net:\n  mode: none\n");
    let out = Command::new(&sandgate)
        .args(["run", "--quiet", "--policy"])
        .arg(&policy)
        .arg("--")
        .arg("touch")
        .arg(&witness)
        .env("XDG_STATE_HOME", state_home())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(!witness.exists(), "the command ran under a stale init");
    assert!(stderr.contains("from one build"), "{stderr}");
}

/// `sandgate doctor` with a trusted `sandgate-init` that starts the command without
/// loading any filter: the seccomp check fails (before, it passed whatever exited 0).
#[test]
fn doctor_fails_an_init_that_loads_no_filter() {
    let (_dir, sandgate) = installed(Some(UNFILTERED_INIT));
    let out = Command::new(&sandgate)
        .arg("doctor")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    let line = stdout
        .lines()
        .find(|l| l.contains("seccomp"))
        .unwrap_or_else(|| panic!("{stdout}\n{stderr}"));
    assert!(line.contains("FAIL") && line.contains("did not load"), "{line}");
}

/// `sandgate` copied alone (no `sandgate-init` beside it) runs its own steps, as confined.
#[test]
fn sandgate_alone_is_its_own_init_and_as_confined() {
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("sandgate");
    common::place_binary(common::sandgate_bin(), &alone);
    let whole = size(common::sandgate_bin());
    for (net, stdout) in inside_with(&alone) {
        assert_confined(&net, &stdout, whole);
    }
}

/// A command line the init does not read (one from a `sandgate` of another build: another
/// `--build`, or none) runs nothing: usage status and a message that names the cause. The
/// same from `sandgate` itself, which reads the steps through clap when its fast path does
/// not. With this build's identity the same step runs.
#[test]
fn an_init_of_another_build_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let witness = dir.path().join("ran");
    let build = sandgate_sandbox::steps::BUILD;
    for args in [
        vec!["sandbox-init", "--build", "0123456789abcdef", "--", "touch"],
        vec!["sandbox-exec", "--build", "0123456789abcdef", "--", "touch"],
        vec!["sandbox-init", "--", "touch"],
        vec!["sandbox-exec", "--rlimit", "nproc=512", "--", "touch"],
        vec!["sandbox-init", "--build", build, "--future-flag", "--", "touch"],
        vec!["sandbox-init", "--build", build, "touch"],
    ] {
        for program in [small_init(), common::sandgate_bin().into()] {
            let out = Command::new(&program)
                .args(&args)
                .arg(&witness)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let (stdout, stderr) = text(&out);
            // The small init names a build that is not its own (70, as any init that cannot
            // confine the command); other command lines are usage errors (64).
            let other = program == small_init() && args.contains(&"0123456789abcdef");
            assert_eq!(
                out.status.code(),
                Some(if other { 70 } else { 64 }),
                "{args:?}: {stdout}\n{stderr}"
            );
            assert!(!witness.exists(), "{program:?} {args:?}: the command ran");
            if program == small_init() || args.contains(&"0123456789abcdef") {
                assert!(
                    stderr.contains("same build") || stderr.contains("one build"),
                    "{args:?}: {stderr}"
                );
            }
        }
    }
    let out = Command::new(small_init())
        .args(["sandbox-exec", "--build", build, "--", "touch"])
        .arg(&witness)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success() && witness.exists(), "{:?}", text(&out));
}

/// An attacker, another user, plants a `sandgate-init` (one that runs the command with no
/// filter) beside a `sandgate` in a shared sticky directory, or makes the victim's own
/// init writable to others: the run does not use it, and its PID 1 is filtered.
#[test]
fn a_planted_or_writable_init_is_not_run() {
    use std::os::unix::fs::PermissionsExt;
    if !common::is_root() {
        return; // chown to another user needs root; the unit tests cover the modes
    }
    // The plant, made by another user in a shared sticky directory beside the victim's.
    let (dir, sandgate) = installed(Some(UNFILTERED_INIT));
    let shared = dir.path();
    std::fs::set_permissions(shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let plant = shared.join("sandgate-init");
    std::os::unix::fs::chown(&plant, Some(4242), Some(4242)).unwrap();
    let whole = size(&sandgate);
    for (net, stdout) in inside_with(&sandgate) {
        assert!(
            !stdout.contains("PLANTED"),
            "{net}: the planted init ran:\n{stdout}"
        );
        assert_confined(&net, &stdout, whole);
    }
    // The victim's own init, in a directory only it writes, but writable by others.
    std::fs::set_permissions(shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&plant, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&plant, std::fs::Permissions::from_mode(0o757)).unwrap();
    for (net, stdout) in inside_with(&sandgate) {
        assert!(
            !stdout.contains("PLANTED"),
            "{net}: the writable init ran:\n{stdout}"
        );
        assert_confined(&net, &stdout, whole);
    }
}

/// A command line the init does not read at all runs nothing either.
#[test]
fn the_small_init_runs_nothing_from_a_command_line_it_does_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let witness = dir.path().join("ran");
    for args in [vec!["proxy"], vec![]] {
        let out = Command::new(small_init())
            .args(&args)
            .args(args.last().filter(|a| **a == "touch").map(|_| &witness))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stdout}\n{stderr}");
        assert!(stderr.contains("same build"), "{args:?}: {stderr}");
        assert!(!witness.exists(), "{args:?}: the command ran");
    }
}

/// Each test again as `nobody`, with both binaries placed as they are installed.
#[test]
fn the_init_tests_pass_as_an_ordinary_user() {
    common::rerun_as_nobody("init_binary_e2e", "the_init_tests_pass_as_an_ordinary_user", 3);
}
