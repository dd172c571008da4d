//! `sandgate doctor`: checks this host for what `sandgate run` and the proxy need and says,
//! for each piece, what it found and what its absence costs. Exit 0 when `sandgate run` can
//! work here (bwrap, a user namespace made as a run makes it, the seccomp filter loaded),
//! 1 otherwise; `--json` prints the same as one object.
//!
//! The facts come from the sandbox crate's `host` module (probes in bounded children, a
//! probe cgroup removed at once); this file only judges them and words the report. It
//! changes nothing on the host.

use std::path::Path;
use std::process::ExitCode;

use sandgate_sandbox::host::{self, SetupFailure};

/// How one piece stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Present and working.
    Ok,
    /// Missing or partial; `sandgate run` still works, with less.
    Warn,
    /// Missing; `sandgate run` cannot work.
    Fail,
    /// Reported for information: nothing in sandgate depends on it yet.
    Info,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Info => "info",
        }
    }
}

/// One piece of the host: what was found, and what its absence costs (when it is absent).
#[derive(Debug)]
struct Check {
    name: &'static str,
    status: Status,
    found: String,
    cost: Option<String>,
}

impl Check {
    fn new(name: &'static str, status: Status, found: impl Into<String>, cost: Option<String>) -> Self {
        Check {
            name,
            status,
            found: found.into(),
            cost,
        }
    }
}

pub fn run(json: bool) -> ExitCode {
    let exe = std::env::current_exe().unwrap_or_else(|_| "sandgate".into());
    let bwrap = host::find_bwrap();
    let version = bwrap.as_deref().and_then(host::bwrap_version);
    let checks = vec![
        bwrap_check(
            bwrap.as_deref(),
            version.as_deref(),
            bwrap
                .as_deref()
                .is_some_and(|b| sandgate_sandbox::run::bwrap_options(b).bind_fd),
        ),
        userns_check(bwrap.as_deref(), &exe),
        seccomp_check(&exe),
        cgroup_check(),
        landlock_check(),
        ktls_check(),
        nofile_check(),
    ];
    let works = cfg!(target_os = "linux") && checks.iter().all(|c| c.status != Status::Fail);
    if json {
        println!("{}", to_json(&checks, works, version.as_deref()));
    } else {
        print_text(&checks, works);
    }
    if works {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn dotted(version: &[u32]) -> String {
    version.iter().map(u32::to_string).collect::<Vec<_>>().join(".")
}

/// `binds_fds`: the bwrap found has `--bind-fd`, without which no run starts.
fn bwrap_check(bwrap: Option<&Path>, version: Option<&[u32]>, binds_fds: bool) -> Check {
    let Some(bwrap) = bwrap else {
        return Check::new(
            "bwrap",
            Status::Fail,
            "bubblewrap (bwrap) is not on PATH",
            Some("sandgate run cannot work: it builds every sandbox with bwrap (apt-get install -y bubblewrap, dnf install bubblewrap)".into()),
        );
    };
    if !binds_fds {
        let found = version.map_or_else(
            || "bubblewrap".to_owned(),
            |v| format!("bubblewrap {}", dotted(v)),
        );
        return Check::new(
            "bwrap",
            Status::Warn,
            format!("{found} at {} has no --bind-fd", bwrap.display()),
            Some("sandgate run passes bind sources as paths, which bwrap resolves again when it mounts them, and sandgate mcp runs commands that take workspaces one at a time; with --bind-fd (bubblewrap 0.10.0, or a distribution's 2024 backport) each is a descriptor opened and checked".into()),
        );
    }
    match version {
        Some(v) if v >= [0, 8, 0].as_slice() => Check::new(
            "bwrap",
            Status::Ok,
            format!("bubblewrap {} at {}", dotted(v), bwrap.display()),
            None,
        ),
        Some(v) => Check::new(
            "bwrap",
            Status::Warn,
            format!("bubblewrap {} at {}", dotted(v), bwrap.display()),
            Some("--disable-userns needs bubblewrap 0.8: without it only the seccomp filter keeps the command from making user namespaces of its own".into()),
        ),
        None => Check::new(
            "bwrap",
            Status::Warn,
            format!("{} (its version could not be read)", bwrap.display()),
            Some("--disable-userns (bubblewrap 0.8) is not used: only the seccomp filter keeps the command from making user namespaces".into()),
        ),
    }
}

/// The user-namespace sysctls that exist here, as `name=value`.
fn userns_sysctls() -> String {
    let names = [
        "user/max_user_namespaces",
        "kernel/unprivileged_userns_clone",
        "kernel/apparmor_restrict_unprivileged_userns",
    ];
    let found: Vec<String> = names
        .iter()
        .filter_map(|n| Some(format!("{}={}", n.replace('/', "."), host::read_sysctl(n)?)))
        .collect();
    found.join(", ")
}

fn userns_check(bwrap: Option<&Path>, exe: &Path) -> Check {
    let sysctls = userns_sysctls();
    let Some(bwrap) = bwrap else {
        return Check::new(
            "user namespaces",
            Status::Fail,
            format!("not tried (no bwrap); {sysctls}"),
            Some("sandgate run cannot work: every sandbox is a user namespace".into()),
        );
    };
    match host::try_sandbox(bwrap, true) {
        Ok(()) => Check::new(
            "user namespaces",
            Status::Ok,
            format!("a user and a network namespace were made, as a run makes them; {sysctls}"),
            None,
        ),
        Err(said) => {
            let fix = SetupFailure::classify(&said)
                .map_or_else(|| format!("bwrap said: {said}"), |failure| failure.advice(exe));
            Check::new(
                "user namespaces",
                Status::Fail,
                format!(
                    "unavailable: bwrap could not make them ({}); {sysctls}",
                    first_line(&said)
                ),
                Some(format!("sandgate run cannot work: {fix}")),
            )
        }
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

fn seccomp_check(exe: &Path) -> Check {
    let mode = match host::seccomp_mode() {
        Some(0) => "this process is under no filter",
        Some(1) => "this process is in strict mode",
        Some(2) => {
            "this process is already under a filter (a container engine's, say); the sandbox's is added to it"
        }
        _ => "the Seccomp field of /proc/self/status is missing",
    };
    let init = sandgate_sandbox::run::init_binary(exe);
    // A sandgate-init beside the binary that is not used (its modes, its owner) is said:
    // runs then start about 0.8 ms later.
    let unused = sandgate_sandbox::run::init_not_used(exe)
        .map_or_else(String::new, |why| format!("; {why}, so sandgate is its own init"));
    match host::try_seccomp(&init) {
        Ok(()) => Check::new(
            "seccomp",
            Status::Ok,
            format!("the sandbox's filter loads (in {}{unused}); {mode}", init.display()),
            None,
        ),
        Err(said) => Check::new(
            "seccomp",
            Status::Fail,
            format!("the sandbox's filter did not load ({}); {mode}", first_line(&said)),
            Some("sandgate run cannot work: every command starts under the filter, and does not start without it".into()),
        ),
    }
}

fn cgroup_check() -> Check {
    let held = host::cgroup_controllers();
    let fallback = "limits.processes falls back to RLIMIT_NPROC (which root is exempt from) and limits.memory to RLIMIT_DATA per process";
    match held.as_slice() {
        ["pids", "memory"] => Check::new(
            "cgroup",
            Status::Ok,
            "a cgroup of a run's own can be made, with pids and memory",
            None,
        ),
        [] => Check::new(
            "cgroup",
            Status::Warn,
            "no cgroup of a run's own can be made here (no writable, delegated pids or memory controller)",
            Some(format!(
                "{fallback}; run under a delegated systemd unit (systemd-run --user -p Delegate=yes) to have one"
            )),
        ),
        some => Check::new(
            "cgroup",
            Status::Warn,
            format!(
                "a cgroup of a run's own can be made, with {} only",
                some.join(", ")
            ),
            Some(format!("where a controller is missing, {fallback}")),
        ),
    }
}

fn landlock_check() -> Check {
    let not_used = "sandgate does not use Landlock yet: nothing depends on it";
    match host::landlock_abi() {
        Ok(abi) => Check::new(
            "landlock",
            Status::Info,
            format!("ABI version {abi}"),
            Some(not_used.into()),
        ),
        Err(e) => Check::new(
            "landlock",
            Status::Info,
            format!("not available ({e})"),
            Some(not_used.into()),
        ),
    }
}

fn ktls_check() -> Check {
    let found = if host::kernel_tls() {
        "the tls module is loaded (/proc/net/tls_stat)"
    } else {
        "the tls module is not loaded"
    };
    Check::new(
        "kernel tls",
        Status::Info,
        found,
        Some(
            "nothing in sandgate uses kernel TLS yet: the proxy's TLS (central mode) is rustls in user space"
                .into(),
        ),
    )
}

fn nofile_check() -> Check {
    use sandgate_proxy::admission::{FDS_PER_CONNECTION, RESERVED_FDS, connections_for_fd_limit};
    let Ok((soft, hard)) = rlimit::getrlimit(rlimit::Resource::NOFILE) else {
        return Check::new(
            "open files",
            Status::Warn,
            "RLIMIT_NOFILE could not be read",
            None,
        );
    };
    let cap = sandgate_proxy::config::Limits::default().max_connections;
    let holds = connections_for_fd_limit(hard);
    let hard_text = if hard == rlimit::INFINITY {
        "unlimited".to_owned()
    } else {
        hard.to_string()
    };
    let found = format!(
        "soft {soft}, hard {hard_text}: the proxy raises its soft limit to the hard one at start; each connection holds {FDS_PER_CONNECTION} descriptors, {RESERVED_FDS} are kept back"
    );
    if holds >= cap {
        Check::new(
            "open files",
            Status::Ok,
            format!("{found}: room for the default cap of {cap} connections"),
            None,
        )
    } else {
        Check::new(
            "open files",
            Status::Warn,
            format!("{found}: room for {holds} connections"),
            Some(format!(
                "the proxy lowers its connection cap ({cap} by default) to {holds}; raise the hard limit to {} (LimitNOFILE= in its unit, ulimit -Hn) for the default",
                u64::try_from(cap)
                    .unwrap_or(u64::MAX)
                    .saturating_mul(FDS_PER_CONNECTION)
                    .saturating_add(RESERVED_FDS)
            )),
        )
    }
}

fn print_text(checks: &[Check], works: bool) {
    for c in checks {
        println!("{:<4}  {:<15}  {}", c.status.word(), c.name, c.found);
        if let Some(cost) = &c.cost {
            println!("{:<4}  {:<15}  -> {cost}", "", "");
        }
    }
    if works {
        println!("sandgate run can work here.");
    } else if !cfg!(target_os = "linux") {
        println!(
            "sandgate run needs Linux and bubblewrap here; on macOS, `sandgate run --print-profile seatbelt`."
        );
    } else {
        println!("sandgate run cannot work here: see FAIL above.");
    }
}

fn to_json(checks: &[Check], works: bool, bwrap_version: Option<&[u32]>) -> serde_json::Value {
    let checks: Vec<serde_json::Value> = checks
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c.name,
                "status": c.status.word().to_ascii_lowercase(),
                "found": c.found,
                "cost": c.cost,
            })
        })
        .collect();
    serde_json::json!({
        "run_can_work": works,
        "bwrap_version": bwrap_version.map(dotted),
        "checks": checks,
    })
}
