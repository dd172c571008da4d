//! Filing requests against a real store (SQLite, and PostgreSQL on the run's cluster): an
//! identical pending request or a covering active exception is returned instead of a new
//! row, an agent's flood of duplicates leaves one row, and an approver's one-step allow stays
//! within the policy's bounds and the roles.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "tests"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use sandgate_policy::exception::Enablement;
use sandgate_policy::{
    AddressGuard, ExceptionPolicy, ExceptionState, NewRequest, Principal, Principals, RequestError, Role,
    Ruleset, Scope,
};
use sandgate_proxy::{AuditDestination, AuditOptions, Limits, Listener, Nameservers, Proxy, ProxyConfig};

use super::Filed;
use crate::service::{Control, ControlError};
use crate::store::{ExceptionStore, PgStore, SqliteStore};

struct Fixture {
    control: Arc<Control>,
    store: Arc<dyn ExceptionStore>,
    clock: Arc<AtomicI64>,
    _proxy: Proxy,
    _dir: tempfile::TempDir,
}

/// Exceptions enabled for task t-1 on ports 443 and 8443, for at most 600 s.
async fn fixture(store: Option<Arc<dyn ExceptionStore>>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::bind(ProxyConfig {
        listen: vec![Listener::system("127.0.0.1:0".parse().unwrap())],
        rules: Ruleset::new(),
        guard: AddressGuard::default(),
        nameservers: Nameservers::Explicit(vec!["127.0.0.1:9".parse().unwrap()]),
        audit: AuditDestination::File(dir.path().join("audit.jsonl")),
        limits: Limits::default(),
        audit_options: AuditOptions::default(),
        metrics_listen: None,
        remedies: Default::default(),
        connector: Default::default(),
    })
    .await
    .unwrap();
    let store = match store {
        Some(s) => s,
        None => Arc::new(SqliteStore::open(&dir.path().join("x.sqlite3")).unwrap()),
    };
    let policy = ExceptionPolicy {
        enabled: vec![Enablement {
            scope: Scope::Task("t-1".into()),
            ports: vec![443, 8443],
            max_ttl_seconds: 600,
        }],
    };
    let clock = Arc::new(AtomicI64::new(1_000_000));
    let now = clock.clone();
    let control = Control::start(
        store.clone(),
        policy,
        Default::default(),
        proxy.policy_handle(),
        Arc::new(move || now.load(Ordering::Relaxed)),
    )
    .await
    .unwrap();
    Fixture {
        control: Arc::new(control),
        store,
        clock,
        _proxy: proxy,
        _dir: dir,
    }
}

fn who(name: &str) -> Principal {
    let role = match name {
        "agent" | "agent-2" => Role::Requester,
        "alice" | "bob" => Role::Approver,
        _ => Role::Viewer,
    };
    let hash = sandgate_policy::auth::secret_hash(name);
    let all = Principals::new(vec![(name.to_owned(), role, hash, vec!["t-1".to_owned()])]).unwrap();
    all.verify_bearer(name).cloned().unwrap()
}

fn ask(hosts: &[&str], ports: &[u16]) -> NewRequest {
    NewRequest {
        task_id: "t-1".into(),
        project_id: None,
        requested_hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        requested_ports: Some(ports.to_vec()),
        ttl_seconds: 300,
        reason: "pip install".into(),
        ..NewRequest::default()
    }
}

async fn pending(f: &Fixture) -> Vec<String> {
    let rows = f.store.list_in(ExceptionState::Pending).await.unwrap();
    rows.into_iter().map(|e| e.id).collect()
}

/// An agent fires 50 identical requests, 40 of them at once: one row is pending, and every
/// answer is that row. (Without the check, each request filed a row of its own: 50 pending
/// requests for the approver to pick from.)
async fn a_flood_of_duplicates_files_one_row(f: &Fixture) {
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let control = f.control.clone();
        tasks.push(tokio::spawn(async move {
            control.request(&who("agent"), ask(&["pypi.org"], &[443])).await
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap().unwrap());
    }
    for _ in 0..10 {
        answers.push(
            f.control
                .request(&who("agent"), ask(&["pypi.org"], &[443]))
                .await
                .unwrap(),
        );
    }
    let rows = pending(f).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(answers.iter().filter(|a| a.is_new()).count(), 1);
    assert!(
        answers.iter().all(|a| a.exception().id == rows[0]),
        "every answer is the one pending row"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_duplicate_requests_leave_one_pending_row() {
    let f = fixture(None).await;
    a_flood_of_duplicates_files_one_row(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_duplicate_requests_leave_one_pending_row_in_postgresql() {
    let db = sandgate_testkit::pg::TestDb::create(&sandgate_testkit::pg::shared_host());
    let store: Arc<dyn ExceptionStore> = Arc::new(PgStore::connect(&db.url(), None).await.unwrap());
    let f = fixture(Some(store)).await;
    a_flood_of_duplicates_files_one_row(&f).await;
}

/// The same task, hosts and ports (in any order, whatever the TTL and reason, whoever asks)
/// is the same request; another host set or port set is another.
#[tokio::test]
async fn identical_means_task_hosts_and_ports_as_sets() {
    let f = fixture(None).await;
    let first = f
        .control
        .request(&who("agent"), ask(&["b.example", "a.example"], &[443, 8443]))
        .await
        .unwrap();
    assert!(first.is_new());
    let mut again = ask(&["A.example", "b.example", "a.example"], &[8443, 443]);
    again.ttl_seconds = 60;
    again.reason = "once more".into();
    let same = f.control.request(&who("agent-2"), again).await.unwrap();
    assert_eq!(same, Filed::Pending(first.exception().clone()));
    for other in [
        ask(&["a.example"], &[443, 8443]),
        ask(&["a.example", "b.example"], &[443]),
        ask(&["a.example", "b.example", "c.example"], &[443, 8443]),
    ] {
        assert!(f.control.request(&who("agent"), other).await.unwrap().is_new());
    }
    assert_eq!(pending(&f).await.len(), 4);
}

/// A request covered by an exception active now returns it; once it is over (denied,
/// revoked or expired), the same request is filed again.
#[tokio::test]
async fn an_active_exception_answers_what_it_covers() {
    let f = fixture(None).await;
    let filed = f
        .control
        .request(&who("agent"), ask(&["a.example", "b.example"], &[443, 8443]))
        .await
        .unwrap();
    let id = filed.exception().id.clone();
    f.control
        .approve(&who("alice"), &id, &Default::default())
        .await
        .unwrap();
    for covered in [
        ask(&["a.example"], &[443]),
        ask(&["b.example", "a.example"], &[8443, 443]),
    ] {
        match f.control.request(&who("agent"), covered).await.unwrap() {
            Filed::Active(ex) => assert_eq!(
                (ex.id.as_str(), ex.state),
                (id.as_str(), ExceptionState::Approved)
            ),
            other => panic!("{other:?}"),
        }
    }
    let wider = f
        .control
        .request(&who("agent"), ask(&["a.example", "c.example"], &[443]))
        .await
        .unwrap();
    assert!(wider.is_new(), "{wider:?}");
    // At its expiry second it covers nothing.
    f.clock.fetch_add(300, Ordering::Relaxed);
    let after = f
        .control
        .request(&who("agent"), ask(&["a.example"], &[443]))
        .await
        .unwrap();
    assert!(after.is_new(), "{after:?}");
    // A denied request does not answer the next one.
    f.control
        .deny(&who("alice"), &after.exception().id, Some("no".into()))
        .await
        .unwrap();
    assert!(
        f.control
            .request(&who("agent"), ask(&["a.example"], &[443]))
            .await
            .unwrap()
            .is_new()
    );
}

/// The bounds are checked before anything stored answers: a request the policy refuses is
/// refused, even when an identical one is pending from before.
#[tokio::test]
async fn a_request_out_of_bounds_is_refused_not_deduplicated() {
    let f = fixture(None).await;
    f.control
        .request(&who("agent"), ask(&["a.example"], &[443]))
        .await
        .unwrap();
    let mut long = ask(&["a.example"], &[443]);
    long.ttl_seconds = 601;
    let err = f.control.request(&who("agent"), long).await.unwrap_err();
    assert!(
        matches!(err, ControlError::Request(RequestError::TtlTooLong { .. })),
        "{err}"
    );
}

/// An approver's one-step allow: approved at once, requested and decided by that approver,
/// active for its TTL, the rules updated; asked again, the same exception answers.
#[tokio::test]
async fn an_approver_allows_in_one_step() {
    let f = fixture(None).await;
    let mut req = ask(&["web.example"], &[8443]);
    req.ttl_seconds = 120;
    let allowed = f.control.allow(&who("alice"), req.clone()).await.unwrap();
    let Filed::New(ex) = &allowed else {
        panic!("{allowed:?}")
    };
    assert_eq!(ex.state, ExceptionState::Approved);
    assert_eq!(ex.requested_by, "alice");
    assert_eq!(ex.decided_by.as_deref(), Some("alice"));
    assert_eq!(ex.expires_at, Some(1_000_000 + 120));
    assert_eq!(f.store.get(&ex.id).await.unwrap().as_ref(), Some(ex));
    assert!(pending(&f).await.is_empty(), "no pending row was ever stored");
    let known = f.control.known.known();
    assert_eq!(known, vec![ex.clone()], "published to the rules");
    match f.control.allow(&who("bob"), req).await.unwrap() {
        Filed::Active(again) => assert_eq!(again.id, ex.id),
        other => panic!("{other:?}"),
    }
}

/// As attackers: a viewer and a requester cannot allow; a port, a TTL, a task or a host the
/// bounds do not allow is refused with the rule, and nothing is stored.
#[tokio::test]
async fn a_one_step_allow_stays_within_roles_and_bounds() {
    let f = fixture(None).await;
    for name in ["victor", "agent"] {
        let err = f
            .control
            .allow(&who(name), ask(&["web.example"], &[443]))
            .await
            .unwrap_err();
        assert!(matches!(err, ControlError::Forbidden(_)), "{name}: {err}");
    }
    let mut long = ask(&["web.example"], &[443]);
    long.ttl_seconds = 3600;
    let mut elsewhere = ask(&["web.example"], &[443]);
    elsewhere.task_id = "t-2".into();
    let refused = [
        (ask(&["web.example"], &[8080]), "port 8080 is not allowed"),
        (long, "over the limit of 600"),
        (elsewhere, "not enabled for task \"t-2\""),
        (ask(&["10.0.0.1"], &[443]), "no IP literal"),
        (ask(&["*.example"], &[443]), "no wildcard"),
    ];
    for (req, why) in refused {
        let err = f.control.allow(&who("alice"), req).await.unwrap_err();
        assert!(err.to_string().contains(why), "{err}");
    }
    assert!(f.store.list().await.unwrap().is_empty());
}

fn tweak_ask(sandbox: &str, max_seconds: u64, network: bool) -> NewRequest {
    NewRequest {
        task_id: "t-1".into(),
        ttl_seconds: 300,
        reason: "the suite takes ten minutes".into(),
        tweak: Some(sandgate_policy::exception::Tweak {
            sandbox: sandbox.into(),
            max_seconds: Some(max_seconds),
            network,
            ..Default::default()
        }),
        ..NewRequest::default()
    }
}

/// A tweak is filed like hosts: the same tweak again returns the pending row, another
/// tweak (or hosts) is another row; a requester cannot approve it; once approved it answers
/// every tweak within it for its sandbox, and nothing else: not a larger one, not another
/// sandbox's, not a request for hosts. It publishes no network entry.
#[tokio::test]
async fn tweaks_are_filed_deduplicated_and_covered_only_by_tweaks_within() {
    let f = fixture(None).await;
    let first = f
        .control
        .request(&who("agent"), tweak_ask("web", 600, false))
        .await
        .unwrap();
    assert!(first.is_new());
    let id = first.exception().id.clone();
    assert!(first.exception().hosts.is_empty());
    let mut again = tweak_ask("web", 600, false);
    again.reason = "still".into();
    assert_eq!(
        f.control.request(&who("agent-2"), again).await.unwrap(),
        Filed::Pending(first.exception().clone())
    );
    for other in [
        tweak_ask("web", 601, false),
        tweak_ask("db", 600, false),
        tweak_ask("web", 600, true),
    ] {
        assert!(f.control.request(&who("agent"), other).await.unwrap().is_new());
    }
    // The requester's token cannot decide, its own request included.
    let err = f
        .control
        .approve(&who("agent"), &id, &Default::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ControlError::Forbidden(_)), "{err}");
    f.control
        .approve(&who("alice"), &id, &Default::default())
        .await
        .unwrap();
    assert!(
        f.control.known.known().iter().all(|e| e.entries().is_empty()),
        "a tweak opens nothing on the network"
    );
    match f
        .control
        .request(&who("agent"), tweak_ask("web", 300, false))
        .await
        .unwrap()
    {
        Filed::Active(ex) => assert_eq!(ex.id, id),
        other => panic!("{other:?}"),
    }
    for not_covered in [tweak_ask("web", 900, false), tweak_ask("db", 60, false)] {
        let filed = f.control.request(&who("agent"), not_covered).await.unwrap();
        assert!(!matches!(filed, Filed::Active(_)), "{filed:?}");
    }
    assert!(
        f.control
            .request(&who("agent"), ask(&["a.example"], &[443]))
            .await
            .unwrap()
            .is_new(),
        "a tweak never answers a request for hosts"
    );
    // A request for hosts and a tweak in one is refused.
    let mut both = tweak_ask("web", 60, false);
    both.requested_hosts = vec!["a.example".into()];
    let err = f.control.request(&who("agent"), both).await.unwrap_err();
    assert!(
        matches!(err, ControlError::Request(RequestError::TweakWithHosts)),
        "{err}"
    );
}

/// Listing by state reads the store by state, and says what filtering the whole history
/// would: every state, with an approved exception past its expiry listed as `expired` and
/// never as `approved`.
#[tokio::test]
async fn listing_by_state_agrees_with_the_whole_history() {
    let f = fixture(None).await;
    let mut ids = Vec::new();
    for host in ["a.example", "b.example", "c.example", "d.example", "e.example"] {
        let filed = f
            .control
            .request(&who("agent"), ask(&[host], &[443]))
            .await
            .unwrap();
        ids.push(filed.exception().id.clone());
    }
    let alice = who("alice");
    for id in &ids[1..4] {
        f.control.approve(&alice, id, &Default::default()).await.unwrap();
    }
    f.control.revoke(&alice, &ids[2], None).await.unwrap();
    f.control.deny(&alice, &ids[4], None).await.unwrap();
    // ids[1] and ids[3] are approved for 300 s; past it, expired though stored approved.
    let states =
        |all: &[sandgate_policy::Exception]| all.iter().map(|e| (e.id.clone(), e.state)).collect::<Vec<_>>();
    for at in [0, 301] {
        f.clock.fetch_add(at, Ordering::Relaxed);
        let viewer = who("viewer");
        let all = f.control.list(&viewer).await.unwrap();
        for state in [
            ExceptionState::Pending,
            ExceptionState::Approved,
            ExceptionState::Denied,
            ExceptionState::Revoked,
            ExceptionState::Expired,
        ] {
            let wanted: Vec<_> = all.iter().filter(|e| e.state == state).cloned().collect();
            let listed = f.control.list_in(&viewer, state).await.unwrap();
            assert_eq!(states(&listed), states(&wanted), "{state} at +{at}s");
        }
        let approved = f
            .control
            .list_in(&viewer, ExceptionState::Approved)
            .await
            .unwrap();
        let expired = f.control.list_in(&viewer, ExceptionState::Expired).await.unwrap();
        let (now_approved, now_expired) = if at == 0 { (2, 0) } else { (0, 2) };
        assert_eq!(
            (approved.len(), expired.len()),
            (now_approved, now_expired),
            "+{at}s"
        );
    }
}
