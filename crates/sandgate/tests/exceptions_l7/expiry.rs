//! A below-host exception's expiry reaches a tunnel already open under it: `GET` on
//! `/docs/**` of tls.test is granted, the approval shortening it to 2 s, and a keep-alive
//! connection inside the tunnel the proxy intercepts for it is open and has been answered
//! when the exception expires. The next request on that connection is not answered by the
//! origin: the tunnel is cut (closed `expired`) or the request refused, and either is on
//! record.

use std::panic::AssertUnwindSafe;

use serde_json::{Value, json};

use crate::l7::decisions::events_once;
use crate::l7_tls::{https_conn, inside};

#[test]
fn a_below_host_exceptions_expiry_ends_an_intercepted_tunnel_already_open() {
    let f = crate::fixture();
    // The shortest grant: the approval narrows the time to 2 s.
    let id = f.approved_get("read the docs", &["/docs/**"], r#"{"ttl_seconds":2}"#);

    let host = format!("tls.test:{}", f.tls);
    let mut conn = https_conn(f.task, "tls.test", f.tls, &f.i.ca_pem);
    let first = conn.exchange("GET", "/docs/first", &host, false);
    assert_eq!(first.status, 200, "{first:?}");

    // Awaited: the proxy records the expiry when it happens.
    let audit = &f.i.proxy.audit_path;
    let expired = |e: &Value| e["event"] == "exception_expired" && e["exception_id"] == json!(id);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !events_once(audit, expired).iter().any(expired) {
        assert!(
            std::time::Instant::now() < deadline,
            "the exception never expired"
        );
    }

    // The next request on the same connection: a write or read error (the tunnel was cut)
    // or a refusal, never the origin's answer.
    let second = std::panic::catch_unwind(AssertUnwindSafe(|| {
        conn.exchange("GET", "/docs/second", &host, true).status
    }));
    let status = second.unwrap_or(0);
    assert!(status == 0 || status == 403, "after expiry: {status}");

    let events = events_once(audit, |e| {
        (e["event"] == "close" && e["outcome"] == "expired")
            || (e["event"] == "decision" && e["path"] == "/docs/second")
    });
    let cut = events
        .iter()
        .any(|e| e["event"] == "close" && e["outcome"] == "expired" && e["destination_host"] == "tls.test");
    let refused = inside(&events, "tls.test")
        .iter()
        .any(|d| d["path"] == "/docs/second" && d["decision"] == "deny");
    assert!(cut || refused, "the expiry is not on record: {events:#?}");
    assert!(
        !inside(&events, "tls.test")
            .iter()
            .any(|d| d["path"] == "/docs/second" && d["decision"] == "allow"),
        "{events:#?}"
    );
}
