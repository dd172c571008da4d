//! Interception inside `sandgate run` (bubblewrap, `net.mode: allowlist`): with fetch-only
//! and read-only entries in the SandboxPolicy's `net.allowlist`, the run makes its own CA
//! and the sandbox trusts it with no flag. git clones over HTTPS and cannot push; curl,
//! Debian's Python (urllib) and Node's fetch (when node is installed) each read and are
//! refused a write on the read-only entry; a push through an entry without rules works,
//! relayed undecrypted. Only certificates reach the sandbox and the run's state directory:
//! no private key is anywhere in either.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;

use super::{connect_decision, files_under, pem_file};
use crate::common::read_audit;
use crate::common::world::World;
use crate::l7::decisions::{assert_refused_by, decision, entry_lines};
use crate::l7::git_origin::{GitOrigin, sandboxed_git_script};
use crate::l7::{entry_at, fetch_only};
use crate::sandbox_support::{base, run_command, wait_bounded};

/// Where Debian's npm keeps undici, whose `ProxyAgent` Node's own fetch takes as its
/// dispatcher (Node 20's fetch reads no proxy variable by itself).
const UNDICI: &str = "/usr/lib/node_modules/npm/node_modules/undici";

/// Inside the sandbox (GIT_PORT and RO_PORT replaced), no CA flag anywhere. Prints
/// `CONTROL=<id>` once the push through the entry without rules landed, `CLONED` with the
/// control commit in the fetch-only clone, `REFUSED=<id>` and git's error when its push
/// fails; `CURL`, `PY` and `NODE` lines with each client's `METHOD=STATUS` on the read-only
/// entry; `KEYS=` how many files under /run/sandgate hold a private key, and what is there.
/// Then `READY`, and it waits for a line of input while the test looks at the run. The
/// Python and Node scripts are written in (PY_SCRIPT, NODE_SCRIPT): the run passes no
/// variable of the host's.
const SCRIPT: &str = r#"
GIT_LINES
c() { timeout -k 5 30 curl -sS -o /dev/null -w '%{http_code}' "$@"; }
echo "CURL GET=$(c https://ro.test:RO_PORT/curl/GET) POST=$(c --data x=1 https://ro.test:RO_PORT/curl/POST)"
cat > /tmp/check.py <<'EOF'
PY_SCRIPT
EOF
timeout -k 5 30 /usr/bin/python3 /tmp/check.py https://ro.test:RO_PORT
cat > /tmp/check.js <<'EOF'
NODE_SCRIPT
EOF
if [ -x /usr/bin/node ]; then timeout -k 5 30 /usr/bin/node /tmp/check.js https://ro.test:RO_PORT; fi
echo "KEYS=$(grep -rls 'PRIVATE KEY' /run/sandgate | wc -l) $(ls /run/sandgate | tr '\n' ' ')"
echo READY
read _
"#;

/// Debian's Python, urllib with its default context: `https_proxy` and `SSL_CERT_FILE` from
/// the run.
const PY: &str = r#"import sys, urllib.error, urllib.request
out = []
for method in ["GET", "POST"]:
    body = b"x=1" if method == "POST" else None
    req = urllib.request.Request(f"{sys.argv[1]}/py/{method}", data=body, method=method)
    try:
        out.append(f"{method}={urllib.request.urlopen(req, timeout=20).status}")
    except urllib.error.HTTPError as e:
        out.append(f"{method}={e.code}")
print("PY " + " ".join(out))"#;

/// Node's fetch through the run's proxy; `NODE_EXTRA_CA_CERTS` from the run.
const NODE: &str = r#"const { ProxyAgent } = require("UNDICI");
const dispatcher = new ProxyAgent(process.env.https_proxy);
(async () => {
  const out = [];
  for (const method of ["GET", "POST"]) {
    const body = method === "POST" ? "x=1" : undefined;
    const r = await fetch(`${process.argv[2]}/node/${method}`, { method, body, dispatcher });
    out.push(`${method}=${r.status}`);
  }
  console.log("NODE " + out.join(" "));
})().catch((e) => console.log(`NODE failed: ${e} ${e.cause}`));"#;

#[test]
fn clients_in_a_sandbox_trust_the_runs_ca_with_no_flag_and_the_rules_hold() {
    let w = World::new();
    let ca = TestCa::new(&["git.test", "open.test", "ro.test"]);
    let git_origin = GitOrigin::start_tls(&ca);
    let ro_origin = w.tls_origin(&ca);
    let (git_port, ro_port) = (git_origin.port(), ro_origin.port());
    let dns = w.dns(
        Zone::new()
            .with("git.test", &["127.0.0.1"])
            .with("open.test", &["127.0.0.1"])
            .with("ro.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let yaml = format!(
        "{}net:\n  mode: allowlist\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\n  allowlist:\n{}{}{}",
        base(),
        dns.addr(),
        entry_at(4, "open.test", git_port, &[]),
        fetch_only("git.test", git_port, 4),
        entry_at(4, "ro.test", ro_port, &["read_only: true"]),
    );
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, &yaml).unwrap();
    let lines = entry_lines(&yaml);
    let audit = dir.path().join("audit.jsonl");
    // The run's state directory goes under TMPDIR: one of this test's own, to search.
    let state = tempfile::tempdir().unwrap();

    let node = Path::new("/usr/bin/node").exists() && Path::new(UNDICI).exists();
    if !node {
        println!("node (with npm's undici) is not installed: Node's fetch is not checked");
    }
    let script = SCRIPT
        .replace("GIT_LINES", &sandboxed_git_script("https", git_port))
        .replace("PY_SCRIPT", PY)
        .replace("NODE_SCRIPT", &NODE.replace("UNDICI", UNDICI))
        .replace("GIT_PORT", &git_port.to_string())
        .replace("RO_PORT", &ro_port.to_string());
    let mut child = run_command(
        &policy,
        &["--audit-log", audit.to_str().unwrap()],
        &["sh", "-c", &script],
    )
    .env("SSL_CERT_FILE", &roots)
    .env_remove("SSL_CERT_DIR")
    .env("TMPDIR", state.path())
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();

    // Its output up to READY (or its end), read on a thread so a stuck run fails in time.
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut printed = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(200)) {
        let ready = line == "READY";
        printed.push(line);
        if ready {
            break;
        }
    }
    // While the run lasts: no private key in its state directory (the run's: its bridge
    // socket is there), and not the CA's certificate either: bwrap got it as data, so it
    // is never a file on the host that another run could change.
    let files = files_under(state.path());
    let runs_own = std::fs::read_dir(state.path())
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.path().join("bridge/proxy.sock").exists());
    let keys: Vec<_> = files
        .iter()
        .filter(|f| std::fs::read(f).is_ok_and(|b| String::from_utf8_lossy(&b).contains("PRIVATE KEY")))
        .collect();
    let ca_on_host = files.iter().any(|f| f.extension().is_some_and(|e| e == "pem"));
    // The run may have ended already (a step failed): its output says why, below.
    let _ = child.stdin.take().unwrap().write_all(b"done\n");
    let status = wait_bounded(&mut child);
    let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    let stdout = printed.join("\n");
    assert!(
        status.success() && printed.last().is_some_and(|l| l == "READY"),
        "{status:?}\n{stdout}\n{stderr}"
    );
    assert!(
        runs_own && !ca_on_host && keys.is_empty(),
        "state: {files:#?}, keys in {keys:?}"
    );

    let value = |key: &str| {
        printed
            .iter()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in:\n{stdout}\n{stderr}"))
            .to_owned()
    };
    let (control, refused) = (value("CONTROL="), value("REFUSED="));
    assert!(
        stdout.contains("CLONED") && !stdout.contains("PUSHED") && stdout.contains("403"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(value("CURL "), "GET=200 POST=403", "{stdout}\n{stderr}");
    assert_eq!(value("PY "), "GET=200 POST=403", "{stdout}\n{stderr}");
    if node {
        assert_eq!(value("NODE "), "GET=200 POST=403", "{stdout}\n{stderr}");
    }
    let keys_inside = value("KEYS=");
    assert!(
        keys_inside.starts_with("0 ")
            && keys_inside.contains("ca.pem")
            && keys_inside.contains("ca-bundle.pem"),
        "/run/sandgate: {keys_inside}"
    );

    let refs = git_origin.refs("myorg/repo.git");
    assert!(refs.contains(&control), "the control push did not land: {refs}");
    assert!(!refs.contains(&refused), "the refused push landed: {refs}");
    assert_eq!(git_origin.received("git.test", "POST", "/git-receive-pack"), 0);
    let mut reads = vec!["GET /curl/GET", "GET /py/GET"];
    if node {
        reads.push("GET /node/GET");
    }
    assert_eq!(ro_origin.requests(), reads, "only the reads reach the origin");

    let d = decision(&audit, "git.test", "POST", "/myorg/repo.git/git-receive-pack");
    assert_refused_by(&d, "request_not_allowed", "policy.yaml", &lines[1..3]);
    assert_eq!(d["scheme"], "https", "{d:#}");
    assert!(
        d["task_id"].as_str().is_some_and(|t| t.starts_with("run-")),
        "{d:#}"
    );
    for client in ["curl", "py"].into_iter().chain(node.then_some("node")) {
        let d = decision(&audit, "ro.test", "POST", &format!("/{client}/POST"));
        assert_refused_by(&d, "request_not_allowed", "policy.yaml", &lines[3..]);
        assert_eq!(d["scheme"], "https", "{d:#}");
    }
    assert_eq!(connect_decision(&audit, "git.test")["reason_code"], "inspected");
    assert_eq!(connect_decision(&audit, "ro.test")["reason_code"], "inspected");
    assert_eq!(
        connect_decision(&audit, "open.test")["reason_code"],
        "allowlisted"
    );
    let events = read_audit(&audit);
    assert!(
        super::inside(&events, "open.test").is_empty(),
        "a tunnel without rules was decrypted: {events:#?}"
    );
}
