//! Wires the control plane into `sandgate proxy`: with admin tokens in the policy file and an
//! admin listener, the exceptions API is mounted beside `/metrics`, backed by the SQLite
//! store in the state directory or, with `--state postgres://...`, a PostgreSQL database
//! shared with other proxies (re-read on every change notification and every
//! `--state-resync` seconds). Expiry runs every quarter second. Fails closed: a store that
//! cannot be opened (or whose schema is newer than this binary) stops the proxy from starting.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sandgate_control::client::AdminUrl;
use sandgate_control::{
    ApiState, Control, ExceptionStore, FeedSpec, Follower, PgStore, SqliteStore, StoreError,
};
use sandgate_policy::exception::Enablement;
use sandgate_policy::{ExceptionPolicy, PolicyFile, Scope};
use sandgate_proxy::Proxy;
use sandgate_proxy::reload::PolicySource;
use sandgate_sandbox::run::{Follow, FollowRequest, Following};

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
        if !file.exceptions.enabled.is_empty() && args.exceptions_from.is_none() {
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

/// Follows the control plane `--exceptions-from` names, within the policy's
/// `spec.exceptions` bounds: the approved exceptions it publishes apply here too. A proxy
/// hosts a control plane or follows one, not both. The first read happens before the proxy
/// serves; a token the control plane refuses stops the start (exit 64), one that cannot be
/// reached now does not (the follower keeps trying, and `/readyz` says so).
pub async fn follow(
    proxy: &Proxy,
    args: &ProxyArgs,
    policy: Option<&(PolicySource, PolicyFile)>,
) -> Result<Option<Follower>, ControlSetupError> {
    let (Some(from), Some(token_file)) = (&args.exceptions_from, &args.exceptions_token_file) else {
        return Ok(None);
    };
    let Some((_, file)) = policy.filter(|(_, f)| !f.exceptions.enabled.is_empty()) else {
        return Err(ControlSetupError::Usage(
            "--exceptions-from needs spec.exceptions in the policy file: the tasks and bounds this proxy may apply exceptions for".into(),
        ));
    };
    if !file.admin.tokens.is_empty() {
        return Err(ControlSetupError::Usage(
            "--exceptions-from: this policy's spec.admin.tokens make this proxy host a control plane of its own; a proxy hosts one or follows one, not both".into(),
        ));
    }
    let url = feed_url(from, args.exceptions_ca.as_deref())
        .map_err(|e| ControlSetupError::Usage(format!("--exceptions-from: {e}")))?;
    let token = std::fs::read_to_string(token_file).map_err(|e| {
        ControlSetupError::Usage(format!("--exceptions-token-file {}: {e}", token_file.display()))
    })?;
    let secs = args.exceptions_resync.unwrap_or(10.0);
    if !(0.5..=3600.0).contains(&secs) {
        return Err(ControlSetupError::Usage(
            "--exceptions-resync: between 0.5 and 3600 seconds".into(),
        ));
    }
    let spec = FeedSpec {
        url,
        token: token.trim().to_owned(),
        ca: args.exceptions_ca.clone(),
        resync: Duration::from_secs_f64(secs),
    };
    let bounds = file.exceptions.clone();
    let handle = proxy.policy_handle();
    let started = tokio::task::spawn_blocking(move || {
        Follower::start(spec, bounds, handle, Arc::new(sandgate_proxy::unix_now))
    })
    .await
    .map_err(|e| ControlSetupError::Store(format!("the follower did not start: {e}")))?;
    let follower = started.map_err(|e| ControlSetupError::Usage(format!("--exceptions-from {from}: {e}")))?;
    if follower.is_up() {
        tracing::info!(from = %from, exceptions = follower.known().len(), "following the control plane's exceptions");
    }
    Ok(Some(follower))
}

/// The follower a run's proxy starts for `net.exceptions` ([`sandgate_sandbox::run::Follow`]):
/// the approved exceptions of the run's task, on the ports and for at most the TTL the
/// policy gives there. The control plane's URL is checked as `--exceptions-from`'s is.
pub fn run_follow() -> Follow {
    Follow(Arc::new(|req: FollowRequest| {
        let url = feed_url(&req.feed.from, req.feed.ca.as_deref()).map_err(|e| format!("from: {e}"))?;
        let token = std::fs::read_to_string(&req.feed.token_file)
            .map_err(|e| format!("token_file {}: {e}", req.feed.token_file.display()))?;
        let bounds = ExceptionPolicy {
            enabled: vec![Enablement {
                scope: Scope::Task(req.task.clone()),
                ports: req.feed.ports.clone(),
                max_ttl_seconds: req.feed.max_ttl_seconds,
            }],
        };
        let spec = FeedSpec {
            url,
            token: token.trim().to_owned(),
            ca: req.feed.ca.clone(),
            resync: Duration::from_secs(10),
        };
        let follower = Follower::start(spec, bounds, req.proxy, Arc::new(sandgate_proxy::unix_now))
            .map_err(|e| format!("from {}: {e}", req.feed.from))?;
        if !follower.is_up() {
            eprintln!(
                "sandgate: warning: cannot read the control plane at {} now: exceptions approved there reach this run once it can",
                req.feed.from
            );
        }
        Ok(Box::new(follower) as Following)
    }))
}

/// A control plane's admin URL as a follower may use it: parsed (an IP literal or
/// `localhost`, never a name to resolve), and `https://` with a CA or plain HTTP on loopback.
pub fn feed_url(from: &str, ca: Option<&std::path::Path>) -> Result<AdminUrl, String> {
    let url = AdminUrl::parse(from).map_err(|e| e.to_string())?;
    sandgate_control::follow::check_feed(&url, ca).map_err(|e| e.to_string())?;
    Ok(url)
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
