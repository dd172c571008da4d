use std::path::PathBuf;

use sandgate_sandbox::policy::{Limits, NetMode};

use super::*;
use crate::config::Gates;
use crate::limits::RunLimits;
use sandgate_policy::exception::BelowHost;

const ADMIN: &str = "http://127.0.0.1:9090";

fn sandbox(name: &str, approvals: Approvals, run_task: &str) -> Sandbox {
    Sandbox {
        name: name.to_owned(),
        description: String::new(),
        policy: PathBuf::from(format!("/srv/{name}.yaml")),
        net: NetMode::Allowlist,
        allowed_hosts: Vec::new(),
        policy_limits: Limits::default(),
        gates: Gates {
            commands: vec!["curl".to_owned()],
            max_seconds: 60,
            max_output_bytes: 1024,
            network: true,
            workspaces: Vec::new(),
            limits: RunLimits::default(),
            tweaks: None,
        },
        approvals,
        run_task: run_task.to_owned(),
        start_in_workspace: false,
    }
}

fn followed(from: &str) -> Approvals {
    Approvals::Followed {
        from: from.to_owned(),
        ports: vec![80, 443],
        max_ttl_seconds: 900,
    }
}

fn config(sandboxes: Vec<Sandbox>) -> Config {
    Config {
        name: "t".to_owned(),
        task: "t-1".to_owned(),
        audit_log: PathBuf::from("/srv/audit.jsonl"),
        audit_log_default: false,
        egress: None,
        sandboxes,
        max_concurrent_runs: 1,
        own_files: Vec::new(),
    }
}

fn hosts(h: &[&str]) -> Vec<String> {
    h.iter().map(|s| (*s).to_owned()).collect()
}

fn exception(id: &str, state: ExceptionState, hosts: &[&str], ports: &[u16], ttl: u32) -> Exception {
    Exception {
        id: id.to_owned(),
        task_id: "t-1".to_owned(),
        project_id: None,
        hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        ports: ports.to_vec(),
        ttl_seconds: ttl,
        reason: "r".to_owned(),
        requested_by: "agent".to_owned(),
        requested_at: 0,
        state,
        decided_by: None,
        decided_at: None,
        note: None,
        expires_at: (state == ExceptionState::Approved).then_some(1000),
        below: Default::default(),
        tweak: None,
    }
}

#[test]
fn a_request_is_for_the_sandboxes_an_approval_reaches_and_the_task_they_carry() {
    let c = config(vec![
        sandbox("offline", Approvals::NoNetwork { mode: NetMode::None }, "t-1"),
        sandbox("web", followed(ADMIN), "t-1"),
    ]);
    let p = plan(
        &c,
        ADMIN,
        None,
        &hosts(&["PyPI.org."]),
        None,
        300,
        BelowHost::default(),
    )
    .unwrap_or_else(|e| unreachable!("{e:?}"));
    assert_eq!(
        p.targets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["web"]
    );
    assert_eq!(
        (p.task.as_str(), p.hosts.clone(), p.ports.clone()),
        ("t-1", hosts(&["pypi.org"]), vec![80, 443])
    );

    let named = plan(
        &c,
        ADMIN,
        Some("offline"),
        &hosts(&["a.test"]),
        None,
        300,
        BelowHost::default(),
    )
    .unwrap_err();
    assert_eq!(named.gate, "egress");
    assert!(
        named.message.contains("sandbox \"offline\": net.mode none"),
        "{named:?}"
    );
    let unknown = plan(
        &c,
        ADMIN,
        Some("nope"),
        &hosts(&["a.test"]),
        None,
        300,
        BelowHost::default(),
    )
    .unwrap_err();
    assert_eq!(unknown.gate, "sandbox");
}

#[test]
fn a_request_no_run_would_apply_is_not_filed() {
    let c = config(vec![sandbox("web", followed(ADMIN), "t-1")]);
    let port = plan(
        &c,
        ADMIN,
        None,
        &hosts(&["a.test"]),
        Some(&[8443]),
        300,
        BelowHost::default(),
    )
    .unwrap_err();
    assert!(
        port.message
            .contains("not filed: no sandbox's runs would apply it (web: port 8443: this sandbox's runs apply exceptions on ports [80, 443] only"),
        "{port:?}"
    );
    let ttl = plan(
        &c,
        ADMIN,
        None,
        &hosts(&["a.test"]),
        None,
        901,
        BelowHost::default(),
    )
    .unwrap_err();
    assert!(ttl.message.contains("at most 900 s"), "{ttl:?}");
    // A run's own proxy following nothing, or another control plane: nothing to file for.
    for approvals in [
        Approvals::OwnProxy {
            mode: NetMode::Allowlist,
        },
        followed("http://127.0.0.1:1"),
    ] {
        let c = config(vec![sandbox("web", approvals, "t-1")]);
        let r = plan(
            &c,
            ADMIN,
            None,
            &hosts(&["a.test"]),
            None,
            60,
            BelowHost::default(),
        )
        .unwrap_err();
        assert!(
            r.message
                .contains("no approval reaches the runs of any sandbox here"),
            "{r:?}"
        );
    }
}

#[test]
fn sandboxes_whose_runs_carry_different_tasks_must_be_named() {
    let c = config(vec![
        sandbox("web", followed(ADMIN), "t-1"),
        sandbox(
            "node",
            Approvals::Upstream {
                via: "https://central:8443".to_owned(),
            },
            "node-a:t-1",
        ),
    ]);
    let r = plan(
        &c,
        ADMIN,
        None,
        &hosts(&["a.test"]),
        None,
        60,
        BelowHost::default(),
    )
    .unwrap_err();
    assert!(r.message.contains("name the sandbox"), "{r:?}");
    let p = plan(
        &c,
        ADMIN,
        Some("node"),
        &hosts(&["a.test"]),
        None,
        60,
        BelowHost::default(),
    )
    .unwrap_or_else(|e| unreachable!("{e:?}"));
    assert_eq!(p.task, "node-a:t-1");
}

/// The plan of a request for `a.test` on 443, for 300 s, every request, in `c`.
fn a_test_on_443(c: &Config) -> Plan<'_> {
    plan(
        c,
        ADMIN,
        None,
        &hosts(&["a.test"]),
        Some(&[443]),
        300,
        BelowHost::default(),
    )
    .unwrap_or_else(|e| unreachable!("{e:?}"))
}

#[test]
fn approved_means_an_active_exception_covers_the_ask_and_reaches_the_next_run() {
    let c = config(vec![sandbox("web", followed(ADMIN), "t-1")]);
    let p = a_test_on_443(&c);
    let pending = exception("ex-2", ExceptionState::Pending, &["a.test"], &[443], 300);
    let v = judge(&p, ADMIN, (&pending, &[]), 10, |_| true);
    assert!(!v.is_final());
    assert_eq!(v.state(10), "pending");

    // Another exception (an older request an approver picked) covers it: approved.
    let older = exception(
        "ex-1",
        ExceptionState::Approved,
        &["a.test", "b.test"],
        &[80, 443],
        300,
    );
    let v = judge(&p, ADMIN, (&pending, std::slice::from_ref(&older)), 10, |_| true);
    assert!(v.is_final());
    assert_eq!(
        (v.state(10), v.exception().id.as_str()),
        ("approved".to_owned(), "ex-1")
    );
    assert!(
        message(&p, &v, "u")
            .starts_with("Approved (exception ex-1): the next run in web reaches a.test until"),
        "{}",
        message(&p, &v, "u")
    );
    // Expired by now: not approved.
    assert_eq!(
        judge(&p, ADMIN, (&pending, std::slice::from_ref(&older)), 1000, |_| {
            true
        })
        .state(1000),
        "pending"
    );

    // Approved at the control plane, but beyond what the run's proxy applies.
    let long = exception("ex-3", ExceptionState::Approved, &["a.test"], &[443], 3600);
    let v = judge(&p, ADMIN, (&long, &[]), 10, |_| true);
    assert_eq!(v.state(10), "not_applied");
    assert!(
        message(&p, &v, "u").contains("at most 900 s"),
        "{}",
        message(&p, &v, "u")
    );

    // Approved narrower than asked.
    let p2 = plan(
        &c,
        ADMIN,
        None,
        &hosts(&["a.test", "b.test"]),
        Some(&[443]),
        300,
        BelowHost::default(),
    )
    .unwrap_or_else(|e| unreachable!("{e:?}"));
    let narrowed = exception("ex-4", ExceptionState::Approved, &["a.test"], &[443], 300);
    let v = judge(&p2, ADMIN, (&narrowed, &[]), 10, |_| true);
    assert_eq!(v.state(10), "not_applied");
    assert!(message(&p2, &v, "u").contains("narrower than asked"));

    // Denied: final, and said so.
    let denied = exception("ex-5", ExceptionState::Denied, &["a.test"], &[443], 300);
    let v = judge(&p, ADMIN, (&denied, &[]), 10, |_| true);
    assert!(v.is_final());
    assert_eq!(v.state(10), "denied");
}

#[test]
fn an_approval_through_an_upstream_says_on_what_it_depends() {
    let c = config(vec![sandbox(
        "web",
        Approvals::Upstream {
            via: "10.0.0.5:3128".to_owned(),
        },
        "t-1",
    )]);
    let p = plan(
        &c,
        ADMIN,
        None,
        &hosts(&["a.test"]),
        None,
        300,
        BelowHost::default(),
    )
    .unwrap_or_else(|e| unreachable!("{e:?}"));
    let ex = exception("ex-1", ExceptionState::Approved, &["a.test"], &[80, 443], 300);
    let v = judge(&p, ADMIN, (&ex, &[]), 10, |_| true);
    assert_eq!(v.state(10), "approved");
    assert!(
        message(&p, &v, "u").contains("In web the upstream proxy decides"),
        "{}",
        message(&p, &v, "u")
    );
}

/// A sandbox whose runs have no network now (its gate closed, no tweak opening it) is
/// reached by no approval: the agent hears `not_applied` and why, never `approved`.
#[test]
fn an_approval_does_not_reach_a_sandbox_whose_network_is_closed() {
    let c = config(vec![sandbox("web", followed(ADMIN), "t-1")]);
    let p = a_test_on_443(&c);
    let approved = exception("ex-1", ExceptionState::Approved, &["a.test"], &[443], 300);
    let closed = judge(&p, ADMIN, (&approved, &[]), 10, |_| false);
    assert_eq!(closed.state(10), "not_applied");
    assert!(
        matches!(&closed, Verdict::NotApplied { why, .. } if why.contains("request_tweak with network")),
        "{closed:?}"
    );
    let open = judge(&p, ADMIN, (&approved, &[]), 10, |_| true);
    assert_eq!(open.state(10), "approved");
}
