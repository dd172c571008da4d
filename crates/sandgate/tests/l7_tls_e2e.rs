//! Method and path rules on HTTPS (issue 33, phase 2: interception), end to end with real
//! clients against loopback origins signed by a test CA that the proxy takes for the
//! system's roots: git clones over HTTPS through fetch-only entries with the interception CA
//! and its push is refused inside the tunnel, recorded and never reaches the origin, while a
//! push through an entry without rules is relayed undecrypted (here; inside `sandgate run`,
//! with Python, curl and Node too, in `l7_tls/sandboxed.rs`); an origin ending its
//! connection does not fail the tunnel's next request. What a client can write inside
//! an intercepted tunnel is in `l7_tls/spelling.rs`, which certificates each side sees and
//! how interception fails closed in `l7_tls/trust.rs`. The fixtures are the plain-HTTP
//! tests' own (`l7/`), loaded here without those tests.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;
mod l7_tls;
mod sandbox_support;

/// The fixtures of `l7/` (its `mod.rs` would bring the plain-HTTP tests along).
#[allow(dead_code, reason = "these tests use part of the fixtures")]
mod l7 {
    pub mod decisions;
    pub mod entries;
    pub mod git_origin;
    pub mod wire;

    pub use entries::{egress_policy, entry, entry_at, fetch_only};
}

use common::read_audit;
use common::world::World;
use l7::decisions::{assert_refused_by, decision, entry_lines};
use l7::git_origin::{GitOrigin, assert_push_refused, commit, git_trusting, run_git_trusting};
use l7::{egress_policy, entry, fetch_only};
use l7_tls::{close_of, connect_decision, inside, intercepting, pem_file};
use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;

#[test]
fn git_clones_over_https_through_fetch_only_entries_and_its_push_is_refused_inside_the_tunnel() {
    let w = World::new();
    let ca = TestCa::new(&["git.test", "open.test"]);
    let origin = GitOrigin::start_tls(&ca);
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("git.test", &["127.0.0.1"])
            .with("open.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, text) = egress_policy(
        dir.path(),
        &(entry("open.test", port, &[]) + &fetch_only("git.test", port, 6)),
    );
    let lines = entry_lines(&text);
    let i = intercepting(&dns, &policy, &roots);
    let (proxy, audit) = (Some(i.proxy.addr), &i.proxy.audit_path);
    let work = tempfile::tempdir().unwrap();

    // The control: through the entry without rules, git trusting only the origin's CA (so
    // it saw the origin's own certificate), the clone and the push work.
    let url = format!("https://open.test:{port}/myorg/repo.git");
    run_git_trusting(work.path(), proxy, &roots, &["clone", "-q", &url, "open"]);
    let open = work.path().join("open");
    let control = commit(&open, "control");
    run_git_trusting(&open, proxy, &roots, &["push", "-q", "origin", "main"]);
    let refs = origin.refs("myorg/repo.git");
    assert!(refs.contains(&control), "the control push did not land: {refs}");
    assert!(origin.received("open.test", "POST", "/git-receive-pack") > 0);

    // Through the fetch-only entries, git trusting only the interception CA: the clone
    // works and has the control commit...
    let url = format!("https://git.test:{port}/myorg/repo.git");
    run_git_trusting(work.path(), proxy, &i.ca_file, &["clone", "-q", &url, "fetch"]);
    let fetch = work.path().join("fetch");
    assert!(
        fetch.join("control").exists(),
        "the clone lacks the control commit"
    );
    // ...and the push is refused inside the tunnel before the origin sees it.
    commit(&fetch, "refused");
    let out = git_trusting(&fetch, proxy, &i.ca_file, &["push", "origin", "main"]);
    assert_push_refused(&origin, &out, &refs);
    assert!(origin.received("git.test", "POST", "/git-upload-pack") > 0);

    let refused = decision(audit, "git.test", "POST", "/myorg/repo.git/git-receive-pack");
    assert_refused_by(&refused, "request_not_allowed", "policy.yaml", &lines[1..]);
    assert_eq!(refused["scheme"], "https", "{refused:#}");
    let upload = decision(audit, "git.test", "POST", "/myorg/repo.git/git-upload-pack");
    assert_eq!(
        (&upload["decision"], &upload["scheme"]),
        (&"allow".into(), &"https".into()),
        "{upload:#}"
    );
    let closed = close_of(audit, &upload);
    assert_eq!(closed["status"], 200, "{closed:#}");
    assert!(closed["bytes_received"].as_u64() > Some(0), "{closed:#}");

    // The tunnels: git.test's inspected, open.test's relayed as it was (no request inside
    // it decided, so none decrypted).
    let tunnel = connect_decision(audit, "git.test");
    assert_eq!(
        (&tunnel["decision"], &tunnel["reason_code"]),
        (&"allow".into(), &"inspected".into()),
        "{tunnel:#}"
    );
    assert_eq!(tunnel["tls_server_name"], "git.test", "{tunnel:#}");
    let closed = close_of(audit, &tunnel);
    assert_eq!(
        (&closed["status"], &closed["outcome"]),
        (&200.into(), &"ok".into()),
        "{closed:#}"
    );
    let tunnel = connect_decision(audit, "open.test");
    assert_eq!(tunnel["reason_code"], "allowlisted", "{tunnel:#}");
    let events = read_audit(audit);
    assert_eq!(inside(&events, "open.test"), Vec::<serde_json::Value>::new());
    assert!(
        events
            .iter()
            .filter(|e| e["event"] == "decision" && e["scheme"] == "https")
            .all(|e| e["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/myorg/") && !p.contains('?'))),
        "every request inside carries its path without the query: {events:#?}"
    );
}

/// An origin may end its connection after any response (`Connection: close`, or at its idle
/// or request limit). The tunnel's next request must still be answered: by a new upstream
/// connection, or by the client's own next tunnel once it is told the connection ends.
#[test]
fn a_request_after_the_origin_ends_its_connection_is_still_answered() {
    let w = World::new();
    let ca = TestCa::new(&["ka.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("ka.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = egress_policy(dir.path(), &entry("ka.test", port, &["read_only: true"]));
    let i = intercepting(&dns, &policy, &roots);

    // curl keeps its tunnel for the second URL unless told otherwise.
    let (code, statuses, err) = i.statuses(&[
        format!("https://ka.test:{port}/close/first"),
        format!("https://ka.test:{port}/second"),
    ]);
    assert_eq!(
        (code, statuses.as_str()),
        (0, "200 200 "),
        "{err}\norigin received {:?}\n{:#?}",
        origin.requests(),
        read_audit(&i.proxy.audit_path)
            .iter()
            .filter(|e| e["event"] == "close")
            .map(|e| format!("{} {} {}", e["method"], e["path"], e["outcome"]))
            .collect::<Vec<_>>()
    );
    assert_eq!(origin.requests(), ["GET /close/first", "GET /second"]);
}

/// A refused request whose body is still coming (a `git push` to a fetch-only entry, an
/// upload to a read-only one) must read as its 403. Over HTTP/2 the proxy answers at once;
/// a stream it then reset while the client still sends is, to curl, a framing error (git:
/// "RPC failed; curl 92") in place of the refusal. The body is read and dropped instead,
/// so the client finishes its upload and reads the 403; nothing of it goes upstream.
#[test]
fn a_refused_upload_still_in_flight_over_http2_reads_as_its_403() {
    let w = World::new();
    let ca = TestCa::new(&["ro.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("ro.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (policy, _) = egress_policy(dir.path(), &entry("ro.test", port, &["read_only: true"]));
    let i = intercepting(&dns, &policy, &roots);
    let upload = dir.path().join("upload.bin");
    std::fs::write(&upload, vec![b'x'; 384 * 1024]).unwrap();
    let data = format!("@{}", upload.display());
    let url = format!("https://ro.test:{port}/bucket/object");
    // Throttled, so the upload is still going when the refusal is written.
    let (code, status, err) = common::curl(
        &i.proxy.url(),
        &[
            "--http2",
            "--cacert",
            i.ca_file.to_str().unwrap(),
            "--limit-rate",
            "256K",
            "-H",
            "content-type: application/octet-stream",
            "--data-binary",
            &data,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version}",
            &url,
        ],
    );
    assert_eq!((code, status.as_str()), (0, "403 2"), "{err}");
    assert_eq!(origin.requests(), Vec::<String>::new());
    let refused = inside(&read_audit(&i.proxy.audit_path), "ro.test");
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(
        (&refused[0]["method"], &refused[0]["decision"]),
        (&"POST".into(), &"deny".into()),
        "{refused:#?}"
    );
}
