//! The embedded store: one SQLite file under the state directory, written by one proxy.
//!
//! Every change is one transaction, and SQLite runs with `synchronous = FULL` in WAL mode,
//! so a change the API answered is on disk and survives a crash or a restart. Calls are
//! short and local, so they run inline under one mutex rather than on a blocking thread.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use sandgate_policy::{Exception, ExceptionState};

use super::{ExceptionStore, Same, StoreError, StoreFuture};

/// The embedded store: one SQLite file under the state directory.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Mutex<Connection>,
    path: String,
}

impl SqliteStore {
    /// Opens (or creates) the database at `path`.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS exceptions (
                 id TEXT PRIMARY KEY,
                 task_id TEXT NOT NULL,
                 state TEXT NOT NULL,
                 requested_at INTEGER NOT NULL,
                 body TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS exceptions_task ON exceptions (task_id);",
        )?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            path: path.display().to_string(),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        match self.conn.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

impl ExceptionStore for SqliteStore {
    fn insert<'a>(&'a self, ex: &'a Exception) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.insert_now(ex) })
    }

    fn insert_pending_unless<'a>(
        &'a self,
        ex: &'a Exception,
        same: Same,
    ) -> StoreFuture<'a, Option<Exception>> {
        Box::pin(async move { self.insert_pending_unless_now(ex, same) })
    }

    fn transition<'a>(&'a self, ex: &'a Exception, from: ExceptionState) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.transition_now(ex, from) })
    }

    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Exception>> {
        Box::pin(async move { self.get_now(id) })
    }

    fn list(&self) -> StoreFuture<'_, Vec<Exception>> {
        Box::pin(async move { self.select("SELECT body FROM exceptions ORDER BY requested_at, id", None) })
    }

    fn list_in(&self, state: ExceptionState) -> StoreFuture<'_, Vec<Exception>> {
        Box::pin(async move {
            self.select(
                "SELECT body FROM exceptions WHERE state = ?1 ORDER BY requested_at, id",
                Some(state.as_str()),
            )
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.conn().query_row("SELECT 1", [], |_| Ok(()))?;
            Ok(())
        })
    }

    fn describe(&self) -> String {
        format!("sqlite {}", self.path)
    }

    fn changed(&self) -> Option<Arc<tokio::sync::Notify>> {
        None
    }
}

impl SqliteStore {
    fn insert_now(&self, ex: &Exception) -> Result<(), StoreError> {
        let body = serde_json::to_string(ex)?;
        let done = self.conn().execute(
            "INSERT OR IGNORE INTO exceptions (id, task_id, state, requested_at, body) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![ex.id, ex.task_id, ex.state.as_str(), ex.requested_at, body],
        )?;
        if done == 0 {
            return Err(StoreError::Duplicate(ex.id.clone()));
        }
        Ok(())
    }

    /// One immediate transaction (the write lock taken at its start) under the connection's
    /// mutex: the check and the insert cannot interleave with another writer's.
    fn insert_pending_unless_now(&self, ex: &Exception, same: Same) -> Result<Option<Exception>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let bodies = {
            let mut stmt = tx.prepare(
                "SELECT body FROM exceptions WHERE state = ?1 AND task_id = ?2 ORDER BY requested_at, id",
            )?;
            stmt.query_map(params![ExceptionState::Pending.as_str(), ex.task_id], |r| {
                r.get::<_, String>(0)
            })?
            .collect::<Result<Vec<_>, _>>()?
        };
        let pending = super::parse_rows(bodies.iter().map(String::as_str));
        if let Some(found) = pending.into_iter().find(|p| same(p, ex)) {
            return Ok(Some(found));
        }
        let body = serde_json::to_string(ex)?;
        let done = tx.execute(
            "INSERT OR IGNORE INTO exceptions (id, task_id, state, requested_at, body) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![ex.id, ex.task_id, ex.state.as_str(), ex.requested_at, body],
        )?;
        if done == 0 {
            return Err(StoreError::Duplicate(ex.id.clone()));
        }
        tx.commit()?;
        Ok(None)
    }

    fn transition_now(&self, ex: &Exception, from: ExceptionState) -> Result<(), StoreError> {
        let body = serde_json::to_string(ex)?;
        let done = self.conn().execute(
            "UPDATE exceptions SET state = ?2, body = ?3 WHERE id = ?1 AND state = ?4",
            params![ex.id, ex.state.as_str(), body, from.as_str()],
        )?;
        if done == 0 {
            return Err(StoreError::Conflict {
                id: ex.id.clone(),
                expected: from.as_str(),
            });
        }
        Ok(())
    }

    fn get_now(&self, id: &str) -> Result<Option<Exception>, StoreError> {
        let body: Option<String> = self
            .conn()
            .query_row("SELECT body FROM exceptions WHERE id = ?1", params![id], |r| {
                r.get(0)
            })
            .optional()?;
        Ok(body.map(|b| serde_json::from_str(&b)).transpose()?)
    }
    /// The exceptions a query selects (its one parameter, if any, bound to `?1`).
    fn select(&self, sql: &str, param: Option<&str>) -> Result<Vec<Exception>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(sql)?;
        let bodies = stmt
            .query_map(rusqlite::params_from_iter(param), |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(super::parse_rows(bodies.iter().map(String::as_str)))
    }
}
