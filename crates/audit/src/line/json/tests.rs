//! The hand-written line against `serde_json`'s, byte for byte: every kind of event, every
//! outcome, IPv6 addresses, and hostile strings (every control character, quotes,
//! backslashes, non-ASCII, line separators).

use std::sync::Arc;

use sandgate_policy::{Exception, ExceptionState, Identity, PolicyReason, Verdict};

use crate::event::{
    AdminRefusal, Aggregate, Change, Close, Decision, Dest, Event, ExceptionChange, Outcome, Party, Reload,
    Stamped,
};
use crate::line::Line;

fn assert_same(stamped: &Stamped) {
    let line = Line::of(stamped);
    let mut ours = Vec::new();
    line.write_json(&mut ours);
    let theirs = serde_json::to_vec(&line).unwrap();
    assert_eq!(String::from_utf8_lossy(&ours), String::from_utf8_lossy(&theirs));
}

fn party(text: &str) -> Party {
    Party {
        request_id: format!("id-{text}"),
        client_addr: ([10, 200, 3, 4], 65_535).into(),
        identity: Arc::new(Identity {
            task: Some(text.to_owned()),
            project: None,
            job: Some("j".into()),
            subject: Some(text.to_owned()),
            agent: None,
        }),
        method: Some(text.to_owned().into()),
        path: Some(Arc::from(text)),
        node: None,
    }
}

fn decision(text: &str) -> Decision {
    Decision {
        party: party(text),
        dest: Some(Dest {
            scheme: "http",
            host: text.to_owned(),
            port: 0,
        }),
        verdict: Verdict::Deny,
        reason_code: "not_allowlisted".into(),
        resolved_ip: Some([0, 0, 0, 0].into()),
        rule: Some(Arc::from(text)),
        status: Some(403),
        tls_server_name: Some(text.to_owned()),
        would_deny: Some(PolicyReason::NotAllowlisted),
        detail: Some(text.to_owned()),
    }
}

#[test]
fn hostile_strings_are_escaped_as_serde_json_escapes_them() {
    let every_ascii: String = (0u8..=0x7f).map(char::from).collect();
    let texts = [
        "",
        "plain.example.com",
        every_ascii.as_str(),
        "quote\" backslash\\ slash/",
        "\u{2028}\u{2029}\u{85}\u{feff}é😀",
        "\u{1b}[2J\r\n\t\u{8}\u{c}\0",
    ];
    for text in texts {
        assert_same(&Event::Decision(decision(text)).stamp());
    }
}

#[test]
fn every_kind_and_outcome_is_written_as_serde_json_writes_it() {
    let mut events = vec![];
    for outcome in Outcome::all() {
        events.push(Event::Close(Close {
            party: party("t"),
            dest: Dest {
                scheme: "connect",
                host: "[2001:db8::1]".into(),
                port: 443,
            },
            resolved_ip: Some("2001:db8::1".parse().unwrap()),
            status: None,
            bytes_sent: u64::MAX,
            bytes_received: 0,
            duration_ms: 1_234_567,
            outcome,
        }));
    }
    let mut allow = decision("a.test");
    allow.verdict = Verdict::Allow;
    allow.party.client_addr = "[fe80::1%2]:8080".parse().unwrap();
    allow.party.method = None;
    allow.dest = None;
    allow.resolved_ip = None;
    events.push(Event::Decision(allow));
    events.push(Event::PolicyReload(Reload {
        generation: 3,
        applied: false,
        rejection: 2,
        detail: "policy.yaml:4: bad \"host\"".into(),
    }));
    events.push(Event::Aggregate(Aggregate {
        id: 7,
        dest: None,
        task_id: Some("t-1".into()),
        project_id: None,
        count: 12,
        bytes_sent: 1200,
        bytes_received: 99_000,
        window_start: "2026-11-22T10:00:00Z".into(),
    }));
    events.push(Event::AdminRefused(AdminRefusal {
        who: None,
        action: "POST /ui/login".into(),
        status: 429,
        reason: "too many".into(),
        client_addr: None,
    }));
    for (change, hosts, ports) in [
        (Change::Requested, vec![], vec![]),
        (
            Change::Expired,
            vec!["pypi.org".to_owned(), "a\"b".to_owned()],
            vec![443, 8443],
        ),
    ] {
        let hosts_empty = hosts.is_empty();
        events.push(Event::Exception(Box::new(ExceptionChange {
            change,
            exception: Exception {
                id: "ex-1".into(),
                task_id: "t-1".into(),
                project_id: Some("p".into()),
                hosts,
                ports,
                ttl_seconds: 600,
                reason: "install deps".into(),
                requested_by: "agent".into(),
                requested_at: 1_790_000_000,
                state: ExceptionState::Approved,
                decided_by: Some("bob".into()),
                decided_at: Some(1_790_000_100),
                note: None,
                expires_at: Some(1_790_000_700),
                below: Default::default(),
                // The empty one asks for a tweak instead of hosts.
                tweak: hosts_empty.then(|| sandgate_policy::exception::Tweak {
                    sandbox: "web".into(),
                    max_seconds: Some(600),
                    network: true,
                    workspace: Some("/srv/x".into()),
                    ..Default::default()
                }),
            },
            by: None,
        })));
    }
    for event in events {
        assert_same(&event.stamp());
    }
}
