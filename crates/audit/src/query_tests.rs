//! Tests of reading audit logs back: files and torn lines, filters, the human and CSV
//! forms, summaries and learned destinations.

use super::*;

/// A record from the fields given, read as any line is.
fn rec(fields: serde_json::Value) -> Record {
    let mut line = serde_json::json!({
        "schema_version": 1, "created_at": "2026-11-22T10:00:01Z", "request_id": "r-1",
    });
    if let (Some(line), serde_json::Value::Object(more)) = (line.as_object_mut(), fields) {
        line.extend(more);
    }
    Record::parse(&line.to_string()).unwrap()
}

#[test]
fn torn_last_line_is_skipped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let line = |id: &str| {
        format!(
            "{{\"event\":\"policy_reload\",\"created_at\":\"2026-11-22T10:00:00Z\",\"request_id\":\"{id}\",\"outcome\":\"applied\"}}\n"
        )
    };
    std::fs::write(dir.path().join("audit.jsonl.1"), line("reload-1")).unwrap();
    std::fs::write(&path, format!("{}not json\n{{\"event\":\"clo", line("reload-2"))).unwrap();
    let files = log_files(&path);
    assert_eq!(files.len(), 2);
    let (events, skipped) = read_events(&files).unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(
        events[0].record.request_id, "reload-1",
        "rotated files come first"
    );
    assert_eq!(skipped.len(), 2);
    assert!(matches!(skipped[0].error, ReadError::Invalid { line: 2, .. }));
    assert!(matches!(skipped[1].error, ReadError::Torn { line: 3 }));
    assert!(
        skipped[1]
            .to_string()
            .ends_with("audit.jsonl:3: skipped torn last line (incomplete write)")
    );
    let (appended, bad, offset) = read_appended(&path, 0).unwrap();
    assert_eq!(
        (appended.len(), bad.len(), offset),
        (1, 1, line("reload-2").len() as u64 + 9),
        "the partial line is left for later"
    );
    let (again, _, same) = read_appended(&path, offset).unwrap();
    assert_eq!((again.len(), same), (0, offset));
}

#[test]
fn tail_times_are_of_one_width_whatever_the_fraction() {
    let at = |created_at: &str| {
        let r = rec(serde_json::json!({
            "event": "decision", "decision": "deny", "created_at": created_at,
            "destination_host": "a.test", "destination_port": 443,
        }));
        human(&r).split_once(' ').map(|(t, _)| t.to_owned()).unwrap()
    };
    let times = [
        at("2026-11-22T10:00:01Z"),
        at("2026-11-22T10:00:01.25Z"),
        at("2026-11-22T10:00:01.123456789Z"),
    ];
    assert_eq!(
        times,
        [
            "2026-11-22T10:00:01.000Z",
            "2026-11-22T10:00:01.250Z",
            "2026-11-22T10:00:01.123Z"
        ]
    );
}

#[test]
fn aggregates_read_as_the_traffic_they_fold() {
    let agg = rec(serde_json::json!({
        "event": "aggregate", "request_id": "aggregate-1",
        "decision": "allow", "scheme": "connect", "destination_host": "a.test", "destination_port": 443,
        "task_id": "t-1", "count": 3, "bytes_sent": 30, "bytes_received": 300,
        "window_start": "2026-11-22T10:00:00Z",
    }));
    let close = rec(serde_json::json!({
        "event": "close", "destination_host": "a.test", "destination_port": 443,
        "task_id": "t-1", "bytes_sent": 1, "bytes_received": 2, "outcome": "ok",
    }));
    let allow = rec(serde_json::json!({
        "event": "decision", "decision": "allow", "destination_host": "a.test", "destination_port": 443,
    }));
    assert_eq!(
        human(&agg),
        "2026-11-22T10:00:01.000Z aggregate connect a.test:443 count=3 sent=30 received=300 since=2026-11-22T10:00:00Z task=t-1 [aggregate-1]"
    );
    let s = summarize([&agg, &close, &allow]);
    assert_eq!(s.allowed, vec![("a.test:443".to_owned(), 4)]);
    assert_eq!(s.bytes_by_destination, vec![("a.test:443".to_owned(), 31, 302)]);
    assert_eq!(s.bytes_by_task, vec![("t-1".to_owned(), 31, 302)]);
}

#[test]
fn a_summary_counts_an_upstream_refusal_as_denied_folded_or_not() {
    let with_id = |id: &str, mut fields: serde_json::Value| {
        fields["request_id"] = serde_json::json!(id);
        fields["destination_host"] = serde_json::json!("up.test");
        fields["destination_port"] = serde_json::json!(443);
        rec(fields)
    };
    let allow = |id| with_id(id, serde_json::json!({"event": "decision", "decision": "allow"}));
    let refused = |id| {
        with_id(
            id,
            serde_json::json!({"event": "close", "outcome": "upstream_failure:upstream_denied"}),
        )
    };
    let ok = |id| with_id(id, serde_json::json!({"event": "close", "outcome": "ok"}));
    let agg = with_id(
        "aggregate-1",
        serde_json::json!({"event": "aggregate", "decision": "allow", "count": 2}),
    );
    // a: allowed and through; b: allowed here, refused upstream; c and d: folded into the
    // aggregate, c then refused upstream.
    let records = [allow("a"), ok("a"), allow("b"), refused("b"), agg, refused("c")];
    let s = summarize(&records);
    assert_eq!(s.denied, vec![("up.test:443".to_owned(), 2)]);
    assert_eq!(s.allowed, vec![("up.test:443".to_owned(), 2)]);
}

#[test]
fn learned_destinations_are_what_only_the_allowlist_kept_out() {
    let d = |host: &str, port: u16, code: &str, would: Option<&str>, task: Option<&str>| {
        rec(serde_json::json!({
            "event": "decision", "decision": if would.is_some() { "allow" } else { "deny" },
            "reason_code": code, "would_deny": would, "destination_host": host,
            "destination_port": port, "task_id": task,
        }))
    };
    let records = [
        d("b.test", 443, "report_only", Some("not_allowlisted"), Some("t-1")),
        d("b.test", 80, "report_only", Some("not_allowlisted"), Some("t-2")),
        d("b.test", 443, "report_only", Some("not_allowlisted"), Some("t-1")),
        d("a.test", 8443, "not_allowlisted", None, None),
        d("evil.test", 443, "report_only", Some("denylisted"), None),
        d("ok.test", 443, "allowlisted", None, None),
        d("guarded.test", 443, "destination_ip_prohibited", None, None),
    ];
    let found = learned(&records, false);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(
        found[0],
        Learned {
            host: "b.test".into(),
            ports: vec![80, 443],
            count: 3,
            tasks: vec!["t-1".into(), "t-2".into()],
            denylisted: false,
        }
    );
    assert!(found[1].denylisted && found[1].host == "evil.test");
    let with_denied = learned(&records, true);
    assert_eq!(with_denied[0].host, "a.test");
    assert_eq!(with_denied.len(), 3);
}

#[test]
fn filters_go_by_the_typed_fields() {
    let entry = |fields| {
        let record = rec(fields);
        let text = serde_json::to_string(&Line::of_record(&record)).unwrap();
        Entry {
            line: 1,
            text,
            record,
        }
    };
    let deny = entry(serde_json::json!({
        "event": "decision", "decision": "deny", "reason_code": "not_allowlisted",
        "destination_host": "api.evil.test", "destination_port": 443, "task_id": "t-1",
    }));
    let agg = entry(
        serde_json::json!({"event": "aggregate", "destination_host": "a.test", "destination_port": 80}),
    );
    let reload = entry(serde_json::json!({"event": "policy_reload", "outcome": "applied"}));
    let f = |f: Filter| {
        [&deny, &agg, &reload]
            .into_iter()
            .filter(|e| f.matches(e))
            .count()
    };
    assert_eq!(f(Filter::default()), 3);
    let allow = Some(Verdict::Allow);
    assert_eq!(
        f(Filter {
            decision: allow,
            ..Filter::default()
        }),
        1,
        "aggregates are allowed traffic"
    );
    let host = Some("*.evil.test".to_owned());
    assert_eq!(
        f(Filter {
            host,
            ..Filter::default()
        }),
        1
    );
    let task = Some("t-1".to_owned());
    assert_eq!(
        f(Filter {
            task,
            ..Filter::default()
        }),
        1
    );
    let events = vec![EventKind::PolicyReload, EventKind::Aggregate];
    assert_eq!(
        f(Filter {
            events,
            ..Filter::default()
        }),
        2
    );
    let grep = Some("\"reason_code\":\"not_allowlisted\"".to_owned());
    assert_eq!(
        f(Filter {
            grep,
            ..Filter::default()
        }),
        1
    );
    let since = "2026-11-22T10:00:02Z".parse().ok();
    assert_eq!(
        f(Filter {
            since,
            ..Filter::default()
        }),
        0
    );
}

#[test]
fn since_and_csv() {
    let now: jiff::Timestamp = "2026-11-22T12:00:00Z".parse().unwrap();
    assert_eq!(
        parse_since("1h", now).unwrap().to_string(),
        "2026-11-22T11:00:00Z"
    );
    assert_eq!(
        parse_since("2026-01-01T00:00:00Z", now).unwrap().to_string(),
        "2026-01-01T00:00:00Z"
    );
    assert!(parse_since("1w", now).is_err());
    assert_eq!(
        parse_since("2026-11-20", now).unwrap().to_string(),
        "2026-11-20T00:00:00Z"
    );
    assert_eq!(
        parse_since("2026-11-20T08:30", now).unwrap().to_string(),
        "2026-11-20T08:30:00Z"
    );
    let e = rec(serde_json::json!({"event": "decision", "decision": "allow", "rule": "allow:a, \"b\""}));
    let row = csv_row(&e);
    assert!(row.contains("\"allow:a, \"\"b\"\"\""), "{row}");
    assert!(row.starts_with("1,decision,2026-11-22T10:00:01Z,r-1,"), "{row}");
}

#[test]
fn the_csv_columns_are_the_written_fields_in_order() {
    let e = rec(serde_json::json!({"event": "policy_reload", "outcome": "applied"}));
    let text = serde_json::to_string(&Line::of_record(&e)).unwrap();
    let mut at = 0;
    for column in CSV_COLUMNS {
        let key = format!("\"{column}\":");
        let found = text.get(at..).and_then(|rest| rest.find(&key));
        assert!(found.is_some(), "{column} missing or out of order in {text}");
        at += found.unwrap_or(0) + key.len();
    }
    assert_eq!(text.matches("\":").count(), CSV_COLUMNS.len(), "{text}");
}
