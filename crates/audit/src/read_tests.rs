//! The reader against what the writer writes (every kind, every outcome), against lines it
//! must refuse (malformed, overlong, torn, newer), lines it must accept (unknown fields,
//! older lines), and against hostile values written through the writer itself.

use std::io::{BufReader, Cursor};
use std::sync::Arc;

use sandgate_policy::{Exception, ExceptionState as State, Identity, PolicyReason, Verdict};

use super::*;
use crate::event::{
    AdminRefusal, Aggregate, Change, Close, Decision, Dest, Event, EventKind, ExceptionChange, Outcome,
    Party, Reload, UpstreamFailure,
};
use crate::line::Line;
use crate::record::{Destination, Recorded, Requester};

fn party(task: Option<&str>) -> Party {
    Party {
        path: None,
        request_id: "0000abcd00000001".into(),
        client_addr: ([127, 0, 0, 1], 40_000).into(),
        identity: Arc::new(Identity {
            task: task.map(str::to_owned),
            project: Some("p-1".into()),
            job: Some("j-1".into()),
            subject: Some("alice".into()),
            agent: Some("mcp:claude-code".into()),
        }),
        method: Some("CONNECT".into()),
        node: Some("node-a".into()),
    }
}

fn dest(host: &str) -> Dest {
    Dest {
        scheme: "connect",
        host: host.into(),
        port: 443,
    }
}

fn decision(host: &str, verdict: Verdict, would_deny: Option<PolicyReason>) -> Decision {
    Decision {
        party: party(Some("t-1")),
        dest: Some(dest(host)),
        verdict,
        reason_code: match (verdict, would_deny) {
            (Verdict::Allow, Some(_)) => "report_only".into(),
            (Verdict::Allow, None) => "allowlisted".into(),
            (Verdict::Deny, _) => "not_allowlisted".into(),
        },
        resolved_ip: Some([93, 184, 216, 34].into()),
        rule: Some("allow:*.example.com".into()),
        status: (verdict == Verdict::Deny).then_some(403),
        tls_server_name: Some("api.example.com".into()),
        would_deny,
        detail: would_deny.map(|r| format!("would deny: {}", r.code())),
    }
}

fn exception(change: Change) -> Event {
    Event::Exception(Box::new(ExceptionChange {
        change,
        exception: Exception {
            id: "ex-1".into(),
            task_id: "t-1".into(),
            project_id: None,
            hosts: vec!["pypi.org".into(), "files.pythonhosted.org".into()],
            ports: vec![443],
            ttl_seconds: 600,
            reason: "install deps".into(),
            requested_by: "agent".into(),
            requested_at: 1_790_000_000,
            state: State::Approved,
            decided_by: Some("bob".into()),
            decided_at: Some(1_790_000_100),
            note: Some("ok for today".into()),
            expires_at: Some(1_790_000_700),
            below: Default::default(),
            tweak: None,
        },
        by: (change != Change::Expired).then(|| "bob".to_owned()),
    }))
}

/// One event of every kind (and every exception change).
fn every_kind() -> Vec<Event> {
    let mut malformed = decision("x", Verdict::Deny, None);
    malformed.dest = None;
    malformed.reason_code = "malformed_head".into();
    let mut events = vec![
        Event::Decision(decision("api.example.com", Verdict::Allow, None)),
        Event::Decision(decision(
            "new.example.com",
            Verdict::Allow,
            Some(PolicyReason::Denylisted),
        )),
        Event::Decision(decision("evil.test", Verdict::Deny, None)),
        Event::Decision(malformed),
        Event::Close(Close {
            party: party(None),
            dest: dest("api.example.com"),
            resolved_ip: Some("2001:db8::1".parse().unwrap()),
            status: Some(200),
            bytes_sent: 517,
            bytes_received: 40_960,
            duration_ms: 12,
            outcome: Outcome::Upstream(UpstreamFailure::ResponseBody),
        }),
        Event::PolicyReload(Reload {
            generation: 3,
            applied: false,
            rejection: 2,
            detail: "policy.yaml:4: spec.network.allowlist[0].host: bad host".into(),
        }),
        Event::PolicyReload(Reload {
            generation: 4,
            applied: true,
            rejection: 0,
            detail: "2 allow, 1 deny".into(),
        }),
        Event::Aggregate(Aggregate {
            id: 7,
            dest: Some(dest("pypi.org")),
            task_id: Some("t-1".into()),
            project_id: None,
            count: 12,
            bytes_sent: 1200,
            bytes_received: 99_000,
            window_start: "2026-11-22T10:00:00Z".into(),
        }),
        Event::AdminRefused(AdminRefusal {
            who: None,
            action: "POST /ui/login".into(),
            status: 429,
            reason: "too many failed logins from this address; try again in 30 s".into(),
            client_addr: Some(([10, 0, 0, 9], 5000).into()),
        }),
    ];
    for change in [
        Change::Requested,
        Change::Approved,
        Change::Denied,
        Change::Revoked,
        Change::Expired,
    ] {
        events.push(exception(change));
    }
    events
}

fn written(events: Vec<Event>) -> String {
    let mut text = String::new();
    for e in events {
        let stamped = e.stamp();
        text.push_str(&serde_json::to_string(&Line::of(&stamped)).unwrap());
        text.push('\n');
    }
    text
}

fn read_all(text: &str) -> Vec<Result<Entry, ReadError>> {
    Reader::new(Cursor::new(text.as_bytes())).collect()
}

fn entries(text: &str) -> Vec<Entry> {
    read_all(text).into_iter().map(Result::unwrap).collect()
}

#[test]
fn every_kind_reads_back_as_written() {
    let events = every_kind();
    let text = written(events.clone());
    let read = entries(&text);
    assert_eq!(read.len(), events.len());
    for ((entry, event), line) in read.iter().zip(&events).zip(text.lines()) {
        assert_eq!(entry.text, line);
        // Written again from what was read, the line is the same to the byte.
        let again = serde_json::to_string(&Line::of_record(&entry.record)).unwrap();
        assert_eq!(again, line);
        assert_eq!(entry.record.request_id, event.request_id());
        match (&entry.record.event, event) {
            (Recorded::Decision(r), Event::Decision(d)) => {
                assert_eq!(r.verdict, d.verdict);
                assert_eq!(r.would_deny, d.would_deny);
                assert_eq!(r.reason_code.as_deref(), Some(d.reason_code.as_ref()));
                assert_eq!(
                    r.dest,
                    d.dest.as_ref().map(|d| Destination {
                        access: Some(sandgate_policy::Access::Connect),
                        host: d.host.clone(),
                        port: d.port,
                    })
                );
                assert_eq!(
                    r.requester,
                    Requester {
                        client_addr: Some(d.party.client_addr),
                        task_id: Some("t-1".into()),
                        project_id: Some("p-1".into()),
                        job_id: Some("j-1".into()),
                        subject: Some("alice".into()),
                        agent: Some("mcp:claude-code".into()),
                        method: Some("CONNECT".into()),
                        path: None,
                        node: Some("node-a".into()),
                    }
                );
            }
            (Recorded::Close(r), Event::Close(c)) => {
                assert_eq!(
                    (r.outcome, r.bytes_sent, r.bytes_received),
                    (c.outcome, 517, 40_960)
                );
            }
            (Recorded::PolicyReload(r), Event::PolicyReload(p)) => assert_eq!(r.applied, p.applied),
            (Recorded::Aggregate(r), Event::Aggregate(a)) => assert_eq!(r.count, a.count),
            (Recorded::Exception(r), Event::Exception(x)) => {
                assert_eq!(
                    (r.change, &r.hosts, r.by.as_ref()),
                    (x.change, &x.exception.hosts, x.by.as_ref())
                );
            }
            (Recorded::AdminRefused(r), Event::AdminRefused(a)) => assert_eq!(r.status, Some(a.status)),
            (r, e) => panic!("{e:?} read back as {r:?}"),
        }
    }
}

#[test]
fn every_outcome_and_kind_reads_back() {
    let closes: Vec<Event> = Outcome::all()
        .map(|outcome| {
            Event::Close(Close {
                party: party(None),
                dest: dest("a.test"),
                resolved_ip: None,
                status: None,
                bytes_sent: 0,
                bytes_received: 0,
                duration_ms: 0,
                outcome,
            })
        })
        .collect();
    let read = entries(&written(closes));
    let outcomes: Vec<Outcome> = read
        .iter()
        .map(|e| match &e.record.event {
            Recorded::Close(c) => c.outcome,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(outcomes, Outcome::all().collect::<Vec<_>>());
    for kind in EventKind::ALL {
        assert_eq!(EventKind::parse(kind.as_str()), Some(kind));
        assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
    }
}

/// Numbers every outcome and kind by exhaustive matches: a new variant does not compile here
/// until it is numbered (and the count raised), and then fails the test until
/// `Outcome::all` or `EventKind::ALL` lists it, so every written value can be read back.
#[test]
fn every_outcome_and_kind_is_listed_for_reading() {
    use UpstreamFailure as F;
    const OUTCOMES: usize = 26;
    let number = |o: Outcome| match o {
        Outcome::Ok => 0,
        Outcome::ClientReset => 1,
        Outcome::UpstreamReset => 2,
        Outcome::ClientFailure => 3,
        Outcome::IdleTimeout => 4,
        Outcome::Shutdown => 5,
        Outcome::Revoked => 6,
        Outcome::Expired => 7,
        Outcome::OutOfDescriptors => 8,
        Outcome::RetryRefused => 9,
        Outcome::LateHelloRefused => 10,
        Outcome::CredentialLeak => 11,
        Outcome::Upstream(f) => match f {
            F::Dns => 12,
            F::DnsTimeout => 13,
            F::ConnectionRefused => 14,
            F::ConnectionTimeout => 15,
            F::Connect => 16,
            F::ResponseTimeout => 17,
            F::Closed => 18,
            F::MalformedResponse => 19,
            F::ResponseHeadTooLarge => 20,
            F::ResponseBody => 21,
            F::IdleTimeout => 22,
            F::UpstreamDenied => 23,
            F::UpstreamProxy => 24,
            F::Tls => 25,
        },
    };
    let mut seen: Vec<usize> = Outcome::all().map(number).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..OUTCOMES).collect::<Vec<_>>());
    const KINDS: usize = 10;
    let number = |k: EventKind| match k {
        EventKind::Decision => 0,
        EventKind::Close => 1,
        EventKind::PolicyReload => 2,
        EventKind::Aggregate => 3,
        EventKind::ExceptionRequested => 4,
        EventKind::ExceptionApproved => 5,
        EventKind::ExceptionDenied => 6,
        EventKind::ExceptionRevoked => 7,
        EventKind::ExceptionExpired => 8,
        EventKind::AdminRefused => 9,
    };
    let mut seen: Vec<usize> = EventKind::ALL.into_iter().map(number).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..KINDS).collect::<Vec<_>>());
}

#[test]
fn a_malformed_line_is_a_typed_error_with_its_line_number_and_reading_goes_on() {
    let good = written(vec![Event::Decision(decision("a.test", Verdict::Deny, None))]);
    let good = good.trim_end();
    let bad = [
        "not json",
        "[1, 2]",
        r#"{"event":"decision","created_at":"2026-11-22T10:00:00Z","request_id":"r","decision":"maybe"}"#,
        r#"{"event":"close","created_at":"2026-11-22T10:00:00Z","request_id":"r"}"#,
        r#"{"event":"close","created_at":"2026-11-22T10:00:00Z","request_id":"r","outcome":"exploded"}"#,
        r#"{"event":"teleport","created_at":"2026-11-22T10:00:00Z","request_id":"r"}"#,
        r#"{"event":"decision","created_at":"yesterday","request_id":"r","decision":"deny"}"#,
        r#"{"schema_version":2,"event":"decision","created_at":"2026-11-22T10:00:00Z","request_id":"r","decision":"deny"}"#,
        r#"{"event":"decision","event":"close","created_at":"2026-11-22T10:00:00Z","request_id":"r","decision":"deny"}"#,
        r#"{"event":"decision","created_at":"2026-11-22T10:00:00Z","request_id":"r","decision":"deny","destination_port":70000}"#,
    ];
    let mut text = String::new();
    for b in bad {
        text.push_str(b);
        text.push('\n');
    }
    text.push_str(good);
    text.push('\n');
    let mut bytes = text.into_bytes();
    bytes.extend_from_slice(b"{\"event\":\"\xff\"}\n");
    let read: Vec<_> = Reader::new(Cursor::new(bytes)).collect();
    assert_eq!(read.len(), bad.len() + 2);
    for (i, r) in read.iter().enumerate().take(bad.len()) {
        match r {
            Err(ReadError::Invalid { line, .. }) => assert_eq!(*line, i + 1),
            other => panic!("line {}: {other:?}", i + 1),
        }
    }
    let cause = |i: usize| match &read[i] {
        Err(ReadError::Invalid { cause, .. }) => cause.to_string(),
        other => panic!("{other:?}"),
    };
    assert_eq!(cause(2), "decision: unknown value \"maybe\"");
    assert_eq!(cause(3), "no outcome");
    assert_eq!(cause(4), "outcome: unknown value \"exploded\"");
    assert_eq!(cause(5), "event: unknown value \"teleport\"");
    assert!(cause(7).starts_with("schema_version 2"), "{}", cause(7));
    assert!(cause(8).contains("duplicate field"), "{}", cause(8));
    assert!(matches!(&read[bad.len()], Ok(e) if e.line == bad.len() + 1));
    assert!(matches!(
        read[bad.len() + 1],
        Err(ReadError::NotUtf8 { line: 12 })
    ));
}

#[test]
fn an_overlong_line_is_skipped_to_its_newline_and_the_next_line_is_read() {
    let good = written(vec![Event::Decision(decision("a.test", Verdict::Deny, None))]);
    let limit = good.len() + 10;
    let long = format!("{{\"detail\":\"{}\"}}\n", "x".repeat(limit * 3));
    let text = format!("{long}{good}{long}{good}");
    // A small buffer: the long line arrives in many pieces.
    let reader = Reader::with_limit(BufReader::with_capacity(16, Cursor::new(text.as_bytes())), limit);
    let read: Vec<_> = reader.collect();
    assert_eq!(read.len(), 4);
    assert!(matches!(read[0], Err(ReadError::TooLong { line: 1, limit: l }) if l == limit));
    assert!(matches!(&read[1], Ok(e) if e.line == 2 && e.text == good.trim_end()));
    assert!(matches!(read[2], Err(ReadError::TooLong { line: 3, .. })));
    assert!(matches!(&read[3], Ok(e) if e.line == 4));
    // The default limit holds for a line just over it.
    let huge = format!("{}\n", "y".repeat(MAX_LINE_BYTES + 1));
    let read = read_all(&huge);
    assert!(matches!(
        read.as_slice(),
        [Err(ReadError::TooLong { line: 1, .. })]
    ));
}

#[test]
fn a_torn_last_line_is_reported_and_not_counted_in_the_offset() {
    let good = written(vec![Event::Decision(decision("a.test", Verdict::Deny, None))]);
    let text = format!("{good}\n{good}{{\"event\":\"clo");
    let mut reader = Reader::new(Cursor::new(text.as_bytes()));
    let read: Vec<_> = reader.by_ref().collect();
    assert_eq!(read.len(), 3, "the blank line is skipped");
    assert!(matches!(&read[1], Ok(e) if e.line == 3));
    assert!(matches!(read[2], Err(ReadError::Torn { line: 4 })));
    assert_eq!(reader.offset(), 2 * good.len() as u64 + 1);
}

#[test]
fn unknown_fields_are_ignored() {
    let line = r#"{"schema_version":1,"event":"decision","created_at":"2026-11-22T10:00:00Z","request_id":"r","decision":"deny","reason_code":"not_allowlisted","destination_host":"a.test","destination_port":443,"scheme":"socks5","added_later":{"nested":[1,"two"]},"another":null}"#;
    let read = entries(&format!("{line}\n"));
    let Recorded::Decision(d) = &read[0].record.event else {
        panic!("{read:?}")
    };
    assert_eq!(d.policy_reason(), Some(PolicyReason::NotAllowlisted));
    assert_eq!(
        d.dest.as_ref().and_then(|d| d.access),
        Some(sandgate_policy::Access::Socks5)
    );
    assert_eq!(read[0].text, line, "passed on as written");
}

#[test]
fn older_lines_read_back() {
    // Before `would_deny`: the verdict of a report-only pass was said only in words.
    let before = r#"{"schema_version":1,"event":"decision","created_at":"2026-11-22T10:00:00Z","request_id":"r1","client_addr":"127.0.0.1:5000","task_id":null,"decision":"allow","reason_code":"report_only","scheme":"connect","method":"CONNECT","destination_host":"evil.test","destination_port":443,"rule":"deny:evil.test","detail":"would deny: denylisted","node":null}"#;
    // A line with only some fields (no schema_version, client address or scheme).
    let sparse = r#"{"event":"decision","created_at":"2026-11-22T10:00:00Z","request_id":"r2","decision":"deny","destination_host":"a.test","destination_port":443,"method":"CONNECT","reason_code":"x"}"#;
    // A report-only pass whose words say nothing readable: not guessed at.
    let wordless = r#"{"event":"decision","created_at":"2026-11-22T10:00:00Z","request_id":"r3","decision":"allow","reason_code":"report_only"}"#;
    let read = read_all(&format!("{before}\n{sparse}\n{wordless}\n"));
    let decision = |i: usize| match &read[i] {
        Ok(Entry {
            record: Record {
                event: Recorded::Decision(d),
                ..
            },
            ..
        }) => d.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(decision(0).would_deny, Some(PolicyReason::Denylisted));
    let sparse = decision(1);
    assert_eq!(sparse.requester.client_addr, None);
    assert_eq!(
        sparse.dest,
        Some(Destination {
            access: None,
            host: "a.test".into(),
            port: 443
        })
    );
    assert!(matches!(
        &read[2],
        Err(ReadError::Invalid { line: 3, cause }) if cause.to_string() == "no would_deny"
    ));
}

#[derive(Debug)]
struct Unobserved;

impl crate::Observe for Unobserved {
    fn observe(&self, _: &Event) {}
}

/// A sandboxed client controls the host it asks for (within what the parser lets through)
/// and the identity fields its run states. Whatever it puts there, each event is one line
/// and reads back as exactly that event: no value ends a line, adds a field or changes the
/// verdict.
#[tokio::test]
async fn hostile_values_written_through_the_writer_read_back_as_exactly_themselves() {
    let hostile = [
        "evil.test\n{\"schema_version\":1,\"event\":\"decision\",\"decision\":\"allow\"}",
        "evil.test\",\"decision\":\"allow\",\"reason_code\":\"allowlisted",
        "evil.test\r\n\r\n",
        "evil.test\u{2028}\u{2029}\u{85}",
        "evil.test\\\"}\n",
        "nul\0byte",
        "\u{1b}[2Jterminal",
        "{\"event\":\"close\"}",
        &"x".repeat(64 * 1024),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (audit, writer) = crate::AuditWriter::start(
        &crate::AuditDestination::File(path.clone()),
        &crate::AuditOptions::default(),
        Arc::new(crate::AuditMetrics::default()),
        Arc::new(Unobserved),
    )
    .unwrap();
    for host in hostile {
        let mut d = decision(host, Verdict::Deny, None);
        d.party.identity = Arc::new(Identity {
            task: Some(host.to_owned()),
            ..Identity::default()
        });
        d.party.method = Some(host.to_owned().into());
        audit.record(Event::Decision(d)).await;
    }
    drop(audit);
    writer.finish().await.unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let read: Vec<_> = Reader::new(BufReader::new(file)).map(Result::unwrap).collect();
    assert_eq!(read.len(), hostile.len());
    for (entry, host) in read.iter().zip(hostile) {
        let Recorded::Decision(d) = &entry.record.event else {
            panic!("{entry:?}")
        };
        assert_eq!(d.verdict, Verdict::Deny);
        assert_eq!(d.reason_code.as_deref(), Some("not_allowlisted"));
        assert_eq!(d.dest.as_ref().map(|d| d.host.as_str()), Some(host));
        assert_eq!(d.requester.task_id.as_deref(), Some(host));
        assert_eq!(d.requester.method.as_deref(), Some(host));
        assert_eq!(entry.record.kind(), EventKind::Decision);
        assert!(!entry.text.contains('\n'));
    }
}
