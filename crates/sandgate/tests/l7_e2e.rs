//! Method and path rules on plain HTTP (issue 33, phase 1), end to end with real clients
//! against loopback origins: git clones through an entry that allows fetch and its push is
//! refused, recorded, and never reaches the origin (here, and inside `sandgate run` in
//! `l7/sandboxed.rs`); a tunnel (CONNECT, SOCKS5) to a host whose only entries carry such
//! rules is refused until HTTPS interception exists; the policy file's new fields are
//! checked at load. Read-only entries with curl and Python are in `l7/read_only.rs`, spelling
//! attacks on a path rule with a raw client in `l7/spelling.rs`. Every origin here counts
//! what reached it: a refused request must leave no trace there.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;
mod l7;
mod sandbox_support;

use std::process::Command;

use common::world::{World, proxy, status_from};
use common::{curl, outcome, sandgate_bin};
use l7::decisions::{assert_names_entry, assert_refused_by, decision, entry_lines, events_once};
use l7::git_origin::{GitOrigin, assert_push_refused, commit, git, run_git};
use l7::{egress_policy, entry, fetch_only};
use sandgate_testkit::dns::Zone;

#[test]
fn git_clones_through_a_fetch_only_entry_and_its_push_is_refused() {
    let w = World::new();
    let origin = GitOrigin::start();
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("git.test", &["127.0.0.1"])
            .with("open.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let (policy, text) = egress_policy(
        dir.path(),
        &(entry("open.test", port, &[]) + &fetch_only("git.test", port, 6)),
    );
    let lines = entry_lines(&text);
    let p = proxy(&dns, &["--policy", policy.to_str().unwrap()]);
    let work = tempfile::tempdir().unwrap();

    // The control: through the entry without rules, the same origin takes a push, so the
    // refusal below is the rule's and not the fixture's.
    let url = format!("http://open.test:{port}/myorg/repo.git");
    run_git(work.path(), Some(p.addr), &["clone", "-q", &url, "open"]);
    let open = work.path().join("open");
    let control = commit(&open, "control");
    run_git(&open, Some(p.addr), &["push", "-q", "origin", "main"]);
    let refs = origin.refs("myorg/repo.git");
    assert!(refs.contains(&control), "the control push did not land: {refs}");
    let receive_packs = origin.received("open.test", "POST", "/git-receive-pack");
    assert!(receive_packs > 0, "{:?}", origin.requests());

    // Through the fetch-only entries: the clone works and has the control commit...
    let url = format!("http://git.test:{port}/myorg/repo.git");
    run_git(work.path(), Some(p.addr), &["clone", "-q", &url, "fetch"]);
    let fetch = work.path().join("fetch");
    assert!(
        fetch.join("control").exists(),
        "the clone lacks the control commit"
    );
    // ...and the push is refused before the origin sees it.
    commit(&fetch, "refused");
    let out = git(&fetch, Some(p.addr), &["push", "origin", "main"]);
    assert_push_refused(&origin, &out, &refs);

    let audit = &p.audit_path;
    let refused = decision(audit, "git.test", "POST", "/myorg/repo.git/git-receive-pack");
    assert_refused_by(&refused, "request_not_allowed", "policy.yaml", &lines[1..]);
    // Allowed requests carry their path too, without the query string, and name the entry
    // that let each through.
    let refs_get = decision(audit, "git.test", "GET", "/myorg/repo.git/info/refs");
    assert_eq!(refs_get["decision"], "allow", "{refs_get:#}");
    assert_names_entry(&refs_get, "policy.yaml", &lines[1..2]);
    let upload = decision(audit, "git.test", "POST", "/myorg/repo.git/git-upload-pack");
    assert_eq!(upload["decision"], "allow", "{upload:#}");
    assert_names_entry(&upload, "policy.yaml", &lines[2..3]);
    let events = common::read_audit(audit);
    assert!(
        events
            .iter()
            .filter(|e| e["event"] == "decision" && e["scheme"] == "http")
            .all(|e| e["path"]
                .as_str()
                .is_some_and(|path| path.starts_with('/') && !path.contains('?'))),
        "every plain HTTP decision carries the path without its query: {events:#?}"
    );

    // A repository outside /myorg cannot even be cloned.
    let url = format!("http://git.test:{port}/other/repo.git");
    let out = git(work.path(), Some(p.addr), &["clone", "-q", &url, "other"]);
    assert!(!out.status.success(), "cloned outside /myorg");
    let refused = decision(audit, "git.test", "GET", "/other/repo.git/info/refs");
    assert_refused_by(&refused, "request_not_allowed", "policy.yaml", &lines[1..]);
    assert_eq!(origin.received("git.test", "GET", "/other/repo.git/info/refs"), 0);
}

#[test]
fn a_tunnel_to_a_host_whose_entries_all_carry_rules_is_refused_until_it_can_be_inspected() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("l7.test", &["127.0.0.1"])
            .with("open.test", &["127.0.0.1"])
            .with("both.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let entries = [
        entry("l7.test", port, &["read_only: true"]),
        entry("open.test", port, &[]),
        entry("both.test", port, &["read_only: true"]),
        entry("both.test", port, &[]),
    ]
    .concat();
    let (policy, _) = egress_policy(dir.path(), &entries);
    let p = proxy(
        &dns,
        &[
            "--policy",
            policy.to_str().unwrap(),
            "--socks-listen",
            "127.0.0.1:0",
        ],
    );
    let socks = p.listener(&["role=socks5"]);
    let proxy_url = p.url();
    let tunnel = |url: &str| curl(&proxy_url, &["-p", "-o", "/dev/null", "-w", "%{http_code}", url]);
    let via_socks = |url: &str| {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg("--socks5-hostname")
            .arg(socks.to_string())
            .arg(url)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };

    // Refused: the tunnel would hide every request from the rules.
    let (code, _, err) = tunnel(&format!("http://l7.test:{port}/by-connect"));
    assert_ne!(code, 0, "a CONNECT to an L7-only host opened");
    assert!(err.contains("403"), "{err}");
    let (status, head) = status_from("127.0.0.1", p.addr, &format!("l7.test:{port}"));
    assert_eq!(status, 403, "{head}");
    let (code, _) = via_socks(&format!("http://l7.test:{port}/by-socks"));
    assert_ne!(code, 0, "a SOCKS5 tunnel to an L7-only host opened");

    // Opened: a host without rules, and a host that also has an entry without rules (the
    // entries are a union). Plain HTTP to the L7-only host is decided request by request.
    let (code, status, err) = tunnel(&format!("http://open.test:{port}/open-connect"));
    assert_eq!((code, status.as_str()), (0, "200"), "{err}");
    let (code, status, err) = tunnel(&format!("http://both.test:{port}/both-connect"));
    assert_eq!((code, status.as_str()), (0, "200"), "{err}");
    assert_eq!(
        via_socks(&format!("http://open.test:{port}/open-socks")),
        (0, "200".to_owned())
    );
    let plain = |args: &[&str]| {
        curl(
            &proxy_url,
            &[&["-o", "/dev/null", "-w", "%{http_code}"], args].concat(),
        )
        .1
    };
    assert_eq!(plain(&[&format!("http://l7.test:{port}/plain")]), "200");
    assert_eq!(
        plain(&["-X", "POST", &format!("http://both.test:{port}/both-post")]),
        "200"
    );

    let events = events_once(&p.audit_path, |e| {
        e["scheme"] == "socks5" && e["decision"] == "deny"
    });
    let refused: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "decision" && e["destination_host"] == "l7.test" && e["decision"] == "deny")
        .collect();
    let schemes: Vec<_> = refused
        .iter()
        .map(|e| e["scheme"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(schemes, ["connect", "connect", "socks5"], "{events:#?}");
    assert!(
        refused.iter().all(|e| e["reason_code"] == "inspection_required"),
        "{refused:#?}"
    );
    let seen = origin.requests();
    assert!(
        seen.iter().all(|r| !r.contains("/by-")),
        "a refused tunnel reached the origin: {seen:?}"
    );
    for path in [
        "/open-connect",
        "/both-connect",
        "/open-socks",
        "/plain",
        "/both-post",
    ] {
        assert!(
            seen.iter().any(|r| r.ends_with(path)),
            "{path} did not arrive: {seen:?}"
        );
    }
}

#[test]
fn the_policy_file_takes_method_and_path_rules_on_allow_entries_only() {
    let dir = tempfile::tempdir().unwrap();
    let check = |entries: &str, deny: &str| {
        let (path, _) = egress_policy(dir.path(), entries);
        if !deny.is_empty() {
            let mut text = std::fs::read_to_string(&path).unwrap();
            text.push_str(&format!("    denylist:\n{deny}"));
            std::fs::write(&path, text).unwrap();
        }
        outcome(Command::new(sandgate_bin()).arg("check-config").arg(&path))
    };
    let good = [
        entry(
            "a.test",
            80,
            &[
                "methods: [GET, HEAD]",
                "paths: [\"/myorg/**\", \"/v1/*/items\", \"/files/*.tar.gz\"]",
            ],
        ),
        entry(
            "a.test",
            80,
            &["methods: [POST]", "paths: [\"/myorg/*/git-upload-pack\"]"],
        ),
        entry("b.test", 8080, &["read_only: true"]),
    ]
    .concat();
    let (code, _, err) = check(&good, "");
    assert_eq!(code, 0, "{err}");

    // Each refused with the field named: (allow entries, deny entries, the field).
    let refused: [(String, &str, &str); 5] = [
        (
            entry("a.test", 80, &[]),
            "      - host: a.test\n        methods: [POST]\n",
            "methods",
        ),
        (
            entry("a.test", 80, &[]),
            "      - host: a.test\n        paths: [\"/x/**\"]\n",
            "paths",
        ),
        (
            entry("a.test", 80, &["read_only: true", "methods: [POST]"]),
            "",
            "read_only",
        ),
        (entry("a.test", 80, &["paths: [\"myorg/**\"]"]), "", "paths"),
        (entry("a.test", 80, &["paths: [\"/myorg/a**\"]"]), "", "paths"),
    ];
    for (allow, deny, field) in refused {
        let (code, _, err) = check(&allow, deny);
        assert_eq!(code, 64, "accepted:\n{allow}{deny}\n{err}");
        // read_only with methods may be reported on either field.
        let named = err.contains(field) || (field == "read_only" && err.contains("methods"));
        assert!(err.contains("policy.yaml:") && named, "{field}: {err}");
    }
}
