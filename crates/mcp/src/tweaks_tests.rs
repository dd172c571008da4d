//! Tweaks against a sandbox's bounds: what may be asked, what active tweaks grant (never
//! beyond the bounds, never another sandbox's or task's, never an expired one), and when
//! the agent is told `approved`.

use std::path::PathBuf;

use sandgate_policy::ExceptionState;
use sandgate_sandbox::policy::{Limits, NetMode};

use super::*;
use crate::approvals::Approvals;
use crate::limits::RunLimits;

fn sandbox(name: &str, bounds: Option<TweakBounds>) -> Sandbox {
    Sandbox {
        name: name.to_owned(),
        description: String::new(),
        policy: PathBuf::from(format!("/srv/{name}.yaml")),
        net: NetMode::Allowlist,
        allowed_hosts: Vec::new(),
        policy_limits: Limits::default(),
        gates: Gates {
            commands: vec!["curl".to_owned()],
            max_seconds: 30,
            max_output_bytes: 1024,
            network: false,
            workspaces: Vec::new(),
            limits: RunLimits::default(),
            tweaks: bounds,
        },
        approvals: Approvals::NoNetwork { mode: NetMode::None },
        run_task: "t-1".to_owned(),
        start_in_workspace: false,
    }
}

fn bounds() -> TweakBounds {
    TweakBounds {
        max_seconds: Some(600),
        max_output_bytes: Some(1 << 20),
        network: true,
        workspaces: vec![PathBuf::from("/srv/work")],
    }
}

fn tweak(sandbox: &str) -> Tweak {
    Tweak {
        sandbox: sandbox.to_owned(),
        ..Tweak::default()
    }
}

fn exception(id: &str, t: Tweak, state: ExceptionState, expires_at: i64) -> Exception {
    Exception {
        id: id.to_owned(),
        task_id: "t-1".to_owned(),
        project_id: None,
        hosts: Vec::new(),
        ports: Vec::new(),
        ttl_seconds: 300,
        reason: "r".to_owned(),
        requested_by: "agent".to_owned(),
        requested_at: 0,
        state,
        decided_by: Some("alice".to_owned()),
        decided_at: Some(0),
        note: None,
        expires_at: Some(expires_at),
        below: Default::default(),
        tweak: Some(t),
    }
}

#[test]
fn an_ask_beyond_the_bounds_is_refused_naming_the_bound() {
    let web = sandbox("web", Some(bounds()));
    let ok = Tweak {
        max_seconds: Some(600),
        max_output_bytes: Some(1 << 20),
        network: true,
        workspace: Some("/srv/work/a".into()),
        ..tweak("web")
    };
    assert_eq!(admissible(&web, &ok), Ok(()));
    let cases: Vec<(Tweak, &str)> = vec![
        (
            Tweak {
                max_seconds: Some(601),
                ..tweak("web")
            },
            "tweaks.max_seconds: 600",
        ),
        (
            Tweak {
                max_output_bytes: Some((1 << 20) + 1),
                ..tweak("web")
            },
            "tweaks.max_output_bytes",
        ),
        (
            Tweak {
                workspace: Some("/srv/workshop".into()),
                ..tweak("web")
            },
            "tweaks.workspaces",
        ),
        (
            Tweak {
                workspace: Some("/etc".into()),
                ..tweak("web")
            },
            "tweaks.workspaces",
        ),
        (tweak("web"), "asks for nothing"),
    ];
    for (t, why) in cases {
        let r = admissible(&web, &t).unwrap_err();
        assert_eq!(r.gate, "tweaks");
        assert!(r.message.contains(why), "{t:?}: {}", r.message);
    }
    let time_only = sandbox(
        "web",
        Some(TweakBounds {
            max_seconds: Some(600),
            ..TweakBounds::default()
        }),
    );
    for more in [
        Tweak {
            network: true,
            ..tweak("web")
        },
        Tweak {
            max_output_bytes: Some(1),
            ..tweak("web")
        },
        Tweak {
            workspace: Some("/srv/work".into()),
            ..tweak("web")
        },
    ] {
        assert!(admissible(&time_only, &more).is_err(), "{more:?}");
    }
    let none = sandbox("web", None);
    let r = admissible(
        &none,
        &Tweak {
            max_seconds: Some(1),
            ..tweak("web")
        },
    )
    .unwrap_err();
    assert!(r.message.contains("takes no tweaks"), "{}", r.message);
}

#[test]
fn active_tweaks_grant_within_the_bounds_only_to_their_sandbox() {
    let web = sandbox("web", Some(bounds()));
    let huge = Tweak {
        max_seconds: Some(3600),
        max_output_bytes: Some(1 << 30),
        network: true,
        workspace: Some("/srv/work/x".into()),
        ..tweak("web")
    };
    let seen = vec![
        exception("ex-1", huge.clone(), ExceptionState::Approved, 100),
        exception(
            "ex-2",
            Tweak {
                max_seconds: Some(120),
                ..tweak("web")
            },
            ExceptionState::Approved,
            100,
        ),
        // Another sandbox's, an expired one, a pending one, one outside the workspaces.
        exception(
            "ex-3",
            Tweak {
                max_seconds: Some(600),
                ..tweak("db")
            },
            ExceptionState::Approved,
            100,
        ),
        exception("ex-4", huge.clone(), ExceptionState::Approved, 10),
        exception("ex-5", huge.clone(), ExceptionState::Pending, 100),
        exception(
            "ex-6",
            Tweak {
                workspace: Some("/etc".into()),
                ..tweak("web")
            },
            ExceptionState::Approved,
            100,
        ),
    ];
    let g = granted(&web, &seen, 50);
    assert_eq!(g.ids, vec!["ex-1".to_owned(), "ex-2".to_owned()]);
    assert_eq!(g.max_seconds, Some(600), "capped by the bounds");
    assert_eq!(g.max_output_bytes, Some(1 << 20), "capped by the bounds");
    assert!(g.network);
    assert_eq!(g.workspaces, vec![PathBuf::from("/srv/work/x")]);
    let gates = widened(&web.gates, &g);
    assert_eq!(
        (gates.max_seconds, gates.max_output_bytes, gates.network),
        (600, 1 << 20, true)
    );
    // Another task's runs, or a sandbox without bounds, get nothing.
    let mut other = web.clone();
    other.run_task = "t-2".to_owned();
    assert!(granted(&other, &seen, 50).is_nothing());
    assert!(granted(&sandbox("web", None), &seen, 50).is_nothing());
    assert_eq!(widened(&web.gates, &Granted::default()), web.gates);
    // At its expiry second it grants nothing.
    assert!(granted(&web, &seen, 100).is_nothing());
}

#[test]
fn approved_only_when_an_active_tweak_covers_the_ask() {
    let web = sandbox("web", Some(bounds()));
    let asked = Tweak {
        max_seconds: Some(300),
        ..tweak("web")
    };
    let filed = exception("ex-1", asked.clone(), ExceptionState::Pending, 0);
    assert_eq!(judge(&web, &asked, &filed, &[], 50).state(50), "pending");
    let wider = exception(
        "ex-2",
        Tweak {
            max_seconds: Some(600),
            ..tweak("web")
        },
        ExceptionState::Approved,
        100,
    );
    let v = judge(&web, &asked, &filed, std::slice::from_ref(&wider), 50);
    assert_eq!(v.state(50), "approved");
    assert_eq!(v.exception().id, "ex-2");
    let narrower = exception(
        "ex-3",
        Tweak {
            max_seconds: Some(60),
            ..tweak("web")
        },
        ExceptionState::Approved,
        100,
    );
    let other = exception(
        "ex-4",
        Tweak {
            max_seconds: Some(600),
            ..tweak("db")
        },
        ExceptionState::Approved,
        100,
    );
    assert_eq!(
        judge(&web, &asked, &filed, &[narrower, other], 50).state(50),
        "pending"
    );
    let mut denied = filed.clone();
    denied.state = ExceptionState::Denied;
    let v = judge(&web, &asked, &denied, &[], 50);
    assert!(v.is_final());
    assert_eq!(v.state(50), "denied");
    // The request itself approved for less (an approver narrowed it): final, not_applied
    // and saying what was granted, never `expired` nor `approved`.
    let mut narrowed = exception(
        "ex-1",
        Tweak {
            max_seconds: Some(30),
            ..tweak("web")
        },
        ExceptionState::Approved,
        100,
    );
    narrowed.id = filed.id.clone();
    let v = judge(&web, &asked, &narrowed, &[], 50);
    assert!(v.is_final());
    assert_eq!(v.state(50), "not_applied");
    let Verdict::NotApplied { why, .. } = &v else {
        unreachable!("{v:?}")
    };
    assert!(
        why.contains("max_seconds=30") && why.contains("max_seconds=300"),
        "{why}"
    );
    // Once it has expired, it reads as expired.
    assert_eq!(judge(&web, &asked, &narrowed, &[], 100).state(100), "expired");
}

/// A run holds what only a tweak gave it; it is kept while what is granted still gives all
/// of it, and when it is not, the grants it relied on that ended are named (not those it
/// did not need, nor another sandbox's).
#[test]
fn a_run_holds_what_only_a_tweak_gave_it_until_that_tweak_ends() {
    let mut s = sandbox("web", Some(bounds()));
    s.gates.workspaces = vec![PathBuf::from("/srv/plain")];
    let longer = |secs: u64| Tweak {
        max_seconds: Some(secs),
        ..tweak("web")
    };
    let seen = vec![
        exception("ex-60", longer(60), ExceptionState::Approved, 500),
        exception("ex-120", longer(120), ExceptionState::Approved, 300),
        exception(
            "ex-net",
            Tweak {
                network: true,
                ..tweak("web")
            },
            ExceptionState::Approved,
            500,
        ),
        exception(
            "ex-db",
            Tweak {
                max_seconds: Some(600),
                ..tweak("db")
            },
            ExceptionState::Approved,
            500,
        ),
    ];
    let at_start = granted(&s, &seen, 100);
    assert_eq!(at_start.ids, ["ex-60", "ex-120", "ex-net"]);
    assert_eq!(at_start.grants[1].gives, longer(120));
    assert_eq!(at_start.grants[1].expires_at, Some(300));

    // Within the plain gates (and a network sandbox with `network: true`): nothing held.
    s.gates.network = true;
    let plain = Holding::of(&s, 30, 1024, Some(Path::new("/srv/plain/a")));
    assert!(plain.is_nothing());
    assert!(plain.kept_by(&Granted::default()));
    s.gates.network = false;

    let h = Holding::of(&s, 100, 1024, Some(Path::new("/srv/plain/a")));
    assert_eq!(h.seconds, Some(100));
    assert!(h.network, "the gates keep the network off");
    assert!(h.kept_by(&at_start));
    assert!(!h.relies_on(&at_start.grants[0]), "60 s does not give 100");
    assert!(h.relies_on(&at_start.grants[1]));
    // ex-60 gone: still kept. ex-120 gone (revoked, or past its second): ended, named.
    let without = |id: &str| {
        granted(
            &s,
            &seen.iter().filter(|e| e.id != id).cloned().collect::<Vec<_>>(),
            100,
        )
    };
    assert!(h.kept_by(&without("ex-60")));
    let now = without("ex-120");
    assert!(!h.kept_by(&now));
    let ended: Vec<&str> = h.ended(&at_start, &now).iter().map(|g| g.id.as_str()).collect();
    assert_eq!(ended, ["ex-120"]);
    assert!(!h.kept_by(&granted(&s, &seen, 300)), "at its expiry second");
    assert!(!h.kept_by(&without("ex-net")));

    // Output and a workspace: held when over the plain gates, relied on when given.
    let h = Holding::of(&s, 30, 4096, Some(Path::new("/srv/work/x/y")));
    assert_eq!(
        (h.output, h.workspace.as_deref()),
        (Some(4096), Some(Path::new("/srv/work/x/y")))
    );
    let more = vec![
        exception(
            "ex-out",
            Tweak {
                max_output_bytes: Some(8192),
                ..tweak("web")
            },
            ExceptionState::Approved,
            500,
        ),
        exception(
            "ex-ws",
            Tweak {
                workspace: Some("/srv/work/x".into()),
                network: true,
                ..tweak("web")
            },
            ExceptionState::Approved,
            500,
        ),
    ];
    let g = granted(&s, &more, 100);
    assert!(h.kept_by(&g));
    assert!(g.grants.iter().all(|grant| h.relies_on(grant)));
    assert!(
        !h.kept_by(&granted(&s, &more[..1], 100)),
        "the workspace's tweak gone"
    );
}
