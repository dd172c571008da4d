//! `sandgate run` under macOS's Seatbelt (`crate::run::seatbelt`; the file sits with the
//! rest of the backend in `seatbelt/`, and is a part of the runner so it shares the run's
//! proxy start, identity and protected files without widening their visibility).
//!
//! Chosen at run time ([`Sandboxer::choose`]): on macOS always, elsewhere when
//! `SANDGATE_SANDBOX_EXEC` names a stand-in for sandbox-exec (how the Linux tests drive
//! this whole flow). Everything before it (the policy, the environment, the identity, the
//! start directory) is `run`'s, the same for both backends. Then, in order:
//!
//! 1. the run's state directory, and in the proxied modes the run's own proxy and its
//!    bridges, exactly as for bwrap, with a loopback port in front of each bridge
//!    ([`crate::seatbelt::front`]); the command's proxy variables name those ports, and
//!    its CA variables the interception CA's files, written into the state directory;
//! 2. the profile ([`crate::seatbelt::profile`]) written to `profile.sb` in the state
//!    directory, and `tmp/` beside it for `tmp: private` (the command's `TMPDIR`);
//! 3. `sandbox-exec -f profile.sb -D ... -- COMMAND` with exactly the command's environment,
//!    in the start directory; SIGINT, SIGTERM and SIGHUP forwarded to it (sandbox-exec
//!    executes the command in its own process);
//! 4. teardown: the denials' recorder, the loopback ports, the proxy (its audit log drained,
//!    the summary printed), then the state directory with the profile in it.
//!
//! Not here: limits (no cgroups or rlimits are applied; a policy that sets any is warned
//! about), `--ask` (refused: stopping the sandbox while asking reads Linux's /proc), and
//! killing what the command leaves running (macOS has no PID namespace; what survives keeps
//! the profile but loses the proxy).

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use super::proxy::{ProxyRun, RunningProxy, start_proxy};
use super::{RunError, RunIdentity, RunOptions, audit_place, protected_files, relay_outputs};
use crate::argv::{PROXY_SOCKET, SOCKS_SOCKET};
use crate::policy::{Limits, SandboxPolicy};
use crate::seatbelt::{Facts, front, trace};
use crate::state::{RunState, sweep_stale_state};

/// Which sandbox runs the command.
#[derive(Debug)]
pub(super) enum Sandboxer {
    /// bubblewrap, at this path.
    Bwrap(PathBuf),
    /// Seatbelt, through this sandbox-exec.
    Seatbelt(PathBuf),
}

impl Sandboxer {
    /// Seatbelt where [`crate::seatbelt::sandbox_exec`] chooses it, else bwrap after its
    /// `preflight`.
    pub(super) fn choose(
        preflight: impl FnOnce() -> Result<PathBuf, RunError>,
    ) -> Result<Sandboxer, RunError> {
        let Some(exec) = crate::seatbelt::sandbox_exec() else {
            return preflight().map(Sandboxer::Bwrap);
        };
        if exec != Path::new(crate::seatbelt::SANDBOX_EXEC) {
            eprintln!(
                "sandgate: {}={}: the command runs under this stand-in for macOS's sandbox-exec (a test hook){}",
                crate::seatbelt::SANDBOX_EXEC_VAR,
                exec.display(),
                if cfg!(target_os = "macos") {
                    ""
                } else {
                    "; on this system nothing confines it"
                }
            );
        }
        Ok(Sandboxer::Seatbelt(exec))
    }
}

/// The run's proxy with the loopback ports in front of it.
struct Network {
    proxy: RunningProxy,
    fronts: front::Fronts,
}

/// Runs the command under sandbox-exec `exec`; returns its exit status (128+N for a signal).
pub(super) async fn supervise(
    policy: SandboxPolicy,
    opts: RunOptions,
    identity: RunIdentity,
    env: Vec<(String, String)>,
    exec: PathBuf,
) -> Result<i32, RunError> {
    refuse_what_does_not_hold(&policy, &opts)?;
    let tmp = std::env::temp_dir();
    sweep_stale_state(&tmp);
    let state = RunState::create(&tmp).map_err(|e| {
        RunError::Unavailable(format!("cannot create the run's state in {}: {e}", tmp.display()))
    })?;
    let run = identity.run.clone();
    let ids = identity.ids();
    let (kept, audit_path) = audit_place(&policy, &opts, &state, &run)?;
    let sandbox = std::sync::Arc::new(std::sync::OnceLock::new());
    let network = match policy.net.proxied() {
        true => {
            let how = ProxyRun {
                sandbox: sandbox.clone(),
                identity,
                ask: None,
                learn: opts.learn,
                audit_query: opts.audit_query,
                live: !opts.quiet,
                follow: opts.follow.clone(),
                kept_log: kept.clone(),
                probed: false,
            };
            let proxy = start_proxy(&policy, &audit_path, &state, how).await?;
            Some(open_fronts(&policy, &state, proxy).await?)
        }
        false => None,
    };
    let ports = network.as_ref().map(|n| n.fronts.ports.as_slice());
    let (policy, mut env) = at_front_ports(policy, env, ports.unwrap_or_default());
    let tmp = private_tmp(&policy, &state, &mut env)?;
    let ca_files = match &network {
        Some(n) => ca_files(&n.proxy.ca_files, &state, &mut env)?,
        None => Vec::new(),
    };
    let recorder = policy.seatbelt.trace.then(|| record_denials(&run)).flatten();
    let mut protected = protected_files(&opts, &policy, Some(&audit_path))?;
    protected.extend(recorder.as_ref().map(|r| r.path.clone()));
    protected.extend(ca_files.iter().cloned());
    let facts = Facts {
        tmp,
        protected,
        ca_files,
        trace_tag: recorder.as_ref().map(|_| trace::tag(&run)),
        ..crate::seatbelt::user_facts()
    };
    let argv = write_profile(&policy, &facts, &state, &exec, &opts.command)?;
    let code = run_command(&argv, env, &policy, &opts, &sandbox).await;
    if let Some(recorder) = recorder {
        let path = recorder.stop().await;
        if !opts.quiet {
            eprintln!("sandgate: the profile's denials are in {}", path.display());
        }
    }
    let proxied = network.is_some();
    let unrecorded = match network {
        Some(Network { proxy, fronts }) => {
            fronts.close().await;
            proxy.stop().await.err()
        }
        None => None,
    };
    let log = proxied.then(|| crate::summary::AuditPlace {
        written: &audit_path,
        kept: kept.as_deref(),
    });
    let summary = crate::summary::RunSummary::of(ids, policy.net.name(), code.as_ref().ok().copied(), log);
    crate::summary::at_exit(super::exit_output(&opts), &summary, proxied);
    drop(state);
    match (code, unrecorded) {
        (Ok(code), Some(why)) => Err(RunError::Unavailable(super::unrecorded_run(code, &why))),
        (code, _) => code,
    }
}

/// `--print-argv` under this backend: the sandbox-exec command line the run would start,
/// each word quoted for a POSIX shell, with a placeholder for the run's state directory
/// (as bwrap's has); on stderr the names, not the values, of the command's environment.
pub(super) fn print_argv(
    policy: &SandboxPolicy,
    opts: &RunOptions,
    run: &str,
    exec: &Path,
    env: &[(String, String)],
) -> Result<(), RunError> {
    let placeholder = "sandgate-run-XXXXXXXXXX";
    let tmp = std::env::temp_dir();
    let state = tmp.join(placeholder);
    let mut protected = protected_files(opts, policy, opts.audit_log.as_deref())?;
    let trace = policy.seatbelt.trace;
    if trace {
        protected.push(trace::path(crate::runlog::dir().as_deref(), run));
    }
    // Canonical, as `private_tmp` and `ca_files` make them.
    let canonical = std::fs::canonicalize(&tmp).unwrap_or(tmp).join(placeholder);
    let ca_files = crate::seatbelt::ca_files_in(policy, &canonical);
    protected.extend(ca_files.iter().cloned());
    let facts = Facts {
        tmp: policy.private_tmp.then(|| canonical.join("tmp")),
        ca_files,
        protected,
        trace_tag: trace.then(|| trace::tag(run)),
        ..crate::seatbelt::user_facts()
    };
    let profile = crate::seatbelt::render_with(policy, &facts);
    let argv = crate::seatbelt::argv(exec, &state.join("profile.sb"), &profile, &opts.command);
    let words: Vec<String> = argv
        .iter()
        .map(|w| crate::seatbelt::shell_word(&w.to_string_lossy()))
        .collect();
    println!("{}", words.join(" "));
    let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    eprintln!(
        "sandgate: sandbox-exec's environment (values not shown): {}",
        names.join(" ")
    );
    Ok(())
}

/// What this backend cannot do: `--ask` is refused; limits are warned about.
fn refuse_what_does_not_hold(policy: &SandboxPolicy, opts: &RunOptions) -> Result<(), RunError> {
    if opts.ask.is_some() {
        return Err(RunError::Usage(
            "--ask needs the Linux sandbox: under macOS's sandbox-exec the run cannot hold the command still while it asks".into(),
        ));
    }
    if policy.limits != Limits::default() || !opts.limits.is_empty() {
        eprintln!(
            "sandgate: warning: limits are not enforced under sandbox-exec (no cgroups or rlimits here)"
        );
    }
    Ok(())
}

/// A loopback port in front of each of the proxy's bridges (HTTP, then SOCKS5).
async fn open_fronts(
    policy: &SandboxPolicy,
    state: &RunState,
    proxy: RunningProxy,
) -> Result<Network, RunError> {
    let sockets = std::iter::once(PROXY_SOCKET).chain(policy.socks_port.map(|_| SOCKS_SOCKET));
    let bridges: Vec<PathBuf> = sockets.map(|s| state.bridge_dir().join(s)).collect();
    match front::open(&bridges).await {
        Ok(fronts) => Ok(Network { proxy, fronts }),
        Err(reason) => {
            let _ = proxy.stop().await;
            Err(RunError::Unavailable(format!(
                "the run's proxy is not ready: {reason}; the command was not run"
            )))
        }
    }
}

/// The policy and the command's environment with the proxy ports the command really has
/// (`ports`: HTTP, then SOCKS5), not the ones inside a bwrap sandbox: every variable
/// [`crate::env::environment`] derives from the ports takes the new value, the rest stays.
fn at_front_ports(
    policy: SandboxPolicy,
    env: Vec<(String, String)>,
    ports: &[u16],
) -> (SandboxPolicy, Vec<(String, String)>) {
    let Some(&http) = ports.first() else {
        return (policy, env);
    };
    let moved = SandboxPolicy {
        proxy_port: http,
        socks_port: policy.socks_port.and(ports.get(1).copied()),
        ..policy.clone()
    };
    let (before, _) = crate::env::environment(&policy, &[]);
    let (after, _) = crate::env::environment(&moved, &[]);
    let changed: std::collections::BTreeMap<String, String> =
        after.into_iter().filter(|kv| !before.contains(kv)).collect();
    let env = env
        .into_iter()
        .map(|(k, v)| match changed.get(&k) {
            Some(new) => (k, new.clone()),
            None => (k, v),
        })
        .collect();
    (moved, env)
}

/// `tmp: private`: `tmp/` in the state directory, canonical (macOS's temporary directory is
/// under the `/var` symlink, and Seatbelt matches real paths); the command's `TMPDIR`
/// unless the policy sets one.
fn private_tmp(
    policy: &SandboxPolicy,
    state: &RunState,
    env: &mut Vec<(String, String)>,
) -> Result<Option<PathBuf>, RunError> {
    if !policy.private_tmp {
        return Ok(None);
    }
    let dir = state.path().join("tmp");
    let made = {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&dir)
    };
    let dir = made
        .and_then(|()| std::fs::canonicalize(&dir))
        .map_err(|e| RunError::Unavailable(format!("cannot create the run's {}: {e}", dir.display())))?;
    if !policy.env_set.contains_key("TMPDIR") {
        env.retain(|(k, _)| k != "TMPDIR");
        env.push(("TMPDIR".to_owned(), dir.display().to_string()));
    }
    Ok(Some(dir))
}

/// The run's interception CA (its certificate, and the bundle of it with the system's
/// roots) where the command can read it: macOS has no `/run/sandgate` to hand it in as
/// bwrap's data, so each is written, new, into the state directory (the runner's own,
/// made private before the proxy started) by its canonical path (Seatbelt matches real
/// paths), and every variable whose value is exactly its path under `/run/sandgate` (the
/// runner's own, and an `env.set` that names it) names it there. The profile lets the
/// command read these two files and write neither. Returns their paths.
///
/// The directory is resolved once, before anything is written, and each file is made new
/// (`create_new`: a link planted at its name is not followed): the paths named are the ones
/// written, never what a link found after the write would point to.
fn ca_files(
    files: &[(&'static str, String)],
    state: &RunState,
    env: &mut [(String, String)],
) -> Result<Vec<PathBuf>, RunError> {
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let dir = std::fs::canonicalize(state.path()).map_err(|e| {
        RunError::Unavailable(format!(
            "cannot resolve the run's state {}: {e}",
            state.path().display()
        ))
    })?;
    let mut paths = Vec::new();
    for (name, pem) in files {
        let path = dir.join(name);
        write_private(&path, pem).map_err(|e| {
            RunError::Unavailable(format!("cannot write the run's CA to {}: {e}", path.display()))
        })?;
        let inside = format!("{}/{name}", crate::argv::BRIDGE_DIR);
        for (_, value) in env.iter_mut().filter(|(_, v)| *v == inside) {
            *value = path.display().to_string();
        }
        paths.push(path);
    }
    Ok(paths)
}

/// Starts recording the profile's denials; a run goes on without it, saying why.
fn record_denials(run: &str) -> Option<trace::Recorder> {
    let tool = trace::log_tool();
    let path = trace::path(crate::runlog::dir().as_deref(), run);
    match trace::start(&tool, &trace::tag(run), &path) {
        Ok(recorder) => Some(recorder),
        Err(e) => {
            eprintln!(
                "sandgate: warning: platform.seatbelt.trace: cannot run {}: {e}; denials are not recorded",
                tool.display()
            );
            None
        }
    }
}

/// Renders the profile into `profile.sb` in the state directory; returns the sandbox-exec
/// argv that applies it to `command`.
fn write_profile(
    policy: &SandboxPolicy,
    facts: &Facts,
    state: &RunState,
    exec: &Path,
    command: &[OsString],
) -> Result<Vec<OsString>, RunError> {
    let profile = crate::seatbelt::render_with(policy, facts);
    let path = state.path().join("profile.sb");
    write_private(&path, &profile.text)
        .map_err(|e| RunError::Unavailable(format!("cannot write the profile {}: {e}", path.display())))?;
    Ok(crate::seatbelt::argv(exec, &path, &profile, command))
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}

/// Starts `argv` with exactly `env`, in the policy's start directory, and waits for it,
/// forwarding SIGINT, SIGTERM and SIGHUP.
async fn run_command(
    argv: &[OsString],
    env: Vec<(String, String)>,
    policy: &SandboxPolicy,
    opts: &RunOptions,
    sandbox: &std::sync::OnceLock<i32>,
) -> Result<i32, RunError> {
    use std::io::IsTerminal;
    use std::process::Stdio;
    let Some((program, args)) = argv.split_first() else {
        return Err(RunError::Usage("no command".into()));
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).env_clear().envs(env);
    if let Some(dir) = &policy.cwd {
        cmd.current_dir(dir);
    }
    // --no-terminal: as for bwrap, no descriptor of the terminal reaches the command.
    let (out_tty, err_tty) = (
        opts.no_terminal && std::io::stdout().is_terminal(),
        opts.no_terminal && std::io::stderr().is_terminal(),
    );
    if opts.no_terminal && std::io::stdin().is_terminal() {
        cmd.stdin(Stdio::null());
    }
    if out_tty {
        cmd.stdout(Stdio::piped());
    }
    if err_tty {
        cmd.stderr(Stdio::piped());
    }
    // Listening before the command starts: a signal in between is forwarded, not fatal to
    // sandgate with the command left running.
    let signals = Signals::listen();
    let mut child = cmd
        .spawn()
        .map_err(|e| RunError::Unavailable(format!("cannot start {}: {e}", program.to_string_lossy())))?;
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = sandbox.set(pid);
    }
    let relays = relay_outputs(&mut child);
    let status = wait_forwarding(&mut child, signals).await;
    for relay in relays.into_iter().flatten() {
        let _ = relay.await;
    }
    match status {
        Ok(s) => Ok(s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))),
        Err(e) => Err(RunError::Unavailable(format!(
            "waiting for sandbox-exec failed: {e}"
        ))),
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught for the command.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Catches the three (sandgate no longer ends on them); `None` if one cannot be caught.
    fn listen() -> Option<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Some(Signals {
            int: signal(SignalKind::interrupt()).ok()?,
            term: signal(SignalKind::terminate()).ok()?,
            hup: signal(SignalKind::hangup()).ok()?,
        })
    }
}

/// Waits for `child`, passing the `signals` sandgate gets on to it.
async fn wait_forwarding(
    child: &mut tokio::process::Child,
    signals: Option<Signals>,
) -> std::io::Result<std::process::ExitStatus> {
    use nix::sys::signal::Signal;
    let Some(mut s) = signals else {
        return child.wait().await;
    };
    loop {
        let sig = tokio::select! {
            status = child.wait() => return status,
            _ = s.int.recv() => Signal::SIGINT,
            _ = s.term.recv() => Signal::SIGTERM,
            _ = s.hup.recv() => Signal::SIGHUP,
        };
        // `id()` is None once the child has been reaped: a pid is never signalled after it
        // could have been reused.
        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
        }
    }
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
