//! What this host offers the sandbox: bubblewrap and its version, user namespaces (tried the
//! way a run makes them, in a bounded child), the seccomp state, Landlock's ABI, a cgroup of a
//! run's own, kernel TLS and the open-file limit. `sandgate doctor` reports these; `sandgate
//! run` uses [`try_sandbox`] and [`SetupFailure`] to say why bwrap could not set a sandbox up
//! and what fixes it.
//!
//! Nothing here changes the host: the probes run in children (bwrap, `sandbox-exec`) that
//! are killed after [`PROBE_TIME`], and the probe cgroup is removed at once.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a probe child may take before it is killed and counted as failed.
pub const PROBE_TIME: Duration = Duration::from_secs(5);

/// Where Ubuntu's apparmor package ships the profile that lets bwrap make user namespaces.
pub const BWRAP_PROFILE: &str = "/usr/share/apparmor/extra-profiles/bwrap-userns-restrict";

/// `bwrap` on `PATH`.
pub fn find_bwrap() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
}

/// bwrap's version (`bubblewrap 0.8.0` prints `[0, 8, 0]`), or `None` when it cannot say.
pub fn bwrap_version(bwrap: &Path) -> Option<Vec<u32>> {
    let out = Command::new(bwrap)
        .arg("--version")
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version: Vec<u32> = text
        .split_whitespace()
        .last()?
        .split('.')
        .map_while(|n| n.parse().ok())
        .collect();
    (!version.is_empty()).then_some(version)
}

/// Runs `command` with stdin and stdout closed, keeping what it writes on stderr (the first
/// 4 KiB), for [`PROBE_TIME`] at most: `Ok(())` when it exits 0, else what it said.
fn probe(command: &mut Command) -> Result<(), String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < PROBE_TIME => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", PROBE_TIME.as_secs()));
            }
        }
    };
    let mut said = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        let _ = std::io::Read::read_to_end(&mut std::io::Read::take(stderr, 4096), &mut said);
    }
    if status.success() {
        Ok(())
    } else {
        let said = String::from_utf8_lossy(&said).trim().to_owned();
        Err(if said.is_empty() {
            format!("{status}")
        } else {
            said
        })
    }
}

/// Makes a sandbox the way a run does (a user namespace, a network namespace when the run
/// has one, capabilities dropped) around `true`: `Err` carries bwrap's message.
pub fn try_sandbox(bwrap: &Path, unshare_net: bool) -> Result<(), String> {
    let mut cmd = Command::new(bwrap);
    cmd.args(["--die-with-parent", "--unshare-user", "--cap-drop", "ALL"]);
    if unshare_net {
        cmd.arg("--unshare-net");
    }
    cmd.args(["--ro-bind", "/", "/", "--", "true"]);
    probe(&mut cmd)
}

/// Loads the sandbox's seccomp filter in `sandbox-exec` of `init` (the program a run starts
/// first inside, [`crate::run::init_binary`]), the path a run without an init takes (a run
/// with one loads the same filter in the init), around a shell that succeeds only if it
/// runs under one filter more than this process (`Seccomp_filters:`, Linux 5.9; before it,
/// `Seccomp: 2` where this process has none): a step that exits 0 without loading one does
/// not pass, even where a container engine's filter is already in place.
pub fn try_seccomp(init: &Path) -> Result<(), String> {
    let ours = own_status("Seccomp_filters:").unwrap_or_default();
    probe(Command::new(init).args([
        "sandbox-exec",
        "--build",
        crate::steps::BUILD,
        "--",
        "/bin/sh",
        "-c",
        SECCOMP_PROBE,
        "sh",
        &ours,
    ]))
}

/// The shell [`try_seccomp`] runs: with `$1` the prober's own filter count (empty where the
/// kernel does not report one), exit 0 only under more filters than that, or (no count)
/// under a filter at all when the prober is under none.
const SECCOMP_PROBE: &str = r#"mode=; count=
while read -r k v; do
  case $k in Seccomp:) mode=$v ;; Seccomp_filters:) count=$v ;; esac
done < /proc/self/status
if [ -n "$1" ] && [ -n "$count" ]; then [ "$count" -gt "$1" ] && exit 0
elif [ "$mode" = 2 ]; then exit 0; fi
echo "no seccomp filter of the sandbox's in place (mode $mode, filters ${count:-?}, the prober's ${1:-?})" >&2
exit 1"#;

/// The value of this process's `/proc/self/status` field `name` (with its colon).
fn own_status(name: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    Some(
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .to_owned(),
    )
}

/// Why bwrap could not set a sandbox up, from its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupFailure {
    /// Ubuntu's AppArmor: the namespace is made, then refused the capabilities bwrap needs
    /// in it ("setting up uid map: Permission denied", "loopback: Failed RTM_NEWADDR").
    AppArmorRestricted,
    /// No user namespace may be made: `user.max_user_namespaces` is 0, or the nesting limit
    /// is reached (ENOSPC).
    NamespaceLimit,
    /// Debian's `kernel.unprivileged_userns_clone=0` (EPERM for an unprivileged user).
    UnprivilegedDisabled,
    /// The kernel has no user namespaces, or refused them for another reason.
    NoUserNamespaces,
}

impl SetupFailure {
    /// Recognises bwrap's own message for a failure to make the sandbox's namespaces.
    pub fn classify(bwrap_said: &str) -> Option<SetupFailure> {
        let s = bwrap_said;
        if s.contains("setting up uid map")
            || s.contains("setting up gid map")
            || s.contains("RTM_NEWADDR")
            || s.contains("loopback: Failed")
        {
            Some(SetupFailure::AppArmorRestricted)
        } else if s.contains("_namespaces exceeded")
            || s.contains("(ENOSPC)")
            || (s.contains("namespace") && s.contains("No space left"))
        {
            Some(SetupFailure::NamespaceLimit)
        } else if s.contains("No permissions to creat") {
            Some(SetupFailure::UnprivilegedDisabled)
        } else if s.contains("Creating new namespace failed") {
            Some(SetupFailure::NoUserNamespaces)
        } else {
            None
        }
    }

    /// The cause and the fix, as one message. `sandgate_exe` is this binary's path (the
    /// AppArmor profile names it).
    pub fn advice(self, sandgate_exe: &Path) -> String {
        match self {
            SetupFailure::AppArmorRestricted => format!(
                "bwrap could not set up the sandbox's user namespace: AppArmor refuses unprivileged user namespaces to programs without a profile that allows them ({}). Fix, either: \
                 (1) Ubuntu's profile for bwrap: sudo cp {BWRAP_PROFILE} /etc/apparmor.d/ && sudo apparmor_parser -r /etc/apparmor.d/bwrap-userns-restrict; \
                 or (2) sandgate's profile: sudo cp deploy/apparmor/sandgate /etc/apparmor.d/sandgate, with its path changed to {} if sandgate lives elsewhere than /usr/local/bin/sandgate, then sudo apparmor_parser -r /etc/apparmor.d/sandgate. \
                 (sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 lifts the restriction for every program; docs/sandbox.md, \"Ubuntu 24.04 and later\")",
                match read_sysctl("kernel/apparmor_restrict_unprivileged_userns").as_deref() {
                    Some("1") => "kernel.apparmor_restrict_unprivileged_userns=1, Ubuntu 24.04's default",
                    _ => "or another security module refused bwrap its capabilities there",
                },
                sandgate_exe.display()
            ),
            SetupFailure::NamespaceLimit => format!(
                "bwrap could not make a user namespace: no more are allowed here (user.max_user_namespaces is {}, or the nesting limit is reached). Fix: sysctl -w user.max_user_namespaces=15000 (as root on the host; inside a container, its engine decides)",
                read_sysctl("user/max_user_namespaces").unwrap_or_else(|| "unreadable".into())
            ),
            SetupFailure::UnprivilegedDisabled => "bwrap could not make a user namespace: the kernel allows them to root only (kernel.unprivileged_userns_clone=0). Fix: sysctl -w kernel.unprivileged_userns_clone=1".into(),
            SetupFailure::NoUserNamespaces => "bwrap could not make a user namespace: this kernel has none, or refused one. Fix: a kernel with CONFIG_USER_NS, and user namespaces allowed (sandgate doctor says what it found)".into(),
        }
    }
}

/// A value under /proc/sys (`kernel/...`, `user/...`), trimmed.
pub fn read_sysctl(name: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/proc/sys").join(name))
        .ok()
        .map(|v| v.trim().to_owned())
}

/// The `Seccomp:` field of /proc/self/status: 0 none, 1 strict, 2 filter (this process is
/// already under one, e.g. a container engine's).
pub fn seccomp_mode() -> Option<u8> {
    own_status("Seccomp:")?.parse().ok()
}

/// Landlock's ABI version (`landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`),
/// or the errno: `EOPNOTSUPP` built in but disabled at boot, `ENOSYS` not built in.
/// Landlock is Linux's own: elsewhere the error is `Unsupported`.
#[cfg(not(target_os = "linux"))]
pub fn landlock_abi() -> Result<i64, std::io::Error> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "Landlock exists on Linux only",
    ))
}

/// Landlock's ABI version (`landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`),
/// or the errno: `EOPNOTSUPP` built in but disabled at boot, `ENOSYS` not built in.
#[cfg(target_os = "linux")]
pub fn landlock_abi() -> Result<i64, std::io::Error> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    #[expect(
        unsafe_code,
        reason = "landlock_create_ruleset has no wrapper in std, nix or rustix; with a null attribute pointer and size 0 it only reports the ABI version and touches no memory"
    )]
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if version < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(version)
    }
}

/// The controllers (`pids`, `memory`) a cgroup of a run's own can hold here: one is made
/// (as [`crate::limits::enforce`] makes a run's) and removed at once.
pub fn cgroup_controllers() -> Vec<&'static str> {
    let limits = crate::policy::Limits {
        processes: Some(1 << 20),
        memory: Some(1 << 50),
        ..crate::policy::Limits::default()
    };
    let run = format!("run-{}-doctor", std::process::id());
    let enforcement = crate::limits::enforce(&run, &limits);
    ["pids", "memory"]
        .into_iter()
        .filter(|c| enforcement.cgroup.holds(c))
        .collect()
}

/// Kernel TLS: whether the `tls` module is loaded (or built in): /proc/net/tls_stat exists.
pub fn kernel_tls() -> bool {
    Path::new("/proc/net/tls_stat").exists() || Path::new("/sys/module/tls").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe's shell, run here (under no filter of the sandbox's): it fails for this
    /// process's own count and for no count at all, and passes only for a count below the
    /// one it finds (what one more filter gives).
    #[test]
    fn the_seccomp_probe_passes_only_under_one_filter_more() {
        let ours = own_status("Seccomp_filters:").unwrap_or_default();
        let run = |count: &str| {
            Command::new("/bin/sh")
                .args(["-c", SECCOMP_PROBE, "sh", count])
                .stderr(Stdio::null())
                .status()
                .unwrap()
                .success()
        };
        assert!(!run(&ours), "passed under this process's own filters");
        if own_status("Seccomp:").as_deref() == Some("0") {
            assert!(!run(""), "passed with no filter at all");
        }
        if let Ok(n) = ours.parse::<i64>() {
            assert!(run(&(n - 1).to_string()), "the count is not compared");
        }
    }

    #[test]
    fn bwraps_setup_messages_are_recognised() {
        let cases = [
            (
                "bwrap: setting up uid map: Permission denied",
                Some(SetupFailure::AppArmorRestricted),
            ),
            (
                "bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted",
                Some(SetupFailure::AppArmorRestricted),
            ),
            (
                "bwrap: Creating new namespace failed: No space left on device",
                Some(SetupFailure::NamespaceLimit),
            ),
            (
                "bwrap: Creating new namespace failed: nesting depth or /proc/sys/user/max_*_namespaces exceeded (ENOSPC)",
                Some(SetupFailure::NamespaceLimit),
            ),
            (
                "bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged user namespaces.",
                Some(SetupFailure::UnprivilegedDisabled),
            ),
            (
                "bwrap: Creating new namespace failed: Invalid argument",
                Some(SetupFailure::NoUserNamespaces),
            ),
            ("grep: pattern not found", None),
        ];
        for (said, want) in cases {
            assert_eq!(SetupFailure::classify(said), want, "{said}");
        }
    }

    #[test]
    fn advice_names_the_fix() {
        let exe = Path::new("/opt/sandgate/bin/sandgate");
        let text = SetupFailure::AppArmorRestricted.advice(exe);
        assert!(text.contains(BWRAP_PROFILE), "{text}");
        assert!(text.contains("deploy/apparmor/sandgate"), "{text}");
        assert!(text.contains("/opt/sandgate/bin/sandgate"), "{text}");
        assert!(
            SetupFailure::NamespaceLimit
                .advice(exe)
                .contains("user.max_user_namespaces")
        );
    }
}
