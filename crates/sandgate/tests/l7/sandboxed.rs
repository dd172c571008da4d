//! The clone/push pair inside `sandgate run` (bubblewrap, `net.mode: allowlist`): git in the
//! sandbox, using the run's proxy from the variables the run sets, clones and pushes through
//! an entry without rules (the control), then clones through the fetch-only entries of a
//! SandboxPolicy's `net.allowlist` and cannot push. The origin on the host keeps the control
//! commit and never sees the refused one; the run's audit log names the entry.

use sandgate_testkit::dns::{DnsServer, Zone};

use super::decisions::{assert_refused_by, decision, entry_lines};
use super::entry_at;
use super::git_origin::{GitOrigin, sandboxed_git_script};
use crate::common::{read_audit, runtime};
use crate::sandbox_support::{base, run, text};

/// Inside the sandbox (PORT replaced): both clones in its private /tmp, every git bounded.
/// Prints `CONTROL=<id>` once the control push landed, `CLONED` with the control commit
/// in the fetch-only clone, and `REFUSED=<id>` with git's error when its push fails. Then
/// the ways around the HTTP proxy the sandbox offers: the push through the run's SOCKS5 port
/// (`SOCKS-PUSHED` if it worked) and a receive-pack through a CONNECT tunnel (`CONNECT=` the
/// proxy's answer to the CONNECT, then the origin's to the POST: `000` for none).
const SCRIPT: &str = r#"
GIT_LINES
g -c http.proxy=socks5h://127.0.0.1:1080 push origin main 2>/dev/null && echo SOCKS-PUSHED
echo "CONNECT=$(curl -sS -m 10 -p -o /dev/null -w '%{http_connect} %{http_code}' --data x http://git.test:PORT/myorg/repo.git/git-receive-pack 2>/dev/null)"
"#;

#[test]
fn git_in_a_sandbox_clones_through_a_fetch_only_entry_and_cannot_push() {
    let rt = runtime();
    let origin = GitOrigin::start();
    let port = origin.port();
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("git.test", &["127.0.0.1"])
            .with("open.test", &["127.0.0.1"]),
    ));
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "{}net:\n  mode: allowlist\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\n  allowlist:\n{}{}",
        base(),
        dns.addr(),
        entry_at(4, "open.test", port, &[]),
        super::fetch_only("git.test", port, 4),
    );
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, &yaml).unwrap();
    let lines = entry_lines(&yaml);
    let audit = dir.path().join("audit.jsonl");

    let script = SCRIPT
        .replace("GIT_LINES", &sandboxed_git_script("http", port))
        .replace("PORT", &port.to_string());
    let out = run(
        &policy,
        &["--audit-log", audit.to_str().unwrap()],
        &["sh", "-c", &script],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let id = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in:\n{stdout}\n{stderr}"))
            .to_owned()
    };
    let (control, refused) = (id("CONTROL="), id("REFUSED="));
    assert!(
        stdout.contains("CLONED") && stdout.contains("403"),
        "{stdout}\n{stderr}"
    );
    // A tunnel to a host whose entries all carry rules is refused (403), or, once the run
    // intercepts TLS for such hosts, opened only to be inspected: then the plain request
    // inside it gets no answer. Either way the POST gets none from the origin.
    let connect = stdout
        .lines()
        .find_map(|l| l.strip_prefix("CONNECT="))
        .unwrap_or_default();
    assert!(
        !stdout.contains("SOCKS-PUSHED") && ["403 000", "200 000"].contains(&connect),
        "{stdout}\n{stderr}"
    );

    let refs = origin.refs("myorg/repo.git");
    assert!(refs.contains(&control), "the control push did not land: {refs}");
    assert!(!refs.contains(&refused), "the refused push landed: {refs}");
    assert_eq!(
        origin.received("git.test", "POST", "/git-receive-pack"),
        0,
        "{:?}",
        origin.requests()
    );
    assert!(
        origin.received("git.test", "POST", "/git-upload-pack") > 0,
        "{:?}",
        origin.requests()
    );

    let d = decision(&audit, "git.test", "POST", "/myorg/repo.git/git-receive-pack");
    assert_refused_by(&d, "request_not_allowed", "policy.yaml", &lines[1..]);
    assert!(
        d["task_id"].as_str().is_some_and(|t| t.starts_with("run-")),
        "{d:#}"
    );
    let events = read_audit(&audit);
    let tunnels: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "decision" && e["destination_host"] == "git.test" && e["scheme"] != "http")
        .collect();
    let schemes: Vec<_> = tunnels
        .iter()
        .map(|e| e["scheme"].as_str().unwrap_or_default())
        .collect();
    assert!(
        schemes.contains(&"socks5") && schemes.contains(&"connect"),
        "{events:#?}"
    );
    assert!(
        tunnels.iter().all(
            |e| (e["decision"] == "deny" && e["reason_code"] == "inspection_required")
                || (e["decision"] == "allow" && e["reason_code"] == "inspected")
        ),
        "a tunnel to git.test was opened without inspection: {tunnels:#?}"
    );
}
