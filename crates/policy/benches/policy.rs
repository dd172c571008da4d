//! Micro-benchmarks of the pure core: a decision against 10,000 rules (exact and wildcard,
//! hit and miss) and the address classifier. Run: `cargo bench -p sandgate-policy`.

#![allow(clippy::panic, reason = "benchmark setup")]

use std::hint::black_box;
use std::net::IpAddr;

use criterion::{Criterion, criterion_group, criterion_main};
use sandgate_policy::{Access, Context, Pattern, Ruleset, Target, classify, parse_connect_target};

fn ruleset(n: usize) -> Ruleset {
    let mut rules = Ruleset::new();
    for i in 0..n {
        let text = if i % 2 == 0 {
            format!("host{i}.example{}.com", i % 97)
        } else {
            format!("*.zone{i}.example.net")
        };
        rules.allow(Pattern::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}")));
    }
    for i in 0..n / 100 {
        rules.deny(Pattern::parse(&format!("bad{i}.example.org")).unwrap_or_else(|e| panic!("{e}")));
    }
    rules
}

fn target(text: &str) -> Target {
    parse_connect_target(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn decisions(c: &mut Criterion) {
    let rules = ruleset(10_000);
    let cases = [
        ("exact_hit", target("host5000.example53.com:443")),
        ("wildcard_hit", target("a.b.c.zone5001.example.net:443")),
        ("miss", target("nothing.here.example.com:443")),
        ("deep_miss", target("a.b.c.d.e.f.g.h.example.com:443")),
    ];
    let mut group = c.benchmark_group("decide_10k_rules");
    for (name, t) in &cases {
        group.bench_function(*name, |b| {
            b.iter(|| rules.decide(black_box(t), Access::Connect, &Context::system(0)))
        });
    }
    group.finish();
}

/// The same decisions with 0 and with 10,000 active exceptions (each a task-scoped entry for
/// a task of its own, as the control plane publishes them): they must cost the same.
fn exceptions(c: &mut Criterion) {
    use sandgate_policy::exception::{Enablement, ExceptionPolicy, Narrowing, NewRequest};
    let policy = ExceptionPolicy {
        enabled: (0..10_000)
            .map(|i| Enablement {
                scope: sandgate_policy::Scope::Task(format!("t-{i}")),
                ports: vec![443],
                max_ttl_seconds: 900,
            })
            .collect(),
    };
    let mut with = ruleset(10_000);
    for i in 0..10_000 {
        let req = NewRequest {
            task_id: format!("t-{i}"),
            project_id: None,
            requested_hosts: vec![format!("extra{i}.example.io")],
            requested_ports: Some(vec![443]),
            ttl_seconds: 900,
            reason: "bench".into(),
            ..NewRequest::default()
        };
        let mut ex = policy
            .admit(req, format!("ex-{i}"), "agent", 0)
            .unwrap_or_else(|e| panic!("{e}"));
        ex.approve("alice", 0, &Narrowing::default())
            .unwrap_or_else(|e| panic!("{e}"));
        ex.entries().into_iter().for_each(|e| with.allow_entry(e));
    }
    let without = ruleset(10_000);
    let ctx = Context {
        task: Some("t-5000"),
        project: None,
        now: 1,
    };
    let cases = [
        ("exact_hit", target("host5000.example53.com:443")),
        ("miss", target("nothing.here.example.com:443")),
        ("exception_hit", target("extra5000.example.io:443")),
    ];
    let mut group = c.benchmark_group("decide_with_exceptions");
    for (label, rules) in [("0", &without), ("10k", &with)] {
        for (name, t) in &cases {
            group.bench_function(format!("{label}/{name}"), |b| {
                b.iter(|| rules.decide(black_box(t), Access::Connect, &ctx))
            });
        }
    }
    group.finish();
}

fn parsing(c: &mut Criterion) {
    c.bench_function("parse_connect_target", |b| {
        b.iter(|| parse_connect_target(black_box("api.example.com:443")))
    });
}

fn classifier(c: &mut Criterion) {
    let ips: Vec<IpAddr> = [
        "8.8.8.8",
        "10.1.2.3",
        "169.254.169.254",
        "2606:4700::1111",
        "::ffff:127.0.0.1",
        "2001:0:4136:e378:8000:63bf:3f57:fefe",
    ]
    .iter()
    .map(|s| s.parse().unwrap_or_else(|e| panic!("{e}")))
    .collect();
    let mut group = c.benchmark_group("classify");
    for ip in &ips {
        group.bench_function(ip.to_string(), |b| b.iter(|| classify(black_box(*ip))));
    }
    group.finish();
}

criterion_group!(benches, decisions, exceptions, parsing, classifier);
criterion_main!(benches);
