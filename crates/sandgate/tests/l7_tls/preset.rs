//! The `github-read-only` preset end to end: an EgressPolicy whose only allow is
//! `presets: [ github-read-only ]`, github.com answered by the test's DNS zone with
//! 127.0.0.1, where a loopback git origin (signed by a test CA the proxy takes for the
//! system's roots) is reached on 443, the one port a preset allows. A clone through the
//! intercepting proxy works; the push is refused inside the tunnel, recorded with the
//! preset as its rule, and never reaches the origin. Port 443 is only free to take in a
//! network namespace of the test's own (`unshare`, as root there), so the test runs itself
//! again inside one; there a relay on 127.0.0.1:443 carries each connection to the origin.

use std::net::{TcpListener, TcpStream};

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;

use super::{connect_decision, intercepting, pem_file};
use crate::common::rerun_in_private_netns;
use crate::common::world::{World, policy_doc};
use crate::l7::decisions::decision;
use crate::l7::git_origin::{GitOrigin, assert_push_refused, commit, git_trusting, run_git_trusting};

/// At most this many connections are relayed: the test makes a handful.
const RELAYED: usize = 64;

/// Relays connections to 127.0.0.1:443 to 127.0.0.1:`port`, on threads of its own, for
/// the life of the test process.
fn relay_443_to(port: u16) {
    let listener = TcpListener::bind("127.0.0.1:443").expect("bind 443 (in the test's own namespace)");
    std::thread::spawn(move || {
        for client in listener.incoming().take(RELAYED).flatten() {
            let Ok(origin) = TcpStream::connect(("127.0.0.1", port)) else {
                continue;
            };
            let (Ok(mut c2), Ok(mut o2)) = (client.try_clone(), origin.try_clone()) else {
                continue;
            };
            let (mut c, mut o) = (client, origin);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c, &mut o);
                let _ = o.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut o2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
        }
    });
}

#[test]
fn the_github_read_only_preset_clones_and_refuses_the_push() {
    if rerun_in_private_netns("l7_tls::preset::the_github_read_only_preset_clones_and_refuses_the_push") {
        return;
    }
    let w = World::new();
    let ca = TestCa::new(&["github.com"]);
    let origin = GitOrigin::start_tls(&ca);
    relay_443_to(origin.port());
    let dns = w.dns(Zone::new().with("github.com", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        policy_doc("  network:\n    presets: [ github-read-only ]\n"),
    )
    .unwrap();
    let i = intercepting(&dns, &policy, &roots);
    let (proxy, audit) = (Some(i.proxy.addr), &i.proxy.audit_path);
    let work = tempfile::tempdir().unwrap();

    let url = "https://github.com/myorg/repo.git";
    run_git_trusting(work.path(), proxy, &i.ca_file, &["clone", "-q", url, "clone"]);
    let clone = work.path().join("clone");
    assert!(clone.join("README").exists(), "the clone is empty");
    assert!(origin.received("github.com", "POST", "/git-upload-pack") > 0);

    let refs = origin.refs("myorg/repo.git");
    commit(&clone, "refused");
    let out = git_trusting(&clone, proxy, &i.ca_file, &["push", "origin", "main"]);
    assert_push_refused(&origin, &out, &refs);
    assert_eq!(origin.received("github.com", "POST", "/git-receive-pack"), 0);

    let refused = decision(audit, "github.com", "POST", "/myorg/repo.git/git-receive-pack");
    assert_eq!(
        (&refused["decision"], &refused["reason_code"], &refused["scheme"]),
        (&"deny".into(), &"request_not_allowed".into(), &"https".into()),
        "{refused:#}"
    );
    assert!(
        refused["rule"]
            .as_str()
            .is_some_and(|r| r.contains("preset:github-read-only")),
        "the refusal names the preset: {refused:#}"
    );
    let tunnel = connect_decision(audit, "github.com");
    assert_eq!(tunnel["reason_code"], "inspected", "{tunnel:#}");
}
