//! What the `sandgate run` test files share: a policy that gives the command a working
//! userland (/usr and the merged-/usr symlinks), the `net` section of an allowlist run, running the real binary with a known
//! environment, bounded waits, and the rerun of a whole test binary as `nobody`.

#![allow(dead_code, reason = "each test file uses a different part")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;

const BASE: &str = "apiVersion: sandgate.dev/v1\nkind: SandboxPolicy\nenv:\n  set: { HOME: /tmp, PATH: /usr/bin:/bin, LANG: C.UTF-8 }\nfs:\n  read_paths: [ /usr, /lib, /bin, /etc/ssl, /etc/alternatives ]\n";

fn lib64() -> &'static str {
    if Path::new("/lib64").exists() {
        ", /lib64"
    } else {
        ""
    }
}

/// The policy every test starts from (no network section: `none`).
pub fn base() -> String {
    BASE.replace(", /etc/alternatives", &format!(", /etc/alternatives{}", lib64()))
}

/// Writes `base()` plus `extra` to `dir/policy.yaml`.
pub fn write_policy(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("policy.yaml");
    std::fs::write(&path, format!("{}{extra}", base())).unwrap();
    path
}

/// The `net` section of an allowlist run: `allow` (each entry quoted), loopback allowed as
/// a range (the tests' origins), names resolved by the test's DNS server at `dns`.
pub fn allowlist(dns: std::net::SocketAddr, allow: &[String]) -> String {
    let quoted: Vec<String> = allow.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "net:\n  mode: allowlist\n  allow_domains: [ {} ]\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{dns}\" ] }}\n",
        quoted.join(", ")
    )
}

/// `sandgate run --policy P [extra_args] -- command`, with two known host variables.
pub fn run(policy: &Path, extra_args: &[&str], command: &[&str]) -> Output {
    run_command(policy, extra_args, command)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The command [`run`] runs, for a test that sets more of its environment or talks to the
/// run while it lasts.
pub fn run_command(policy: &Path, extra_args: &[&str], command: &[&str]) -> Command {
    let mut cmd = Command::new(common::sandgate_bin());
    cmd.arg("run")
        .arg("--policy")
        .arg(policy)
        .args(extra_args)
        .arg("--")
        .args(command)
        .env("SECRET_TOKEN", "do-not-leak")
        .env("PASS_ME", "visible")
        .env("XDG_STATE_HOME", state_home());
    cmd
}

/// Where the runs of these tests keep their audit logs: under the temporary directory, one
/// per user (the suite reruns itself as nobody), not in the real home.
pub fn state_home() -> PathBuf {
    let user = std::env::var("SANDGATE_AS_NOBODY").map_or("root-or-user", |_| "nobody");
    std::env::temp_dir().join(format!("sandgate-test-state-{user}"))
}

pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Waits at most 15 s for `child` to exit.
pub fn wait_bounded(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "sandgate run did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Is a process whose command line contains `needle` running?
pub fn running(needle: &str) -> bool {
    let out = Command::new("pgrep").args(["-f", needle]).output().unwrap();
    !out.stdout.is_empty()
}

/// Polls `cond` every 20 ms for at most `limit`.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The run's state directory: the one it holds open (for its lock).
pub fn state_dir_of(pid: u32) -> Option<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .find(|target| {
            target
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("sandgate-run-"))
        })
}

/// The host's python3 for driver scripts (a pty, a listener): Debian's, which `nobody` can
/// run, rather than whatever shim PATH finds first.
pub const HOST_PYTHON: &str = "/usr/bin/python3";
