//! The bounds, the state machine and the entries of exceptions, with time injected.

use super::*;
use crate::decision::{Context, Ruleset, Verdict};
use crate::target::{Access, parse_connect_target};

fn policy() -> ExceptionPolicy {
    ExceptionPolicy {
        enabled: vec![
            Enablement {
                scope: Scope::Project("p-1".into()),
                ports: DEFAULT_PORTS.to_vec(),
                max_ttl_seconds: DEFAULT_MAX_TTL,
            },
            Enablement {
                scope: Scope::Task("t-wide".into()),
                ports: vec![443, 8443],
                max_ttl_seconds: 3600,
            },
        ],
    }
}

fn request(task: &str, hosts: &[&str], ports: Option<Vec<u16>>, ttl: u32) -> NewRequest {
    NewRequest {
        task_id: task.into(),
        project_id: Some("p-1".into()),
        requested_hosts: hosts.iter().map(|h| h.to_string()).collect(),
        requested_ports: ports,
        ttl_seconds: ttl,
        reason: "the build needs it".into(),
        ..NewRequest::default()
    }
}

fn admit(req: NewRequest) -> Result<Exception, RequestError> {
    policy().admit(req, "ex-1".into(), "agent-7", 1000)
}

#[test]
fn every_bound_is_refused_with_its_reason() {
    let cases: Vec<(NewRequest, &str)> = vec![
        (request("t-1", &["*.pypi.org"], None, 60), "no wildcard"),
        (request("t-1", &["10.0.0.1"], None, 60), "no IP literal"),
        (request("t-1", &["127.1"], None, 60), "no IP literal"),
        (request("t-1", &["https://pypi.org"], None, 60), "not a URL"),
        (request("t-1", &["pypi.org/simple"], None, 60), "not a URL"),
        (request("t-1", &["pypi.org:443"], None, 60), "not a URL"),
        (request("t-1", &["bad_host!"], None, 60), "bad_host!"),
        (request("t-1", &[], None, 60), "empty"),
        (request("t-1", &["pypi.org"], Some(vec![22]), 60), "port 22"),
        (request("t-1", &["pypi.org"], None, 901), "over the limit of 900"),
        (request("t-1", &["pypi.org"], None, 0), "at least 1"),
        (
            NewRequest {
                reason: "  ".into(),
                ..request("t-1", &["pypi.org"], None, 60)
            },
            "reason",
        ),
        (
            NewRequest {
                project_id: Some("p-other".into()),
                ..request("t-1", &["pypi.org"], None, 60)
            },
            "not enabled",
        ),
        (
            NewRequest {
                project_id: None,
                ..request("t-1", &["pypi.org"], None, 60)
            },
            "not enabled",
        ),
    ];
    for (req, want) in cases {
        let err = admit(req.clone()).unwrap_err().to_string();
        assert!(err.contains(want), "{req:?}: {err}");
    }
}

#[test]
fn a_task_entry_widens_the_bounds_for_that_task_only() {
    let wide = admit(request("t-wide", &["Files.Example.COM."], Some(vec![8443]), 3600)).unwrap();
    assert_eq!(wide.hosts, ["files.example.com"]);
    assert_eq!((wide.ports.clone(), wide.ttl_seconds), (vec![8443], 3600));
    assert!(admit(request("t-1", &["files.example.com"], Some(vec![8443]), 60)).is_err());
    let ok = admit(request("t-1", &["pypi.org", "pypi.org"], None, 60)).unwrap();
    assert_eq!(
        (ok.hosts.len(), ok.ports.clone(), ok.state),
        (1, vec![80, 443], State::Pending)
    );
}

/// A node's runs have fresh task ids under the node's name (`node-a:run-...`): a prefix
/// scope enables them, an exact entry still wins, the longest prefix wins over a shorter
/// one, and a port one prefix allows is not another's.
#[test]
fn a_prefix_scope_enables_a_nodes_runs_and_an_exact_task_entry_wins_over_it() {
    let p = ExceptionPolicy {
        enabled: vec![
            Enablement {
                scope: Scope::Task("node-*".into()),
                ports: vec![7070],
                max_ttl_seconds: 60,
            },
            Enablement {
                scope: Scope::Task("node-a:*".into()),
                ports: vec![8080],
                max_ttl_seconds: 60,
            },
            Enablement {
                scope: Scope::Task("node-a:run-special".into()),
                ports: vec![9090],
                max_ttl_seconds: 600,
            },
        ],
    };
    let bounds = |task: &str| p.bounds_for(task, None).map(|e| e.ports.clone());
    assert_eq!(bounds("node-a:run-1-abcd"), Some(vec![8080]));
    assert_eq!(bounds("node-a:run-special"), Some(vec![9090]));
    // The longest prefix wins, whatever the order.
    assert_eq!(bounds("node-b:run-1-abcd"), Some(vec![7070]));
    assert_eq!(bounds("other:run-1"), None);
    let mut req = request("node-b:run-1", &["pypi.org"], Some(vec![8080]), 60);
    req.project_id = None;
    assert!(matches!(
        p.admit(req.clone(), "ex-2".into(), "agent", 1000),
        Err(RequestError::Port { port: 8080, .. })
    ));
    req.task_id = "other:run-1".into();
    assert!(matches!(
        p.admit(req, "ex-3".into(), "agent", 1000),
        Err(RequestError::NotEnabled { .. })
    ));
}

#[test]
fn approval_is_never_by_the_requester_and_only_narrows() {
    let mut ex = admit(request("t-1", &["a.example", "b.example"], None, 600)).unwrap();
    assert!(matches!(
        ex.clone().approve("agent-7", 1001, &Narrowing::default()),
        Err(TransitionError::SelfApproval { .. })
    ));
    let wider = Narrowing {
        hosts: Some(vec!["c.example".into()]),
        ttl_seconds: None,
        ..Narrowing::default()
    };
    assert!(matches!(
        ex.clone().approve("alice", 1001, &wider),
        Err(TransitionError::Widens(_))
    ));
    let longer = Narrowing {
        hosts: None,
        ttl_seconds: Some(601),
        ..Narrowing::default()
    };
    assert!(matches!(
        ex.clone().approve("alice", 1001, &longer),
        Err(TransitionError::Widens(_))
    ));
    let narrow = Narrowing {
        hosts: Some(vec!["b.example".into()]),
        ttl_seconds: Some(120),
        ..Narrowing::default()
    };
    ex.approve("alice", 1001, &narrow).unwrap();
    assert_eq!(
        (ex.hosts.clone(), ex.expires_at),
        (vec!["b.example".to_owned()], Some(1121))
    );
    assert!(matches!(
        ex.clone().approve("bob", 1002, &Narrowing::default()),
        Err(TransitionError::NotPending { .. })
    ));
    assert!(matches!(
        ex.clone().deny("bob", 1002, None),
        Err(TransitionError::NotPending { .. })
    ));
}

#[test]
fn an_approved_exception_allows_exactly_its_task_hosts_and_ports_until_the_second_it_expires() {
    let mut ex = admit(request("t-1", &["pypi.org"], None, 60)).unwrap();
    assert!(ex.entries().is_empty(), "pending allows nothing");
    ex.approve("alice", 2000, &Narrowing::default()).unwrap();
    let mut rules = Ruleset::new();
    for e in ex.entries() {
        rules.allow_entry(e);
    }
    let t1 = |now| Context {
        task: Some("t-1"),
        project: Some("p-1"),
        now,
    };
    let decide = |target: &str, ctx: Context<'_>| {
        rules.decide(&parse_connect_target(target).unwrap(), Access::Connect, &ctx)
    };
    let d = decide("pypi.org:443", t1(2059));
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.rule_label().as_deref(), Some("exception:ex-1"));
    assert_eq!(
        decide("pypi.org:443", t1(2060)).verdict,
        Verdict::Deny,
        "expired at 2060 exactly"
    );
    assert_eq!(decide("pypi.org:8443", t1(2000)).verdict, Verdict::Deny);
    assert_eq!(decide("files.pypi.org:443", t1(2000)).verdict, Verdict::Deny);
    let other = Context {
        task: Some("t-2"),
        project: Some("p-1"),
        now: 2000,
    };
    assert_eq!(
        decide("pypi.org:443", other).verdict,
        Verdict::Deny,
        "another task of the project"
    );
    assert!(ex.is_active(2059) && !ex.is_active(2060));
    assert_eq!(ex.state_at(2060), State::Expired);
    assert!(!ex.expire_if_due(2059) && ex.expire_if_due(2060));
    assert!(ex.entries().is_empty());
}

#[test]
fn revoke_ends_an_active_exception_now() {
    let mut ex = admit(request("t-1", &["pypi.org"], None, 60)).unwrap();
    assert!(matches!(
        ex.clone().revoke("alice", 1001, None),
        Err(TransitionError::NotApproved { .. })
    ));
    ex.approve("alice", 1001, &Narrowing::default()).unwrap();
    ex.revoke("bob", 1010, Some("done".into())).unwrap();
    assert_eq!(
        (ex.state, ex.expires_at, ex.decided_by.as_deref()),
        (State::Revoked, Some(1010), Some("bob"))
    );
    assert!(ex.entries().is_empty());
}

fn list(items: &[&str]) -> Option<Vec<String>> {
    Some(items.iter().map(|s| (*s).to_owned()).collect())
}

/// `GET` on one path for 15 minutes: admitted with its rules checked and kept sorted, and
/// once approved it allows exactly that, on its host, for its task.
#[test]
fn an_exception_can_grant_a_method_on_a_path_and_nothing_else_of_the_host() {
    let ask = NewRequest {
        methods: list(&["GET", "GET"]),
        paths: list(&["/org/repo/**", "/org/docs/*"]),
        ..request("t-1", &["git.example"], None, 900)
    };
    let mut ex = admit(ask).unwrap();
    assert_eq!(ex.below.methods, list(&["GET"]));
    assert_eq!(ex.below.paths, list(&["/org/docs/*", "/org/repo/**"]));
    ex.approve("alice", 2000, &Narrowing::default()).unwrap();
    let mut rules = Ruleset::new();
    for e in ex.entries() {
        rules.allow_entry(e);
    }
    let ctx = Context {
        task: Some("t-1"),
        project: Some("p-1"),
        now: 2000,
    };
    let target = parse_connect_target("git.example:443").unwrap();
    let decide = |method: &str, path: &str| {
        let line = crate::decision::RequestLine { method, target: path };
        rules.decide_request(&target, Access::Https, &ctx, Some(line))
    };
    let allowed = decide("GET", "/org/repo/info/refs?service=git-upload-pack");
    assert_eq!(allowed.verdict, Verdict::Allow);
    assert_eq!(allowed.rule_label().as_deref(), Some("exception:ex-1"));
    assert_eq!(decide("GET", "/org/docs/a").verdict, Verdict::Allow);
    for (method, path) in [
        ("POST", "/org/repo/git-receive-pack"),
        ("GET", "/org/other"),
        ("GET", "/org/docs/a/b"),
        ("GET", "/org/repo/%2e%2e/other"),
        ("DELETE", "/org/docs/a"),
    ] {
        assert_eq!(decide(method, path).verdict, Verdict::Deny, "{method} {path}");
    }
    // A tunnel cannot be judged by method and path: it is not opened blind.
    let blind = rules.decide_request(&target, Access::Connect, &ctx, None);
    assert_ne!(
        (blind.verdict, blind.reason),
        (Verdict::Allow, crate::decision::PolicyReason::Allowlisted),
        "a CONNECT is never allowed blind by an exception with rules"
    );
}

/// What a request cannot say is refused when it is made, naming the field, and a JSON
/// exception without the fields (a row stored before them) allows every request, as before.
#[test]
fn rules_a_request_cannot_mean_are_refused_and_old_rows_read_as_before() {
    for (methods, paths, read_only, want) in [
        (list(&["get"]), None, false, "uppercase"),
        (None, list(&["/a/../b"]), false, "/a/../b"),
        (None, list(&["no-slash"]), false, "starts with"),
        (list(&["GET"]), None, true, "not both"),
        (list(&[]), None, false, "empty"),
    ] {
        let ask = NewRequest {
            methods,
            paths,
            read_only,
            ..request("t-1", &["a.example"], None, 60)
        };
        let err = admit(ask).unwrap_err();
        assert!(matches!(err, RequestError::Rules(_)), "{err:?}");
        assert!(err.to_string().contains(want), "{err} lacks {want}");
    }
    let mut ex = admit(request("t-1", &["a.example"], None, 60)).unwrap();
    let json = serde_json::to_value(&ex).unwrap();
    assert!(
        json.get("methods").is_none() && json.get("paths").is_none() && json.get("read_only").is_none(),
        "an exception without rules is written as before: {json}"
    );
    let back: Exception = serde_json::from_value(json).unwrap();
    assert_eq!(back, ex);
    ex.below.read_only = true;
    let json = serde_json::to_value(&ex).unwrap();
    assert_eq!(json["read_only"], true);
    assert_eq!(serde_json::from_value::<Exception>(json).unwrap(), ex);
}

/// An approver may narrow what was asked below the host, never widen it: more methods, a
/// wider path, or read-only where the request named POST are refused, and the exception
/// stays pending.
#[test]
fn an_approval_narrows_methods_and_paths_and_never_widens_them() {
    let ask = NewRequest {
        methods: list(&["GET", "POST"]),
        paths: list(&["/org/**"]),
        ..request("t-1", &["a.example"], None, 600)
    };
    let ex = admit(ask).unwrap();
    let narrowing = |methods: Option<Vec<String>>, paths: Option<Vec<String>>, read_only: bool| Narrowing {
        methods,
        paths,
        read_only,
        ..Narrowing::default()
    };
    for wider in [
        narrowing(list(&["GET", "PUT"]), None, false),
        narrowing(None, list(&["/**"]), false),
        narrowing(None, list(&["/other"]), false),
        narrowing(None, None, true),
        narrowing(list(&["get"]), None, false),
    ] {
        let mut tried = ex.clone();
        let err = tried.approve("alice", 1001, &wider).unwrap_err();
        assert!(matches!(err, TransitionError::Widens(_)), "{wider:?}: {err:?}");
        assert_eq!(tried.state, State::Pending);
        assert_eq!(tried.below, ex.below);
    }
    let mut narrowed = ex.clone();
    narrowed
        .approve(
            "alice",
            1001,
            &narrowing(list(&["GET"]), list(&["/org/repo/*"]), false),
        )
        .unwrap();
    assert_eq!(
        (narrowed.below.methods, narrowed.below.paths),
        (list(&["GET"]), list(&["/org/repo/*"]))
    );
    // Read-only narrows a request that named no method.
    let mut open = admit(request("t-1", &["a.example"], None, 600)).unwrap();
    open.approve("alice", 1001, &narrowing(None, None, true)).unwrap();
    assert!(open.below.read_only);
}

/// A narrowing that names only paths keeps the methods asked for, and one that names only
/// methods keeps the paths.
#[test]
fn a_narrowing_keeps_what_it_does_not_name() {
    let ask = NewRequest {
        methods: list(&["POST"]),
        paths: list(&["/docs/**"]),
        ..request("t-1", &["a.example"], None, 600)
    };
    let mut ex = admit(ask).unwrap();
    let paths_only = Narrowing {
        paths: list(&["/docs/drafts/*"]),
        ..Narrowing::default()
    };
    ex.approve("alice", 1001, &paths_only).unwrap();
    assert_eq!(
        (ex.below.methods, ex.below.paths),
        (list(&["POST"]), list(&["/docs/drafts/*"]))
    );
}

/// Rules that do not read on the outer side (`read_only` beside `methods`, as a control
/// plane could publish) cover nothing: they install no entry either.
#[test]
fn rules_that_do_not_read_cover_nothing() {
    let broken = BelowHost::new(list(&["GET", "POST"]), None, true);
    assert!(broken.rules().is_err());
    let asked = BelowHost::new(list(&["POST"]), None, false);
    assert!(!asked.within(&broken));
    assert!(!BelowHost::default().within(&broken));
}
