//! Where exceptions live: one small interface, [`ExceptionStore`], with the embedded SQLite
//! store behind it today (a shared PostgreSQL store for several proxies comes next).
//!
//! An exception is stored whole (its JSON) beside the columns queries select on, in one
//! table; every change is one transaction, and SQLite runs with `synchronous = FULL` in WAL
//! mode, so a change the API answered is on disk and survives a crash or a restart.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};
use sandgate_policy::{Exception, ExceptionState};

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("exception store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("exception store: a stored exception cannot be read: {0}")]
    Corrupt(#[from] serde_json::Error),
    #[error("exception store: {0} already exists")]
    Duplicate(String),
}

/// The store's interface.
pub trait ExceptionStore: Send + Sync + std::fmt::Debug {
    /// Adds a new exception; an id that exists is an error.
    fn insert(&self, ex: &Exception) -> Result<(), StoreError>;
    /// Replaces an exception's record.
    fn update(&self, ex: &Exception) -> Result<(), StoreError>;
    fn get(&self, id: &str) -> Result<Option<Exception>, StoreError>;
    /// Every exception, oldest first.
    fn list(&self) -> Result<Vec<Exception>, StoreError>;
    /// The exceptions in `state`, oldest first (what the expiry timer and publication need,
    /// without reading every decided exception ever stored).
    fn list_in(&self, state: ExceptionState) -> Result<Vec<Exception>, StoreError>;
    /// Whether the store answers (for `/readyz`).
    fn ping(&self) -> Result<(), StoreError>;
}

/// The embedded store: one SQLite file under the state directory.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Mutex<Connection>,
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
    fn insert(&self, ex: &Exception) -> Result<(), StoreError> {
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

    fn update(&self, ex: &Exception) -> Result<(), StoreError> {
        let body = serde_json::to_string(ex)?;
        self.conn().execute(
            "UPDATE exceptions SET state = ?2, body = ?3 WHERE id = ?1",
            params![ex.id, ex.state.as_str(), body],
        )?;
        Ok(())
    }

    fn get(&self, id: &str) -> Result<Option<Exception>, StoreError> {
        let body: Option<String> = self
            .conn()
            .query_row("SELECT body FROM exceptions WHERE id = ?1", params![id], |r| {
                r.get(0)
            })
            .optional()?;
        Ok(body.map(|b| serde_json::from_str(&b)).transpose()?)
    }

    fn list(&self) -> Result<Vec<Exception>, StoreError> {
        self.select("SELECT body FROM exceptions ORDER BY requested_at, id", None)
    }

    fn list_in(&self, state: ExceptionState) -> Result<Vec<Exception>, StoreError> {
        self.select(
            "SELECT body FROM exceptions WHERE state = ?1 ORDER BY requested_at, id",
            Some(state.as_str()),
        )
    }

    fn ping(&self) -> Result<(), StoreError> {
        self.conn().query_row("SELECT 1", [], |_| Ok(()))?;
        Ok(())
    }
}

impl SqliteStore {
    /// The exceptions a query selects (its one parameter, if any, bound to `?1`).
    fn select(&self, sql: &str, param: Option<&str>) -> Result<Vec<Exception>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(sql)?;
        let bodies = stmt
            .query_map(rusqlite::params_from_iter(param), |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        // A row that cannot be read is reported and left out: it can then allow nothing
        // (fail closed) and the rest still works.
        Ok(bodies
            .iter()
            .filter_map(|b| match serde_json::from_str(b) {
                Ok(e) => Some(e),
                Err(e) => {
                    tracing::error!(error = %e, "an exception row cannot be read; it is ignored");
                    None
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandgate_policy::ExceptionState;

    fn ex(id: &str) -> Exception {
        Exception {
            id: id.into(),
            task_id: "t-1".into(),
            project_id: None,
            hosts: vec!["pypi.org".into()],
            ports: vec![443],
            ttl_seconds: 60,
            reason: "r".into(),
            requested_by: "agent".into(),
            requested_at: 5,
            state: ExceptionState::Pending,
            decided_by: None,
            decided_at: None,
            note: None,
            expires_at: None,
        }
    }

    #[test]
    fn a_reopened_store_has_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exceptions.sqlite3");
        {
            let store = SqliteStore::open(&path).unwrap();
            store.insert(&ex("a")).unwrap();
            store.insert(&ex("b")).unwrap();
            assert!(matches!(store.insert(&ex("a")), Err(StoreError::Duplicate(_))));
            let mut b = ex("b");
            b.state = ExceptionState::Approved;
            b.expires_at = Some(65);
            store.update(&b).unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        let all = store.list().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(store.get("b").unwrap().unwrap().expires_at, Some(65));
        assert!(store.get("zzz").unwrap().is_none());
        let approved: Vec<String> = store
            .list_in(ExceptionState::Approved)
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(approved, ["b"]);
        assert_eq!(store.list_in(ExceptionState::Pending).unwrap().len(), 1);
        store.ping().unwrap();
    }
}
