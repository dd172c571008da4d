use super::*;
use crate::entry::Scope;
use crate::target::parse_connect_target;

#[test]
fn address_deny_entries_apply_to_resolved_addresses() {
    let r = rules(&["*"], &["192.0.2.7", "[2001:db8::7]:443", "198.51.100.1"]);
    let ctx = Context::system(0);
    let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
    assert!(r.deny_address(ip("192.0.2.7"), 443, &ctx).is_some());
    assert!(r.deny_address(ip("::ffff:192.0.2.7"), 80, &ctx).is_some());
    assert!(r.deny_address(ip("2001:db8::7"), 443, &ctx).is_some());
    assert!(
        r.deny_address(ip("2001:db8::7"), 80, &ctx).is_none(),
        "that entry names port 443"
    );
    assert!(r.deny_address(ip("192.0.2.8"), 443, &ctx).is_none());
    assert!(
        rules(&["*"], &["*.example.com"])
            .deny_address(ip("192.0.2.7"), 443, &ctx)
            .is_none()
    );
}

/// The attacker's name answers with an IPv6 address that a NAT64, 6to4 or Teredo
/// gateway delivers to the denied IPv4 address.
#[test]
fn address_deny_entries_hold_for_the_ipv4_an_ipv6_answer_carries() {
    let r = rules(&["*"], &["8.8.8.8"]);
    let ctx = Context::system(0);
    let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
    for carrier in [
        "64:ff9b::808:808",
        "64:ff9b:1::808:808",
        "::8.8.8.8",
        "2002:808:808::1",
        "2001:0:808:808::f7f7:f7f7",
    ] {
        assert!(r.deny_address(ip(carrier), 443, &ctx).is_some(), "{carrier}");
    }
    assert!(r.deny_address(ip("64:ff9b::808:809"), 443, &ctx).is_none());
}

fn rules(allow: &[&str], deny: &[&str]) -> Ruleset {
    let mut r = Ruleset::new();
    for a in allow {
        r.allow(Pattern::parse(a).unwrap());
    }
    for d in deny {
        r.deny(Pattern::parse(d).unwrap());
    }
    r
}

fn decide(r: &Ruleset, target: &str, access: Access) -> Decision {
    r.decide(
        &parse_connect_target(target).unwrap(),
        access,
        &Context::system(0),
    )
}

fn label(d: &Decision) -> Option<String> {
    d.rule_label().map(|l| l.to_string())
}

#[test]
fn default_deny() {
    let r = rules(&[], &[]);
    let d = decide(&r, "example.com:443", Access::Connect);
    assert_eq!(
        (d.verdict, d.reason, d.rule),
        (Verdict::Deny, PolicyReason::NotAllowlisted, None)
    );
}

#[test]
fn deny_wins_over_allow() {
    let r = rules(&["*.example.com", "*"], &["bad.example.com"]);
    let d = decide(&r, "bad.example.com:443", Access::Connect);
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(label(&d).as_deref(), Some("deny:bad.example.com"));
    let d = decide(&r, "good.example.com:443", Access::Connect);
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(label(&d).as_deref(), Some("allow:*.example.com"));
}

#[test]
fn wildcard_deny_covers_subdomains_only() {
    let r = rules(&["*"], &["*.evil.example"]);
    assert_eq!(
        decide(&r, "x.evil.example:443", Access::Connect).verdict,
        Verdict::Deny
    );
    assert_eq!(
        decide(&r, "evil.example:443", Access::Connect).verdict,
        Verdict::Allow
    );
}

#[test]
fn most_specific_rule_is_reported() {
    let r = rules(&["*", "*.example.com", "api.example.com"], &[]);
    let d = decide(&r, "api.example.com:443", Access::Connect);
    assert_eq!(label(&d).as_deref(), Some("allow:api.example.com"));
}

#[test]
fn ip_literals_only_when_listed() {
    let r = rules(&["*", "192.0.2.7"], &[]);
    assert_eq!(
        decide(&r, "192.0.2.7:443", Access::Connect).verdict,
        Verdict::Allow
    );
    assert_eq!(
        decide(&r, "192.0.2.8:443", Access::Connect).verdict,
        Verdict::Deny
    );
}

#[test]
fn expired_rules_that_would_match_are_found_in_scope_only() {
    let entry = |host: &str, scope: Scope, expires_at: Option<i64>| Entry {
        expires_at,
        scope,
        ..Entry::from_flag(Pattern::parse(host).unwrap())
    };
    let mut r = Ruleset::new();
    r.allow_entry(entry("a.example", Scope::System, Some(100)));
    r.allow_entry(entry("a.example", Scope::Task("t-2".into()), Some(100)));
    r.allow_entry(entry("*.b.example", Scope::System, None));
    let target = parse_connect_target("a.example:443").unwrap();
    let at = |now| Context {
        task: Some("t-1"),
        project: None,
        now,
    };
    assert!(r.expired_matches(&target, Access::Connect, &at(99)).is_empty());
    let found = r.expired_matches(&target, Access::Connect, &at(100));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].scope, Scope::System);
    let other = parse_connect_target("b.example:443").unwrap();
    assert!(r.expired_matches(&other, Access::Connect, &at(100)).is_empty());
}
