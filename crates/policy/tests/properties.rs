//! Property tests for the policy core: parsers never panic and round-trip, wildcards respect
//! label boundaries, the indexed decision equals a naive scan, and embedded IPv4 forms
//! classify as the IPv4 they carry.

use std::net::Ipv4Addr;

use proptest::prelude::*;
use sandgate_policy::addr::{classify_v4, classify_v6};
use sandgate_policy::{
    Access, Host, Pattern, Ruleset, Target, Verdict, parse_connect_target, parse_http_target,
};

fn label() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,8}[a-z0-9]"
}

fn name() -> impl Strategy<Value = String> {
    prop::collection::vec(label(), 1..4).prop_map(|v| v.join("."))
}

proptest! {
    #[test]
    fn host_parser_never_panics_and_round_trips(s in "\\PC{0,40}") {
        if let Ok(host) = Host::parse(&s) {
            prop_assert_eq!(Host::parse(&host.to_string()), Ok(host));
        }
    }

    #[test]
    fn target_parsers_never_panic(s in "[ -~]{0,60}") {
        let _ = parse_connect_target(&s);
        let _ = parse_http_target(&s);
        let _ = parse_http_target(&format!("http://{s}"));
    }

    #[test]
    fn pattern_parser_round_trips(s in "[*a-zA-Z0-9.:\\[\\]-]{0,30}") {
        if let Ok(p) = Pattern::parse(&s) {
            prop_assert_eq!(Pattern::parse(&p.to_string()), Ok(p));
        }
    }

    #[test]
    fn wildcard_matches_only_below_label_boundary(sub in name(), glue in label()) {
        let p = Pattern::parse("*.example.com").unwrap();
        let t = |h: String| Target { host: Host::parse(&h).unwrap(), port: 443 };
        let below = t(format!("{sub}.example.com"));
        let glued = t(format!("{glue}example.com"));
        let tail = t(format!("{sub}.example.com.{glue}.net"));
        prop_assert!(p.allows(&below, Access::Connect));
        prop_assert!(!p.allows(&glued, Access::Connect));
        prop_assert!(!p.allows(&tail, Access::Connect));
        prop_assert!(!p.allows(&t("example.com".to_owned()), Access::Connect));
    }

    #[test]
    fn indexed_decision_equals_naive_scan(
        allow in prop::collection::vec((name(), any::<bool>(), prop::option::of(1u16..3)), 0..12),
        deny in prop::collection::vec((name(), any::<bool>()), 0..4),
        target in name(),
        port in prop::sample::select(vec![1u16, 2, 80, 443]),
        connect in any::<bool>(),
    ) {
        let mk = |n: &String, wild: bool, port: Option<u16>| {
            let host = if wild { format!("*.{n}.test") } else { format!("{n}.test") };
            let text = match port { Some(p) => format!("{host}:{p}"), None => host };
            Pattern::parse(&text).unwrap()
        };
        let allow: Vec<Pattern> = allow.iter().map(|(n, w, p)| mk(n, *w, *p)).collect();
        let deny: Vec<Pattern> = deny.iter().map(|(n, w)| mk(n, *w, None)).collect();
        let mut rules = Ruleset::new();
        allow.iter().cloned().for_each(|p| rules.allow(p));
        deny.iter().cloned().for_each(|p| rules.deny(p));
        let target = Target { host: Host::parse(&format!("{target}.test")).unwrap(), port };
        let access = if connect { Access::Connect } else { Access::Http };
        let naive = !deny.iter().any(|p| p.denies(&target))
            && allow.iter().any(|p| p.allows(&target, access));
        prop_assert_eq!(rules.decide(&target, access, &sandgate_policy::Context::system(0)).verdict == Verdict::Allow, naive);
    }

    #[test]
    fn embedded_forms_classify_as_carried_ipv4(bits in any::<u32>()) {
        let v4 = Ipv4Addr::from(bits);
        let want = classify_v4(v4);
        prop_assert_eq!(classify_v6(v4.to_ipv6_mapped()), want);
        prop_assert_eq!(classify_v6(format!("64:ff9b::{v4}").parse().unwrap()), want);
        let six_to_four = (0x2002u128 << 112) | (u128::from(bits) << 80);
        prop_assert_eq!(classify_v6(six_to_four.into()), want);
    }
}

/// A path pattern over a small alphabet, so that patterns and paths meet often.
fn path_pattern() -> impl Strategy<Value = String> {
    let segment = prop_oneof!["a", "b", "ab", "\\*", "\\*\\*", "a\\*", "\\*b"];
    prop::collection::vec(segment, 1..5).prop_map(|s| format!("/{}", s.join("/")))
}

fn request_path() -> impl Strategy<Value = String> {
    prop::collection::vec(prop_oneof!["a", "b", "ab", "ba", "aab"], 0..6)
        .prop_map(|s| format!("/{}", s.join("/")))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    /// What an approval may narrow to never widens: when `within` says a pattern is inside
    /// another, every path the inner one matches, the outer one matches too.
    #[test]
    fn a_pattern_within_another_matches_nothing_more(
        inner in path_pattern(),
        outer in path_pattern(),
        paths in prop::collection::vec(request_path(), 1..24),
    ) {
        use sandgate_policy::{CanonicalPath, PathPattern};
        let (Ok(i), Ok(o)) = (PathPattern::parse(&inner), PathPattern::parse(&outer)) else {
            return Ok(());
        };
        if i.within(&o) {
            for p in &paths {
                let p = CanonicalPath::parse(p).expect("the alphabet is canonical");
                prop_assert!(!i.matches(&p) || o.matches(&p), "{inner} within {outer}, but {p:?}");
            }
        }
    }
}
