//! docs/openapi.json and the router agree: every documented operation is routed (it
//! answers something other than 404/405 without a token), and paths that are not documented
//! are not routed. `/metrics` belongs to the proxy's admin router and is checked there.

#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "tests"
)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, StatusCode};
use sandgate_control::{ApiState, Control, SqliteStore};
use sandgate_policy::{AddressGuard, ExceptionPolicy, Principals, Ruleset};
use sandgate_proxy::{AuditDestination, AuditOptions, Limits, Listener, Nameservers, Proxy, ProxyConfig};
use tower::ServiceExt as _;

async fn state(dir: &std::path::Path) -> Arc<ApiState> {
    let proxy = Proxy::bind(ProxyConfig {
        listen: vec![Listener::system("127.0.0.1:0".parse().unwrap())],
        rules: Ruleset::new(),
        guard: AddressGuard::default(),
        nameservers: Nameservers::Explicit(vec!["127.0.0.1:9".parse().unwrap()]),
        audit: AuditDestination::File(dir.join("audit.jsonl")),
        limits: Limits::default(),
        audit_options: AuditOptions::default(),
        metrics_listen: None,
        remedies: Default::default(),
        connector: Default::default(),
    })
    .await
    .unwrap();
    let store = SqliteStore::open(&dir.join("x.sqlite3")).unwrap();
    let handle = proxy.policy_handle();
    let control = Control::start(
        Arc::new(store),
        ExceptionPolicy::default(),
        Default::default(),
        handle.clone(),
        Arc::new(|| 0),
    )
    .await
    .unwrap();
    Arc::new(ApiState {
        control,
        principals: Principals::default(),
        proxy: handle,
        sessions: Default::default(),
        throttle: Default::default(),
    })
}

#[tokio::test]
async fn every_documented_operation_is_routed_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let app = sandgate_control::router(state(dir.path()).await)
        .layer(MockConnectInfo(SocketAddr::from(([127, 0, 0, 1], 1))));
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json")).unwrap(),
    )
    .unwrap();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        if path == "/metrics" {
            continue;
        }
        for method in ["get", "post", "put", "delete", "patch"] {
            let concrete = path.replace("{id}", "ex-0000000000000001");
            let request = Request::builder()
                .method(method.to_uppercase().as_str())
                .uri(&concrete)
                .body(Body::empty())
                .unwrap();
            let status = app.clone().oneshot(request).await.unwrap().status();
            let documented = item.get(method).is_some();
            let routed = status != StatusCode::NOT_FOUND && status != StatusCode::METHOD_NOT_ALLOWED;
            assert_eq!(documented, routed, "{method} {path}: {status}");
            checked += usize::from(documented);
        }
    }
    assert_eq!(checked, 9, "every operation but /metrics");
    for stray in [
        "/v1/exception",
        "/v1/exceptions/x/approve/now",
        "/v2/exceptions",
        "/uix",
    ] {
        let request = Request::builder().uri(stray).body(Body::empty()).unwrap();
        assert_eq!(
            app.clone().oneshot(request).await.unwrap().status(),
            StatusCode::NOT_FOUND,
            "{stray}"
        );
    }
}

/// The document's `Exception` is what the API writes: every property the type writes is
/// documented with the JSON type it has (times as RFC 3339 strings), and every required one
/// is written.
#[test]
fn the_documented_exception_is_what_the_api_writes() {
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json")).unwrap(),
    )
    .unwrap();
    let schema = &doc["components"]["schemas"]["Exception"];
    let approved = sandgate_policy::Exception {
        id: "ex-1".into(),
        task_id: "t-1".into(),
        project_id: Some("p-1".into()),
        hosts: vec!["pypi.org".into()],
        ports: vec![443],
        ttl_seconds: 60,
        reason: "r".into(),
        requested_by: "agent-7".into(),
        requested_at: 1_795_741_323,
        state: sandgate_policy::ExceptionState::Approved,
        decided_by: Some("alice".into()),
        decided_at: Some(1_795_741_323),
        note: Some("n".into()),
        expires_at: Some(1_795_741_383),
        below: Default::default(),
        tweak: None,
    };
    let pending = sandgate_policy::Exception {
        state: sandgate_policy::ExceptionState::Pending,
        project_id: None,
        decided_by: None,
        decided_at: None,
        note: None,
        expires_at: None,
        ..approved.clone()
    };
    let below = sandgate_policy::Exception {
        below: sandgate_policy::exception::BelowHost::new(
            Some(vec!["GET".into()]),
            Some(vec!["/org/**".into()]),
            false,
        ),
        ..approved.clone()
    };
    let read_only = sandgate_policy::Exception {
        below: sandgate_policy::exception::BelowHost::new(None, None, true),
        ..approved.clone()
    };
    let tweak = sandgate_policy::Exception {
        hosts: Vec::new(),
        ports: Vec::new(),
        tweak: Some(sandgate_policy::exception::Tweak {
            sandbox: "web".into(),
            max_seconds: Some(600),
            max_output_bytes: Some(1 << 20),
            network: true,
            workspace: Some("/srv/x".into()),
        }),
        ..approved.clone()
    };
    for ex in [approved, pending, below, read_only, tweak] {
        let written = serde_json::to_value(&ex).unwrap();
        let written = written.as_object().unwrap();
        for (name, value) in written {
            let property = &schema["properties"][name];
            assert!(!property.is_null(), "{name} is written but not documented");
            let kind = match value {
                serde_json::Value::Null => "null",
                serde_json::Value::Bool(_) => "boolean",
                serde_json::Value::Number(_) => "integer",
                serde_json::Value::String(_) => "string",
                serde_json::Value::Array(_) => "array",
                serde_json::Value::Object(_) => "object",
            };
            let documented = match &property["type"] {
                serde_json::Value::String(t) => vec![t.as_str()],
                serde_json::Value::Array(ts) => ts.iter().filter_map(|t| t.as_str()).collect(),
                _ => vec!["string"], // an enum of strings (state)
            };
            assert!(
                documented.contains(&kind),
                "{name}: {value} is not {documented:?}"
            );
            if name.ends_with("_at") && !value.is_null() {
                assert_eq!(property["format"], "date-time", "{name}");
                assert!(
                    value.as_str().unwrap().parse::<jiff::Timestamp>().is_ok(),
                    "{name}: {value}"
                );
            }
        }
        for required in schema["required"].as_array().unwrap() {
            assert!(written.contains_key(required.as_str().unwrap()), "{required}");
        }
    }
}
