//! The design's sidecar, as its own words configure it (issue 30): a proxy started with no
//! flags at all, from the environment of design file 000 (`PROXY_ALLOWLIST` with an internal
//! `IP:port` entry), aa-proxy's `AA_PROXY_NETWORK_ALLOWLIST` (design file 001), and sandgate's
//! variables for the address guard's ranges, the resolver, the policy file and the audit log;
//! and the design's `GovernancePolicy` document read by `check-config`, `explain` and the
//! proxy. Real clients (curl) against loopback origins; every listener on port 0.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::world::World;
use common::{curl, outcome, read_audit, sandgate_bin};
use sandgate_testkit::dns::Zone;
use serde_json::Value;

/// `sandgate proxy` with no arguments: everything from `env` (and a clean environment
/// otherwise, so nothing of the test runner's leaks in). Killed when dropped.
struct Sidecar {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Sidecar {
    fn start(env: &[(&str, &str)]) -> Sidecar {
        let mut cmd = Command::new(sandgate_bin());
        cmd.arg("proxy")
            .env_clear()
            .env("SANDGATE_LOG", "info")
            .env("SANDGATE_LISTEN", "127.0.0.1:0")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn sandgate");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        // The first `listening` line names the address (bounded: the proxy exits or says it).
        let addr = loop {
            let Some(Ok(line)) = lines.next() else {
                panic!(
                    "sandgate exited before listening:\n{}",
                    log.lock().unwrap().join("\n")
                );
            };
            log.lock().unwrap().push(line.clone());
            if line.contains(" listening ") {
                break line
                    .split("addr=")
                    .nth(1)
                    .unwrap()
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
            }
        };
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        Sidecar { child, addr, log }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// curl through `proxy`: the status code and the response's Proxy-Status header (if any).
fn fetch(proxy: &str, url: &str) -> (String, String) {
    let (_, out, err) = curl(proxy, &["-i", url]);
    let status = out.split_whitespace().nth(1).unwrap_or("").to_owned();
    let proxy_status = out
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("proxy-status:"))
        .unwrap_or("")
        .to_owned();
    assert!(!status.is_empty(), "no answer for {url}: {err}");
    (status, proxy_status)
}

/// The decision events of an audit log, waiting (bounded) until there are `n`.
fn decisions(path: &Path, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found: Vec<Value> = read_audit(path)
            .into_iter()
            .filter(|e| e["event"] == "decision")
            .collect();
        if found.len() >= n || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Item 3, as a migrating user: design file 000's sidecar environment, its internal entry
/// (`192.168.1.50:80` there; `127.0.0.1:PORT` and a name that resolves to it here, loopback
/// standing in for the internal network) reaches the service only once
/// `SANDGATE_ALLOW_RANGE` exempts that range; the resolver and the audit log come from the
/// environment too. Fails before issue 30: no variable for any of the three.
#[test]
fn an_environment_only_sidecar_reaches_an_internal_service_with_an_allow_range() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(Zone::new().with("internal.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let allowlist = format!("api.openai.com:443,github.com:443,127.0.0.1:{port},internal.test:{port}");
    let dns_addr = dns.addr().to_string();
    let by_ip = format!("http://127.0.0.1:{port}/service");
    let by_name = format!("http://internal.test:{port}/service");

    let audit = dir.path().join("refused.jsonl");
    let audit_text = audit.to_str().unwrap();
    let env = [
        ("PROXY_ALLOWLIST", allowlist.as_str()),
        ("SANDGATE_DNS_SERVER", dns_addr.as_str()),
        ("SANDGATE_AUDIT_LOG", audit_text),
    ];
    let p = Sidecar::start(&env);
    for url in [&by_ip, &by_name] {
        let (status, proxy_status) = fetch(&p.url(), url);
        assert_eq!(status, "403", "{url}: the guard let a loopback address through");
        assert!(
            proxy_status.contains("destination_ip_prohibited"),
            "{url}: {proxy_status}"
        );
    }
    assert_eq!(origin.connections(), 0, "the internal service was reached");
    assert!(
        dns.questions_about("internal.test") > 0,
        "SANDGATE_DNS_SERVER was not asked: {:?}",
        dns.questions()
    );
    let refused = decisions(&audit, 2);
    assert!(
        refused.len() == 2
            && refused
                .iter()
                .all(|e| e["decision"] == "deny" && e["reason_code"] == "destination_ip_prohibited"),
        "SANDGATE_AUDIT_LOG: {refused:#?}"
    );
    drop(p);

    let audit = dir.path().join("allowed.jsonl");
    let audit_text = audit.to_str().unwrap();
    let mut env = env.to_vec();
    env[2] = ("SANDGATE_AUDIT_LOG", audit_text);
    env.push(("SANDGATE_ALLOW_RANGE", "127.0.0.0/8"));
    let p = Sidecar::start(&env);
    for url in [&by_ip, &by_name] {
        let (status, proxy_status) = fetch(&p.url(), url);
        assert_eq!(status, "200", "{url}: {proxy_status}\n{}", p.log_text());
    }
    assert_eq!(origin.connections(), 2);
    let allowed = decisions(&audit, 2);
    assert!(
        allowed.len() == 2 && allowed.iter().all(|e| e["decision"] == "allow"),
        "{allowed:#?}"
    );
    assert!(
        p.log_text().contains("address guard exemption"),
        "{}",
        p.log_text()
    );
}

/// Item 1, as a user of aa-proxy: `AA_PROXY_NETWORK_ALLOWLIST` is the allowlist, with a note
/// naming sandgate's own variable; set but empty (aa-proxy's "no filter") or unset, the
/// proxy still denies. Fails before issue 30: the variable was ignored.
#[test]
fn aa_proxys_allowlist_variable_is_the_allowlist_and_empty_stays_default_deny() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("api.allowed.test", &["127.0.0.1"])
            .with("deep.tools.test", &["127.0.0.1"])
            .with("other.test", &["127.0.0.1"]),
    );
    let dns_addr = dns.addr().to_string();
    let list = format!("api.allowed.test:{port},*.tools.test:{port}");
    let base = [
        ("SANDGATE_DNS_SERVER", dns_addr.as_str()),
        ("SANDGATE_ALLOW_RANGE", "127.0.0.0/8"),
    ];
    let with = |value: Option<&str>| {
        let mut env = base.to_vec();
        if let Some(v) = value {
            env.push(("AA_PROXY_NETWORK_ALLOWLIST", v));
        }
        Sidecar::start(&env)
    };
    let url = |host: &str| format!("http://{host}:{port}/");

    let p = with(Some(&list));
    assert_eq!(
        fetch(&p.url(), &url("api.allowed.test")).0,
        "200",
        "{}",
        p.log_text()
    );
    assert_eq!(fetch(&p.url(), &url("deep.tools.test")).0, "200");
    assert_eq!(fetch(&p.url(), &url("other.test")).0, "403");
    let notes: Vec<String> = p
        .log_text()
        .lines()
        .filter(|l| l.contains("AA_PROXY_NETWORK_ALLOWLIST"))
        .map(str::to_owned)
        .collect();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("read as SANDGATE_ALLOW, sandgate's own name"),
        "{notes:?}"
    );

    for value in [Some(""), None] {
        let p = with(value);
        let (status, proxy_status) = fetch(&p.url(), &url("api.allowed.test"));
        assert_eq!(status, "403", "{value:?} opened the proxy");
        assert!(
            proxy_status.contains("error=http_request_denied"),
            "{proxy_status}"
        );
        if value.is_some() {
            assert!(p.log_text().contains("set but empty"), "{}", p.log_text());
        }
    }
    assert_eq!(
        origin.connections(),
        2,
        "only the allowed requests reached the origin"
    );
}

/// The design's policy form (design file 001), as written, plus one entry for the test's
/// origin.
fn governance_policy(extra_entry: &str) -> String {
    format!(
        "apiVersion: agent-assembly.dev/v1alpha1\nkind: GovernancePolicy\nmetadata:\n  name: prod-egress\n  version: \"1.0.0\"\nspec:\n  network:\n    allowlist:\n      - api.openai.com\n      - \"*.anthropic.com\"\n      - \"*.googleapis.com\"\n      - \"{extra_entry}\"\n"
    )
}

/// Item 2, as a migrating user: the design's `GovernancePolicy` passes `check-config` with a
/// note naming sandgate's form, decides as the design's grammar table says (`explain`), and
/// runs the proxy (from `SANDGATE_POLICY`, item 3). Fails before issue 30: the kind was
/// refused.
#[test]
fn the_designs_governance_policy_is_checked_explained_and_enforced() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("api.anthropic.com", &["127.0.0.1"])
            .with("evil.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("governance.yaml");
    std::fs::write(&file, governance_policy(&format!("api.anthropic.com:{port}"))).unwrap();
    let path = file.to_str().unwrap();

    let (code, out, err) = outcome(Command::new(sandgate_bin()).args(["check-config", path]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ok: prod-egress (4 allow"), "{out}");
    assert!(
        err.contains(
            "GovernancePolicy is read as sandgate's own form, apiVersion: sandgate.dev/v1, kind: EgressPolicy"
        ),
        "{err}"
    );

    // The design's grammar table (design file 001, "Pattern grammar").
    for (target, allowed) in [
        ("https://api.openai.com/", true),
        ("https://chat.openai.com/", false),
        ("https://attackerapi.openai.com/", false),
        ("https://a.b.anthropic.com/", true),
        ("https://anthropic.com/", false),
        ("https://evil.openai.com.attacker.net/", false),
    ] {
        let (code, out, err) =
            outcome(Command::new(sandgate_bin()).args(["explain", "--policy", path, target]));
        assert_eq!(code, if allowed { 0 } else { 1 }, "{target}: {out}{err}");
    }

    let dns_addr = dns.addr().to_string();
    let p = Sidecar::start(&[
        ("SANDGATE_POLICY", path),
        ("SANDGATE_DNS_SERVER", &dns_addr),
        ("SANDGATE_ALLOW_RANGE", "127.0.0.0/8"),
    ]);
    assert_eq!(
        fetch(&p.url(), &format!("http://api.anthropic.com:{port}/")).0,
        "200",
        "{}",
        p.log_text()
    );
    assert_eq!(fetch(&p.url(), &format!("http://evil.test:{port}/")).0, "403");
    assert_eq!(origin.connections(), 1);
    assert!(
        p.log_text()
            .contains("GovernancePolicy is read as sandgate's own form"),
        "{}",
        p.log_text()
    );
}

/// Item 3: every variable the proxy reads is named in `sandgate proxy --help`.
#[test]
fn proxy_help_names_every_variable() {
    let (code, out, err) = outcome(Command::new(sandgate_bin()).args(["proxy", "--help"]));
    assert_eq!(code, 0, "{err}");
    for var in [
        "SANDGATE_LISTEN",
        "PROXY_PORT",
        "SANDGATE_ALLOW",
        "PROXY_ALLOWLIST",
        "AA_PROXY_NETWORK_ALLOWLIST",
        "SANDGATE_DENY",
        "SANDGATE_ALLOW_RANGE",
        "SANDGATE_DNS_SERVER",
        "SANDGATE_POLICY",
        "SANDGATE_AUDIT_LOG",
    ] {
        assert!(out.contains(var), "--help does not name {var}:\n{out}");
    }
}
