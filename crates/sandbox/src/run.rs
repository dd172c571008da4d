//! `sandgate run`: preflight, the run's state directory, its own proxy and bridges (proxied
//! modes: HTTP and SOCKS5; loopback ports), bubblewrap, exit status, teardown and the
//! summary.
//!
//! The proxy and the bridge sockets exist before bwrap starts; the init inside checks them
//! before it starts the command. bwrap gets the command's environment as its own (never on
//! its command line). On exit the sandbox is gone (PID namespace; without one, what is left
//! is killed, see [`crate::processes`]), the proxy drains its audit log and stops, and the
//! state directory is removed. When sandgate itself is killed, bwrap's `--die-with-parent`
//! ends the sandbox and the next run removes the state directory ([`crate::state`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::os::fd::AsRawFd as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use crate::argv::{DNS_FILES, RunFacts, bwrap_argv, needs_bridges};
pub use crate::error::RunError;
use crate::host::SetupFailure;
use crate::policy::{NetMode, SandboxPolicy};
use crate::state::{RunState, sweep_stale_state};
use crate::{env, processes, summary};

mod audit_log;
mod bwrap;
mod identity;
mod init_binary;
mod load;
mod proxy;
mod sources;
// The macOS backend's run, kept with the rest of it in seatbelt/ (a part of the runner).
#[path = "seatbelt/run.rs"]
mod seatbelt;

pub(crate) use audit_log::unrecorded_run;
use audit_log::{audit_place, kept_log};
pub use bwrap::{BwrapOptions, bwrap_options};
use identity::RunIdentity;
pub use identity::user_subject;
pub use init_binary::{INIT_BINARY, init_binary, init_not_used};
pub use load::{load_policy, path_param};
use load::{protected_files, refuse_covering_run_state};
pub use proxy::{Follow, FollowRequest, Following};
use proxy::{ProxyRun, open_bridge, start_proxy};
pub use sources::WORKSPACE_PARAM;

/// How `sandgate run` was asked to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub policy_path: PathBuf,
    pub params: BTreeMap<String, String>,
    pub net: Option<NetMode>,
    pub allow_domains: Vec<String>,
    pub audit_log: Option<PathBuf>,
    /// `--no-audit-log`: the run's audit log lives in its state directory and goes with it.
    pub no_audit_log: bool,
    /// `--learn`: the run's proxy lets what the policy denies pass, recorded as
    /// `report_only` (the address guard still refuses).
    pub learn: bool,
    /// `--audit-query`: the run's proxy records each request's path with its query string.
    pub audit_query: bool,
    pub print_argv: bool,
    /// `seatbelt`: print the macOS profile instead of running.
    pub print_profile: Option<String>,
    pub quiet: bool,
    /// Ask at the terminal before the allowlist refuses (`--ask`), waiting this long.
    pub ask: Option<std::time::Duration>,
    /// `--subject`: who starts the run (else the user).
    pub subject: Option<String>,
    /// `--agent`: the agent acting for the subject (an MCP client, a coding agent), as
    /// stated.
    pub agent: Option<String>,
    /// `--task`: the run's task id, as its orchestrator names it (else the run's own id,
    /// `run-PID-T`); task-scoped policy entries and exceptions apply to it.
    pub task: Option<String>,
    /// `--project`: the run's project id.
    pub project: Option<String>,
    /// `--job`: the run's job id.
    pub job: Option<String>,
    /// `--no-terminal`: a session of its own, stdin not the terminal.
    pub no_terminal: bool,
    /// `--protect`: host paths the command may not change.
    pub protect: Vec<PathBuf>,
    /// `--limit NAME=VALUE`, over the policy's `limits:`.
    pub limits: Vec<String>,
    /// `--chdir DIR`: where the command starts, over `fs.cwd` ([`crate::policy::start_dir`]).
    pub chdir: Option<PathBuf>,
    pub command: Vec<OsString>,
    /// `--summary-json FILE`: the exit summary as JSON ([`crate::summary::RunSummary`]).
    pub summary_json: Option<PathBuf>,
    /// What starts the run's proxy's follower of `net.exceptions` (the binary gives it).
    pub follow: Option<Follow>,
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Checks that the sandbox can be built here, with a message that says what to do.
fn preflight() -> Result<PathBuf, RunError> {
    if !cfg!(target_os = "linux") {
        return Err(RunError::Unavailable(
            "sandgate run needs Linux and bubblewrap; on macOS, `sandgate run --print-profile seatbelt` renders the policy for sandbox-exec".into(),
        ));
    }
    let bwrap = find_in_path("bwrap").ok_or_else(|| {
        RunError::Unavailable("bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap".into())
    })?;
    if std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone").is_ok_and(|v| v.trim() == "0") {
        return Err(RunError::Unavailable(
            "user namespaces are disabled (kernel.unprivileged_userns_clone=0): sysctl -w kernel.unprivileged_userns_clone=1".into(),
        ));
    }
    // Ubuntu's kernel.apparmor_restrict_unprivileged_userns=1 is not refused here: with
    // its bwrap profile or sandgate's loaded the sandbox works. When it does not, bwrap
    // fails at once and `setup_failure` says why and what fixes it.
    Ok(bwrap)
}

/// The host's DNS files that exist, canonical source first (`net.mode: all` binds them).
fn dns_files(policy: &SandboxPolicy) -> Vec<(PathBuf, PathBuf)> {
    if policy.net != NetMode::All {
        return Vec::new();
    }
    DNS_FILES
        .iter()
        .filter_map(|f| Some((std::fs::canonicalize(f).ok()?, PathBuf::from(f))))
        .collect()
}

/// Runs the command; returns its exit status (128+N for a signal).
pub fn run(opts: RunOptions) -> Result<i32, RunError> {
    let policy = load_policy(&opts)?;
    sources::check_workspace(&policy, &opts.params)?;
    let identity = RunIdentity::of(&opts, policy.central.as_ref())?;
    let host_env: Vec<(String, String)> = std::env::vars().collect();
    let (mut env, withheld) = env::environment(&policy, &host_env);
    env.extend(identity.env());
    for w in &withheld {
        eprintln!(
            "sandgate: not passing {}: {}; list it by its exact name to pass it",
            w.name, w.reason
        );
    }
    let start = crate::policy::start_dir(
        &policy,
        opts.chdir.as_deref(),
        &env,
        std::env::current_dir().ok().as_deref(),
        &|p| std::fs::canonicalize(p),
    )
    .map_err(|e| RunError::Usage(e.0))?;
    if let Some(note) = start.note.as_deref().filter(|_| !opts.quiet) {
        eprintln!("sandgate: {note}");
    }
    let policy = SandboxPolicy {
        cwd: Some(start.dir),
        ..policy
    };
    let sandgate_exe = std::env::current_exe()
        .map_err(|e| RunError::Unavailable(format!("cannot find the sandgate binary: {e}")))?;
    match opts.print_profile.as_deref() {
        None => {}
        Some("seatbelt") => {
            let profile = crate::seatbelt::render(&policy);
            let command: Vec<String> = opts
                .command
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            print!("{}", profile.text);
            println!(
                ";; run with: {}",
                crate::seatbelt::command_line(&profile, "PROFILE.sb", &command)
            );
            return Ok(0);
        }
        Some(other) => {
            return Err(RunError::Usage(format!(
                "--print-profile {other:?}: the only kind is seatbelt"
            )));
        }
    }
    // Canonical: the bridge directory is a bind source, opened and checked ([`sources`]).
    let tmp = std::fs::canonicalize(std::env::temp_dir()).unwrap_or_else(|_| std::env::temp_dir());
    // Before `--print-argv` too: it prints only what a run would start.
    refuse_covering_run_state(&policy, &tmp)?;
    if opts.print_argv {
        // What `run` would start: sandbox-exec where the seatbelt backend is chosen.
        if let Some(exec) = crate::seatbelt::sandbox_exec() {
            seatbelt::print_argv(&policy, &opts, &identity.run, &exec, &env)?;
            return Ok(0);
        }
        let facts = RunFacts {
            init_exe: init_binary(&sandgate_exe),
            bridge_dir: Some("/tmp/sandgate-run-XXXXXXXXXX/bridge".into()),
            bridge_data: Vec::new(),
            dns_files: dns_files(&policy),
            protected: protected_files(&opts, &policy, opts.audit_log.as_deref())?,
            disable_userns: find_in_path("bwrap").is_some_and(|b| bwrap_options(&b).disable_userns),
            new_session: opts.no_terminal,
            rlimits: crate::limits::rlimits(&policy.limits, &crate::limits::RunCgroup::default()),
            command: opts.command,
        };
        let line: Vec<String> = bwrap_argv(&policy, &facts)
            .iter()
            .map(|w| crate::seatbelt::shell_word(&w.to_string_lossy()))
            .collect();
        println!("{}", line.join(" "));
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        eprintln!(
            "sandgate: bwrap's environment (values not shown): {}",
            names.join(" ")
        );
        return Ok(0);
    }
    let sandboxer = seatbelt::Sandboxer::choose(preflight)?;
    if opts.no_terminal {
        // Out of the caller's session: no controlling terminal to read, write or take (it
        // fails harmlessly for a process group leader, whose sandbox bwrap's --new-session
        // still puts in a session of its own).
        let _ = nix::unistd::setsid();
    }
    if policy.net == NetMode::All {
        tracing::warn!("net mode all: the sandbox shares the host's network, unfiltered");
    }
    // The run's proxy and bridges get two worker threads; a run without them only waits for
    // bwrap and forwards signals, on this thread (no workers to start and join).
    let rt = if needs_bridges(&policy) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    }
    .map_err(|e| RunError::Unavailable(e.to_string()))?;
    // `net.proxy.upstream: HOST:PORT`: resolved once, now, through the run's resolver.
    let policy = rt.block_on(crate::policy::upstream::resolve(policy))?;
    if !opts.quiet {
        eprintln!("sandgate: {}", identity.describe());
    }
    let code = match sandboxer {
        seatbelt::Sandboxer::Bwrap(bwrap) => {
            rt.block_on(supervise(policy, opts, identity, env, sandgate_exe, bwrap, tmp))
        }
        seatbelt::Sandboxer::Seatbelt(exec) => {
            rt.block_on(seatbelt::supervise(policy, opts, identity, env, exec))
        }
    };
    // A run that ended has ended everything that records or prints: the sandbox reaped,
    // the run's proxy stopped with its audit log written and flushed, the live printer and
    // the output relays done, the state removed, the sweep awaited. What the runtime
    // still holds is its workers and the bridges' accept loops, whose sandbox is gone;
    // joining them one by one would only delay the exit (about half a millisecond of every
    // run). An error may have left tasks behind: the runtime's drop ends those first.
    if code.is_ok() {
        rt.shutdown_background();
    }
    code
}

async fn supervise(
    policy: SandboxPolicy,
    opts: RunOptions,
    identity: RunIdentity,
    env: Vec<(String, String)>,
    sandgate_exe: PathBuf,
    bwrap: PathBuf,
    tmp: PathBuf,
) -> Result<i32, RunError> {
    // A run without bridges keeps nothing on the host while it runs: no state directory.
    let state = if needs_bridges(&policy) {
        Some(RunState::create(&tmp).map_err(|e| {
            RunError::Unavailable(format!("cannot create the run's state in {}: {e}", tmp.display()))
        })?)
    } else {
        None
    };
    let run = identity.run.clone();
    let ids = identity.ids();
    let (kept, audit_path) = match &state {
        Some(state) => {
            let (kept, path) = audit_place(&policy, &opts, state, &run)?;
            (kept, Some(path))
        }
        None => {
            let kept = kept_log(&policy, &opts, &run)?;
            (kept.clone(), kept)
        }
    };
    let sandbox = std::sync::Arc::new(std::sync::OnceLock::new());
    let proxy = if let (true, Some(state), Some(audit_path)) = (policy.net.proxied(), &state, &audit_path) {
        let how = ProxyRun {
            sandbox: sandbox.clone(),
            identity,
            ask: opts.ask,
            learn: opts.learn,
            audit_query: opts.audit_query,
            live: !opts.quiet,
            follow: opts.follow.clone(),
            kept_log: kept.clone(),
            probed: true,
        };
        Some(start_proxy(&policy, audit_path, state, how).await?)
    } else {
        None
    };
    // Explicitly bridged host loopback ports: the init listens on the same port inside.
    if let Some(state) = &state {
        for port in &policy.loopback_ports {
            open_bridge(
                state,
                &crate::argv::loopback_socket(*port),
                SocketAddr::from(([127, 0, 0, 1], *port)),
                format!("host loopback port {port} (net.loopback_ports)"),
                None,
                true,
            )?;
        }
    }
    let limits = crate::limits::enforce(&run, &policy.limits);
    tracing::debug!("{}", limits.describe());
    for what in &limits.unenforced {
        eprintln!("sandgate: warning: limit not enforced here: {what}");
    }
    let options = bwrap_options(&bwrap);
    // The interception CA's files go to bwrap as data: nothing on the host to change.
    let ca_files = proxy.as_ref().map_or(&[][..], |p| p.ca_files.as_slice());
    let data = sources::data(ca_files)?;
    let facts = RunFacts {
        init_exe: init_binary(&sandgate_exe),
        bridge_dir: state.as_ref().map(RunState::bridge_dir),
        bridge_data: data.iter().map(|(name, fd)| (*name, fd.as_raw_fd())).collect(),
        dns_files: dns_files(&policy),
        protected: protected_files(&opts, &policy, audit_path.as_deref())?,
        disable_userns: options.disable_userns,
        new_session: opts.no_terminal,
        rlimits: limits.rlimits.clone(),
        command: opts.command.clone(),
    };
    // Each bind source opened once and checked, handed to bwrap as a descriptor. A bwrap
    // without `--bind-fd` (before 0.10.0, no backport) mounts the paths as they are when it
    // reads them; `sandgate mcp` then runs one command at a time where workspaces are taken.
    let (argv, sources) = if options.bind_fd {
        sources::open(bwrap_argv(&policy, &facts), facts.bridge_dir.as_deref())?
    } else {
        tracing::debug!(
            "{} has no --bind-fd: bind sources passed as paths",
            bwrap.display()
        );
        (bwrap_argv(&policy, &facts), sources::Sources::default())
    };
    if !policy.unshare_pid {
        processes::become_subreaper();
    }
    // In a cgroup of the run's own, the child that becomes bwrap joins it before its execve:
    // every process of the sandbox is counted from its first fork.
    let procs = limits.cgroup.procs_files();
    let join = crate::exec::CgroupJoin::open(&procs)
        .map_err(|e| RunError::Unavailable(format!("cannot enter the run's cgroup: {e}")))?;
    let mut cmd = tokio::process::Command::new(&bwrap);
    cmd.args(argv.iter().skip(1)).env_clear().envs(env);
    join.before_exec(cmd.as_std_mut());
    let inherited = sources
        .raw()
        .into_iter()
        .chain(data.iter().map(|(_, fd)| fd.as_raw_fd()));
    crate::fds::inherit_in_child(cmd.as_std_mut(), inherited.collect());
    // --no-terminal: where sandgate's own stdin, stdout or stderr is a terminal, the sandbox
    // gets /dev/null or a pipe instead (relayed here): a descriptor of the terminal would
    // let it read what the person types or change the terminal's modes.
    let (out_tty, err_tty) = (
        opts.no_terminal && std::io::stdout().is_terminal(),
        opts.no_terminal && std::io::stderr().is_terminal(),
    );
    if opts.no_terminal && std::io::stdin().is_terminal() {
        cmd.stdin(std::process::Stdio::null());
    }
    if out_tty {
        cmd.stdout(std::process::Stdio::piped());
    }
    if err_tty {
        cmd.stderr(std::process::Stdio::piped());
    }
    let mut child = cmd.spawn().map_err(|e| {
        let inside = if procs.is_empty() {
            ""
        } else {
            " in the run's cgroup"
        };
        RunError::Unavailable(format!(
            "cannot start bwrap{inside}: {e}; the command was not run"
        ))
    })?;
    drop((sources, data));
    let started = std::time::Instant::now();
    // The state of runs that were killed is removed while bwrap builds the sandbox, off the
    // run's path (a directory is removed only once its lock is free, so never this run's).
    let sweep = tokio::task::spawn_blocking(move || sweep_stale_state(&tmp));
    let bwrap_pid = child.id();
    if let Some(pid) = bwrap_pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = sandbox.set(pid);
    }
    let relays = relay_outputs(&mut child);
    let status = {
        let forward = processes::forward_signals(bwrap_pid);
        tokio::pin!(forward);
        tokio::select! {
            status = child.wait() => status,
            _ = &mut forward => child.wait().await,
        }
    };
    let code = match status {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(e) => {
            // The proxy stopped first, its audit log drained: what it decided is on record.
            if let Some(running) = proxy {
                let _ = running.stop().await;
            }
            return Err(RunError::Unavailable(format!("waiting for bwrap failed: {e}")));
        }
    };
    if !policy.unshare_pid {
        let _ = tokio::task::spawn_blocking(processes::kill_leftovers).await;
    }
    for relay in relays.into_iter().flatten() {
        let _ = relay.await;
    }
    let failed = setup_failure(code, started.elapsed(), &bwrap, &policy, &sandgate_exe).await;
    let proxied = proxy.is_some();
    let unrecorded = match proxy {
        Some(running) => running.stop().await.err(),
        None => None,
    };
    if failed.is_none() {
        let log = audit_path
            .as_deref()
            .filter(|_| proxied)
            .map(|written| summary::AuditPlace {
                written,
                kept: kept.as_deref(),
            });
        let summary = summary::RunSummary::of(ids, policy.net.name(), Some(code), log);
        summary::at_exit(exit_output(&opts), &summary, proxied);
    }
    drop(state);
    drop(limits);
    let _ = sweep.await;
    match (failed, unrecorded) {
        (Some(why), _) => Err(RunError::Unavailable(why)),
        (None, Some(why)) => Err(RunError::Unavailable(unrecorded_run(code, &why))),
        (None, None) => Ok(code),
    }
}

/// Was an exit of 1 bwrap's own failure to set the sandbox up? Its message went to the
/// terminal unread (bwrap's stderr is the command's, never captured), so a probe makes the
/// same namespaces again with its stderr read, and a message [`SetupFailure`] knows gives
/// the cause and the fix. Only for a quick exit of 1 (bwrap's `die`): a command that fails
/// that way costs one short bwrap start, a healthy host's probe says nothing.
async fn setup_failure(
    code: i32,
    ran: std::time::Duration,
    bwrap: &Path,
    policy: &SandboxPolicy,
    sandgate_exe: &Path,
) -> Option<String> {
    if code != 1 || ran > std::time::Duration::from_secs(10) {
        return None;
    }
    let (bwrap, net) = (bwrap.to_path_buf(), policy.net != NetMode::All);
    let said = tokio::task::spawn_blocking(move || crate::host::try_sandbox(&bwrap, net).err())
        .await
        .ok()??;
    Some(SetupFailure::classify(&said)?.advice(sandgate_exe))
}

/// Relays the command's piped stdout and stderr (`--no-terminal`) to sandgate's own.
fn relay_outputs(child: &mut tokio::process::Child) -> [Option<tokio::task::JoinHandle<()>>; 2] {
    [
        child
            .stdout
            .take()
            .map(|o| tokio::spawn(relay(o, tokio::io::stdout()))),
        child
            .stderr
            .take()
            .map(|e| tokio::spawn(relay(e, tokio::io::stderr()))),
    ]
}

/// Copies the sandbox's output to sandgate's own, until the sandbox closes it (its last
/// process gone, since the PID namespace takes them all).
async fn relay(mut from: impl tokio::io::AsyncRead + Unpin, mut to: impl tokio::io::AsyncWrite + Unpin) {
    let _ = tokio::io::copy(&mut from, &mut to).await;
    let _ = tokio::io::AsyncWriteExt::flush(&mut to).await;
}

/// Where the run's summary goes at its end, from its options.
fn exit_output(opts: &RunOptions) -> crate::summary::ExitOutput<'_> {
    crate::summary::ExitOutput {
        quiet: opts.quiet,
        learn: opts.learn,
        json: opts.summary_json.as_deref(),
    }
}
