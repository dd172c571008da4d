//! `sandgate run`'s macOS backend, driven on Linux through a stand-in for
//! `/usr/bin/sandbox-exec` (`SANDGATE_SANDBOX_EXEC`): a script written by each test that
//! checks the arguments it gets (`-f PROFILE [-D NAME=VALUE]... -- COMMAND`), records the
//! profile, its parameters and its environment, and runs the command. Nothing confines the
//! command here; what is tested is everything sandgate does around sandbox-exec: the run's
//! proxy (allowed and refused requests, both audited), the environment, the profile's rules
//! for the policy's paths and the proxy's ports, the exit status, teardown, signals and the
//! trace (what `--print-profile seatbelt` and `--print-argv` print is
//! `seatbelt_print_e2e.rs`). Whether macOS enforces the profile is not (docs/sandbox.md,
//! "macOS").

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;
#[path = "seatbelt/interception.rs"]
mod interception;
mod sandbox_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;

use common::runtime;
use sandbox_support::{base, eventually, state_home, text, wait_bounded};

/// The stand-in's script: it records into `record` and fails with 90+ on arguments that
/// are not sandbox-exec's.
const STAND_IN: &str = r#"#!/bin/sh
out='RECORD'
[ "$1" = -f ] || { echo "stand-in: expected -f, got $1" >&2; exit 90; }
[ -f "$2" ] || { echo "stand-in: no profile at $2" >&2; exit 91; }
printf '%s\n' "$2" > "$out/profile-path"
cp "$2" "$out/profile.sb"
shift 2
: > "$out/params"
while [ "$1" = -D ]; do
  case "$2" in *=*) ;; *) echo "stand-in: -D $2 is not NAME=VALUE" >&2; exit 92 ;; esac
  printf '%s\n' "$2" >> "$out/params"
  shift 2
done
[ "$1" = -- ] || { echo "stand-in: expected --, got $1" >&2; exit 93; }
shift
env > "$out/env"
exec "$@"
"#;

/// A test's directory with the stand-in and what it recorded.
struct StandIn {
    dir: tempfile::TempDir,
}

impl StandIn {
    fn new() -> StandIn {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("record")).unwrap();
        let script = STAND_IN.replace("RECORD", &dir.path().join("record").display().to_string());
        let path = dir.path().join("sandbox-exec");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        StandIn { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("sandbox-exec")
    }

    fn recorded(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("record").join(name))
            .unwrap_or_else(|e| panic!("the stand-in recorded no {name}: {e}"))
    }

    /// The `-D` parameters it was given.
    fn param(&self, name: &str) -> Option<String> {
        self.recorded("params")
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")).map(str::to_owned))
    }

    /// The command's environment, as the stand-in saw it.
    fn env(&self, name: &str) -> Option<String> {
        self.recorded("env")
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")).map(str::to_owned))
    }

    /// `sandgate run --policy POLICY ARGS -- COMMAND` under this stand-in.
    fn command(&self, policy: &Path, args: &[&str], command: &[&str]) -> Command {
        let mut cmd = Command::new(common::sandgate_bin());
        cmd.arg("run")
            .arg("--policy")
            .arg(policy)
            .args(args)
            .arg("--")
            .args(command)
            .env("SANDGATE_SANDBOX_EXEC", self.path())
            .env("SECRET_TOKEN", "do-not-leak")
            .env("XDG_STATE_HOME", state_home())
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, policy: &Path, args: &[&str], command: &[&str]) -> Output {
        self.command(policy, args, command).output().unwrap()
    }
}

/// `base()` (read paths /usr, /lib, /bin, ...) plus `extra`, in `dir/policy.yaml`.
fn write_policy(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("policy.yaml");
    std::fs::write(&path, format!("{}{extra}", base())).unwrap();
    path
}

/// The port in `http://127.0.0.1:PORT`.
fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

#[test]
fn the_whole_flow_runs_under_the_stand_in() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("denied.test", &["127.0.0.1"]),
    ));
    let stand_in = StandIn::new();
    let work = tempfile::tempdir().unwrap();
    let port = origin.port();
    let policy = write_policy(
        work.path(),
        &format!(
            "  write_paths: [ \"{}\" ]\nnet:\n  mode: allowlist\n  allow_domains: [ \"allowed.test:{port}\" ]\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\nplatform:\n  bwrap: {{ unshare: {{ pid: true }} }}\n  seatbelt: {{ extra_allow: {{ mach-lookup: [ com.apple.fonts ] }} }}\n",
            work.path().display(),
            dns.addr()
        ),
    );
    let audit = work.path().join("audit.jsonl");
    let script = format!(
        r#"curl -sS -o /dev/null -w "allowed=%{{http_code}}\n" http://allowed.test:{port}/under-seatbelt
curl -sS -o /dev/null -w "denied=%{{http_code}}\n" http://denied.test:{port}/
echo "secret=${{SECRET_TOKEN:-unset}}"
echo x > "$TMPDIR/scratch" && echo tmp-ok
exit 7"#
    );
    let out = stand_in.run(
        &policy,
        &["--audit-log", audit.to_str().unwrap()],
        &["sh", "-c", &script],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(7),
        "the command's status\n{stdout}\n{stderr}"
    );
    for want in ["allowed=200", "denied=403", "secret=unset", "tmp-ok"] {
        assert!(stdout.contains(want), "missing {want}:\n{stdout}\n{stderr}");
    }
    assert!(stderr.contains("SANDGATE_SANDBOX_EXEC="), "{stderr}");
    assert!(
        stderr.contains(&format!("blocked: denied.test:{port} (not allowlisted)")),
        "{stderr}"
    );

    // The audit log has both requests, under the run's task.
    let events = common::read_audit(&audit);
    let with = |decision: &str, host: &str| {
        events
            .iter()
            .any(|e| e["decision"] == decision && e.to_string().contains(host))
    };
    assert!(with("allow", "allowed.test"), "{events:#?}");
    assert!(with("deny", "denied.test"), "{events:#?}");
    assert!(
        events
            .iter()
            .all(|e| e["task_id"].as_str().is_none_or(|t| t.starts_with("run-")))
    );

    // The environment: built from the policy alone, the proxy on a port of the host's
    // loopback (not the 3128 of a bwrap sandbox), TMPDIR the run's own.
    assert_eq!(stand_in.env("SECRET_TOKEN"), None);
    let proxy = stand_in.env("HTTP_PROXY").unwrap();
    assert!(proxy.starts_with("http://127.0.0.1:"), "{proxy}");
    let http = port_of(&proxy);
    assert_ne!(http, 3128);
    assert_eq!(stand_in.env("ALL_PROXY"), Some(proxy.clone()));
    let tmpdir = stand_in.env("TMPDIR").unwrap();

    // The profile: the policy's paths as parameters, network only to the run's proxy ports.
    let profile = stand_in.recorded("profile.sb");
    let profile_path = PathBuf::from(stand_in.recorded("profile-path").trim());
    let canonical = |p: &str| std::fs::canonicalize(p).unwrap().display().to_string();
    assert_eq!(stand_in.param("READ_0"), Some(canonical("/usr")));
    assert_eq!(
        stand_in.param("WRITE_0"),
        Some(canonical(work.path().to_str().unwrap()))
    );
    assert_eq!(stand_in.param("TMPDIR"), Some(tmpdir.clone()));
    assert!(
        tmpdir.starts_with(profile_path.parent().unwrap().to_str().unwrap()),
        "{tmpdir}"
    );
    for rule in [
        "(allow file-read* file-map-executable (subpath (param \"READ_0\")))",
        "(allow file-read* file-write* file-map-executable (subpath (param \"WRITE_0\")))",
        "(allow file-read* file-write* (subpath (param \"TMPDIR\")))",
        "(allow mach-lookup (global-name \"com.apple.fonts\"))",
        "(deny file-write* (subpath (param \"PROTECT_0\")))",
    ] {
        assert!(profile.contains(rule), "missing {rule}:\n{profile}");
    }
    let network: Vec<&str> = profile.lines().filter(|l| l.contains("network")).collect();
    let socks = profile
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!(
                ";; net: only sandgate's proxy, on localhost:{http} and "
            ))
        })
        .unwrap_or_else(|| panic!("no proxy ports in:\n{profile}"));
    assert_eq!(
        network,
        [format!(
            "(allow network-outbound (remote ip \"localhost:{http}\") (remote ip \"localhost:{socks}\"))"
        )],
        "{profile}"
    );
    let protected: Vec<String> = stand_in
        .recorded("params")
        .lines()
        .filter(|l| l.starts_with("PROTECT_"))
        .map(|l| l.split_once('=').unwrap().1.to_owned())
        .collect();
    assert!(
        protected.contains(&canonical(policy.to_str().unwrap())),
        "{protected:?}"
    );
    assert!(
        protected.contains(&canonical(audit.to_str().unwrap())),
        "{protected:?}"
    );

    // Teardown: the profile and the state directory gone, the proxy's port closed.
    assert!(!profile_path.exists(), "{} left behind", profile_path.display());
    assert!(
        !profile_path.parent().unwrap().exists(),
        "the state directory left behind"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", http)).is_err(),
        "port {http} still open"
    );
}

#[test]
fn sigterm_reaches_the_command_and_the_run_tears_down() {
    let stand_in = StandIn::new();
    let work = tempfile::tempdir().unwrap();
    let policy = write_policy(work.path(), "net:\n  mode: none\n");
    let ready = work.path().join("ready");
    let got = work.path().join("got");
    let script = format!(
        "trap 'echo TERM > {got}; exit 143' TERM; echo up > {ready}; while :; do sleep 0.05; done",
        got = got.display(),
        ready = ready.display()
    );
    let mut child = stand_in
        .command(&policy, &["--quiet"], &["sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(15), || ready.exists()),
        "the command never started"
    );
    nix_kill(child.id(), "TERM");
    let status = wait_bounded(&mut child);
    assert_eq!(
        std::fs::read_to_string(&got).unwrap_or_default(),
        "TERM\n",
        "the command did not get SIGTERM"
    );
    assert_eq!(status.code(), Some(143), "the command's own exit status");
    let profile = stand_in.recorded("profile.sb");
    assert!(
        profile.contains(";; net: none") && !profile.contains("(allow network"),
        "{profile}"
    );
    let profile_path = PathBuf::from(stand_in.recorded("profile-path").trim());
    assert!(
        !profile_path.parent().unwrap().exists(),
        "the state directory left behind"
    );
}

/// Sends `kill -SIG pid` through the system's kill (the tests link no signal crate).
fn nix_kill(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// A stand-in for `/usr/bin/log`: records its arguments, prints one denial line ending in
/// the predicate's tag, and waits to be stopped.
const LOG_STAND_IN: &str = r#"#!/bin/sh
printf '%s\n' "$@" > 'RECORD/log-args'
tag=$(printf '%s' "$5" | sed 's/.*"\(.*\)"$/\1/')
echo "Sandbox: cat(4242) deny(1) file-read-data /Users/dev/.ssh/id_ed25519 $tag"
exec sleep 30
"#;

#[test]
fn trace_records_the_profiles_denials() {
    use std::os::unix::fs::PermissionsExt;
    let stand_in = StandIn::new();
    let log = stand_in.dir.path().join("log");
    let record = stand_in.dir.path().join("record");
    std::fs::write(
        &log,
        LOG_STAND_IN.replace("RECORD", &record.display().to_string()),
    )
    .unwrap();
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o755)).unwrap();
    let work = tempfile::tempdir().unwrap();
    let policy = write_policy(
        work.path(),
        "net:\n  mode: none\nplatform:\n  seatbelt: { trace: true }\n",
    );
    let out = stand_in
        .command(&policy, &[], &["sh", "-c", "sleep 0.2; exit 3"])
        .env("SANDGATE_SEATBELT_LOG", &log)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    let trace = stderr
        .lines()
        .find_map(|l| l.strip_prefix("sandgate: the profile's denials are in "))
        .unwrap_or_else(|| panic!("no trace file named:\n{stderr}"));
    let profile = stand_in.recorded("profile.sb");
    let tag = profile
        .lines()
        .find_map(|l| {
            l.strip_prefix("(deny default (with message \"")?
                .strip_suffix("\"))")
        })
        .unwrap_or_else(|| panic!("the denials are not tagged:\n{profile}"));
    assert!(tag.starts_with("sandgate-run-"), "{tag}");
    let args = stand_in.recorded("log-args");
    assert_eq!(
        args.lines().collect::<Vec<_>>(),
        [
            "stream",
            "--style",
            "compact",
            "--predicate",
            &format!("eventMessage ENDSWITH \"{tag}\"")
        ]
    );
    let denials = std::fs::read_to_string(trace).unwrap();
    assert!(
        denials.contains(&format!(
            "deny(1) file-read-data /Users/dev/.ssh/id_ed25519 {tag}"
        )),
        "{denials}"
    );
    // The trace is the run's own file: the command may not change it.
    let protected = stand_in.recorded("params");
    assert!(
        protected
            .lines()
            .any(|l| l.starts_with("PROTECT_") && l.ends_with(".seatbelt-denials.log")),
        "{protected}"
    );
    std::fs::remove_file(trace).unwrap();
}

#[test]
fn one_file_with_both_platform_sections_loads_on_linux_and_check_config_checks_both() {
    let work = tempfile::tempdir().unwrap();
    let both = "platform:\n  bwrap: { unshare: { pid: true } }\n  seatbelt:\n    trace: true\n    extra_allow:\n      mach-lookup: [ com.apple.fonts ]\n      system-socket: true\n      dev: { allow_tty_writes: true }\n      file_read_extra: [ /Library/Fonts, /opt/homebrew/share ]\n";
    let policy = write_policy(work.path(), both);
    let check = |policy: &Path| {
        Command::new(common::sandgate_bin())
            .arg("check-config")
            .arg(policy)
            .output()
            .unwrap()
    };
    let out = check(&policy);
    assert!(out.status.success(), "{:?}", text(&out));
    // The bwrap backend takes the file and leaves the seatbelt section alone.
    let out = Command::new(common::sandgate_bin())
        .args(["run", "--print-argv", "--policy"])
        .arg(&policy)
        .args(["--", "true"])
        .env_remove("SANDGATE_SANDBOX_EXEC")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success() && stdout.contains("bwrap"),
        "{stdout}\n{stderr}"
    );
    // A bad seatbelt key fails on Linux too, named.
    for (bad, field) in [
        (
            "extra_allow:\n      mach-lookup: [ \"com.apple fonts\" ]\n",
            "platform.seatbelt.extra_allow.mach-lookup",
        ),
        (
            "extra_allow:\n      file_read_extra: [ Fonts ]\n",
            "platform.seatbelt.extra_allow.file_read_extra",
        ),
        ("extra_allow:\n      network: true\n", "network"),
    ] {
        let policy = write_policy(work.path(), &format!("platform:\n  seatbelt:\n    {bad}"));
        let out = check(&policy);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(64), "{bad}: {stderr}");
        assert!(stderr.contains(field), "{bad}: {stderr}");
    }
}
