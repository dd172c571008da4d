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
}

/// A run that needs its tweaks ends when the first of them ends: `granted` says when,
/// counting only the tweaks that give something here.
#[test]
fn what_is_granted_ends_with_the_first_tweak_that_gives_something() {
    let s = sandbox("web", Some(bounds()));
    let longer = |name: &str| Tweak {
        max_seconds: Some(120),
        ..tweak(name)
    };
    let seen = vec![
        exception("ex-late", longer("web"), ExceptionState::Approved, 500),
        exception("ex-early", longer("web"), ExceptionState::Approved, 300),
        exception("ex-other", longer("db"), ExceptionState::Approved, 200),
    ];
    let g = granted(&s, &seen, 100);
    assert_eq!(g.ids, ["ex-late", "ex-early"]);
    assert_eq!(g.ends_at, Some(300));
    assert_eq!(granted(&s, &[], 100).ends_at, None);
}
