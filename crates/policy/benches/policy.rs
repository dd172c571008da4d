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

criterion_group!(benches, decisions, parsing, classifier);
criterion_main!(benches);
