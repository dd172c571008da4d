//! The store interface's contract, held by both stores: SQLite and real PostgreSQL (one
//! database per test on the run's shared cluster, see sandgate-testkit's `pg`). Conditional
//! transitions (a stale or concurrent writer loses, so a change is made once), migrations
//! applied by several proxies at once, a newer schema refused, notifications that only
//! wake (a forged payload is never read as data), and rows of an older version (Unix-second
//! times) read while a row with a broken time is left out.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "tests"
)]

use std::sync::Arc;
use std::time::Duration;

use sandgate_control::store::postgres::migrate;
use sandgate_control::{ExceptionStore, PgStore, SqliteStore, StoreError};
use sandgate_policy::{Exception, ExceptionState};
use sandgate_testkit::pg::{TestDb, shared_host};

fn ex(id: &str, requested_at: i64) -> Exception {
    Exception {
        id: id.into(),
        task_id: "t-1".into(),
        project_id: None,
        hosts: vec!["pypi.org".into()],
        ports: vec![443],
        ttl_seconds: 60,
        reason: "r".into(),
        requested_by: "agent".into(),
        requested_at,
        state: ExceptionState::Pending,
        decided_by: None,
        decided_at: None,
        note: None,
        expires_at: None,
        below: Default::default(),
        tweak: None,
    }
}

async fn contract(store: &dyn ExceptionStore) {
    store.insert(&ex("b", 2)).await.unwrap();
    store.insert(&ex("a", 1)).await.unwrap();
    assert!(matches!(
        store.insert(&ex("a", 1)).await,
        Err(StoreError::Duplicate(_))
    ));
    let mut a = ex("a", 1);
    a.state = ExceptionState::Approved;
    a.expires_at = Some(61);
    store.transition(&a, ExceptionState::Pending).await.unwrap();
    // A second writer that read "pending" too (another proxy, or a stale read) loses, and
    // what the first stored stays.
    let mut denied = ex("a", 1);
    denied.state = ExceptionState::Denied;
    assert!(matches!(
        store.transition(&denied, ExceptionState::Pending).await,
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(store.get("a").await.unwrap().unwrap(), a);
    assert!(store.get("zzz").await.unwrap().is_none());
    let ids = |v: Vec<Exception>| v.into_iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(ids(store.list().await.unwrap()), ["a", "b"], "oldest first");
    assert_eq!(ids(store.list_in(ExceptionState::Approved).await.unwrap()), ["a"]);
    assert_eq!(ids(store.list_in(ExceptionState::Pending).await.unwrap()), ["b"]);
    store.ping().await.unwrap();
}

#[tokio::test]
async fn sqlite_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    contract(&store).await;
    assert!(store.changed().is_none(), "one proxy's own store needs no wake");
    drop(store);
    // Every change is on disk: a reopened store has it.
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.list().await.unwrap().len(), 2);
    assert_eq!(store.get("a").await.unwrap().unwrap().expires_at, Some(61));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_contract() {
    let db = TestDb::create(&shared_host());
    let store = PgStore::connect(&db.url(), None).await.unwrap();
    contract(&store).await;
    assert!(
        store.describe().starts_with("postgresql host="),
        "{}",
        store.describe()
    );
    assert!(!store.describe().contains("password"));
}

/// An approved exception as a version before RFC 3339 times stored it (Unix seconds), and
/// the same with an expiry that is no time at all (a hand edit, a forgery).
const OLD_ROW: &str = r#"{"id":"old","task_id":"t-1","project_id":null,"hosts":["pypi.org"],"ports":[443],"ttl_seconds":60,"reason":"r","requested_by":"agent","requested_at":1795741323,"state":"approved","decided_by":"alice","decided_at":1795741383,"note":null,"expires_at":1795741443}"#;
const BAD_ROW: &str = r#"{"id":"bad","task_id":"t-1","project_id":null,"hosts":["evil.test"],"ports":[443],"ttl_seconds":60,"reason":"r","requested_by":"agent","requested_at":1,"state":"approved","decided_by":"alice","decided_at":1,"note":null,"expires_at":"forever"}"#;

/// Rows stored before times were RFC 3339 still read as the same exception; a row whose
/// time is not a time is left out (it allows nothing) and the others still read; what is
/// stored now says its times in RFC 3339. `sql` runs SQL on the store's database, `table`
/// is its exceptions table.
async fn old_and_broken_rows(store: &dyn ExceptionStore, table: &str, sql: impl Fn(&str) -> String) {
    store.insert(&ex("new", 1)).await.unwrap();
    sql(&format!(
        "INSERT INTO {table} (id, task_id, state, requested_at, body) VALUES \
         ('old', 't-1', 'approved', 1795741323, '{OLD_ROW}'), ('bad', 't-1', 'approved', 1, '{BAD_ROW}')"
    ));
    let old = store.get("old").await.unwrap().unwrap();
    assert_eq!(
        (old.requested_at, old.decided_at, old.expires_at),
        (1_795_741_323, Some(1_795_741_383), Some(1_795_741_443))
    );
    assert!(old.is_active(1_795_741_442) && !old.is_active(1_795_741_443));
    assert!(
        !matches!(store.get("bad").await, Ok(Some(_))),
        "a broken row is no exception"
    );
    let ids = |v: Vec<Exception>| v.into_iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(ids(store.list().await.unwrap()), ["new", "old"]);
    assert_eq!(
        ids(store.list_in(ExceptionState::Approved).await.unwrap()),
        ["old"]
    );
    let body = sql(&format!("SELECT body FROM {table} WHERE id = 'new'"));
    assert!(
        body.contains(r#""requested_at":"1970-01-01T00:00:01Z""#),
        "{body}"
    );
    // A transition rewrites an old row in the new form.
    let mut revoked = old.clone();
    revoked.state = ExceptionState::Revoked;
    store
        .transition(&revoked, ExceptionState::Approved)
        .await
        .unwrap();
    let body = sql(&format!("SELECT body FROM {table} WHERE id = 'old'"));
    assert!(body.contains(r#""expires_at":"2026-11-27T01:04:03Z""#), "{body}");
    assert_eq!(store.get("old").await.unwrap().unwrap(), revoked);
}

#[tokio::test]
async fn sqlite_reads_old_rows_and_leaves_broken_ones_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    let sql = |q: &str| {
        let conn = rusqlite::Connection::open(&path).unwrap();
        if q.starts_with("SELECT") {
            conn.query_row(q, [], |r| r.get::<_, String>(0)).unwrap()
        } else {
            conn.execute_batch(q).unwrap();
            String::new()
        }
    };
    old_and_broken_rows(&store, "exceptions", sql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reads_old_rows_and_leaves_broken_ones_out() {
    let db = TestDb::create(&shared_host());
    let store = PgStore::connect(&db.url(), None).await.unwrap();
    old_and_broken_rows(&store, "sandgate_exceptions", |q| db.sql(q).unwrap()).await;
}

/// Proxies expiring (or revoking) the same exception at the same moment: exactly one
/// change is stored, so exactly one proxy records it. With an unconditional update every
/// writer "wins" and the change is recorded once per proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_transitions_of_one_exception_store_it_once() {
    let db = TestDb::create(&shared_host());
    let url = db.url();
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(PgStore::connect(&url, None).await.unwrap()));
    }
    let mut approved = ex("x", 1);
    approved.state = ExceptionState::Approved;
    approved.expires_at = Some(61);
    stores[0].insert(&ex("x", 1)).await.unwrap();
    stores[0]
        .transition(&approved, ExceptionState::Pending)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let store = store.clone();
        let mut ended = approved.clone();
        ended.state = if i % 2 == 0 {
            ExceptionState::Expired
        } else {
            ExceptionState::Revoked
        };
        tasks.push(tokio::spawn(async move {
            store.transition(&ended, ExceptionState::Approved).await
        }));
    }
    let mut won = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => won += 1,
            Err(StoreError::Conflict { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(won, 1, "exactly one proxy's change is stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_applied_by_proxies_starting_at_once_do_not_fail() {
    let db = TestDb::create(&shared_host());
    let url = db.url();
    let starts: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PgStore::connect(&url, None).await })
        })
        .collect();
    for s in starts {
        s.await.unwrap().unwrap();
    }
    let versions = db
        .sql("SELECT count(*), max(version) FROM sandgate_schema_version")
        .unwrap();
    assert_eq!(versions, format!("{}|{}", migrate::latest(), migrate::latest()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_with_a_newer_schema_is_refused() {
    let db = TestDb::create(&shared_host());
    drop(PgStore::connect(&db.url(), None).await.unwrap());
    db.sql("INSERT INTO sandgate_schema_version (version) VALUES (999)")
        .unwrap();
    let err = PgStore::connect(&db.url(), None).await.unwrap_err();
    assert!(matches!(err, StoreError::NewerSchema { found: 999, .. }), "{err}");
    assert!(err.to_string().contains("upgrade sandgate"), "{err}");
}

/// A change through one store wakes the other within a second; a notification forged by
/// someone with access to the database wakes it too, but carries nothing it would believe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_wakes_the_other_stores_and_a_forged_notification_is_only_a_wake() {
    let db = TestDb::create(&shared_host());
    let a = PgStore::connect(&db.url(), None).await.unwrap();
    let b = PgStore::connect(&db.url(), None).await.unwrap();
    let woken = b.changed().unwrap();
    // The first wakes come from the listening connection being made; let them pass.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while tokio::time::timeout(Duration::from_millis(50), woken.notified())
        .await
        .is_ok()
    {}
    a.insert(&ex("n", 1)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), woken.notified())
        .await
        .expect("woken within a second");
    let forged =
        r#"{"id":"evil","state":"approved","hosts":["evil.test"],"ports":[443],"expires_at":4102444800}"#;
    db.sql(&format!("NOTIFY sandgate_exceptions, '{forged}'"))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(1), woken.notified())
        .await
        .expect("a forged notification wakes, nothing more");
    assert!(b.list_in(ExceptionState::Approved).await.unwrap().is_empty());
    assert!(b.get("evil").await.unwrap().is_none());
}

/// sandgate resolves no name with the system resolver, so a database host must be an
/// address or a socket directory (or carry `hostaddr`); a name is a configuration error.
#[tokio::test]
async fn a_database_host_name_is_refused_without_a_lookup() {
    let err = PgStore::connect("postgres://sandgate@db.example/sandgate", None)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
    assert!(err.to_string().contains("hostaddr"), "{err}");
    let err = PgStore::connect("not a url ===", None).await.unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
}

/// Over the network the store speaks TLS, verified against `--state-ca`: a database whose
/// certificate another CA signed (an impostor on the path) is refused, and a connection
/// string that asks for TLS without a CA, or a CA with `sslmode=disable` or a Unix socket,
/// is a configuration error rather than a plain connection.
#[tokio::test]
async fn tls_to_the_database_is_verified_against_the_given_ca() {
    let server = sandgate_testkit::tls::TestCa::new(&["127.0.0.1"]);
    let cluster = sandgate_testkit::pg::PgCluster::private_tls(&server.leaf_pem, &server.leaf_key_pem);
    let db = TestDb::create_at(&cluster.host(), cluster.port);
    let dir = tempfile::tempdir().unwrap();
    let (ca, other) = (dir.path().join("ca.pem"), dir.path().join("other.pem"));
    std::fs::write(&ca, &server.ca_pem).unwrap();
    std::fs::write(&other, sandgate_testkit::tls::TestCa::new(&["127.0.0.1"]).ca_pem).unwrap();
    let url = format!(
        "postgresql://{}@127.0.0.1:{}/{}",
        sandgate_testkit::pg::PG_USER,
        cluster.port,
        db.name
    );

    let store = PgStore::connect(&url, Some(&ca)).await.unwrap();
    store.insert(&ex("over-tls", 1)).await.unwrap();
    assert!(store.get("over-tls").await.unwrap().is_some());
    let ssl = db
        .sql("SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE ssl AND application_name = 'sandgate'")
        .unwrap();
    assert_ne!(ssl, "0", "the store's connections are not TLS");
    drop(store);

    let err = PgStore::connect(&url, Some(&other)).await.unwrap_err();
    assert!(!matches!(err, StoreError::Config(_)), "{err}");
    let err = PgStore::connect(&format!("{url}?sslmode=require"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Config(m) if m.contains("--state-ca")),
        "{err}"
    );
    let err = PgStore::connect(&format!("{url}?sslmode=disable"), Some(&ca))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
    let err = PgStore::connect(&db.url(), Some(&ca)).await.unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
}
