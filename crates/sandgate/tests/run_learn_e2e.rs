//! `sandgate run` learns and says what it does (issue 11), with the real bubblewrap and real
//! clients inside: a `--learn` run reaches three loopback origins (curl over CONNECT with
//! TLS, curl and Python's urllib over plain HTTP), `sandgate policy suggest` turns its kept
//! audit log into an EgressPolicy, and the same run under a sandbox policy naming that file
//! (`net.egress_policy`) succeeds with no deny. Learning never opens the address guard.
//! Refusals are shown on stderr as they happen (rate-limited, `--quiet` silences them), the
//! run ends with one totals line naming its audit log, kept under the user's state
//! directory unless `--no-audit-log`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;
mod sandbox_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;
use sandgate_testkit::tls::TestCa;
use serde_json::Value;

use common::{read_audit, runtime, sandgate_bin};
use sandbox_support::{base, text};

/// `sandgate run --policy P ARGS -- sh -c SCRIPT` with XDG_STATE_HOME=`state`.
fn run_in(state: &Path, policy: &Path, args: &[&str], script: &str) -> Output {
    run_command_in(state, policy, args, script).output().unwrap()
}

/// The command [`run_in`] runs, for a test that reads the run while it lasts.
fn run_command_in(state: &Path, policy: &Path, args: &[&str], script: &str) -> Command {
    let mut cmd = Command::new(sandgate_bin());
    cmd.arg("run")
        .arg("--policy")
        .arg(policy)
        .args(args)
        .args(["--", "sh", "-c", script])
        .env("XDG_STATE_HOME", state)
        .stdin(Stdio::null());
    cmd
}

/// The audit log the totals line names.
fn kept_log(stderr: &str) -> Option<PathBuf> {
    let line = stderr.lines().find(|l| l.contains("; audit log: "))?;
    let path = line.split("; audit log: ").nth(1)?;
    (path != "not kept").then(|| PathBuf::from(path))
}

/// Three loopback origins behind names, a test CA, and a name in a guarded range.
struct World {
    _rt: tokio::runtime::Runtime,
    web: Origin,
    api: Origin,
    index: Origin,
    dns: DnsServer,
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let rt = runtime();
        let ca = TestCa::new(&["web.test"]);
        let web = rt.block_on(Origin::https(ca.server_config.clone()));
        let api = rt.block_on(Origin::http());
        let index = rt.block_on(Origin::http());
        let dns = rt.block_on(DnsServer::start(
            Zone::new()
                .with("web.test", &["127.0.0.1"])
                .with("api.test", &["127.0.0.1"])
                .with("index.test", &["127.0.0.1"])
                .with("inside.test", &["10.0.0.1"])
                .with("other-loopback.test", &["127.0.0.2"]),
        ));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), &ca.ca_pem).unwrap();
        World {
            _rt: rt,
            web,
            api,
            index,
            dns,
            dir,
        }
    }

    /// A sandbox policy in allowlist mode with `net_extra` (allowing nothing by itself).
    fn policy(&self, file: &str, net_extra: &str) -> PathBuf {
        let path = self.dir.path().join(file);
        let text = format!(
            "{}net:\n  mode: allowlist\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\n{net_extra}",
            base().replace(
                "read_paths: [ ",
                &format!("read_paths: [ \"{}\", ", self.dir.path().display())
            ),
            self.dns.addr()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The three clients inside the sandbox; each prints a marker when it got its answer.
    fn clients(&self) -> String {
        format!(
            r#"
set -u
curl -sS --cacert {ca} -o /dev/null -w "web=%{{http_code}}\n" https://web.test:{web}/learned
curl -sS -o /dev/null -w "index=%{{http_code}}\n" http://index.test:{index}/simple/
python3 -c 'import urllib.request; print("api=%d" % urllib.request.urlopen("http://api.test:{api}/py", timeout=10).status)'
"#,
            ca = self.dir.path().join("ca.pem").display(),
            web = self.web.port(),
            index = self.index.port(),
            api = self.api.port(),
        )
    }
}

/// What an attacker inside tries under --learn: names and literals the address guard
/// refuses. Each prints its status.
const GUARDED: &str = r#"
curl -sS -o /dev/null -w "inside=%{http_code}\n" http://inside.test/ || true
curl -sS -o /dev/null -w "metadata=%{http_code}\n" http://169.254.169.254/latest/meta-data/ || true
curl -sS -o /dev/null -w "loopback2=%{http_code}\n" http://other-loopback.test/ || true
python3 -c '
import urllib.request, urllib.error
try:
    urllib.request.urlopen("http://169.254.169.254/latest/meta-data/iam/", timeout=10)
    print("py-metadata=reached")
except urllib.error.HTTPError as e:
    print("py-metadata=%d" % e.code)
'
"#;

#[test]
fn learn_round_trip_in_a_sandbox_learn_then_suggest_then_no_deny() {
    let w = World::new();
    let state = tempfile::tempdir().unwrap();

    // 1. Learn: the policy allows nothing; every client gets through, on record.
    let learn_policy = w.policy("learn.yaml", "");
    let out = run_in(state.path(), &learn_policy, &["--learn"], &w.clients());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for want in ["web=200", "index=200", "api=200"] {
        assert!(stdout.contains(want), "missing {want}:\n{stdout}\n{stderr}");
    }
    assert!(
        stderr.contains(&format!(
            "sandgate: learn: let web.test:{} through (not allowlisted)",
            w.web.port()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("sandgate: 3 allowed (3 only because of --learn), 0 denied"),
        "{stderr}"
    );
    let log = kept_log(&stderr).expect("the totals line names the kept log");
    assert!(log.starts_with(state.path().join("sandgate/runs")), "{log:?}");
    assert!(stderr.contains(&format!("sandgate policy suggest --from {}", log.display())));
    let events = read_audit(&log);
    let learned: Vec<&Value> = events
        .iter()
        .filter(|e| e["reason_code"] == "report_only")
        .collect();
    assert_eq!(learned.len(), 3, "{events:#?}");
    assert!(learned.iter().all(|e| e["decision"] == "allow"
        && e["detail"] == "would deny: not_allowlisted"
        && e["task_id"].as_str().is_some_and(|t| t.starts_with("run-"))));

    // 2. Suggest a policy from the run's log; check-config passes it.
    let learned_file = w.dir.path().join("learned.yaml");
    let out = Command::new(sandgate_bin())
        .args(["policy", "suggest", "--from"])
        .arg(&log)
        .args(["--reason", "agent run 1", "--output"])
        .arg(&learned_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(sandgate_bin())
        .arg("check-config")
        .arg(&learned_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // 3. The same run under a sandbox policy naming the suggested file: no deny.
    let enforce = w.policy("enforce.yaml", "  egress_policy: learned.yaml\n");
    let out = Command::new(sandgate_bin())
        .arg("check-config")
        .arg(&enforce)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run_in(state.path(), &enforce, &[], &w.clients());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for want in ["web=200", "index=200", "api=200"] {
        assert!(stdout.contains(want), "missing {want}:\n{stdout}\n{stderr}");
    }
    assert!(stderr.contains("sandgate: 3 allowed, 0 denied"), "{stderr}");
    assert!(!stderr.contains("blocked"), "{stderr}");
    let events = read_audit(&kept_log(&stderr).unwrap());
    assert_eq!(common::allowlisted_without_deny(&events), 3, "{events:#?}");
    // Without the learned file, the same policy refuses them: the file did the allowing.
    let out = run_in(state.path(), &learn_policy, &[], &w.clients());
    assert!(text(&out).1.contains("sandgate: 0 allowed, "), "{:?}", text(&out));
}

#[test]
fn learning_never_opens_the_address_guard() {
    let w = World::new();
    let state = tempfile::tempdir().unwrap();
    let policy = w.policy("learn.yaml", "");
    let out = run_in(state.path(), &policy, &["--learn"], GUARDED);
    let (stdout, stderr) = text(&out);
    for want in ["inside=403", "metadata=403", "loopback2=403", "py-metadata=403"] {
        assert!(stdout.contains(want), "missing {want}:\n{stdout}\n{stderr}");
    }
    assert!(!stdout.contains("reached"), "{stdout}");
    let events = read_audit(&kept_log(&stderr).unwrap());
    let decisions: Vec<&Value> = events.iter().filter(|e| e["event"] == "decision").collect();
    assert_eq!(decisions.len(), 4, "{events:#?}");
    assert!(
        decisions
            .iter()
            .all(|e| e["decision"] == "deny" && e["reason_code"] == "destination_ip_prohibited"),
        "{events:#?}"
    );
    assert!(stderr.contains("sandgate: 0 allowed, 4 denied"), "{stderr}");
    // Learning needs a proxied network mode and a kept log, and never asks.
    let none = w.dir.path().join("none.yaml");
    std::fs::write(&none, base()).unwrap();
    let out = run_in(state.path(), &none, &["--learn"], "true");
    assert_eq!(out.status.code(), Some(64), "{:?}", text(&out));
    assert!(
        text(&out).1.contains("--learn needs net mode allowlist or proxy"),
        "{:?}",
        text(&out)
    );
    // Nowhere to keep what it learns: said, and nothing runs.
    let out = Command::new(sandgate_bin())
        .args(["run", "--learn", "--policy"])
        .arg(&policy)
        .args(["--", "sh", "-c", "echo ran"])
        .env_remove("XDG_STATE_HOME")
        .env_remove("HOME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{:?}", text(&out));
    assert!(
        text(&out)
            .1
            .contains("--learn keeps what it learned in the run's audit log"),
        "{:?}",
        text(&out)
    );
    assert!(text(&out).0.is_empty());
    for conflicting in ["--no-audit-log", "--ask"] {
        let out = run_in(state.path(), &policy, &["--learn", conflicting], "true");
        assert_eq!(out.status.code(), Some(64), "{conflicting}: {:?}", text(&out));
    }
}

/// The ports `pid` listens on (`ss`), waiting up to 5 s for `n` of them.
fn listening_ports(pid: u32, n: usize) -> Vec<u16> {
    let owner = format!("pid={pid},");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let out = Command::new("ss").args(["-ltnpH"]).output().unwrap();
        let ports: Vec<u16> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&owner))
            .filter_map(|l| l.split_whitespace().nth(3)?.rsplit(':').next()?.parse().ok())
            .collect();
        if ports.len() >= n || std::time::Instant::now() > deadline {
            return ports;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Attacker: under --learn, a command that learns where its run's proxy listens on the host
/// (here the test tells it) and asks that proxy for its own ports is refused (the loop
/// guard), although 127.0.0.1 is in the run's allow ranges and learning waives the policy.
#[test]
fn learning_never_reaches_the_runs_own_proxy() {
    let w = World::new();
    let state = tempfile::tempdir().unwrap();
    let policy = w.policy("learn.yaml", "");
    let ports_file = w.dir.path().join("ports.txt");
    let script = format!(
        r#"
for i in $(seq 1 100); do [ -s {f} ] && break; sleep 0.1; done
for p in $(cat {f}); do
  curl -s --noproxy '' -x http://127.0.0.1:3128 -o /dev/null -w "own=%{{http_code}}\n" http://127.0.0.1:$p/
done
"#,
        f = ports_file.display()
    );
    let mut child = run_command_in(state.path(), &policy, &["--learn"], &script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run's proxy: an HTTP and a SOCKS5 listener on host loopback.
    let ports = listening_ports(child.id(), 2);
    assert_eq!(ports.len(), 2, "{ports:?}");
    let list: Vec<String> = ports.iter().map(u16::to_string).collect();
    std::fs::write(&ports_file, list.join(" ")).unwrap();
    sandbox_support::wait_bounded(&mut child);
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(stdout.matches("own=403").count(), 2, "{stdout}\n{stderr}");
    let events = read_audit(&kept_log(&stderr).unwrap());
    let loops = events
        .iter()
        .filter(|e| e["decision"] == "deny" && e["reason_code"] == "proxy_loop")
        .count();
    assert_eq!(loops, 2, "{events:#?}");
    assert!(
        !events.iter().any(|e| e["reason_code"] == "report_only"),
        "{events:#?}"
    );
}

#[test]
fn refusals_show_as_they_happen_rate_limited_and_quiet_silences_them() {
    let w = World::new();
    let state = tempfile::tempdir().unwrap();
    let policy = w.policy(
        "p.yaml",
        &format!("  allow_domains: [ \"api.test:{}\" ]\n", w.api.port()),
    );
    let api = w.api.port();
    // One refusal; the command then waits (30 s at most, saying so if it gave up) until the
    // test has read the refusal's line on the run's stderr, so the line came while the
    // command ran, and a marker follows it. Then eight refusals at once: at most five lines
    // a second, the rest counted. (The command slept a second instead, and the line had to
    // come within it: a bound a loaded machine need not keep.)
    let go = w.dir.path().join("go");
    let gate = go.display();
    let script = format!(
        r#"
curl -sS -o /dev/null http://api.test:{api}/ok
curl -sS -o /dev/null http://denied.test:{api}/first
i=0; while [ ! -e {gate} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
[ -e {gate} ] || echo GATE-TIMEOUT >&2
echo MARKER >&2
python3 -c '
import urllib.request, urllib.error
for i in range(8):
    try:
        urllib.request.urlopen("http://burst.test:{api}/%d" % i, timeout=10)
    except urllib.error.HTTPError as e:
        pass
'
"#
    );
    let first = format!(
        "sandgate: blocked denied.test:{api} (not allowlisted; --allow-domain denied.test:{api} would allow it)"
    );
    let mut child = run_command_in(state.path(), &policy, &[], &script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(err)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(60)) {
        let seen = line == first;
        lines.push(line);
        if seen {
            std::fs::write(&go, "").unwrap();
            break;
        }
    }
    lines.extend(rx.iter());
    reader.join().unwrap();
    let status = sandbox_support::wait_bounded(&mut child);
    let stdout = std::io::read_to_string(child.stdout.take().unwrap()).unwrap();
    let stderr = lines.join("\n");
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(
        !stderr.contains("GATE-TIMEOUT"),
        "the refusal's line did not come while the command ran:\n{stderr}"
    );
    let at = |needle: &str| {
        stderr
            .find(needle)
            .unwrap_or_else(|| panic!("no {needle:?}:\n{stderr}"))
    };
    assert!(at(&first) < at("MARKER"), "{stderr}");
    let shown = stderr
        .lines()
        .filter(|l| l.starts_with(&format!("sandgate: blocked burst.test:{api}")))
        .count();
    let held: usize = stderr
        .lines()
        .filter_map(|l| {
            l.strip_prefix("sandgate: ... and ")?
                .split(' ')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum();
    assert!((1..=5).contains(&shown), "{stderr}");
    assert_eq!(shown + held, 8, "{stderr}");
    assert!(stderr.contains("sandgate: 1 allowed, 9 denied, "), "{stderr}");
    let log = kept_log(&stderr).unwrap();
    assert_eq!(
        read_audit(&log)
            .iter()
            .filter(|e| e["decision"] == "deny")
            .count(),
        9
    );
    // The bytes each way are the close events' sums.
    let events = read_audit(&log);
    let sum = |field: &str| -> u64 { events.iter().filter_map(|e| e[field].as_u64()).sum() };
    assert!(
        stderr.contains(&format!(
            "{} bytes sent, {} bytes received",
            sum("bytes_sent"),
            sum("bytes_received")
        )),
        "{stderr}"
    );

    // --quiet: nothing from sandgate itself.
    let out = run_in(state.path(), &policy, &["--quiet"], &script);
    let (_, stderr) = text(&out);
    assert_eq!(stderr.trim(), "MARKER", "{stderr}");
}

#[test]
fn the_audit_log_is_kept_under_the_state_directory_unless_no_audit_log() {
    let w = World::new();
    let state = tempfile::tempdir().unwrap();
    let policy = w.policy("p.yaml", "");
    let runs = state.path().join("sandgate/runs");
    let out = run_in(state.path(), &policy, &[], "true");
    let (_, stderr) = text(&out);
    let log = kept_log(&stderr).unwrap();
    assert_eq!(log.parent(), Some(runs.as_path()), "{stderr}");
    assert!(log.exists());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&runs).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let out = run_in(
        state.path(),
        &policy,
        &["--no-audit-log"],
        "curl -s http://denied.test/ >/dev/null",
    );
    let (_, stderr) = text(&out);
    assert!(stderr.contains("0 allowed, 1 denied"), "{stderr}");
    assert!(stderr.contains("; audit log: not kept"), "{stderr}");
    assert_eq!(std::fs::read_dir(&runs).unwrap().count(), 1);
    // --audit-log PATH: kept there, and named.
    let mine = w.dir.path().join("mine.jsonl");
    let out = run_in(
        state.path(),
        &policy,
        &["--audit-log", mine.to_str().unwrap()],
        "true",
    );
    assert_eq!(kept_log(&text(&out).1), Some(mine.clone()));
    assert!(mine.exists());
    // audit tail with no log where --file points names the latest kept run's.
    let out = Command::new(sandgate_bin())
        .args(["audit", "tail"])
        .current_dir(w.dir.path())
        .env("XDG_STATE_HOME", state.path())
        .env_remove("SANDGATE_AUDIT_LOG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(&format!("; the latest sandgate run's log is {}", log.display())),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The whole file again as `nobody` (the tests run as root here): learning, the lines and
/// the kept log work for an ordinary user.
#[test]
fn the_learn_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody("run_learn_e2e", "the_learn_suite_passes_as_an_ordinary_user", 5);
}
