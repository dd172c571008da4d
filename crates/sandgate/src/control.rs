//! Wires the control plane into `sandgate proxy`: with admin tokens in the policy file and an
//! admin listener, the exceptions API is mounted beside `/metrics`, backed by the SQLite
//! store in the state directory or, with `--state postgres://...`, a PostgreSQL database
//! shared with other proxies (re-read on every change notification and every
//! `--state-resync` seconds). Expiry runs every quarter second. Fails closed: a store that
//! cannot be opened (or whose schema is newer than this binary) stops the proxy from starting.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sandgate_control::{ApiState, Control, ExceptionStore, PgStore, SqliteStore, StoreError};
use sandgate_policy::PolicyFile;
use sandgate_proxy::Proxy;
use sandgate_proxy::reload::PolicySource;

use crate::cli::ProxyArgs;

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum ControlSetupError {
    /// A configuration problem (exit 64).
    #[error("{0}")]
    Usage(String),
    /// The store could not be opened (exit 1).
    #[error("{0}")]
    Store(String),
}

/// Mounts the exceptions API when the policy file names admin tokens.
pub async fn mount(
    proxy: &mut Proxy,
    args: &ProxyArgs,
    policy: Option<&(PolicySource, PolicyFile)>,
) -> Result<Option<Arc<ApiState>>, ControlSetupError> {
    let Some((source, file)) = policy else {
        return Ok(None);
    };
    if file.admin.tokens.is_empty() {
        if !file.exceptions.enabled.is_empty() {
            tracing::warn!(
                "spec.exceptions is set but spec.admin has no tokens: nobody can request or approve"
            );
        }
        return Ok(None);
    }
    if proxy.metrics_addr().is_none() {
        return Err(ControlSetupError::Usage(
            "spec.admin.tokens needs an admin listener: --admin-listen ADDR or spec.admin.listen".into(),
        ));
    }
    let principals = sandgate_proxy::reload::admin_principals(file, &source.path)
        .map_err(|e| ControlSetupError::Usage(e.to_string()))?;
    let resync = resync_every(args)?;
    let store = open_store(args).await?;
    let store_name = store.describe();
    let handle = proxy.policy_handle();
    // Each task's project, as the policy knows it (a requester may not claim another).
    let mut projects = std::collections::HashMap::new();
    for l in &file.listeners {
        if let (Some(t), Some(p)) = (&l.task, &l.project) {
            projects.insert(t.clone(), p.clone());
        }
    }
    for t in &file.task_secrets {
        if let Some(p) = &t.project {
            projects.insert(t.task.clone(), p.clone());
        }
    }
    let control = Control::start(
        store,
        file.exceptions.clone(),
        projects,
        handle.clone(),
        Arc::new(sandgate_proxy::unix_now),
    )
    .await
    .map_err(|e| ControlSetupError::Store(e.to_string()))?;
    let state = Arc::new(ApiState {
        control,
        principals,
        proxy: handle,
        sessions: Default::default(),
        throttle: Default::default(),
    });
    proxy.mount_admin(sandgate_control::router(state.clone()));
    tokio::spawn(sandgate_control::expire_loop(state.clone()));
    tokio::spawn(sandgate_control::sync_loop(state.clone(), resync));
    tracing::info!(store = %store_name, tokens = file.admin.tokens.len(), "exceptions API on the admin listener");
    Ok(Some(state))
}

/// The store `--state` names, else SQLite under the state directory.
async fn open_store(args: &ProxyArgs) -> Result<Arc<dyn ExceptionStore>, ControlSetupError> {
    if let Some(url) = &args.state {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ControlSetupError::Usage(
                "--state: only postgres:// or postgresql:// URLs (SQLite is the default, under --state-dir)"
                    .into(),
            ));
        }
        return match PgStore::connect(url, args.state_ca.as_deref()).await {
            Ok(store) => Ok(Arc::new(store)),
            Err(e @ (StoreError::NewerSchema { .. } | StoreError::Config(_))) => {
                Err(ControlSetupError::Usage(e.to_string()))
            }
            Err(e) => Err(ControlSetupError::Store(e.to_string())),
        };
    }
    let dir = args
        .state_dir
        .clone()
        .or_else(|| std::env::var_os("STATE_DIRECTORY").map(PathBuf::from))
        .ok_or_else(|| {
            ControlSetupError::Usage(
                "exceptions need a state directory (--state-dir DIR) or a shared database (--state postgres://...)".into(),
            )
        })?;
    std::fs::create_dir_all(&dir).map_err(|e| {
        ControlSetupError::Store(format!(
            "cannot create the state directory {}: {e}",
            dir.display()
        ))
    })?;
    let db = dir.join("exceptions.sqlite3");
    let store =
        SqliteStore::open(&db).map_err(|e| ControlSetupError::Store(format!("{}: {e}", db.display())))?;
    Ok(Arc::new(store))
}

/// `--state-resync`: between 0.1 s and an hour.
fn resync_every(args: &ProxyArgs) -> Result<Duration, ControlSetupError> {
    let secs = args.state_resync.unwrap_or(5.0);
    if !(0.1..=3600.0).contains(&secs) {
        return Err(ControlSetupError::Usage(
            "--state-resync: between 0.1 and 3600 seconds".into(),
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}
