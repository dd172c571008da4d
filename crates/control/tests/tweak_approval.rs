//! An approver narrows a tweak, through the admin API and the approvals page's form, against
//! the real router, a SQLite store and the proxy's audit trail: what is granted is what is
//! stored, listed (to a follower too, which is what a run applies) and recorded. As
//! attackers: an approval that widens any field of a tweak, or gives a tweak to an exception
//! for hosts, is refused with 400 naming the field, and changes nothing; a viewer, a follower
//! and the requester cannot approve one, narrowed or not.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "tests"
)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, StatusCode, header};
use sandgate_control::{ApiState, Control, SqliteStore};
use sandgate_policy::exception::Enablement;
use sandgate_policy::{AddressGuard, ExceptionPolicy, Principals, Role, Ruleset, Scope};
use sandgate_proxy::audit::{Line, Stamped};
use sandgate_proxy::{AuditDestination, AuditOptions, Limits, Listener, Nameservers, Proxy, ProxyConfig};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tower::ServiceExt as _;

struct Fixture {
    app: Router,
    audit: broadcast::Receiver<Arc<Stamped>>,
    _proxy: Proxy,
    _dir: tempfile::TempDir,
}

/// Task t-1 may ask (port 443, at most 600 s); tokens for an agent, an approver, a viewer
/// and a follower.
async fn fixture() -> Fixture {
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
    let handle = proxy.policy_handle();
    let store = SqliteStore::open(&dir.path().join("x.sqlite3")).unwrap();
    let policy = ExceptionPolicy {
        enabled: vec![Enablement {
            scope: Scope::Task("t-1".into()),
            ports: vec![443],
            max_ttl_seconds: 600,
        }],
    };
    let control = Control::start(
        Arc::new(store),
        policy,
        Default::default(),
        handle.clone(),
        Arc::new(|| 1_000_000),
    )
    .await
    .unwrap();
    let token = |name: &str, role: Role, tasks: &[&str]| {
        (
            name.to_owned(),
            role,
            sandgate_policy::auth::secret_hash(&format!("tok-{name}")),
            tasks.iter().map(|t| (*t).to_owned()).collect(),
        )
    };
    let principals = Principals::new(vec![
        token("agent", Role::Requester, &["t-1"]),
        token("alice", Role::Approver, &[]),
        token("victor", Role::Viewer, &[]),
        token("follow", Role::Follower, &[]),
    ])
    .unwrap();
    let audit = handle.subscribe();
    let state = Arc::new(ApiState {
        control,
        principals,
        proxy: handle,
        sessions: Default::default(),
        throttle: Default::default(),
    });
    let app = sandgate_control::router(state).layer(MockConnectInfo(SocketAddr::from(([127, 0, 0, 1], 1))));
    Fixture {
        app,
        audit,
        _proxy: proxy,
        _dir: dir,
    }
}

impl Fixture {
    /// An API call with `name`'s token: (status, JSON answer).
    async fn api(&self, method: &str, path: &str, name: &str, body: Option<Value>) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer tok-{name}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        self.send(request).await
    }

    async fn send(&self, request: Request<Body>) -> (StatusCode, Value) {
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// The agent files a tweak request; its id.
    async fn ask(&self, tweak: Value) -> String {
        let body = json!({"task_id": "t-1", "requested_hosts": [], "ttl_seconds": 600,
                          "reason": "the suite is slow", "tweak": tweak});
        let (status, ex) = self.api("POST", "/v1/exceptions", "agent", Some(body)).await;
        assert_eq!(status, StatusCode::CREATED, "{ex}");
        ex["id"].as_str().unwrap().to_owned()
    }

    async fn show(&self, id: &str) -> Value {
        let (status, ex) = self
            .api("GET", &format!("/v1/exceptions/{id}"), "alice", None)
            .await;
        assert_eq!(status, StatusCode::OK, "{ex}");
        ex
    }

    /// The audit lines recorded so far about exceptions, as the audit log writes them.
    fn changes(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Ok(ev) = self.audit.try_recv() {
            let line = serde_json::to_value(Line::of(&ev)).unwrap();
            if line["exception_id"].is_string() {
                out.push(line);
            }
        }
        out
    }

    /// A page session of `name`: its cookie and CSRF token.
    async fn page_session(&self, name: &str) -> (String, String) {
        let login = Request::builder()
            .method("POST")
            .uri("/ui/login")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("token=tok-{name}")))
            .unwrap();
        let response = self.app.clone().oneshot(login).await.unwrap();
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        let cookie = response.headers()[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        let page = Request::builder()
            .uri("/ui")
            .header(header::COOKIE, &cookie)
            .body(Body::empty())
            .unwrap();
        let response = self.app.clone().oneshot(page).await.unwrap();
        let html = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let html = String::from_utf8(html.to_vec()).unwrap();
        let (_, rest) = html.split_once("name=sandgate-csrf content=\"").unwrap();
        (cookie, rest.split('"').next().unwrap().to_owned())
    }

    /// The page's approve form, as its script posts it.
    async fn page_approve(
        &self,
        (cookie, csrf): &(String, String),
        id: &str,
        fields: &str,
    ) -> (StatusCode, Value) {
        let request = Request::builder()
            .method("POST")
            .uri(format!("/ui/approve/{id}"))
            .header(header::COOKIE, cookie)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("csrf={csrf}&{fields}")))
            .unwrap();
        self.send(request).await
    }
}

fn asked() -> Value {
    json!({"sandbox": "web", "max_seconds": 120, "max_output_bytes": 10485760,
           "network": true, "workspace": "/srv/work"})
}

/// The API: the approver grants less time, less output, no network and a workspace under
/// the one asked, for less time; the answer, `show`, the list a follower reads (what a run
/// applies) and the audit's `exception_approved` all carry the narrowed tweak.
#[tokio::test]
async fn an_approver_narrows_a_tweak_and_the_narrowed_one_is_what_counts() {
    let mut f = fixture().await;
    let id = f.ask(asked()).await;
    let granted = json!({"sandbox": "web", "max_seconds": 30, "max_output_bytes": 1048576,
                         "workspace": "/srv/work/one"});
    let (status, ex) = f
        .api(
            "POST",
            &format!("/v1/exceptions/{id}/approve"),
            "alice",
            Some(json!({"tweak": granted, "ttl_seconds": 60})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{ex}");
    assert_eq!((&ex["tweak"], &ex["ttl_seconds"]), (&granted, &json!(60)), "{ex}");
    let shown = f.show(&id).await;
    assert_eq!((&shown["state"], &shown["tweak"]), (&json!("approved"), &granted));
    let (status, listed) = f
        .api("GET", "/v1/exceptions?state=approved&below=1", "follow", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed[0]["tweak"], granted, "{listed}");
    let changes = f.changes();
    let approved = changes
        .iter()
        .find(|e| e["event"] == "exception_approved")
        .unwrap_or_else(|| panic!("{changes:#?}"));
    assert_eq!(
        approved["tweak"], "sandbox=web max_seconds=30 max_output_bytes=1048576 workspace=/srv/work/one",
        "{approved}"
    );
    let requested = changes
        .iter()
        .find(|e| e["event"] == "exception_requested")
        .unwrap();
    assert_eq!(
        requested["tweak"],
        "sandbox=web max_seconds=120 max_output_bytes=10485760 network workspace=/srv/work"
    );
    // As asked (no narrowing at all) stays possible.
    let plain = f.ask(json!({"sandbox": "web", "max_seconds": 90})).await;
    let (status, ex) = f
        .api("POST", &format!("/v1/exceptions/{plain}/approve"), "alice", None)
        .await;
    assert_eq!(
        (status, &ex["tweak"]),
        (StatusCode::OK, &json!({"sandbox": "web", "max_seconds": 90}))
    );
}

/// As an approver who would widen what an agent asked (or as someone who took an approver's
/// token and widens on purpose): every field beyond the ask is refused with 400, the message
/// naming it; so is a tweak given to an exception for hosts. The request stays pending with
/// the tweak asked, and nothing is on record as approved.
#[tokio::test]
async fn an_approval_that_widens_a_tweak_is_refused_and_changes_nothing() {
    let mut f = fixture().await;
    let narrow = json!({"sandbox": "web", "max_seconds": 120, "max_output_bytes": 1048576,
                        "workspace": "/srv/work/a"});
    let id = f.ask(narrow.clone()).await;
    let with = |field: &str, value: Value| {
        let mut t = narrow.clone();
        t[field] = value;
        t
    };
    for (tweak, names) in [
        (
            with("max_seconds", json!(3600)),
            "tweak.max_seconds 3600 is more than the 120 asked",
        ),
        (with("max_output_bytes", json!(1048577)), "tweak.max_output_bytes"),
        (with("network", json!(true)), "tweak.network"),
        (with("workspace", json!("/srv/work")), "tweak.workspace /srv/work"),
        (with("workspace", json!("/srv/work/a/../../etc")), "workspace"),
        (with("sandbox", json!("db")), "tweak.sandbox"),
        (json!({"sandbox": "web"}), "asks for nothing"),
    ] {
        let (status, answer) = f
            .api(
                "POST",
                &format!("/v1/exceptions/{id}/approve"),
                "alice",
                Some(json!({ "tweak": tweak })),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{tweak}: {answer}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains(names), "{tweak}: {error}");
    }
    // A field the tweak type does not have is not read as something else.
    let (status, _) = f
        .api(
            "POST",
            &format!("/v1/exceptions/{id}/approve"),
            "alice",
            Some(json!({"tweak": with("hosts", json!(["evil.test"]))})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let shown = f.show(&id).await;
    assert_eq!(
        (&shown["state"], &shown["tweak"]),
        (&json!("pending"), &narrow),
        "{shown}"
    );

    // An exception for hosts takes no tweak.
    let body = json!({"task_id": "t-1", "requested_hosts": ["pypi.org"], "requested_ports": [443],
                      "ttl_seconds": 60, "reason": "pip"});
    let (_, hosts) = f.api("POST", "/v1/exceptions", "agent", Some(body)).await;
    let hosts = hosts["id"].as_str().unwrap().to_owned();
    let (status, answer) = f
        .api(
            "POST",
            &format!("/v1/exceptions/{hosts}/approve"),
            "alice",
            Some(json!({ "tweak": narrow })),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("tweak: exception"),
        "{answer}"
    );
    assert_eq!(f.show(&hosts).await["state"], "pending");
    assert!(
        f.changes().iter().all(|e| e["event"] != "exception_approved"),
        "a refused approval is not on record as one"
    );
}

/// As a viewer, a follower (a proxy's read-only token) and the agent that asked: none may
/// approve a tweak, narrowed or as asked; each is 403, and the request stays pending.
#[tokio::test]
async fn only_an_approver_other_than_the_requester_approves_a_tweak() {
    let mut f = fixture().await;
    let id = f.ask(asked()).await;
    let narrowed = json!({"tweak": {"sandbox": "web", "max_seconds": 30}});
    for who in ["victor", "follow", "agent"] {
        for body in [None, Some(narrowed.clone())] {
            let (status, answer) = f
                .api("POST", &format!("/v1/exceptions/{id}/approve"), who, body)
                .await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{who}: {answer}");
        }
    }
    let shown = f.show(&id).await;
    assert_eq!((&shown["state"], &shown["tweak"]), (&json!("pending"), &asked()));
    assert!(f.changes().iter().all(|e| e["event"] != "exception_approved"));
}

/// The approvals page's form: the tweak's fields as its script posts them (a blank field
/// grants nothing of it); a narrowing is taken, a widening refused with 400 naming the
/// field, a field that is not a number refused with 422, and a viewer's session refused.
#[tokio::test]
async fn the_page_narrows_a_tweak_and_never_widens_one() {
    let f = fixture().await;
    let id = f.ask(asked()).await;
    let alice = f.page_session("alice").await;
    for (fields, want, names) in [
        (
            "tweak_sandbox=web&tweak_max_seconds=121&tweak_network=on",
            StatusCode::BAD_REQUEST,
            "tweak.max_seconds 121",
        ),
        (
            "tweak_sandbox=web&tweak_workspace=%2Fsrv",
            StatusCode::BAD_REQUEST,
            "tweak.workspace /srv",
        ),
        (
            "tweak_sandbox=web&tweak_max_output_bytes=lots",
            StatusCode::UNPROCESSABLE_ENTITY,
            "tweak.max_output_bytes: a whole number",
        ),
        (
            "tweak_sandbox=web&tweak_max_seconds=",
            StatusCode::BAD_REQUEST,
            "asks for nothing",
        ),
    ] {
        let (status, answer) = f.page_approve(&alice, &id, fields).await;
        assert_eq!(status, want, "{fields}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(names),
            "{fields}: {answer}"
        );
    }
    let victor = f.page_session("victor").await;
    let fields = "ttl=60&tweak_sandbox=web&tweak_max_seconds=30";
    let (status, _) = f.page_approve(&victor, &id, fields).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(f.show(&id).await["state"], "pending");

    let fields = "ttl=60&tweak_sandbox=web&tweak_max_seconds=30&tweak_max_output_bytes=&tweak_workspace=%2Fsrv%2Fwork%2Fone";
    let (status, answer) = f.page_approve(&alice, &id, fields).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let want = json!({"sandbox": "web", "max_seconds": 30, "workspace": "/srv/work/one"});
    assert_eq!(answer["exception"]["tweak"], want, "{answer}");
    assert_eq!(f.show(&id).await["tweak"], want);
}
