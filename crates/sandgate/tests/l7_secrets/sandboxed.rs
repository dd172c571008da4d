//! A secret bound inside `sandgate run` (bubblewrap, `net.mode: allowlist`), by
//! `net.credentials` or by the EgressPolicy `net.egress_policy` names, with
//! `env.passthrough` naming the secret's variable exactly and by prefix, and passing a
//! variable of the same name as the one the command gets: the command holds only the
//! placeholder, in its environment and in every `/proc/*/environ` it can read; bwrap's
//! command line (printed, and as it runs) and every process the run started hold no
//! secret; curl inside sends the placeholder and the origin receives the secret; the run's
//! state directory, its kept audit log, its summary and its output hold none.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;

use super::{PLACEHOLDER, SECRET_VAR, containing, credential, credential_at, secret, secrets_policy};
use crate::common::world::World;
use crate::l7::decisions::decision;
use crate::l7::entry_at;
use crate::l7_tls::{connect_decision, files_under, pem_file};
use crate::sandbox_support::{base, run_command, wait_bounded};

/// The variable the command gets, holding the placeholder (the one an SDK reads).
const INSIDE_VAR: &str = "OPENAI_API_KEY";

/// Inside the sandbox (PORT replaced): the variable, the whole environment, every
/// `/proc/*/environ` and `/proc/*/cmdline` it can read (and how many), curl with the
/// placeholder in its header and then in its query. Then `READY`, and it waits for a line
/// of input while the test looks at the run from outside. The secret is not in the script:
/// the script is on bwrap's command line, which the test searches.
const SCRIPT: &str = r#"
set -u
echo "VAR=$OPENAI_API_KEY"
echo "== env"; env
n=0
for f in /proc/[0-9]*/environ /proc/[0-9]*/task/[0-9]*/environ; do
  if tr '\0' '\n' 2>/dev/null <"$f"; then n=$((n+1)); fi
done
echo "ENVIRONS=$n"
echo "== cmdline"; for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' 2>/dev/null <"$f"; echo; done
c() { timeout -k 5 30 curl -sS -o /dev/null -w '%{http_code}' "$@"; }
echo "CURL=$(c -H "Authorization: Bearer $OPENAI_API_KEY" https://cred.test:PORT/bytes/8)"
echo "LEAK=$(c "https://cred.test:PORT/bytes/9?key=$OPENAI_API_KEY")"
echo READY
read _
"#;

/// Where the policy binds the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Binding {
    /// `net.credentials`, with `env:` naming the variable the command gets.
    Embedded,
    /// `spec.network.credentials` of the EgressPolicy `net.egress_policy` names, the
    /// variable set by `env.set`.
    EgressFile,
}

/// `net.credentials` as docs/sandbox.md writes it.
#[test]
fn the_sandbox_holds_only_the_placeholder_and_its_request_reaches_the_origin_with_the_secret() {
    holds_only_the_placeholder(Binding::Embedded);
}

/// The same, the credential in the EgressPolicy file the run enforces too.
#[test]
fn a_credential_of_the_runs_egress_policy_file_stays_out_of_the_sandbox_too() {
    holds_only_the_placeholder(Binding::EgressFile);
}

fn holds_only_the_placeholder(binding: Binding) {
    let w = World::new();
    let ca = TestCa::new(&["cred.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("cred.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let policy = sandbox_policy(dir.path(), binding, &dns.addr().to_string(), port);
    let secret = secret();
    let audit = dir.path().join("audit.jsonl");
    let summary = dir.path().join("summary.json");
    // The run's state directory goes under TMPDIR, its state under XDG_STATE_HOME: both
    // this test's own, to search.
    let (state, xdg) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let script = SCRIPT.replace("PORT", &port.to_string());
    let command = ["sh", "-c", script.as_str()];
    let run = |extra: &[&str]| {
        let mut cmd = run_command(&policy, extra, &command);
        cmd.env(SECRET_VAR, &secret)
            .env(INSIDE_VAR, &secret)
            .env("SSL_CERT_FILE", &roots)
            .env_remove("SSL_CERT_DIR")
            .env("TMPDIR", state.path())
            .env("XDG_STATE_HOME", xdg.path())
            .env("SANDGATE_LOG", "debug");
        cmd
    };

    let printed = run(&["--print-argv"]).output().unwrap();
    let argv = String::from_utf8_lossy(&printed.stdout);
    assert!(
        printed.status.success() && argv.contains("--unshare-net"),
        "{printed:?}"
    );
    assert!(!super::contains(&printed.stdout, &secret) && !super::contains(&printed.stderr, &secret));

    let mut child = run(&[
        "--audit-log",
        audit.to_str().unwrap(),
        "--summary-json",
        summary.to_str().unwrap(),
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Its output up to READY (or its end), read on threads so that a stuck run fails in
    // time and a chatty log never fills its pipe.
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let mut printed = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(120)) {
        let ready = line == "READY";
        printed.push(line);
        if ready {
            break;
        }
    }
    // While it runs: every process the run started (bwrap, the sandbox's init, the shell,
    // whatever they started), seen from outside.
    let started = descendants(child.id());
    let state_files = files_under(state.path());
    let bridges: Vec<PathBuf> = std::fs::read_dir(state.path())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bridge/proxy.sock"))
        .filter(|p| p.exists())
        .collect();
    let _ = child.stdin.take().unwrap().write_all(b"done\n");
    let status = wait_bounded(&mut child);
    let stderr = stderr.join().unwrap();
    let stdout = printed.join("\n");
    assert!(
        status.success() && printed.last().is_some_and(|l| l == "READY"),
        "{status:?}\n{stdout}\n{stderr}"
    );

    let value = |key: &str| {
        printed
            .iter()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in:\n{stdout}\n{stderr}"))
    };
    assert_eq!(value("VAR="), PLACEHOLDER);
    assert!(
        value("ENVIRONS=").parse::<usize>().is_ok_and(|n| n >= 1),
        "no environ read:\n{stdout}"
    );
    assert!(!stdout.contains(&format!("{SECRET_VAR}=")), "{stdout}");
    assert!(!stdout.contains(&secret), "the sandbox saw the secret:\n{stdout}");
    assert_eq!(
        (value("CURL="), value("LEAK=")),
        ("200", "403"),
        "{stdout}\n{stderr}"
    );
    let inside = origin.received();
    let real = format!("Bearer {secret}");
    assert_eq!(
        inside
            .iter()
            .map(|r| (r.target.as_str(), r.header("authorization")))
            .collect::<Vec<_>>(),
        [("/bytes/8", vec![real.as_str()])],
        "what the origin received"
    );

    let bwrap: Vec<_> = started.iter().filter(|p| p.comm == "bwrap").collect();
    assert!(!bwrap.is_empty(), "no bwrap among {started:#?}");
    for p in &started {
        assert!(
            !p.cmdline.contains(&secret) && !p.environ.contains(&secret),
            "process {} ({}) holds the secret",
            p.pid,
            p.comm
        );
    }
    assert!(
        started.iter().any(|p| p.environ.contains(PLACEHOLDER)),
        "no environment was read from outside: {started:#?}"
    );
    assert!(
        !bridges.is_empty(),
        "not the run's state directory: {:?}",
        state.path()
    );
    // The interception CA reached the command (it fetched through it above) without ever
    // being a file on the host, where another run that may write there could change it.
    assert!(
        !state_files
            .iter()
            .any(|f| f.extension().is_some_and(|e| e == "pem")),
        "the interception CA is on the host: {state_files:#?}"
    );
    // What the run left behind too, once it ended.
    let mut written = state_files;
    written.extend(files_under(state.path()));
    written.extend(files_under(xdg.path()));
    assert!(audit.exists() && summary.exists(), "no audit log or summary kept");
    written.extend([audit.clone(), summary.clone()]);
    assert_eq!(containing(&written, &secret), Vec::<PathBuf>::new());
    assert!(
        !stderr.contains(&secret),
        "the run's log holds the secret:\n{stderr}"
    );

    assert_eq!(connect_decision(&audit, "cred.test")["reason_code"], "inspected");
    let d = decision(&audit, "cred.test", "GET", "/bytes/8");
    assert_eq!(
        (&d["decision"], &d["scheme"]),
        (&"allow".into(), &"https".into()),
        "{d:#}"
    );
}

/// A process as seen from outside the sandbox.
#[derive(Debug)]
struct Seen {
    pid: u32,
    comm: String,
    cmdline: String,
    environ: String,
}

/// Every descendant of `root` still running (not `root` itself, whose environment holds
/// the secret: the test put it there).
fn descendants(root: u32) -> Vec<Seen> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = Vec::new();
    let mut todo = vec![root];
    while let Some(parent) = todo.pop() {
        for &(pid, _) in parents.iter().filter(|(_, ppid)| *ppid == parent) {
            todo.push(pid);
            let read = |name: &str| {
                let bytes =
                    std::fs::read(Path::new("/proc").join(pid.to_string()).join(name)).unwrap_or_default();
                String::from_utf8_lossy(&bytes).replace('\0', " ")
            };
            found.push(Seen {
                pid,
                comm: read("comm").trim().to_owned(),
                cmdline: read("cmdline"),
                environ: read("environ"),
            });
        }
    }
    found
}

/// Writes a SandboxPolicy (`dir/sandbox.yaml`, and `dir/policy.yaml` for
/// [`Binding::EgressFile`]) in allowlist mode asking `dns`, allowing `cred.test:port` and
/// binding the secret of [`SECRET_VAR`] to it. The attack: `env.passthrough` names the
/// secret's variable exactly and by prefix, and the variable the command gets, which the
/// host has too.
pub(super) fn sandbox_policy(dir: &Path, binding: Binding, dns: &str, port: u16) -> PathBuf {
    let passthrough = format!("env:\n  passthrough: [ {SECRET_VAR}, \"L7_*\", {INSIDE_VAR} ]\n");
    let net = format!(
        "net:\n  mode: allowlist\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{dns}\" ] }}\n"
    );
    let yaml = match binding {
        Binding::Embedded => format!(
            "{}{net}  allowlist:\n{}  credentials:\n{}",
            base().replacen("env:\n", &passthrough, 1),
            entry_at(4, "cred.test", port, &[]),
            credential_at(4, "cred.test", SECRET_VAR, PLACEHOLDER, Some(INSIDE_VAR)),
        ),
        Binding::EgressFile => {
            secrets_policy(
                dir,
                &entry_at(6, "cred.test", port, &[]),
                &credential("cred.test", SECRET_VAR, PLACEHOLDER),
            );
            let set = format!("LANG: C.UTF-8, {INSIDE_VAR}: {PLACEHOLDER} }}");
            format!(
                "{}{net}  egress_policy: policy.yaml\n",
                base()
                    .replacen("env:\n", &passthrough, 1)
                    .replacen("LANG: C.UTF-8 }", &set, 1)
            )
        }
    };
    let path = dir.join("sandbox.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}
