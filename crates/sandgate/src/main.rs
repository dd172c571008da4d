//! The `sandgate` binary: parses the command line, builds configuration, runs the library,
//! and maps failures to exit codes (64 for usage and configuration errors, as sysexits'
//! EX_USAGE; 1 for failures at run time).

mod audit_cmd;
mod cli;
mod explain;
mod settings;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use cli::{Cli, Command, LogFormat};
use sandgate_proxy::Proxy;

pub(crate) const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
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
    init_logging(cli.log_format);
    match cli.command {
        Command::Proxy(args) => run_proxy(&args),
        Command::CheckConfig { file } => check_config(&file),
        Command::Explain(args) => explain::run(&args),
        Command::Audit(cmd) => audit_cmd::run(cmd),
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// `sandgate check-config FILE`.
fn check_config(file: &std::path::Path) -> ExitCode {
    match sandgate_proxy::reload::load_file(file) {
        Ok((policy, _)) => {
            println!(
                "{}: ok: {} ({} allow, {} deny entries, {} listeners)",
                file.display(),
                policy.name,
                policy.allow.len(),
                policy.deny.len(),
                policy.listeners.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(EX_USAGE)
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
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandgate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let settings::ProxySetup { config, policy } = setup;
    runtime.block_on(async move {
        let (allow, deny) = config.rules.len();
        if allow == 0 {
            tracing::warn!("the allowlist is empty: every request will be denied");
        }
        let proxy = match Proxy::bind(config).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("sandgate: {e}");
                return ExitCode::FAILURE;
            }
        };
        for addr in proxy.local_addrs() {
            tracing::info!(%addr, allow_rules = allow, deny_rules = deny, "listening");
        }
        if let Some(addr) = proxy.metrics_addr() {
            if !addr.ip().is_loopback() {
                tracing::warn!(%addr, "the metrics listener is not on loopback");
            }
            tracing::info!(%addr, "metrics listening");
        }
        for range in proxy.guard().allow_ranges() {
            tracing::warn!(%range, "address guard exemption");
        }
        // SIGHUP and changes of the file reload the policy; the watcher ends with the runtime.
        if let Some((source, file)) = policy {
            let (hup_tx, hup_rx) = tokio::sync::mpsc::channel(1);
            tokio::spawn(forward_sighup(hup_tx));
            tokio::spawn(sandgate_proxy::reload::watch(
                source,
                file,
                proxy.policy_handle(),
                hup_rx,
            ));
        }
        match proxy.run(shutdown_signal()).await {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sandgate: audit log failed: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Passes each SIGHUP on to the policy watcher.
async fn forward_sighup(tx: tokio::sync::mpsc::Sender<()>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot watch SIGHUP; the policy reloads only when its file changes");
        return;
    };
    while hup.recv().await.is_some() {
        // A full channel means a reload is already pending.
        let _ = tx.try_send(());
    }
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
