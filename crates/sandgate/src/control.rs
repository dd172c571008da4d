//! Wires the control plane into `sandgate proxy`: with admin tokens in the policy file and an
//! admin listener, the exceptions API is mounted beside `/metrics`, backed by the SQLite
//! store in the state directory, and expiry runs every quarter second. Fails closed: a store
//! that cannot be opened stops the proxy from starting.

use std::path::PathBuf;
use std::sync::Arc;

use sandgate_control::{ApiState, Control, SqliteStore};
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
    let dir = args
        .state_dir
        .clone()
        .or_else(|| std::env::var_os("STATE_DIRECTORY").map(PathBuf::from))
        .ok_or_else(|| {
            ControlSetupError::Usage("exceptions need a state directory: --state-dir DIR".into())
        })?;
    std::fs::create_dir_all(&dir).map_err(|e| {
        ControlSetupError::Store(format!(
            "cannot create the state directory {}: {e}",
            dir.display()
        ))
    })?;
    let principals = sandgate_proxy::reload::admin_principals(file, &source.path)
        .map_err(|e| ControlSetupError::Usage(e.to_string()))?;
    let db = dir.join("exceptions.sqlite3");
    let store =
        SqliteStore::open(&db).map_err(|e| ControlSetupError::Store(format!("{}: {e}", db.display())))?;
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
        Arc::new(store),
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
    });
    proxy.mount_admin(sandgate_control::router(state.clone()));
    tokio::spawn(sandgate_control::expire_loop(state.clone()));
    tracing::info!(store = %db.display(), tokens = file.admin.tokens.len(), "exceptions API on the admin listener");
    Ok(Some(state))
}
