//! `sandgate run --ask` through a real pseudo-terminal (Python's `pty`): when only the
//! allowlist refuses, the run asks at the terminal; "once" allows that request and asks
//! again next time, "run" allows the rest of the run without asking again, no answer in
//! time is a deny, and without a terminal it denies at once. Each answer is on record as an
//! exception decided at the terminal.

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

use std::process::Command;

use common::runtime;
use sandbox_support::{HOST_PYTHON, allowlist, write_policy};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;

/// Runs `script` in a new pseudo-terminal, answering each prompt with the next of
/// `answers`; returns what the terminal showed and how many prompts there were.
const PTY_DRIVER: &str = r#"
import os, pty, re, select, sys, time
script, answers, limit = sys.argv[1], [a for a in sys.argv[2].split(',') if a], float(sys.argv[3])
# Typed when the command (not sandgate) asks something: an answer meant for the command.
decoy = sys.argv[4] if len(sys.argv) > 4 else ''
decoyed = False
pid, fd = pty.fork()
if pid == 0:
    os.execvp('sh', ['sh', '-c', script])
out, prompts, end = b'', 0, time.time() + limit
while time.time() < end:
    r, _, _ = select.select([fd], [], [], 0.1)
    if fd in r:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        out += data
        if decoy and not decoyed and b'name? ' in out:
            os.write(fd, (decoy + '\n').encode()); decoyed = True
        while out.count(b'Type o-') > prompts:
            codes = re.findall(rb'Type o-(\d{4})', out)
            if prompts < len(answers) and len(codes) > prompts:
                a = answers[prompts]
                os.write(fd, ((a + '-' + codes[prompts].decode()) if a in ('o', 'r', '15') else a).encode() + b'\n')
            prompts += 1
os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors='replace'))
print('\nPROMPTS=%d' % prompts)
"#;

struct Setup {
    _rt: tokio::runtime::Runtime,
    _origin: Origin,
    _dns: DnsServer,
    dir: tempfile::TempDir,
    port: u16,
    policy: std::path::PathBuf,
}

fn setup() -> Setup {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), &allowlist(dns.addr(), &["other.test".to_owned()]));
    Setup {
        port: origin.port(),
        _rt: rt,
        _origin: origin,
        _dns: dns,
        dir,
        policy,
    }
}

/// Two requests to the same destination inside one run, under a pty answering `answers`.
fn two_requests(s: &Setup, extra: &str, answers: &str) -> (String, Vec<serde_json::Value>) {
    let audit = s
        .dir
        .path()
        .join(format!("audit-{}.jsonl", answers.replace(',', "-")));
    let curl = |n: &str| {
        format!(
            "curl -s -o /dev/null -w '{n}=%{{http_code}}\\n' http://web.test:{}/",
            s.port
        )
    };
    let script = format!(
        "{sg} run --ask {extra} --audit-log {audit} --policy {policy} -- sh -c \"{a}; {b}\"",
        sg = common::sandgate_bin(),
        audit = audit.display(),
        policy = s.policy.display(),
        a = curl("first"),
        b = curl("second"),
    );
    let out = Command::new(HOST_PYTHON)
        .args(["-c", PTY_DRIVER, &script, answers, "30"])
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        common::read_audit(&audit),
    )
}

#[test]
fn once_then_deny_asks_twice() {
    let s = setup();
    let (shown, events) = two_requests(&s, "", "o,d");
    assert!(
        shown.contains("first=200") && shown.contains("second=403"),
        "{shown}"
    );
    assert!(shown.contains("PROMPTS=2"), "{shown}");
    assert!(
        shown.contains("allowed once") && shown.contains(": denied"),
        "{shown}"
    );
    let changes: Vec<&str> = events
        .iter()
        .filter(|e| e["exception_id"].is_string())
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        changes,
        [
            "exception_requested",
            "exception_approved",
            "exception_requested",
            "exception_denied"
        ]
    );
    let approved = events
        .iter()
        .find(|e| e["event"] == "exception_approved")
        .unwrap();
    assert!(
        approved["subject"].as_str().unwrap().ends_with("(terminal)"),
        "{approved}"
    );
    let id = approved["exception_id"].as_str().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["decision"] == "allow" && e["rule"] == format!("exception:{id}").as_str()),
        "{events:#?}"
    );
}

#[test]
fn for_the_run_asks_once() {
    let s = setup();
    let (shown, _) = two_requests(&s, "", "r");
    assert!(
        shown.contains("first=200") && shown.contains("second=200"),
        "{shown}"
    );
    assert!(shown.contains("PROMPTS=1"), "{shown}");
}

#[test]
fn no_answer_in_time_is_a_deny() {
    let s = setup();
    let (shown, _) = two_requests(&s, "--ask-timeout 1", "");
    assert!(
        shown.contains("first=403") && shown.contains("second=403"),
        "{shown}"
    );
    assert!(shown.contains("no answer in time"), "{shown}");
    assert!(shown.contains("PROMPTS=1"), "the deny was remembered: {shown}");
}

/// The attack: the command asks the person something, then makes a request; what the person
/// types for the command ("robert", which starts with r) must not approve the request.
#[test]
fn what_the_person_types_for_the_command_approves_nothing() {
    let s = setup();
    let script = format!(
        "{sg} run --ask --ask-timeout 2 --policy {policy} -- sh -c \"printf 'name? '; sleep 1; curl -s -o /dev/null -w 'status=%{{http_code}}\\n' http://web.test:{port}/\"",
        sg = common::sandgate_bin(),
        policy = s.policy.display(),
        port = s.port,
    );
    let out = Command::new(HOST_PYTHON)
        .args(["-c", PTY_DRIVER, &script, "", "30", "robert"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("status=403"),
        "the typed-ahead answer approved the request: {shown}"
    );
}

/// The attack: while the question is on the screen, the command writes to the terminal, as
/// it would to draw another host name over the one asked about. The sandbox is held still
/// until the answer is in: nothing it writes lands between the question and the answer, and
/// it runs on afterwards.
#[test]
fn the_command_cannot_write_over_the_question() {
    let s = setup();
    let script = format!(
        "{sg} run --ask --ask-timeout 2 --policy {policy} -- sh -c \"(while true; do printf REDRAWN; sleep 0.05; done) & L=\\$!; sleep 0.3; curl -s -o /dev/null -w 'status=%{{http_code}}\\n' http://web.test:{port}/; sleep 0.3; kill \\$L\"",
        sg = common::sandgate_bin(),
        policy = s.policy.display(),
        port = s.port,
    );
    let out = Command::new(HOST_PYTHON)
        .args(["-c", PTY_DRIVER, &script, "", "30"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    let asked = shown
        .find("Type o-")
        .unwrap_or_else(|| panic!("never asked: {shown}"));
    let answered = shown
        .find("no answer in time")
        .unwrap_or_else(|| panic!("never answered: {shown}"));
    assert!(
        !shown[asked..answered].contains("REDRAWN"),
        "the command wrote while the question was shown: {shown}"
    );
    assert!(
        shown[answered..].contains("REDRAWN"),
        "the command did not run on after the answer: {shown}"
    );
    assert!(shown.contains("status=403"), "{shown}");
}

/// The attack of the second review: before its request, the command makes its own process
/// group the terminal's foreground (ignoring SIGTTOU), so that sandgate, touching the
/// terminal to ask, is stopped by SIGTTOU; at an interactive shell the person then types
/// `fg`, whose SIGCONT continues the frozen sandbox too, which then writes over the
/// question. sandgate takes the foreground back (and checks the freeze) before it asks:
/// the question shows, the sandbox stays still until the answer, and the answer applies.
#[test]
fn the_command_cannot_take_the_terminal_away_from_the_question() {
    let s = setup();
    let code = format!(
        r#"import os, signal, subprocess, time
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
os.setpgid(0, 0)
tty = os.open("/dev/tty", os.O_RDWR)
os.tcsetpgrp(tty, os.getpgrp())
pid = os.fork()
if pid == 0:
    for i in range(200):
        os.write(tty, b"REDRAWN")
        time.sleep(0.05)
    os._exit(0)
time.sleep(0.3)
r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "status=%{{http_code}}", "http://web.test:{port}/"], capture_output=True, text=True)
print(r.stdout, flush=True)
time.sleep(0.3)
os.kill(pid, 9)
"#,
        port = s.port
    );
    let script = format!(
        "{sg} run --ask --ask-timeout 10 --policy {policy} -- python3 -c '{code}'",
        sg = common::sandgate_bin(),
        policy = s.policy.display(),
    );
    let out = Command::new(HOST_PYTHON)
        .args(["-c", PTY_DRIVER, &script, "o", "30"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    let asked = shown
        .find("Type o-")
        .unwrap_or_else(|| panic!("never asked (sandgate was stopped at the terminal?): {shown}"));
    let answered = shown
        .find("allowed once")
        .unwrap_or_else(|| panic!("never answered: {shown}"));
    assert!(
        !shown[asked..answered].contains("REDRAWN"),
        "the command wrote while the question was shown: {shown}"
    );
    assert!(shown.contains("status=200"), "the answer did not apply: {shown}");
}

#[test]
fn without_a_terminal_it_denies_at_once() {
    let s = setup();
    let started = std::time::Instant::now();
    let out = Command::new("setsid")
        .arg(common::sandgate_bin())
        .args(["run", "--ask", "--policy"])
        .arg(&s.policy)
        .args(["--", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://web.test:{}/", s.port))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "403");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "it waited for a terminal"
    );
}

/// The whole file again as `nobody`.
#[test]
fn the_ask_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody("sandbox_ask_e2e", "the_ask_suite_passes_as_an_ordinary_user", 6);
}
