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
mod proxy_cmd;
mod settings;

use std::process::ExitCode;

use clap::Parser;
use cli::{Cli, Command};
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
        Command::Proxy(args) => proxy_cmd::run_proxy(&args),
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
