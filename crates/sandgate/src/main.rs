//! The `sandgate` binary: parses the command line, builds configuration, runs the library,
//! and maps failures to exit codes (64 for usage and configuration errors, as sysexits'
//! EX_USAGE; 1 for failures at run time).

// sandgate builds on Unix-like systems only: the proxy uses splice(2) and Unix signals, the
// runner uses bubblewrap. Say so plainly rather than fail deep inside a dependency.
#[cfg(windows)]
compile_error!(
    "sandgate supports Linux (macOS: proxy, and Seatbelt profiles via `run --print-profile seatbelt`); Windows is not supported"
);

mod audit_cmd;
mod check;
mod cli;
mod control;
mod doctor_cmd;
mod exceptions_cmd;
mod explain;
mod health_cmd;
mod init_cmd;
mod jupyter_cmd;
mod logging;
mod manual_cmd;
mod notify;
mod pki_cmd;
mod policy_cmd;
mod presets_cmd;
mod settings;

use std::process::ExitCode;

use clap::Parser;
use cli::{Cli, Command};
use sandgate_proxy::Proxy;
use sandgate_sandbox::steps::Step;

/// mimalloc for `sandgate proxy`, the system's allocator for every other command, chosen
/// before the first allocation (crates/alloc).
#[global_allocator]
static ALLOCATOR: sandgate_alloc::ByCommand = sandgate_alloc::ByCommand;

pub(crate) const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The sandbox's internal steps start inside every sandbox: read by hand, before clap
    // builds the whole command tree; anything unusual falls through to clap, which reports it.
    if let Some(step) = args.get(1..).and_then(sandgate_sandbox::steps::parse) {
        return exit_code(sandgate_sandbox::steps::run(step));
    }
    let parsed = cli::parse_run(&args).map_or_else(|| Cli::try_parse_from(&args), Ok);
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(EX_USAGE),
            };
        }
    };
    // The runner's own proxy should not chatter on the command's terminal.
    let quiet_by_default = matches!(
        cli.command,
        Command::Run(_) | Command::SandboxInit { .. } | Command::SandboxExec { .. } | Command::Mcp { .. }
    );
    // What a caller left open must not reach a sandbox: every descriptor from 3 up is
    // close-on-exec before anything that starts one (sandbox-init and -exec do it again).
    if matches!(
        cli.command,
        Command::Run(_) | Command::Mcp { .. } | Command::Jupyter(_)
    ) && let Err(e) = sandgate_sandbox::fds::cloexec_from_3()
    {
        eprintln!("sandgate: {e}; nothing was run");
        return ExitCode::from(70);
    }
    logging::init(cli.log_format, if quiet_by_default { "warn" } else { "info" });
    match cli.command {
        Command::Proxy(args) => run_proxy(&args),
        Command::CheckConfig { file, param, json } => check::run(&file, &param, json),
        Command::Explain(args) => explain::run(&args),
        Command::Health(args) => health_cmd::run(&args),
        Command::Init(args) => init_cmd::run(&args),
        Command::Presets { json } => presets_cmd::run(json),
        Command::Policy(cmd) => policy_cmd::run(cmd),
        Command::Audit(cmd) => audit_cmd::run(cmd),
        Command::Run(args) => run_sandbox(args),
        Command::Doctor { json } => doctor_cmd::run(json),
        Command::Exceptions(args) => exceptions_cmd::run(&args),
        Command::Mcp { config } => run_mcp(&config),
        Command::McpSession { command } => {
            ExitCode::from(sandgate_mcp::session::run(&command).clamp(0, 255) as u8)
        }
        Command::Jupyter(cmd) => jupyter_cmd::run(cmd),
        Command::Pki(cmd) => pki_cmd::run(cmd),
        Command::Completions { shell } => manual_cmd::completions(shell),
        Command::Man { dir } => manual_cmd::man(&dir),
        Command::SandboxInit { build, .. } | Command::SandboxExec { build, .. }
            if let Some(why) = sandgate_sandbox::steps::other_build(build.as_deref()) =>
        {
            eprintln!("sandgate: {why}");
            ExitCode::from(EX_USAGE)
        }
        Command::SandboxInit {
            build: _,
            forwards,
            allow_unix_sockets,
            rlimits,
            command,
        } => exit_code(sandgate_sandbox::steps::run(Step::Init {
            forwards,
            allow_unix_sockets,
            rlimits,
            command,
        })),
        Command::SandboxExec {
            build: _,
            allow_unix_sockets,
            rlimits,
            command,
        } => exit_code(sandgate_sandbox::steps::run(Step::Exec {
            allow_unix_sockets,
            rlimits,
            command,
        })),
    }
}

/// A step's exit status as the process's (0 to 255).
fn exit_code(status: i32) -> ExitCode {
    ExitCode::from(status.clamp(0, 255) as u8)
}

/// `sandgate mcp`: serve until the client closes stdin; 64 for a bad configuration, 69 when
/// the audit log cannot be opened.
fn run_mcp(config: &std::path::Path) -> ExitCode {
    use sandgate_mcp::McpError;
    let sandgate = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sandgate: cannot find this program's path: {e}");
            return ExitCode::from(69);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandgate: cannot start the runtime: {e}");
            return ExitCode::from(69);
        }
    };
    match runtime.block_on(sandgate_mcp::serve_stdio(config, sandgate)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ McpError::Config(_)) => {
            eprintln!("sandgate: {e}");
            ExitCode::from(EX_USAGE)
        }
        Err(e) => {
            eprintln!("sandgate: {e}");
            ExitCode::from(69)
        }
    }
}

/// `sandgate run`: exit with the command's status (128+N for a signal).
fn run_sandbox(args: cli::RunArgs) -> ExitCode {
    use sandgate_sandbox::run::{RunError, RunOptions};
    let policy_path = match settings::discovery::sandbox_policy(args.policy.clone(), &settings::ProcessEnv) {
        Ok((path, found)) => {
            if let Some(line) = found.filter(|_| !args.quiet) {
                eprintln!("sandgate: {line}");
            }
            path
        }
        Err(e) => {
            eprintln!("sandgate: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    if let Some(Err(e)) = args
        .audit_log
        .as_deref()
        .map(|p| settings::check_audit_log("--audit-log", p))
    {
        eprintln!("sandgate: {e}");
        return ExitCode::from(EX_USAGE);
    }
    // The summary is written when the command has exited: a directory that is not there
    // is said now, not after the run.
    if let Some(path) = &args.summary_json {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) || path.is_dir() {
            eprintln!(
                "sandgate: --summary-json {}: not a file in an existing directory",
                path.display()
            );
            return ExitCode::from(EX_USAGE);
        }
    }
    let mut params = std::collections::BTreeMap::new();
    for p in &args.param {
        let Some((k, v)) = p.split_once('=') else {
            eprintln!("sandgate: invalid --param {p:?}: expected NAME=VALUE");
            return ExitCode::from(EX_USAGE);
        };
        params.insert(k.to_owned(), v.to_owned());
    }
    for p in &args.path_param {
        match sandgate_sandbox::run::path_param(p, &|path| std::fs::canonicalize(path)) {
            Ok((k, v)) if !params.contains_key(&k) => {
                params.insert(k, v);
            }
            Ok((k, _)) => {
                eprintln!("sandgate: ${{{k}}} is given twice (--param and --path-param)");
                return ExitCode::from(EX_USAGE);
            }
            Err(RunError::Usage(m) | RunError::Unavailable(m)) => {
                eprintln!("sandgate: {m}");
                return ExitCode::from(EX_USAGE);
            }
        }
    }
    let net = match args.net.as_deref().map(sandgate_sandbox::policy::NetMode::parse) {
        None => None,
        Some(Ok(m)) => Some(m),
        Some(Err(e)) => {
            eprintln!("sandgate: invalid --net: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let opts = RunOptions {
        policy_path,
        params,
        net,
        allow_domains: args.allow_domain,
        audit_log: args.audit_log,
        no_audit_log: args.no_audit_log,
        learn: args.learn,
        audit_query: args.audit_query,
        print_argv: args.print_argv,
        print_profile: args.print_profile,
        quiet: args.quiet,
        ask: args
            .ask
            .then(|| std::time::Duration::from_secs(args.ask_timeout.unwrap_or(60))),
        subject: args.subject,
        agent: args.agent,
        task: args.task,
        project: args.project,
        job: args.job,
        no_terminal: args.no_terminal,
        protect: args.protect,
        limits: args.limit,
        chdir: args.chdir,
        command: args.command,
        summary_json: args.summary_json,
        follow: Some(control::run_follow()),
    };
    match sandgate_sandbox::run::run(opts) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(RunError::Usage(m)) => {
            eprintln!("sandgate: {m}");
            ExitCode::from(EX_USAGE)
        }
        Err(RunError::Unavailable(m)) => {
            eprintln!("sandgate: {m}");
            ExitCode::from(69)
        }
    }
}

fn run_proxy(args: &cli::ProxyArgs) -> ExitCode {
    let setup = match settings::proxy_setup(args, &settings::ProcessEnv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandgate: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    // Each tunnel holds two descriptors; the default soft limit (often 1024) is too low.
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::warn!(error = %e, "cannot raise the open-file limit");
    }
    let mut setup = setup;
    if let Ok((nofile, _)) = rlimit::getrlimit(rlimit::Resource::NOFILE) {
        let explicit = args.max_connections.is_some();
        if let Err(e) = settings::fit_to_fd_limit(&mut setup.config.limits, explicit, nofile) {
            eprintln!("sandgate: {e}");
            return ExitCode::from(EX_USAGE);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandgate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let settings::ProxySetup {
        config,
        policy,
        warnings,
    } = setup;
    tracing::debug!(allocator = sandgate_alloc::chosen(), asked = %args.allocator, "allocator");
    for w in &warnings {
        tracing::warn!("{w}");
    }
    runtime.block_on(async move {
        let (allow, deny) = config.rules.len();
        if allow == 0 {
            tracing::warn!("the allowlist is empty: every request will be denied");
        }
        let mut proxy = match Proxy::bind(config).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("sandgate: {e}");
                return ExitCode::FAILURE;
            }
        };
        proxy.set_build_info(env!("CARGO_PKG_VERSION"), cli::COMMIT);
        proxy.set_record_query(args.audit_query);
        if args.report_only {
            proxy.set_report_only(true);
            tracing::warn!(
                "report-only: requests the policy denies pass (recorded as report_only); the address guard still refuses"
            );
        }
        if let Some(path) = &args.intercept_ca_cert {
            match intercept(path) {
                Ok(interceptor) => proxy.set_interceptor(interceptor),
                Err(e) => {
                    eprintln!("sandgate: --intercept-ca-cert {}: {e}", path.display());
                    return ExitCode::from(EX_USAGE);
                }
            }
        }
        if let (Some(cert), Some(key)) = (&args.admin_tls_cert, &args.admin_tls_key) {
            if proxy.metrics_addr().is_none() {
                eprintln!("sandgate: --admin-tls-cert needs an admin listener (--admin-listen ADDR or spec.admin.listen)");
                return ExitCode::from(EX_USAGE);
            }
            let files = sandgate_proxy::transport::tls::AdminFiles {
                cert: cert.clone(),
                key: key.clone(),
            };
            if let Err(e) = proxy.serve_admin_tls(&files) {
                eprintln!("sandgate: --admin-tls-cert/--admin-tls-key: {e}");
                return ExitCode::from(EX_USAGE);
            }
        }
        let follower = match control::follow(&proxy, args, policy.as_ref()).await {
            Ok(f) => f,
            Err(e @ control::ControlSetupError::Usage(_)) => {
                eprintln!("sandgate: {e}");
                return ExitCode::from(EX_USAGE);
            }
            Err(e) => {
                eprintln!("sandgate: {e}");
                return ExitCode::FAILURE;
            }
        };
        let api = match control::mount(&mut proxy, args, policy.as_ref()).await {
            Ok(api) => api.is_some(),
            Err(e @ control::ControlSetupError::Usage(_)) => {
                eprintln!("sandgate: {e}");
                return ExitCode::from(EX_USAGE);
            }
            Err(e) => {
                eprintln!("sandgate: {e}");
                return ExitCode::FAILURE;
            }
        };
        // Caught from before the first "listening" line: a SIGHUP sent as soon as the proxy
        // is up must not meet the signal's default action (the end of the process).
        let (hup_tx, hup_rx) = tokio::sync::mpsc::channel(1);
        let tls = proxy.tls_handle();
        if !tls.is_empty() {
            // Certificates rotated on disk (cert-manager, a Secret's update) are picked up
            // without a signal; the watcher ends with the runtime.
            tokio::spawn(tls.clone().watch());
        }
        forward_sighup(hup_tx, tls);
        // One line per listener with the address bound (a port 0 made real), in the order
        // --listen, spec.listeners, --socks-listen: how a supervisor or a test learns it.
        for l in proxy.bound_listeners() {
            tracing::info!(
                addr = %l.addr,
                role = %l.role,
                task = l.identity.task.as_deref().map(tracing::field::display),
                project = l.identity.project.as_deref().map(tracing::field::display),
                auth = l.require_auth.then_some(tracing::field::display("basic")),
                allow_rules = allow,
                deny_rules = deny,
                "listening"
            );
        }
        // Named for what it serves; `addr=` is how a supervisor or a test learns its port.
        if let Some(addr) = proxy.metrics_addr() {
            // Quoted in the text log only when it holds spaces (logfmt's way).
            let (one, several);
            let serves: &dyn tracing::Value = if api {
                several = "metrics, api, approvals page";
                &several
            } else {
                one = tracing::field::display("metrics");
                &one
            };
            tracing::info!(%addr, serves, "admin listening");
        }
        for range in proxy.guard().allow_ranges() {
            tracing::warn!(%range, "address guard exemption");
        }
        // SIGHUP and changes of the file reload the policy; the watcher ends with the runtime.
        // Without a policy file SIGHUP is still caught (and logged): its default action would
        // end the proxy, and service managers send it to mean "reload".
        if let Some((source, file)) = policy {
            tokio::spawn(sandgate_proxy::reload::watch(
                source,
                file,
                proxy.policy_handle(),
                hup_rx,
            ));
        } else {
            tokio::spawn(ignore_sighup(hup_rx));
        }
        let served = proxy.run(notify::Notifier::from_env().around(shutdown_signal())).await;
        drop(follower);
        match served {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sandgate: audit log failed: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Without a policy file there is nothing to reload: each SIGHUP is only logged.
async fn ignore_sighup(mut rx: tokio::sync::mpsc::Receiver<()>) {
    while rx.recv().await.is_some() {
        tracing::info!("SIGHUP: no policy file to reload (the rules come from flags)");
    }
}

/// Registers for SIGHUP now and passes each one on to the policy watcher from a task,
/// reloading the TLS files first (node listeners, connections to central proxies).
fn forward_sighup(tx: tokio::sync::mpsc::Sender<()>, tls: sandgate_proxy::TlsHandle) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot watch SIGHUP; the policy reloads only when its file changes");
        return;
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if !tls.is_empty() {
                // File reads and parsing, off the request workers.
                let reloading = tls.clone();
                let errors = tokio::task::spawn_blocking(move || reloading.reload())
                    .await
                    .unwrap_or_default();
                for e in &errors {
                    tracing::error!(error = %e, "TLS files not reloaded; the previous ones stay in force");
                }
                if errors.is_empty() {
                    tracing::info!("TLS files reloaded; new connections use them");
                }
            }
            // A full channel means a reload is already pending.
            let _ = tx.try_send(());
        }
    });
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the proxy");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The proxy's interception CA, its certificate written to `path` (replaced whole, so a
/// client never reads half of it).
fn intercept(path: &std::path::Path) -> Result<std::sync::Arc<sandgate_proxy::inspect::Interceptor>, String> {
    let interceptor = sandgate_proxy::inspect::Interceptor::new("sandgate proxy interception CA")
        .map_err(|e| e.to_string())?;
    let mut partial = path.as_os_str().to_owned();
    partial.push(format!(".{}.partial", std::process::id()));
    let partial = std::path::PathBuf::from(partial);
    std::fs::write(&partial, interceptor.ca().cert_pem()).map_err(|e| e.to_string())?;
    std::fs::rename(&partial, path).map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        e.to_string()
    })?;
    tracing::info!(ca = %path.display(), "intercepting TLS for entries with methods or paths");
    Ok(std::sync::Arc::new(interceptor))
}
