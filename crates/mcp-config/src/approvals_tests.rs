use std::collections::BTreeMap;

use super::*;
use sandgate_policy::exception::BelowHost;

const ADMIN: &str = "http://127.0.0.1:9090";

fn policy(net: &str) -> SandboxPolicy {
    let text = format!("apiVersion: sandgate.dev/v1\nkind: SandboxPolicy\nnet: {net}\n");
    let identity = |p: &std::path::Path| Ok(p.to_path_buf());
    sandgate_sandbox::policy::parse(&text, &BTreeMap::new(), &identity, None)
        .unwrap_or_else(|e| unreachable!("{net}: {e}"))
}

fn followed(from: &str) -> Approvals {
    Approvals::of(&policy(&format!(
        "{{ mode: allowlist, allow_domains: [ a.test ], exceptions: {{ from: \"{from}\", token_file: f.token, ports: [ 443, 8443 ], max_ttl_seconds: 600 }} }}"
    )))
}

#[test]
fn each_network_mode_has_its_path() {
    assert_eq!(
        followed(ADMIN),
        Approvals::Followed {
            from: ADMIN.to_owned(),
            ports: vec![443, 8443],
            max_ttl_seconds: 600
        }
    );
    let cases = [
        (
            "{ mode: allowlist, allow_domains: [ a.test ] }",
            Approvals::OwnProxy {
                mode: NetMode::Allowlist,
            },
        ),
        ("{ mode: proxy }", Approvals::OwnProxy { mode: NetMode::Proxy }),
        (
            "{ mode: proxy, proxy: { upstream: \"10.0.0.5:3128\" } }",
            Approvals::Upstream {
                via: "10.0.0.5:3128".to_owned(),
            },
        ),
        ("{ mode: none }", Approvals::NoNetwork { mode: NetMode::None }),
        (
            "{ mode: loopback }",
            Approvals::NoNetwork {
                mode: NetMode::Loopback,
            },
        ),
        ("{ mode: all }", Approvals::Unfiltered),
    ];
    for (net, want) in cases {
        assert_eq!(Approvals::of(&policy(net)), want, "{net}");
    }
}

#[test]
fn list_sandboxes_says_how_approvals_apply() {
    assert_eq!(followed(ADMIN).kind(Some(ADMIN)), FOLLOWED);
    assert_eq!(followed(ADMIN).kind(None), FOLLOWED);
    assert_eq!(followed("http://127.0.0.1:9999").kind(Some(ADMIN)), NONE);
    let upstream = Approvals::Upstream {
        via: "10.0.0.5:3128".to_owned(),
    };
    assert_eq!(upstream.kind(Some(ADMIN)), UPSTREAM);
    assert!(
        upstream
            .detail(Some(ADMIN), "t-1")
            .contains("only if that proxy hosts or follows the control plane at http://127.0.0.1:9090"),
    );
    let own = Approvals::OwnProxy {
        mode: NetMode::Allowlist,
    };
    assert_eq!(own.kind(Some(ADMIN)), NONE);
    assert!(
        own.detail(Some(ADMIN), "t-1")
            .contains("net.exceptions: { from: \"http://127.0.0.1:9090\", token_file: FILE }"),
        "{}",
        own.detail(Some(ADMIN), "t-1")
    );
    assert!(
        followed(ADMIN)
            .detail(Some(ADMIN), "t-1")
            .contains("approved there for task t-1 apply on ports [443, 8443] for up to 600 s")
    );
}

#[test]
fn a_server_that_files_requests_refuses_sandboxes_approvals_cannot_reach() {
    let own = Approvals::OwnProxy {
        mode: NetMode::Allowlist,
    };
    let problem = own.start_problem(ADMIN).unwrap_or_default();
    assert!(
        problem.starts_with("net.mode allowlist: the run's own proxy decides and follows no control plane")
            && problem.contains(
                "add to the policy net.exceptions: { from: \"http://127.0.0.1:9090\", token_file: FILE }"
            ),
        "{problem}"
    );
    let elsewhere = followed("http://127.0.0.1:9999")
        .start_problem(ADMIN)
        .unwrap_or_default();
    assert!(
        elsewhere
            .starts_with("net.exceptions.from is \"http://127.0.0.1:9999\", not \"http://127.0.0.1:9090\""),
        "{elsewhere}"
    );
    for fine in [
        followed(ADMIN),
        followed("http://localhost:9090/"),
        Approvals::Upstream {
            via: "x:1".to_owned(),
        },
        Approvals::NoNetwork { mode: NetMode::None },
        Approvals::Unfiltered,
    ] {
        assert_eq!(fine.start_problem(ADMIN), None, "{fine:?}");
    }
}

#[test]
fn control_planes_compare_in_canonical_form() {
    for (a, b, same) in [
        (ADMIN, "http://127.0.0.1:9090/", true),
        (ADMIN, "HTTP://127.0.0.1:9090", true),
        (ADMIN, "http://localhost:9090", true),
        (ADMIN, "http://127.0.0.1:9091", false),
        (ADMIN, "http://127.0.0.2:9090", false),
        ("http://[::1]:9090", "http://[0:0:0:0:0:0:0:1]:9090", true),
        ("http://[::1]:9090", "http://localhost:9090", false),
        (ADMIN, "http://admin.example:9090", false),
        ("not a url", "not a url", false),
    ] {
        assert_eq!(same_control_plane(a, b), same, "{a} {b}");
    }
}

#[test]
fn an_exception_applies_within_the_runs_own_bounds() {
    let f = followed(ADMIN);
    assert_eq!(f.admits(&[443], 600, ADMIN), Ok(()));
    let port = f.admits(&[443, 80], 60, ADMIN).unwrap_err();
    assert!(
        port.starts_with("port 80: this sandbox's runs apply exceptions on ports [443, 8443] only"),
        "{port}"
    );
    let ttl = f.admits(&[443], 601, ADMIN).unwrap_err();
    assert!(ttl.contains("at most 600 s"), "{ttl}");
    // Followed elsewhere, or not at all: never.
    assert!(followed("http://127.0.0.1:1").admits(&[443], 60, ADMIN).is_err());
    assert!(
        Approvals::OwnProxy {
            mode: NetMode::Allowlist
        }
        .admits(&[443], 60, ADMIN)
        .is_err()
    );
    assert!(
        Approvals::NoNetwork { mode: NetMode::None }
            .admits(&[443], 60, ADMIN)
            .is_err()
    );
    assert_eq!(
        Approvals::Upstream {
            via: "x:1".to_owned()
        }
        .admits(&[8080], 9999, ADMIN),
        Ok(())
    );
}

fn exception(state: ExceptionState, hosts: &[&str], ports: &[u16], expires_at: Option<i64>) -> Exception {
    Exception {
        id: "ex-1".to_owned(),
        task_id: "t-1".to_owned(),
        project_id: None,
        hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        ports: ports.to_vec(),
        ttl_seconds: 300,
        reason: "r".to_owned(),
        requested_by: "agent".to_owned(),
        requested_at: 100,
        state,
        decided_by: None,
        decided_at: None,
        note: None,
        expires_at,
        below: Default::default(),
        tweak: None,
    }
}

#[test]
fn any_active_exception_holding_every_host_and_port_of_the_task_covers_a_request() {
    let hosts = |h: &[&str]| h.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let all = BelowHost::default();
    let wide = exception(
        ExceptionState::Approved,
        &["a.test", "b.test"],
        &[80, 443],
        Some(1000),
    );
    assert!(covers(&wide, "t-1", &hosts(&["a.test"]), &[443], &all, 999));
    assert!(covers(&wide, "t-1", &hosts(&["B.test."]), &[80, 443], &all, 999));
    assert!(!covers(
        &wide,
        "t-1",
        &hosts(&["a.test", "c.test"]),
        &[443],
        &all,
        999
    ));
    assert!(!covers(&wide, "t-1", &hosts(&["a.test"]), &[8443], &all, 999));
    assert!(!covers(&wide, "t-2", &hosts(&["a.test"]), &[443], &all, 999));
    // Expired at its second; pending or revoked covers nothing.
    assert!(!covers(&wide, "t-1", &hosts(&["a.test"]), &[443], &all, 1000));
    for state in [
        ExceptionState::Pending,
        ExceptionState::Revoked,
        ExceptionState::Denied,
    ] {
        let ex = exception(state, &["a.test"], &[443], Some(1000));
        assert!(
            !covers(&ex, "t-1", &hosts(&["a.test"]), &[443], &all, 999),
            "{state:?}"
        );
    }
}

/// An exception that allows some methods and paths covers a request for those or fewer, and
/// never one for more (or for every request).
#[test]
fn an_exception_below_the_host_covers_only_what_it_allows() {
    let hosts = vec!["a.test".to_owned()];
    let below = |m: Option<&[&str]>, p: Option<&[&str]>, ro: bool| {
        let own = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        BelowHost::new(m.map(own), p.map(own), ro)
    };
    let mut ex = exception(ExceptionState::Approved, &["a.test"], &[443], Some(1000));
    ex.below = below(Some(&["GET", "HEAD"]), Some(&["/org/**"]), false);
    let covered = |asked: &BelowHost| covers(&ex, "t-1", &hosts, &[443], asked, 999);
    assert!(covered(&below(Some(&["GET"]), Some(&["/org/repo/**"]), false)));
    assert!(covered(&below(Some(&["HEAD"]), Some(&["/org/x"]), false)));
    assert!(!covered(&below(Some(&["GET"]), None, false)), "every path");
    assert!(!covered(&below(None, Some(&["/org/**"]), false)), "every method");
    assert!(!covered(&below(Some(&["POST"]), Some(&["/org/**"]), false)));
    assert!(
        !covered(&below(None, Some(&["/org/**"]), true)),
        "OPTIONS is not allowed"
    );
    assert!(!covered(&BelowHost::default()), "every request");
}
