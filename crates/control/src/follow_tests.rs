#![allow(clippy::unwrap_used, reason = "tests")]

use super::*;

fn url(text: &str) -> AdminUrl {
    AdminUrl::parse(text).unwrap()
}

#[test]
fn only_loopback_is_followed_over_plain_http() {
    for ok in [
        "http://127.0.0.1:9090",
        "http://[::1]:9090",
        "http://localhost:9090",
        "http://127.9.0.1:1",
    ] {
        assert!(check_feed(&url(ok), None).is_ok(), "{ok}");
    }
    for refused in [
        "http://10.0.0.1:9090",
        "http://192.168.1.2:80",
        "http://[2001:db8::1]:9090",
        "http://0.0.0.0:9090",
    ] {
        let e = check_feed(&url(refused), None).unwrap_err();
        assert!(matches!(e, FeedError::NotLoopback { .. }), "{refused}: {e}");
        assert!(e.to_string().contains("plain HTTP"), "{e}");
    }
    assert!(matches!(check_token("  \n"), Err(FeedError::NoToken)));
    // TLS anywhere, but only with the CA to verify it against.
    let ca = std::path::Path::new("/ca.pem");
    assert!(check_feed(&url("https://10.0.0.1:9443"), Some(ca)).is_ok());
    assert!(matches!(
        check_feed(&url("https://127.0.0.1:9443"), None),
        Err(FeedError::NoCa { .. })
    ));
}

#[test]
fn only_approvals_revocations_and_expiries_wake_a_read() {
    for (line, wakes) in [
        (r#"{"event":"exception_approved","exception_id":"ex-1"}"#, true),
        (r#" {"event":"exception_revoked"}"#, true),
        (r#"{"event":"exception_expired"}"#, true),
        (r#"{"event":"exception_requested"}"#, false),
        (r#"{"event":"exception_denied"}"#, false),
        (r#"{"event":"decision","reason":"exception_approved"}"#, false),
        ("not json", false),
        ("", false),
        (r#"{"event":7}"#, false),
    ] {
        assert_eq!(changes_active(line), wakes, "{line}");
    }
}
