//! The shared store: one PostgreSQL database that several proxies use as one.
//!
//! Each call takes a connection from a small bounded pool (deadpool-postgres) and is bounded
//! in time, so a database that is down or unreachable fails a call within seconds with
//! [`StoreError::Unavailable`] instead of holding the caller; the pool makes new connections
//! when the database returns, with no restart. Every change is one transaction that also
//! sends `NOTIFY sandgate_exceptions` with the exception's id: PostgreSQL delivers it to the
//! other proxies only if the change commits. The payload is never trusted as data (anyone
//! with access to the database can send one); a notification only makes a proxy read the
//! table again ([`listen`]). The schema is versioned and migrated at start ([`migrate`]).
//! A new pending request is checked against the task's pending rows and inserted under a
//! transaction-scoped advisory lock on the task, so two proxies filing the same request at
//! once store one row.
//!
//! Connections are plain on a Unix socket (`host=/run/postgresql`). Over a network, give the
//! CA that signed the database's certificate (`--state-ca`): every connection is then TLS
//! (rustls; `sslmode=require` is implied, and the certificate must name the host), and one
//! that cannot be verified is refused. A connection string that asks for TLS without a CA
//! is refused at start.

mod listen;
pub mod migrate;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use sandgate_policy::{Exception, ExceptionState};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::{Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{ExceptionStore, Same, StoreError, StoreFuture};

/// The channel every change is announced on.
pub const CHANNEL: &str = "sandgate_exceptions";
/// The first key of the transaction-scoped advisory lock a new pending request is checked
/// and inserted under (the second is the task id's hash): "sgpr" in ASCII. Two-key advisory
/// locks never collide with the one-key lock the migrations take.
const PENDING_LOCK: i32 = 0x7367_7072;
/// Connections one proxy keeps to the database (its calls are few and short).
const POOL_SIZE: usize = 4;
/// The longest a call may take, waiting for a connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a new connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The shared PostgreSQL store.
pub struct PgStore {
    pool: Pool,
    /// `postgresql host=... dbname=...`: no user or password, for logs and readiness.
    name: String,
    changed: Arc<tokio::sync::Notify>,
    listener: tokio::task::AbortHandle,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl PgStore {
    /// Connects to the database `url` names (a `postgres://` URL or `key=value` pairs;
    /// `host=/dir` is a Unix socket directory), over TLS verified against the CA certificates
    /// in `ca` when given; applies the schema's migrations, and starts listening for other
    /// proxies' changes. Fails if the database cannot be reached (or verified) or its schema
    /// is newer than this binary's.
    pub async fn connect(url: &str, ca: Option<&std::path::Path>) -> Result<PgStore, StoreError> {
        let mut config: Config = url
            .parse()
            .map_err(|e| StoreError::Config(format!("not a PostgreSQL connection string: {e}")))?;
        let tls = tls(&mut config, ca)?;
        config
            .connect_timeout(CONNECT_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));
        no_names(&config)?;
        if config.get_application_name().is_none() {
            config.application_name("sandgate");
        }
        let name = describe(&config);
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &tls {
            Some(tls) => Manager::from_config(config.clone(), tls.clone(), manager_config),
            None => Manager::from_config(config.clone(), NoTls, manager_config),
        };
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(CALL_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Config(e.to_string()))?;
        let changed = Arc::new(tokio::sync::Notify::new());
        let listener = tokio::spawn(listen::run(config, tls, changed.clone(), name.clone())).abort_handle();
        let store = PgStore {
            pool,
            name,
            changed,
            listener,
        };
        let mut client = store.client().await?;
        bounded(&store.name, migrate::apply(&mut client, &store.name)).await?;
        Ok(store)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| match e {
            PoolError::Backend(e) => pg_error(&self.name, e),
            other => unavailable(&self.name, other),
        })
    }

    /// Runs one change in a transaction that also announces it; `sql` must change exactly
    /// one row to count (0 rows is `none`).
    async fn change(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        id: &str,
        none: impl FnOnce() -> StoreError,
    ) -> Result<(), StoreError> {
        let name = &self.name;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| pg_error(name, e))?;
        let done = tx.execute(sql, params).await.map_err(|e| pg_error(name, e))?;
        if done == 0 {
            return Err(none());
        }
        tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &id])
            .await
            .map_err(|e| pg_error(name, e))?;
        tx.commit().await.map_err(|e| pg_error(name, e))
    }

    /// One transaction: the advisory lock on the task (held until it ends, so every proxy's
    /// check and insert for the task take turns; in READ COMMITTED each statement reads
    /// what committed before it, so the check sees the row of a turn before), the task's
    /// pending rows, then the insert and its notification, or nothing when one is `same`.
    async fn insert_pending_unless_now(
        &self,
        ex: &Exception,
        same: Same,
    ) -> Result<Option<Exception>, StoreError> {
        let name = &self.name;
        let body = serde_json::to_string(ex)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| pg_error(name, e))?;
        tx.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            &[&PENDING_LOCK, &ex.task_id],
        )
        .await
        .map_err(|e| pg_error(name, e))?;
        let rows = tx
            .query(
                "SELECT body FROM sandgate_exceptions WHERE state = $1 AND task_id = $2 \
                 ORDER BY requested_at, id",
                &[&ExceptionState::Pending.as_str(), &ex.task_id],
            )
            .await
            .map_err(|e| pg_error(name, e))?;
        let bodies: Vec<String> = rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(|e| pg_error(name, e))?;
        let pending = super::parse_rows(bodies.iter().map(String::as_str));
        if let Some(found) = pending.into_iter().find(|p| same(p, ex)) {
            // Dropped, the transaction rolls back and the lock goes with it.
            return Ok(Some(found));
        }
        let done = tx
            .execute(
                "INSERT INTO sandgate_exceptions (id, task_id, state, requested_at, body) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
                &[&ex.id, &ex.task_id, &ex.state.as_str(), &ex.requested_at, &body],
            )
            .await
            .map_err(|e| pg_error(name, e))?;
        if done == 0 {
            return Err(StoreError::Duplicate(ex.id.clone()));
        }
        tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &ex.id])
            .await
            .map_err(|e| pg_error(name, e))?;
        tx.commit().await.map_err(|e| pg_error(name, e))?;
        Ok(None)
    }

    /// The exceptions a query selects (its one parameter, if any, bound to `$1`).
    async fn select(&self, sql: &str, param: Option<&str>) -> Result<Vec<Exception>, StoreError> {
        let client = self.client().await?;
        let rows = match param {
            Some(p) => client.query(sql, &[&p]).await,
            None => client.query(sql, &[]).await,
        }
        .map_err(|e| pg_error(&self.name, e))?;
        let bodies: Vec<String> = rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(|e| pg_error(&self.name, e))?;
        Ok(super::parse_rows(bodies.iter().map(String::as_str)))
    }
}

impl ExceptionStore for PgStore {
    fn insert<'a>(&'a self, ex: &'a Exception) -> StoreFuture<'a, ()> {
        Box::pin(bounded(&self.name, async move {
            let body = serde_json::to_string(ex)?;
            self.change(
                "INSERT INTO sandgate_exceptions (id, task_id, state, requested_at, body) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
                &[&ex.id, &ex.task_id, &ex.state.as_str(), &ex.requested_at, &body],
                &ex.id,
                || StoreError::Duplicate(ex.id.clone()),
            )
            .await
        }))
    }

    fn insert_pending_unless<'a>(
        &'a self,
        ex: &'a Exception,
        same: Same,
    ) -> StoreFuture<'a, Option<Exception>> {
        Box::pin(bounded(&self.name, self.insert_pending_unless_now(ex, same)))
    }

    fn transition<'a>(&'a self, ex: &'a Exception, from: ExceptionState) -> StoreFuture<'a, ()> {
        Box::pin(bounded(&self.name, async move {
            let body = serde_json::to_string(ex)?;
            self.change(
                "UPDATE sandgate_exceptions SET state = $2, body = $3 WHERE id = $1 AND state = $4",
                &[&ex.id, &ex.state.as_str(), &body, &from.as_str()],
                &ex.id,
                || StoreError::Conflict {
                    id: ex.id.clone(),
                    expected: from.as_str(),
                },
            )
            .await
        }))
    }

    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Exception>> {
        Box::pin(bounded(&self.name, async move {
            let found = self
                .select("SELECT body FROM sandgate_exceptions WHERE id = $1", Some(id))
                .await?;
            Ok(found.into_iter().next())
        }))
    }

    fn list(&self) -> StoreFuture<'_, Vec<Exception>> {
        Box::pin(bounded(
            &self.name,
            self.select(
                "SELECT body FROM sandgate_exceptions ORDER BY requested_at, id",
                None,
            ),
        ))
    }

    fn list_in(&self, state: ExceptionState) -> StoreFuture<'_, Vec<Exception>> {
        Box::pin(bounded(
            &self.name,
            self.select(
                "SELECT body FROM sandgate_exceptions WHERE state = $1 ORDER BY requested_at, id",
                Some(state.as_str()),
            ),
        ))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(bounded(&self.name, async move {
            let client = self.client().await?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| pg_error(&self.name, e))?;
            Ok(())
        }))
    }

    fn describe(&self) -> String {
        self.name.clone()
    }

    fn changed(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(self.changed.clone())
    }
}

/// Bounds a call in time: no answer within [`CALL_TIMEOUT`] is the database unavailable.
async fn bounded<T>(
    name: &str,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => result,
        Err(_) => Err(unavailable(name, "no answer within 5 s")),
    }
}

fn unavailable(name: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable {
        store: name.to_owned(),
        detail: detail.to_string(),
    }
}

/// A driver error: the connection's failures (no SQL state, or the classes PostgreSQL uses
/// for a lost connection or a server shutting down) are [`StoreError::Unavailable`].
fn pg_error(name: &str, e: tokio_postgres::Error) -> StoreError {
    let lost = match e.as_db_error() {
        None => true,
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("57P")
        }
    };
    if lost || e.is_closed() {
        unavailable(name, e)
    } else {
        StoreError::Postgres(e)
    }
}

/// Refuses a host name without `hostaddr`: the driver would resolve it with the system
/// resolver, which sandgate never uses (and a static binary cannot). A Unix socket directory
/// or an IP address needs no name; `host=NAME&hostaddr=IP` names the address outright.
fn no_names(config: &Config) -> Result<(), StoreError> {
    if !config.get_hostaddrs().is_empty() {
        return Ok(());
    }
    for host in config.get_hosts() {
        if let Host::Tcp(name) = host
            && name.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_err()
        {
            return Err(StoreError::Config(format!(
                "the database host {name:?} is a name: give an IP address, a Unix socket directory (host=/run/postgresql), or hostaddr=IP beside it; sandgate does not resolve names with the system resolver"
            )));
        }
    }
    Ok(())
}

/// `postgresql host=... dbname=...` (what `/readyz` may say to anyone: no user, no password).
fn describe(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(name) => name.clone(),
            Host::Unix(dir) => dir.display().to_string(),
        })
        .collect();
    let mut out = format!("postgresql host={}", hosts.join(","));
    if let Some(db) = config.get_dbname() {
        out.push_str(&format!(" dbname={db}"));
    }
    out
}

/// The TLS connector for `ca` (TLS then required: `sslmode=disable` with a CA is refused);
/// `None` without a CA, when a connection string that asks for TLS is refused.
fn tls(config: &mut Config, ca: Option<&std::path::Path>) -> Result<Option<MakeRustlsConnect>, StoreError> {
    let Some(ca) = ca else {
        if config.get_ssl_mode() == SslMode::Require {
            return Err(StoreError::Config(
                "the connection string asks for TLS (sslmode=require): give the CA that signed the database's certificate with --state-ca FILE".into(),
            ));
        }
        config.ssl_mode(SslMode::Disable);
        return Ok(None);
    };
    if config.get_ssl_mode() == SslMode::Disable {
        return Err(StoreError::Config(
            "--state-ca asks for TLS, and the connection string says sslmode=disable".into(),
        ));
    }
    if config.get_hosts().iter().any(|h| !matches!(h, Host::Tcp(_))) {
        return Err(StoreError::Config(
            "--state-ca: TLS is for a database over the network; a Unix socket (host=/dir) is not encrypted by PostgreSQL".into(),
        ));
    }
    config.ssl_mode(SslMode::Require);
    let roots = sandgate_proxy::transport::tls::roots(ca)
        .map_err(|e| StoreError::Config(format!("--state-ca: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(MakeRustlsConnect::new(client)))
}
