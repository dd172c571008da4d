//! The shared database's schema, versioned: numbered migrations, each applied once, in
//! order, in one transaction with the bookkeeping row that records it.
//!
//! Proxies starting at once take a transaction-scoped advisory lock first, so exactly one
//! applies what is missing and the others then find it applied. A database whose schema is
//! newer than the newest migration this binary knows is refused
//! ([`StoreError::NewerSchema`]): an older binary must not write rows it may misread.

use deadpool_postgres::Client;

use super::pg_error;
use crate::store::StoreError;

/// The advisory lock key every sandgate takes while migrating ("sandgate" in ASCII).
const LOCK_KEY: i64 = 0x7361_6e64_6761_7465;

/// The migrations, in order; a migration once released is never edited, only followed.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE sandgate_exceptions (
         id TEXT PRIMARY KEY,
         task_id TEXT NOT NULL,
         state TEXT NOT NULL,
         requested_at BIGINT NOT NULL,
         body TEXT NOT NULL
     );
     CREATE INDEX sandgate_exceptions_task ON sandgate_exceptions (task_id);
     CREATE INDEX sandgate_exceptions_state ON sandgate_exceptions (state, requested_at, id);",
    ),
    // No table changes: from here a row's body may hold `methods`, `paths`, `read_only` and
    // `tweak`. A binary from before them would read such a row as the whole host (or as an
    // exception for no host) and, approving it, write it back without them; the version
    // makes it refuse the database instead (`NewerSchema`).
    (2, "SELECT 1"),
];

/// The schema version this binary writes.
pub fn latest() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

/// Applies the migrations the database lacks; returns how many.
pub async fn apply(client: &mut Client, name: &str) -> Result<usize, StoreError> {
    let err = |e| pg_error(name, e);
    let tx = client.transaction().await.map_err(err)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
        .await
        .map_err(err)?;
    // Created only when missing, so a user without CREATE can run a migrated database.
    let exists: bool = tx
        .query_one("SELECT to_regclass('sandgate_schema_version') IS NOT NULL", &[])
        .await
        .map_err(err)?
        .try_get(0)
        .map_err(err)?;
    if !exists {
        tx.batch_execute(
            "CREATE TABLE sandgate_schema_version (
                 version INTEGER PRIMARY KEY,
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
             )",
        )
        .await
        .map_err(err)?;
    }
    let found: Option<i32> = tx
        .query_one("SELECT max(version) FROM sandgate_schema_version", &[])
        .await
        .map_err(err)?
        .try_get(0)
        .map_err(err)?;
    let found = found.unwrap_or(0);
    if found > latest() {
        return Err(StoreError::NewerSchema {
            found,
            supported: latest(),
        });
    }
    let mut applied = 0;
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > found) {
        tx.batch_execute(sql).await.map_err(err)?;
        tx.execute(
            "INSERT INTO sandgate_schema_version (version) VALUES ($1)",
            &[version],
        )
        .await
        .map_err(err)?;
        applied += 1;
    }
    tx.commit().await.map_err(err)?;
    if applied > 0 {
        tracing::info!(
            store = name,
            from = found,
            to = latest(),
            "exception store schema migrated"
        );
    }
    Ok(applied)
}
