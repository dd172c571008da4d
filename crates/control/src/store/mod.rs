//! Where exceptions live: one small interface, [`ExceptionStore`], with two stores behind it:
//! the embedded SQLite file of one proxy ([`sqlite`], the default) and a PostgreSQL database
//! several proxies share ([`postgres`]).
//!
//! An exception is stored whole (its JSON) beside the columns queries select on. Every
//! change is one transaction, and a change of state is conditional on the state it was made
//! from ([`ExceptionStore::transition`]): two proxies sharing a database cannot both approve,
//! revoke or expire the same exception, and a stale proxy cannot undo a newer decision. The
//! states only move forward (pending, then approved or denied, then revoked or expired), so
//! the stored state is the version. A new pending request is stored unless an identical
//! one is pending, checked and inserted in one step ([`ExceptionStore::insert_pending_unless`]:
//! on PostgreSQL under a transaction-scoped advisory lock on the task), so identical requests
//! filed at the same instant through two proxies store one row.
//!
//! The interface is asynchronous (the PostgreSQL store awaits the network); its methods
//! return boxed futures so the control plane can hold either store as `dyn ExceptionStore`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sandgate_policy::{Exception, ExceptionState};

pub mod postgres;
pub mod sqlite;

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("exception store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("exception store (postgresql): {0}")]
    Postgres(#[source] tokio_postgres::Error),
    /// The store cannot be reached now (a shared database down or unreachable); callers
    /// answer 503 and try again later.
    #[error("exception store {store} unavailable: {detail}")]
    Unavailable { store: String, detail: String },
    #[error("exception store: a stored exception cannot be read: {0}")]
    Corrupt(#[from] serde_json::Error),
    #[error("exception store: {0} already exists")]
    Duplicate(String),
    /// A conditional change found another state stored (changed meanwhile, perhaps by
    /// another proxy on the same database).
    #[error("exception {id} was changed meanwhile (it is no longer {expected}); read it again")]
    Conflict { id: String, expected: &'static str },
    /// The database's schema is newer than this binary knows (exit 64 at start).
    #[error(
        "the exception database's schema is version {found}, newer than this sandgate knows ({supported}); upgrade sandgate, or point --state at another database"
    )]
    NewerSchema { found: i32, supported: i32 },
    /// A `--state` value that names no store.
    #[error("--state: {0}")]
    Config(String),
}

/// What a store call returns: a boxed future, so the interface stays object-safe.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Whether a stored pending request asks the same as a new one (the service's definition of
/// an identical request; the store only applies it).
pub type Same = fn(stored: &Exception, new: &Exception) -> bool;

/// The store's interface.
pub trait ExceptionStore: Send + Sync + std::fmt::Debug {
    /// Adds a new exception; an id that exists is an error.
    fn insert<'a>(&'a self, ex: &'a Exception) -> StoreFuture<'a, ()>;
    /// Adds `ex`, a pending request, unless a pending request of its task that is `same` as
    /// it is stored: then returns that one (the oldest) and adds nothing. The check and the
    /// insert are one step for every writer of the store, so identical requests filed at
    /// the same instant, through one proxy or several sharing a database, store one row.
    fn insert_pending_unless<'a>(
        &'a self,
        ex: &'a Exception,
        same: Same,
    ) -> StoreFuture<'a, Option<Exception>>;
    /// Stores `ex` (its new state and record) only if the stored state is still `from`;
    /// [`StoreError::Conflict`] otherwise, and nothing is changed.
    fn transition<'a>(&'a self, ex: &'a Exception, from: ExceptionState) -> StoreFuture<'a, ()>;
    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Exception>>;
    /// Every exception, oldest first.
    fn list(&self) -> StoreFuture<'_, Vec<Exception>>;
    /// The exceptions in `state`, oldest first (what the expiry timer and publication need,
    /// without reading every decided exception ever stored).
    fn list_in(&self, state: ExceptionState) -> StoreFuture<'_, Vec<Exception>>;
    /// Whether the store answers (for `/readyz`).
    fn ping(&self) -> StoreFuture<'_, ()>;
    /// The store's kind and place for logs and readiness, with no secret in it.
    fn describe(&self) -> String;
    /// Woken when the stored exceptions may have changed elsewhere (another proxy on a
    /// shared database, or the connection to it restored). `None` for a store that only
    /// this proxy writes.
    fn changed(&self) -> Option<Arc<tokio::sync::Notify>>;
}

/// Reads stored exception bodies; a row that cannot be read is reported and left out, so
/// it allows nothing (fail closed) and the rest still works.
fn parse_rows<'a>(bodies: impl IntoIterator<Item = &'a str>) -> Vec<Exception> {
    bodies
        .into_iter()
        .filter_map(|b| match serde_json::from_str(b) {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::error!(error = %e, "an exception row cannot be read; it is ignored");
                None
            }
        })
        .collect()
}
