//! `sandgate proxy`: its settings fitted to the descriptors it may open, the proxy bound
//! and run until SIGTERM or SIGINT, the policy reloaded on SIGHUP (the TLS files first),
//! and the interception CA made when entries with methods or paths ask for it.

use std::process::ExitCode;

use sandgate_proxy::Proxy;

use crate::{EX_USAGE, cli, control, notify, settings};

pub(crate) fn run_proxy(args: &cli::ProxyArgs) -> ExitCode {
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
