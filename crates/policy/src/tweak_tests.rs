//! Tweaks: their form, the order "asks no more than", their spelling, and how the bounds
//! admit them (no hosts, the same enablement and TTL as hosts, no network entry).

use super::*;
use crate::entry::Scope;
use crate::exception::{
    DEFAULT_MAX_TTL, DEFAULT_PORTS, Enablement, Exception, ExceptionPolicy, Narrowing, NewRequest,
    RequestError,
};

fn tweak(sandbox: &str) -> Tweak {
    Tweak {
        sandbox: sandbox.into(),
        ..Tweak::default()
    }
}

fn policy() -> ExceptionPolicy {
    ExceptionPolicy {
        enabled: vec![Enablement {
            scope: Scope::Task("agent-*".into()),
            ports: DEFAULT_PORTS.to_vec(),
            max_ttl_seconds: DEFAULT_MAX_TTL,
        }],
    }
}

fn ask(t: Tweak) -> NewRequest {
    NewRequest {
        task_id: "agent-7".into(),
        ttl_seconds: 600,
        reason: "the test suite takes ten minutes".into(),
        tweak: Some(t),
        ..NewRequest::default()
    }
}

fn admit(req: NewRequest) -> Result<Exception, RequestError> {
    policy().admit(req, "ex-t".into(), "agent", 1000)
}

#[test]
fn a_tweak_must_name_a_sandbox_and_ask_for_something_plain() {
    let ok = Tweak {
        max_seconds: Some(600),
        ..tweak("web")
    };
    assert_eq!(ok.check(), Ok(()));
    let cases: Vec<(Tweak, &str)> = vec![
        (tweak("web"), "asks for nothing"),
        (
            Tweak {
                network: true,
                ..tweak("")
            },
            "sandbox",
        ),
        (
            Tweak {
                network: true,
                ..tweak("a b")
            },
            "sandbox",
        ),
        (
            Tweak {
                max_seconds: Some(0),
                ..tweak("web")
            },
            "max_seconds must be",
        ),
        (
            Tweak {
                max_output_bytes: Some(0),
                ..tweak("web")
            },
            "max_output_bytes must be",
        ),
        (
            Tweak {
                workspace: Some("srv/x".into()),
                ..tweak("web")
            },
            "workspace",
        ),
        (
            Tweak {
                workspace: Some("/srv/../etc".into()),
                ..tweak("web")
            },
            "workspace",
        ),
        (
            Tweak {
                workspace: Some("/srv/./x".into()),
                ..tweak("web")
            },
            "workspace",
        ),
        (
            Tweak {
                workspace: Some("/srv//x".into()),
                ..tweak("web")
            },
            "workspace",
        ),
        (
            Tweak {
                workspace: Some("/srv/x/".into()),
                ..tweak("web")
            },
            "workspace",
        ),
        (
            Tweak {
                workspace: Some("/srv/-x".into()),
                ..tweak("web")
            },
            "workspace",
        ),
        (
            Tweak {
                workspace: Some("/srv/x\", \"/etc".into()),
                ..tweak("web")
            },
            "workspace",
        ),
        (
            Tweak {
                workspace: Some("/srv/a b".into()),
                ..tweak("web")
            },
            "workspace",
        ),
    ];
    for (t, expected) in cases {
        let err = t.check().expect_err(&format!("{t:?}"));
        assert!(err.to_string().contains(expected), "{t:?}: {err}");
    }
    for good in ["/", "/srv/work", "/srv/work/a.b_c-d+e=f~g"] {
        let t = Tweak {
            workspace: Some(good.into()),
            ..tweak("web")
        };
        assert_eq!(t.check(), Ok(()), "{good}");
    }
}

#[test]
fn within_asks_no_more_than_the_outer_tweak() {
    let outer = Tweak {
        max_seconds: Some(600),
        max_output_bytes: Some(1 << 20),
        network: true,
        workspace: Some("/srv/x".into()),
        ..tweak("web")
    };
    let cases: Vec<(Tweak, bool)> = vec![
        (
            Tweak {
                max_seconds: Some(600),
                ..tweak("web")
            },
            true,
        ),
        (
            Tweak {
                max_seconds: Some(1),
                ..tweak("web")
            },
            true,
        ),
        (
            Tweak {
                max_seconds: Some(601),
                ..tweak("web")
            },
            false,
        ),
        (
            Tweak {
                max_seconds: Some(600),
                ..tweak("db")
            },
            false,
        ),
        (
            Tweak {
                max_output_bytes: Some(1 << 20),
                ..tweak("web")
            },
            true,
        ),
        (
            Tweak {
                max_output_bytes: Some((1 << 20) + 1),
                ..tweak("web")
            },
            false,
        ),
        (
            Tweak {
                network: true,
                ..tweak("web")
            },
            true,
        ),
        (
            Tweak {
                workspace: Some("/srv/x".into()),
                ..tweak("web")
            },
            true,
        ),
        (
            Tweak {
                workspace: Some("/srv/x/y".into()),
                ..tweak("web")
            },
            true,
        ),
        (
            Tweak {
                workspace: Some("/srv/xy".into()),
                ..tweak("web")
            },
            false,
        ),
        (
            Tweak {
                workspace: Some("/srv".into()),
                ..tweak("web")
            },
            false,
        ),
        (outer.clone(), true),
        (tweak("web"), true),
    ];
    for (t, expected) in cases {
        assert_eq!(t.within(&outer), expected, "{t:?}");
    }
    // What the outer one does not give, nothing within it asks.
    let time_only = Tweak {
        max_seconds: Some(600),
        ..tweak("web")
    };
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
            workspace: Some("/srv/x".into()),
            ..tweak("web")
        },
    ] {
        assert!(!more.within(&time_only), "{more:?}");
    }
}

#[test]
fn a_tweak_is_spelt_on_one_line_and_in_json_without_what_it_leaves_out() {
    let t = Tweak {
        max_seconds: Some(600),
        network: true,
        ..tweak("web")
    };
    assert_eq!(t.to_string(), "sandbox=web max_seconds=600 network");
    let all = Tweak {
        max_output_bytes: Some(10),
        workspace: Some("/srv/x".into()),
        ..t.clone()
    };
    assert_eq!(
        all.to_string(),
        "sandbox=web max_seconds=600 max_output_bytes=10 network workspace=/srv/x"
    );
    assert_eq!(
        serde_json::to_string(&t).unwrap(),
        r#"{"sandbox":"web","max_seconds":600,"network":true}"#
    );
    let back: Tweak = serde_json::from_str(r#"{"sandbox":"web","max_seconds":600,"network":true}"#).unwrap();
    assert_eq!(back, t);
    assert!(serde_json::from_str::<Tweak>(r#"{"sandbox":"web","hosts":["x"]}"#).is_err());
}

#[test]
fn the_bounds_admit_a_tweak_without_hosts_and_it_allows_no_destination() {
    let t = Tweak {
        max_seconds: Some(600),
        ..tweak("web")
    };
    let mut ex = admit(ask(t.clone())).unwrap();
    assert!(ex.hosts.is_empty() && ex.ports.is_empty());
    assert_eq!(ex.tweak.as_ref(), Some(&t));
    ex.approve("alice", 1001, &Narrowing::default()).unwrap();
    assert!(ex.is_active(1001));
    assert!(ex.entries().is_empty(), "a tweak opens no network destination");
    // In JSON, and back.
    let json = serde_json::to_value(&ex).unwrap();
    assert_eq!(json["tweak"]["sandbox"], "web");
    let back: Exception = serde_json::from_value(json).unwrap();
    assert_eq!(back, ex);
    // An exception for hosts writes no `tweak`.
    let hosts = NewRequest {
        tweak: None,
        requested_hosts: vec!["pypi.org".into()],
        ..ask(tweak("web"))
    };
    let hosts = admit(hosts).unwrap();
    assert!(serde_json::to_value(&hosts).unwrap().get("tweak").is_none());
}

#[test]
fn a_tweak_request_is_refused_by_the_same_bounds_and_with_hosts() {
    let t = Tweak {
        network: true,
        ..tweak("web")
    };
    let cases: Vec<(NewRequest, &str)> = vec![
        (
            NewRequest {
                requested_hosts: vec!["pypi.org".into()],
                ..ask(t.clone())
            },
            "no hosts",
        ),
        (
            NewRequest {
                requested_ports: Some(vec![443]),
                ..ask(t.clone())
            },
            "no hosts",
        ),
        (
            NewRequest {
                read_only: true,
                ..ask(t.clone())
            },
            "no hosts",
        ),
        (ask(tweak("web")), "asks for nothing"),
        (
            NewRequest {
                task_id: "other-1".into(),
                ..ask(t.clone())
            },
            "not enabled",
        ),
        (
            NewRequest {
                ttl_seconds: DEFAULT_MAX_TTL + 1,
                ..ask(t.clone())
            },
            "over the limit",
        ),
        (
            NewRequest {
                ttl_seconds: 0,
                ..ask(t.clone())
            },
            "at least 1",
        ),
        (
            NewRequest {
                reason: " ".into(),
                ..ask(t.clone())
            },
            "reason",
        ),
    ];
    for (req, expected) in cases {
        let err = admit(req.clone()).expect_err(&format!("{req:?}"));
        assert!(err.to_string().contains(expected), "{req:?}: {err}");
    }
    // Without a tweak, hosts are required as before.
    let none = NewRequest {
        tweak: None,
        ..ask(t)
    };
    assert_eq!(admit(none), Err(RequestError::NoHosts));
}

/// An approval of a tweak takes no methods, paths or read_only (they would sit on an
/// exception for no host, and keep the next identical ask from being covered); its own
/// fields narrow it (below).
#[test]
fn a_tweak_takes_no_methods_paths_or_read_only() {
    let asked = Tweak {
        max_seconds: Some(600),
        ..tweak("web")
    };
    let ex = admit(ask(asked)).unwrap();
    for narrowing in [
        Narrowing {
            read_only: true,
            ..Narrowing::default()
        },
        Narrowing {
            methods: Some(vec!["GET".into()]),
            ..Narrowing::default()
        },
    ] {
        let mut tried = ex.clone();
        assert!(matches!(
            tried.approve("alice", 1001, &narrowing),
            Err(crate::exception::TransitionError::Widens(_))
        ));
        assert_eq!(tried.state, crate::exception::State::Pending);
    }
    let mut shorter = ex.clone();
    let ttl = Narrowing {
        ttl_seconds: Some(60),
        ..Narrowing::default()
    };
    shorter.approve("alice", 1001, &ttl).unwrap();
    assert!(shorter.below.is_everything());
}

fn asked_all() -> Tweak {
    Tweak {
        max_seconds: Some(120),
        max_output_bytes: Some(10 << 20),
        network: true,
        workspace: Some("/srv/work".into()),
        ..tweak("web")
    }
}

fn grant(t: Tweak) -> Narrowing {
    Narrowing {
        tweak: Some(t),
        ..Narrowing::default()
    }
}

/// An approver may grant less than a tweak asks: a shorter time limit, less output, no
/// network, a workspace under the one asked, or leave a field out; what is granted
/// replaces what was asked, whole.
#[test]
fn an_approval_narrows_a_tweak() {
    let ex = admit(ask(asked_all())).unwrap();
    for narrower in [
        Tweak {
            max_seconds: Some(30),
            ..asked_all()
        },
        Tweak {
            max_output_bytes: Some(1 << 20),
            ..asked_all()
        },
        Tweak {
            network: false,
            ..asked_all()
        },
        Tweak {
            workspace: Some("/srv/work/one".into()),
            ..asked_all()
        },
        Tweak {
            max_seconds: Some(30),
            ..tweak("web")
        },
        asked_all(),
    ] {
        let mut approved = ex.clone();
        approved
            .approve("alice", 1001, &grant(narrower.clone()))
            .unwrap_or_else(|e| panic!("{narrower:?}: {e}"));
        assert_eq!(approved.tweak.as_ref(), Some(&narrower));
        assert!(approved.is_active(1001));
    }
}

/// As an approver who would widen a tweak (by mistake or not): each field beyond what was
/// asked, another sandbox, a tweak that is not one, or a tweak on an exception for hosts, is
/// refused naming the field, and the exception is left pending as it was.
#[test]
fn an_approval_never_widens_a_tweak() {
    let narrow = Tweak {
        max_seconds: Some(120),
        max_output_bytes: Some(1 << 20),
        workspace: Some("/srv/work/a".into()),
        ..tweak("web")
    };
    let ex = admit(ask(narrow.clone())).unwrap();
    let cases: Vec<(Tweak, &str)> = vec![
        (
            Tweak {
                max_seconds: Some(121),
                ..narrow.clone()
            },
            "tweak.max_seconds 121 is more than the 120 asked",
        ),
        (
            Tweak {
                max_output_bytes: Some((1 << 20) + 1),
                ..narrow.clone()
            },
            "tweak.max_output_bytes",
        ),
        (
            Tweak {
                network: true,
                ..narrow.clone()
            },
            "tweak.network",
        ),
        (
            Tweak {
                workspace: Some("/srv/work".into()),
                ..narrow.clone()
            },
            "tweak.workspace /srv/work is not /srv/work/a",
        ),
        (
            Tweak {
                workspace: Some("/srv/work/ab".into()),
                ..narrow.clone()
            },
            "tweak.workspace",
        ),
        (
            Tweak {
                sandbox: "db".into(),
                ..narrow.clone()
            },
            "tweak.sandbox",
        ),
        (tweak("web"), "asks for nothing"),
        (
            Tweak {
                max_seconds: Some(0),
                ..narrow.clone()
            },
            "max_seconds must be at least 1",
        ),
        (
            Tweak {
                workspace: Some("/srv/work/a/../..".into()),
                ..narrow.clone()
            },
            "workspace",
        ),
    ];
    for (wider, expected) in cases {
        let mut tried = ex.clone();
        let err = tried
            .approve("alice", 1001, &grant(wider.clone()))
            .expect_err(&format!("{wider:?}"));
        assert!(
            matches!(err, crate::exception::TransitionError::Widens(_)),
            "{err:?}"
        );
        assert!(err.to_string().contains(expected), "{wider:?}: {err}");
        assert_eq!(tried.state, crate::exception::State::Pending, "{wider:?}");
        assert_eq!(tried.tweak.as_ref(), Some(&narrow), "{wider:?}");
    }
    // What was not asked at all cannot be granted.
    let time_only = admit(ask(Tweak {
        max_seconds: Some(60),
        ..tweak("web")
    }))
    .unwrap();
    for (more, field) in [
        (
            Tweak {
                max_output_bytes: Some(1),
                max_seconds: Some(60),
                ..tweak("web")
            },
            "tweak.max_output_bytes 1: none was asked",
        ),
        (
            Tweak {
                workspace: Some("/srv".into()),
                ..tweak("web")
            },
            "tweak.workspace /srv: no workspace was asked",
        ),
    ] {
        let err = time_only
            .clone()
            .approve("alice", 1001, &grant(more))
            .unwrap_err();
        assert!(err.to_string().contains(field), "{err}");
    }
    // An exception for hosts takes no tweak.
    let hosts = admit(NewRequest {
        tweak: None,
        requested_hosts: vec!["pypi.org".into()],
        ..ask(tweak("web"))
    })
    .unwrap();
    let err = hosts.clone().approve("alice", 1001, &grant(narrow)).unwrap_err();
    assert!(
        err.to_string().contains("tweak: exception ex-t asks for hosts"),
        "{err}"
    );
}
