//! The times of an exception in JSON: written as RFC 3339, read from that or from the Unix
//! seconds of rows and clients from before, and anything else refused with a message.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::{Exception, ExceptionState};

fn approved() -> Exception {
    Exception {
        id: "ex-1".into(),
        task_id: "t-1".into(),
        project_id: None,
        hosts: vec!["pypi.org".into()],
        ports: vec![443],
        ttl_seconds: 300,
        reason: "r".into(),
        requested_by: "agent-7".into(),
        requested_at: 1_795_741_323,
        state: ExceptionState::Approved,
        decided_by: Some("alice".into()),
        decided_at: Some(1_795_741_383),
        note: None,
        expires_at: Some(1_795_741_683),
        below: Default::default(),
        tweak: None,
    }
}

fn read(value: Value) -> Result<Exception, String> {
    serde_json::from_value(value).map_err(|e| e.to_string())
}

#[test]
fn times_are_written_as_the_audit_log_writes_them() {
    let v = serde_json::to_value(approved()).unwrap();
    assert_eq!(v["requested_at"], "2026-11-27T01:02:03Z");
    assert_eq!(v["decided_at"], "2026-11-27T01:03:03Z");
    assert_eq!(v["expires_at"], "2026-11-27T01:08:03Z");
    let pending = Exception {
        state: ExceptionState::Pending,
        decided_by: None,
        decided_at: None,
        expires_at: None,
        ..approved()
    };
    let v = serde_json::to_value(&pending).unwrap();
    assert_eq!((&v["decided_at"], &v["expires_at"]), (&Value::Null, &Value::Null));
    assert_eq!(read(v).unwrap(), pending);
    assert_eq!(super::format(0).as_deref(), Some("1970-01-01T00:00:00Z"));
}

#[test]
fn what_the_api_writes_reads_back_whole() {
    let text = serde_json::to_string(&approved()).unwrap();
    assert_eq!(serde_json::from_str::<Exception>(&text).unwrap(), approved());
}

/// Rows stored and clients built before times were text hold Unix seconds.
#[test]
fn a_row_of_unix_seconds_still_reads() {
    let old = r#"{"id":"ex-1","task_id":"t-1","project_id":null,"hosts":["pypi.org"],"ports":[443],"ttl_seconds":300,"reason":"r","requested_by":"agent-7","requested_at":1795741323,"state":"approved","decided_by":"alice","decided_at":1795741383,"note":null,"expires_at":1795741683}"#;
    assert_eq!(serde_json::from_str::<Exception>(old).unwrap(), approved());
    // Mixed, as a hand-edited row might be, and without the optional times at all.
    let mut v = serde_json::to_value(approved()).unwrap();
    v["requested_at"] = json!(1_795_741_323);
    assert_eq!(read(v.clone()).unwrap(), approved());
    let obj = v.as_object_mut().unwrap();
    obj.remove("decided_at");
    obj.remove("expires_at");
    let ex = read(v).unwrap();
    assert_eq!((ex.decided_at, ex.expires_at), (None, None));
}

#[test]
fn any_rfc3339_offset_reads_as_the_same_second() {
    for (text, want) in [
        ("2026-11-27T01:02:03Z", 1_795_741_323),
        ("2026-11-27T01:02:03z", 1_795_741_323),
        ("2026-11-27T02:02:03+01:00", 1_795_741_323),
        ("2026-11-26T20:02:03-05:00", 1_795_741_323),
        // A fraction is cut to the second at or before it: an expiry never moves later.
        ("2026-11-27T01:02:03.999Z", 1_795_741_323),
        ("1969-12-31T23:59:59.5Z", -1),
    ] {
        assert_eq!(super::parse(text), Ok(want), "{text}");
    }
}

/// An attacker's (or a broken client's) times are refused with what was expected, never a
/// panic and never a wrong second.
#[test]
fn anything_else_is_refused_saying_what_is_expected() {
    let cases = [
        (json!("tomorrow"), "RFC 3339"),
        (json!("2026-11-27T01:02:03"), "RFC 3339"),
        (json!("2026-11-27 01:02:03 UTC"), "RFC 3339"),
        (json!("2026-13-27T01:02:03Z"), "RFC 3339"),
        (json!("+99999-01-01T00:00:00Z"), "RFC 3339"),
        (json!(""), "RFC 3339"),
        (json!(1.5e9), "RFC 3339"),
        (json!(true), "RFC 3339"),
        (json!([1]), "RFC 3339"),
        (json!(i64::MAX), "outside the years"),
        (json!(i64::MIN), "outside the years"),
        (json!(u64::MAX), "outside the years"),
    ];
    for field in ["requested_at", "decided_at", "expires_at"] {
        for (bad, want) in &cases {
            let mut v = serde_json::to_value(approved()).unwrap();
            v[field] = bad.clone();
            let err = read(v).unwrap_err();
            assert!(err.contains(want), "{field} = {bad}: {err}");
        }
    }
    let mut v = serde_json::to_value(approved()).unwrap();
    v["requested_at"] = Value::Null;
    assert!(read(v).is_err(), "requested_at is required");
}

#[test]
fn a_long_refused_text_is_quoted_short() {
    let long = format!("2026-{}", "é".repeat(10_000));
    let err = super::parse(&long).unwrap_err();
    assert!(err.len() < 300, "{} bytes: {err}", err.len());
    assert!(err.contains("..."), "{err}");
}

#[test]
fn a_time_outside_what_can_be_written_is_an_error_not_a_panic() {
    let far = Exception {
        expires_at: Some(i64::MAX),
        ..approved()
    };
    assert!(serde_json::to_string(&far).is_err());
    assert_eq!(super::format(i64::MIN), None);
}

proptest! {
    #[test]
    fn every_writable_second_reads_back(secs in -377_705_116_800_i64..=253_402_207_200) {
        let ex = Exception { requested_at: secs, expires_at: Some(secs), ..approved() };
        let text = serde_json::to_string(&ex).unwrap();
        prop_assert_eq!(serde_json::from_str::<Exception>(&text).unwrap(), ex);
    }

    #[test]
    fn any_integer_or_text_reads_or_is_refused_without_a_panic(n in any::<i64>(), s in ".{0,40}") {
        for bad in [json!(n), json!(s)] {
            let mut v = serde_json::to_value(approved()).unwrap();
            v["expires_at"] = bad;
            let _ = read(v);
        }
    }
}
