//! What the audit writer spends encoding one line: the two events of a plain-HTTP GET
//! (its decision and its close), as the proxy records them, and an exception change with
//! strings that need escaping. `cargo bench -p sandgate-audit`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "bench")]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use sandgate_audit::event::{Close, Decision, Dest, Party};
use sandgate_audit::{Event, Line, Outcome};
use sandgate_policy::{Identity, Verdict};

fn party() -> Party {
    Party {
        request_id: "1c0fe66d00000001".into(),
        client_addr: ([127, 0, 0, 1], 46_646).into(),
        identity: Arc::new(Identity::default()),
        method: Some("GET".into()),
        path: Some("/index.html".into()),
        node: None,
    }
}

fn dest() -> Dest {
    Dest {
        scheme: "http",
        host: "127.0.0.1".into(),
        port: 18_080,
    }
}

fn events() -> [(&'static str, Event); 3] {
    let decision = Event::Decision(Decision {
        party: party(),
        dest: Some(dest()),
        verdict: Verdict::Allow,
        reason_code: "allowlisted".into(),
        resolved_ip: Some([127, 0, 0, 1].into()),
        rule: Some("allow:127.0.0.1:18080".into()),
        status: None,
        tls_server_name: None,
        would_deny: None,
        detail: None,
    });
    let close = Event::Close(Close {
        party: party(),
        dest: dest(),
        resolved_ip: Some([127, 0, 0, 1].into()),
        status: Some(200),
        bytes_sent: 98,
        bytes_received: 757,
        duration_ms: 2,
        outcome: Outcome::Ok,
    });
    let mut escaped = party();
    escaped.path = Some("/a \"quoted\" path\\with\ttabs".into());
    let denied = Event::Decision(Decision {
        party: escaped,
        dest: Some(dest()),
        verdict: Verdict::Deny,
        reason_code: "not_allowlisted".into(),
        resolved_ip: None,
        rule: None,
        status: Some(403),
        tls_server_name: None,
        would_deny: None,
        detail: Some("line one\nline two".into()),
    });
    [("decision", decision), ("close", close), ("escaped", denied)]
}

fn encode(c: &mut Criterion) {
    let mut out = Vec::with_capacity(4096);
    for (name, event) in events() {
        let stamped = event.stamp();
        c.bench_function(&format!("audit line: {name}"), |b| {
            b.iter(|| {
                out.clear();
                Line::of(black_box(&stamped)).write_json(&mut out);
                black_box(out.len())
            });
        });
    }
}

criterion_group!(benches, encode);
criterion_main!(benches);
