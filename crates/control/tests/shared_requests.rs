//! Identical requests filed at the same instant through several proxies that share one
//! PostgreSQL database (real PostgreSQL, one database on the run's shared cluster, see
//! sandgate-testkit's `pg`): one pending row, and every answer is that row. Each service has
//! its own store and its own lock, as separate proxies do, so only the store can keep the
//! second row out. Also the store call itself, on both stores.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "tests"
)]

use std::sync::Arc;

use sandgate_control::{Control, ExceptionStore, PgStore, SqliteStore};
use sandgate_policy::exception::Enablement;
use sandgate_policy::{
    AddressGuard, Exception, ExceptionPolicy, ExceptionState, NewRequest, Principal, Principals, Role,
    Ruleset, Scope,
};
use sandgate_proxy::{AuditDestination, AuditOptions, Limits, Listener, Nameservers, Proxy, ProxyConfig};
use sandgate_testkit::pg::{TestDb, shared_host};

/// A proxy (for the rules a service publishes to) and a control plane on `store`.
async fn service(store: Arc<dyn ExceptionStore>, dir: &std::path::Path, n: usize) -> (Proxy, Arc<Control>) {
    let proxy = Proxy::bind(ProxyConfig {
        listen: vec![Listener::system("127.0.0.1:0".parse().unwrap())],
        rules: Ruleset::new(),
        guard: AddressGuard::default(),
        nameservers: Nameservers::Explicit(vec!["127.0.0.1:9".parse().unwrap()]),
        audit: AuditDestination::File(dir.join(format!("audit-{n}.jsonl"))),
        limits: Limits::default(),
        audit_options: AuditOptions::default(),
        metrics_listen: None,
        remedies: Default::default(),
        connector: Default::default(),
    })
    .await
    .unwrap();
    let policy = ExceptionPolicy {
        enabled: vec![Enablement {
            scope: Scope::Task("t-1".into()),
            ports: vec![443],
            max_ttl_seconds: 600,
        }],
    };
    let control = Control::start(
        store,
        policy,
        Default::default(),
        proxy.policy_handle(),
        Arc::new(|| 1_000_000),
    )
    .await
    .unwrap();
    (proxy, Arc::new(control))
}

fn agent() -> Principal {
    let hash = sandgate_policy::auth::secret_hash("agent");
    let all = Principals::new(vec![(
        "agent".to_owned(),
        Role::Requester,
        hash,
        vec!["t-1".to_owned()],
    )])
    .unwrap();
    all.verify_bearer("agent").cloned().unwrap()
}

fn ask(host: &str) -> NewRequest {
    NewRequest {
        task_id: "t-1".into(),
        requested_hosts: vec![host.to_owned()],
        requested_ports: Some(vec![443]),
        ttl_seconds: 300,
        reason: "pip install".into(),
        ..NewRequest::default()
    }
}

/// Proxies on one database: for each of several asks, every proxy files it at once (after
/// a barrier), several times over. Each ask leaves exactly one pending row, and every answer
/// names it. (Checked, then inserted in separate statements, about one ask in two left two
/// or more rows here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identical_requests_through_proxies_sharing_postgresql_file_one_row() {
    const PROXIES: usize = 4;
    const ASKS: usize = 12;
    const EACH: usize = 2;
    let db = TestDb::create(&shared_host());
    let dir = tempfile::tempdir().unwrap();
    let mut services = Vec::new();
    for n in 0..PROXIES {
        let store: Arc<dyn ExceptionStore> = Arc::new(PgStore::connect(&db.url(), None).await.unwrap());
        services.push(service(store, dir.path(), n).await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(PROXIES * EACH));
    let mut answers: Vec<Vec<String>> = vec![Vec::new(); ASKS];
    for (i, answered) in answers.iter_mut().enumerate() {
        let host = format!("h{i}.example");
        let mut filing = Vec::new();
        for (_, control) in &services {
            for _ in 0..EACH {
                let (control, barrier, host) = (control.clone(), barrier.clone(), host.clone());
                filing.push(tokio::spawn(async move {
                    barrier.wait().await;
                    control.request(&agent(), ask(&host)).await
                }));
            }
        }
        for f in filing {
            answered.push(f.await.unwrap().unwrap().exception().id.clone());
        }
    }
    let store = PgStore::connect(&db.url(), None).await.unwrap();
    let pending = store.list_in(ExceptionState::Pending).await.unwrap();
    let mut rows_per_ask = Vec::new();
    for (i, answered) in answers.iter().enumerate() {
        let host = format!("h{i}.example");
        let rows: Vec<&str> = pending
            .iter()
            .filter(|e| e.hosts == [host.clone()])
            .map(|e| e.id.as_str())
            .collect();
        rows_per_ask.push(rows.len());
        if rows.len() == 1 {
            assert!(
                answered.iter().all(|a| a == rows[0]),
                "{host}: {answered:?} {rows:?}"
            );
        }
    }
    assert_eq!(rows_per_ask, [1; ASKS], "pending rows per ask");
    drop(services);
}

fn pending_ex(id: &str, host: &str) -> Exception {
    Exception {
        id: id.into(),
        task_id: "t-1".into(),
        project_id: None,
        hosts: vec![host.into()],
        ports: vec![443],
        ttl_seconds: 60,
        reason: "r".into(),
        requested_by: "agent".into(),
        requested_at: 1,
        state: ExceptionState::Pending,
        decided_by: None,
        decided_at: None,
        note: None,
        expires_at: None,
        below: Default::default(),
        tweak: None,
    }
}

fn same_hosts(a: &Exception, b: &Exception) -> bool {
    a.task_id == b.task_id && a.hosts == b.hosts
}

/// The store call on its own: a pending row `same` as the new one is returned and nothing
/// is added; a row that is not the same, or not pending, does not count.
async fn insert_pending_unless_contract(store: &dyn ExceptionStore) {
    assert_eq!(
        store
            .insert_pending_unless(&pending_ex("a", "x.example"), same_hosts)
            .await
            .unwrap(),
        None
    );
    let found = store
        .insert_pending_unless(&pending_ex("b", "x.example"), same_hosts)
        .await
        .unwrap();
    assert_eq!(found.map(|e| e.id), Some("a".to_owned()));
    assert!(store.get("b").await.unwrap().is_none());
    assert_eq!(
        store
            .insert_pending_unless(&pending_ex("c", "y.example"), same_hosts)
            .await
            .unwrap(),
        None
    );
    let mut denied = pending_ex("a", "x.example");
    denied.state = ExceptionState::Denied;
    store.transition(&denied, ExceptionState::Pending).await.unwrap();
    assert_eq!(
        store
            .insert_pending_unless(&pending_ex("d", "x.example"), same_hosts)
            .await
            .unwrap(),
        None,
        "a decided row is no pending request"
    );
    let ids: Vec<String> = store.list().await.unwrap().into_iter().map(|e| e.id).collect();
    assert_eq!(ids, ["a", "c", "d"]);
}

#[tokio::test]
async fn sqlite_inserts_a_pending_request_unless_the_same_is_pending() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("x.sqlite3")).unwrap();
    insert_pending_unless_contract(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_inserts_a_pending_request_unless_the_same_is_pending() {
    let db = TestDb::create(&shared_host());
    let store = PgStore::connect(&db.url(), None).await.unwrap();
    insert_pending_unless_contract(&store).await;
}
