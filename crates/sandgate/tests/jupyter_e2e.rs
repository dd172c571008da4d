//! `sandgate jupyter` with real Jupyter (jupyter_server 2.21.1, jupyter_client 8.10.0,
//! ipykernel 7.4.0 and jupyter-mcp-server 2.2.4 from target/venv) and the real bubblewrap:
//! a bundle composed, checked and moved; kernels of both profiles started through
//! jupyter_client's KernelManager (tests/jupyter/kernels.py) and run under `sandgate run`
//! with Jupyter's ipc transport: offline computing, no network, writes only where the
//! profile allows, the allowlist through the proxy with the audit naming the kernel's run,
//! interrupt (message mode) and restart. As the kernel turned attacker: another kernel's
//! connection file, key and sockets, the host's loopback, a symlink planted for the
//! (unsandboxed) server to follow. Then `jupyter launch` under a real MCP client (the
//! Python `mcp` SDK, tests/mcp/driver.py), its teardown on exit, SIGTERM and `kill -9`, a
//! kernel reaching for the terminal the launcher runs in, and the kernels as an ordinary
//! user.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;
use serde_json::{Value, json};

fn sandgate(args: &[&str]) -> Output {
    Command::new(common::sandgate_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `jupyter compose` into `out` with the venv's Python; the output.
fn compose(out: &Path, extra: &[&str]) -> Output {
    compose_with(out, &common::python(), extra)
}

/// `jupyter compose` into `out` with `python`; the output.
fn compose_with(out: &Path, python: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "jupyter",
        "compose",
        "--out",
        out.to_str().unwrap(),
        "--python",
        python,
    ];
    args.extend(extra);
    sandgate(&args)
}

fn compose_ok(out: &Path, extra: &[&str]) -> PathBuf {
    let o = compose(out, extra);
    assert!(o.status.success(), "{}", text(&o));
    out.to_path_buf()
}

/// Moves a bundle to `dir/moved/bundle`: everything must keep working from there.
fn relocate(bundle: &Path, dir: &Path) -> PathBuf {
    let to = dir.join("moved/bundle");
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::rename(bundle, &to).unwrap();
    to
}

/// The default `high` policy, its network narrowed to a test origin: `allowed.test` on the
/// origin's port, resolved by the test's DNS server to 127.0.0.1 (exempt from the address
/// guard). Everything else is the composed default.
fn test_high_policy(default_high: &str, origin_port: u16, dns: std::net::SocketAddr) -> String {
    let net = "net:\n  mode: allowlist\n  presets: [ python-packages ]\n";
    assert!(default_high.contains(net), "{default_high}");
    default_high.replace(
        net,
        &format!(
            "net:\n  mode: allowlist\n  allow_domains: [ \"allowed.test:{origin_port}\" ]\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{dns}\" ] }}\n"
        ),
    )
}

/// The kernels driver (tests/jupyter/kernels.py), one command per line.
struct Kernels {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    runtime: tempfile::TempDir,
}

impl Kernels {
    fn start(bundle: &Path) -> Kernels {
        Kernels::start_with(
            Command::new(common::python()),
            bundle,
            tempfile::tempdir().unwrap(),
        )
    }

    fn start_with(mut cmd: Command, bundle: &Path, runtime: tempfile::TempDir) -> Kernels {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/jupyter/kernels.py");
        let mut child = cmd
            .arg(script)
            .arg(bundle)
            .arg(runtime.path())
            // Neither reaches a kernel: its environment is its policy's.
            .env("SANDGATE_TEST_SECRET", "do-not-leak")
            .env("JPY_PARENT_PID", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the kernels driver");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Kernels {
            child,
            stdin: Some(stdin),
            lines,
            runtime,
        }
    }

    fn send(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin.as_mut().unwrap(), "{cmd}").unwrap();
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no answer within 60 s to {cmd}"));
        let v: Value = serde_json::from_str(&line).unwrap();
        assert!(v["driver_error"].is_null(), "{cmd}: {v}");
        v
    }

    fn start_kernel(&mut self, name: &str, alias: &str) -> Value {
        self.send(json!({"start": name, "as": alias}))
    }

    /// Runs `code` (which prints one JSON object) in kernel `alias`; that object.
    fn probe(&mut self, alias: &str, code: &str) -> Value {
        let out = self.send(json!({"exec": alias, "code": code}));
        assert!(out["error"].is_null(), "{out}");
        let stdout = out["stdout"].as_str().unwrap();
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    }
}

impl Drop for Kernels {
    /// End of input: the driver shuts its kernels down (bounded), else it is killed.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Processes (other than this one) whose command line contains `needle`.
fn processes_with(needle: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == me || !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push(format!("{name}: {cmdline}"));
        }
    }
    found
}

/// Waits (bounded) until no process mentions `needle`.
fn none_left(needle: &str, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    loop {
        let left = processes_with(needle);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `write(path)`: "ok" or the exception's name, in kernel code.
const WRITE_FN: &str = r#"
def write(p):
    try:
        with open(p, "w") as f:
            f.write("x")
        return "ok"
    except OSError as e:
        return type(e).__name__
"#;

#[test]
fn compose_writes_a_relocatable_bundle_and_refuses_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bundle");
    let o = compose(&out, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("profiles low, high (default low)"),
        "{}",
        text(&o)
    );
    for f in [
        "bin/sandgate",
        "bin/sandgate-init",
        "jupyter/config/jupyter_server_config.py",
        "kernels/python3-low/kernel.json",
        "kernels/python3-high/kernel.json",
        "policies/low/policy.yaml",
        "policies/high/policy.yaml",
        "mcp/jupyter_mcp_launcher.yaml",
        "workspace",
        "state/low/home",
        "state/high/pycache",
        "audit",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    let root = out.to_str().unwrap().to_owned();
    for f in [
        "kernels/python3-low/kernel.json",
        "jupyter/config/jupyter_server_config.py",
    ] {
        let t = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(!t.contains(&root), "{f} names the build location:\n{t}");
    }
    let bundle = relocate(&out, dir.path());
    // The policies are what `sandgate run` accepts, as the kernelspec gives them.
    let runtime = tempfile::tempdir().unwrap();
    let connection = runtime.path().join("kernel-1.json");
    std::fs::write(&connection, "{}").unwrap();
    std::fs::create_dir(runtime.path().join("kernel-1.json.d")).unwrap();
    let real = bundle.canonicalize().unwrap();
    for profile in ["low", "high"] {
        let from_spec = format!("{}/kernels/python3-{profile}/../..", bundle.display());
        let o = sandgate(&[
            "run",
            "--policy",
            &format!("{}/policies/{profile}/policy.yaml", bundle.display()),
            "--path-param",
            &format!("BUNDLE={from_spec}"),
            "--param",
            &format!("CONNECTION_FILE={}", connection.display()),
            "--print-argv",
            "--",
            "true",
        ]);
        let t = text(&o);
        assert!(o.status.success(), "{t}");
        let ws = real.join("workspace");
        for want in [
            format!("--bind {} {}", ws.display(), ws.display()),
            format!("--ro-bind {} {}", connection.display(), connection.display()),
            format!("--bind {0}.d {0}.d", connection.display()),
            "--unshare-net".to_owned(),
            "--allow-unix-sockets".to_owned(),
            "HOME".to_owned(),
        ] {
            assert!(t.contains(&want), "{profile}: {want}\n{t}");
        }
        assert!(!t.contains(&format!("{} ", runtime.path().display())), "{t}");
    }

    // Bad input: exit 64 (or 69 for a Python without ipykernel), a message naming it, and
    // nothing left behind.
    let low = std::fs::read_to_string(bundle.join("policies/low/policy.yaml")).unwrap();
    let no_sockets = dir.path().join("no-sockets.yaml");
    std::fs::write(
        &no_sockets,
        low.replace("allow_unix_sockets: true", "allow_unix_sockets: false"),
    )
    .unwrap();
    let all = dir.path().join("all.yaml");
    std::fs::write(&all, low.replace("mode: none", "mode: all")).unwrap();
    let fresh = dir.path().join("fresh");
    let spaced = dir.path().join("my bundle");
    let ns = format!("low={}", no_sockets.display());
    let al = format!("low={}", all.display());
    let cases: Vec<(Vec<&str>, &Path, u8, &str)> = vec![
        (
            vec!["--profile", "Bad=x.yaml"],
            &fresh,
            64,
            "profile name \"Bad\"",
        ),
        (vec!["--profile", "low"], &fresh, 64, "expected NAME=FILE"),
        (
            vec!["--profile", "low=/nonexistent.yaml"],
            &fresh,
            64,
            "cannot read /nonexistent.yaml",
        ),
        (
            vec!["--profile", &ns, "--profile", &ns],
            &fresh,
            64,
            "given twice",
        ),
        (
            vec!["--profile", &ns],
            &fresh,
            64,
            "allow_unix_sockets must be true",
        ),
        (vec!["--profile", &al], &fresh, 64, "net.mode all"),
        (vec![], &bundle, 64, "not empty"),
        (
            vec![],
            Path::new("/nonexistent/dir/b"),
            64,
            "parent directory does not exist",
        ),
        (vec![], &spaced, 64, "may hold only letters, digits"),
    ];
    for (extra, out, code, want) in cases {
        let o = compose(out, &extra);
        assert_eq!(o.status.code(), Some(code.into()), "{extra:?}: {}", text(&o));
        assert!(text(&o).contains(want), "{extra:?}: want {want:?}: {}", text(&o));
    }
    for (python, want) in [
        ("/usr/bin/python3", "cannot import ipykernel: install them with `"),
        ("/nonexistent/python", "cannot run /nonexistent/python"),
    ] {
        let o = sandgate(&[
            "jupyter",
            "compose",
            "--out",
            fresh.to_str().unwrap(),
            "--python",
            python,
        ]);
        assert_eq!(o.status.code(), Some(69), "{}", text(&o));
        assert!(text(&o).contains(want), "{}", text(&o));
        assert!(text(&o).contains("-m pip install") || python.starts_with("/nonexistent"));
    }
    assert!(!fresh.exists());
    let staging: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".sandgate-jupyter-"))
        .collect();
    assert!(staging.is_empty(), "{staging:?}");

    // The launcher refuses what is not a whole bundle, an unsafe policy, a Python that
    // lacks the server (naming the pip command), and --no-mcp without a token file.
    let o = sandgate(&["jupyter", "launch", "--bundle", dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    assert!(
        text(&o).contains("is not a sandgate jupyter bundle"),
        "{}",
        text(&o)
    );
    let b = bundle.to_str().unwrap();
    let o = sandgate(&["jupyter", "launch", "--bundle", b, "--no-mcp"]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    let policy = bundle.join("policies/low/policy.yaml");
    std::fs::write(
        &policy,
        low.replace("allow_unix_sockets: true", "allow_unix_sockets: false"),
    )
    .unwrap();
    let o = sandgate(&["jupyter", "launch", "--bundle", b]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    assert!(
        text(&o).contains("policies/low/policy.yaml: platform.seccomp.allow_unix_sockets"),
        "{}",
        text(&o)
    );
    std::fs::write(&policy, &low).unwrap();
    let settings = bundle.join("mcp/jupyter_mcp_launcher.yaml");
    let yaml = std::fs::read_to_string(&settings).unwrap();
    // The line as compose wrote it (its path normalized: common::python() may not be).
    let line = yaml
        .lines()
        .find(|l| l.trim_start().starts_with("python:"))
        .unwrap();
    std::fs::write(&settings, yaml.replace(line, "  python: \"/usr/bin/python3\"")).unwrap();
    let o = sandgate(&["jupyter", "launch", "--bundle", b]);
    assert_eq!(o.status.code(), Some(69), "{}", text(&o));
    assert!(
        text(&o).contains("/usr/bin/python3 cannot import jupyter_server"),
        "{}",
        text(&o)
    );
    assert!(
        text(&o).contains("/usr/bin/python3 -m pip install jupyter_server==2.21.1"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_low_kernel_computes_offline_writes_only_its_workspace_and_can_be_interrupted_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = relocate(&compose_ok(&dir.path().join("b"), &[]), dir.path());
    let mut k = Kernels::start(&bundle);
    let started = k.start_kernel("python3-low", "a");
    let real = bundle.canonicalize().unwrap();
    let venv = Path::new(&common::python())
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let code = format!(
        r#"{WRITE_FN}
import json, os, socket
r = {{"sum": 6 * 7}}
try:
    socket.create_connection(("192.0.2.1", 80), timeout=2)
    r["connect"] = "ok"
except OSError as e:
    r["connect"] = type(e).__name__
try:
    socket.getaddrinfo("example.com", 443)
    r["dns"] = "ok"
except OSError as e:
    r["dns"] = type(e).__name__
r["workspace"] = write("{ws}/from-low.txt")
r["home"] = write(os.path.expanduser("~/.from-low"))
r["policy"] = write("{root}/policies/low/policy.yaml")
r["high_state"] = write("{root}/state/high/home/x")
r["venv"] = write("{venv}/pwned")
r["env"] = sorted(os.environ)
r["home_dir"] = os.path.expanduser("~")
r["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
r["pid1"] = open("/proc/1/cmdline", "rb").read().split(b"\0")[1].decode()
r["init_size"] = os.stat("/run/sandgate-init").st_size
try:
    os.open("/proc/1/mem", os.O_RDWR)
    r["pid1_mem"] = "opened"
except OSError as e:
    r["pid1_mem"] = e.errno
r["seccomp"] = sorted({{l.split()[1] for p in r["pids"] for l in open(f"/proc/{{p}}/status") if l.startswith("Seccomp:")}})
print(json.dumps(r))
"#,
        ws = real.join("workspace").display(),
        root = real.display(),
        venv = venv.display(),
    );
    let r = k.probe("a", &code);
    assert_eq!(r["sum"], 42);
    // Issue 28, finding 1, through a Jupyter kernel: PID 1 is sandgate's filtered init,
    // its memory closed to the kernel, and every process inside shows the filter.
    assert_eq!(r["pid1"], "sandbox-init", "{r}");
    // The bundle's runs start its own small init, not the whole sandgate.
    assert_eq!(
        r["init_size"],
        std::fs::metadata(real.join("bin/sandgate-init")).unwrap().len(),
        "{r}"
    );
    assert_eq!(r["pid1_mem"], 13, "{r}");
    assert_eq!(r["seccomp"], json!(["2"]), "{r}");
    assert_ne!(r["connect"], "ok", "{r}");
    assert_ne!(r["dns"], "ok", "{r}");
    assert_eq!(r["workspace"], "ok", "{r}");
    assert_eq!(r["home"], "ok", "{r}");
    for refused in ["policy", "high_state", "venv"] {
        assert_ne!(r[refused], "ok", "{refused}: {r}");
    }
    assert_eq!(
        std::fs::read_to_string(real.join("workspace/from-low.txt")).unwrap(),
        "x"
    );
    assert!(real.join("state/low/home/.from-low").exists());
    assert!(!venv.join("pwned").exists());
    assert_eq!(
        r["home_dir"],
        real.join("state/low/home").to_str().unwrap(),
        "{r}"
    );
    let env: Vec<&str> = r["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for leaked in [
        "JPY_PARENT_PID",
        "JPY_SESSION_NAME",
        "SANDGATE_TEST_SECRET",
        "JUPYTER_TOKEN",
    ] {
        assert!(!env.contains(&leaked), "{leaked} reached the kernel: {env:?}");
    }
    assert!(
        env.contains(&"PYTHONPYCACHEPREFIX") && env.contains(&"MPLCONFIGDIR"),
        "{env:?}"
    );
    assert!(
        r["pids"].as_array().unwrap().len() < 10,
        "a PID namespace of its own: {r}"
    );

    // Interrupt (message mode: the kernel gets an interrupt_request on its control socket).
    let out = k.send(json!({"interrupt": "a", "code": "import time\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    print('interrupted')\n"}));
    assert_eq!(out["stdout"], "interrupted\n", "{out}");
    assert!(out["seconds"].as_f64().unwrap() < 10.0, "{out}");
    // Restart: a new sandbox, a fresh interpreter, the same connection file.
    k.send(json!({"exec": "a", "code": "x = 1"}));
    let restarted = k.send(json!({"restart": "a"}));
    assert_ne!(restarted["pid"], started["pid"]);
    let out = k.send(json!({"exec": "a", "code": "print('x' in dir())"}));
    assert_eq!(out["stdout"], "False\n", "{out}");
    let connection = started["connection_file"].as_str().unwrap().to_owned();
    k.send(json!({"stop": "a"}));
    let left = none_left(&connection, Duration::from_secs(10));
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_high_kernel_reaches_allowed_origins_through_the_proxy_only_and_the_audit_names_its_run() {
    let rt = common::runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("denied.test", &["127.0.0.1"]),
    ));
    // Another service on the host's loopback (as Jupyter Server's port is).
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other_port = other.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let defaults = compose_ok(&dir.path().join("defaults"), &[]);
    let high = dir.path().join("high.yaml");
    let default_high = std::fs::read_to_string(defaults.join("policies/high/policy.yaml")).unwrap();
    std::fs::write(&high, test_high_policy(&default_high, origin.port(), dns.addr())).unwrap();
    let low_flag = format!("low={}", defaults.join("policies/low/policy.yaml").display());
    let high_flag = format!("high={}", high.display());
    let bundle = compose_ok(
        &dir.path().join("b"),
        &["--profile", &low_flag, "--profile", &high_flag],
    );
    let bundle = relocate(&bundle, dir.path());
    let mut k = Kernels::start(&bundle);
    let started = k.start_kernel("python3-high", "h");
    let port = origin.port();
    let code = format!(
        r#"
import json, os, socket, urllib.error, urllib.request
r = {{}}
r["allowed"] = urllib.request.urlopen("http://allowed.test:{port}/from-kernel", timeout=10).status
try:
    urllib.request.urlopen("http://denied.test:{port}/", timeout=10)
    r["denied"] = "ok"
except urllib.error.HTTPError as e:
    r["denied"] = e.code
# urllib would go around a proxy for no_proxy's 127.0.0.1: ask the proxy itself.
os.environ.pop("no_proxy"); os.environ.pop("NO_PROXY")
through_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({{"http": "http://127.0.0.1:3128"}}))
try:
    through_proxy.open("http://127.0.0.1:{other_port}/", timeout=10)
    r["loopback_via_proxy"] = "ok"
except urllib.error.HTTPError as e:
    r["loopback_via_proxy"] = e.code
except OSError as e:
    r["loopback_via_proxy"] = type(e).__name__
try:
    socket.create_connection(("127.0.0.1", {other_port}), timeout=2)
    r["loopback_direct"] = "ok"
except OSError as e:
    r["loopback_direct"] = type(e).__name__
print(json.dumps(r))
"#
    );
    let r = k.probe("h", &code);
    assert_eq!(r["allowed"], 200, "{r}");
    assert_eq!(r["denied"], 403, "{r}");
    assert_eq!(r["loopback_via_proxy"], 403, "{r}");
    assert_ne!(r["loopback_direct"], "ok", "{r}");
    // The audit of the high profile names the kernel's run: sandgate run's pid is the
    // process Jupyter started for the kernel.
    let run = format!("run-{}-", started["pid"]);
    let audit = bundle.join("audit/high.jsonl");
    let deadline = Instant::now() + Duration::from_secs(5);
    let events = loop {
        let events = common::read_audit(&audit);
        if events.iter().filter(|e| e["event"] == "decision").count() >= 3 || Instant::now() > deadline {
            break events;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let decided = |host: &str, decision: &str| {
        events.iter().any(|e| {
            e["event"] == "decision"
                && e["destination_host"] == host
                && e["decision"] == decision
                && e["task_id"].as_str().is_some_and(|t| t.starts_with(&run))
        })
    };
    assert!(decided("allowed.test", "allow"), "{run}: {events:#?}");
    assert!(decided("denied.test", "deny"), "{events:#?}");
    assert!(decided("127.0.0.1", "deny"), "{events:#?}");
    drop(other);
}

#[test]
fn a_kernel_cannot_read_another_kernels_connection_file_or_reach_its_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = compose_ok(&dir.path().join("b"), &[]);
    let mut k = Kernels::start(&bundle);
    let a = k.start_kernel("python3-low", "a");
    let b = k.start_kernel("python3-high", "b");
    let runtime = k.runtime.path().to_str().unwrap().to_owned();
    for (me, mine, other, other_pid) in [("a", &a, &b, &b["pid"]), ("b", &b, &a, &a["pid"])] {
        let code = format!(
            r#"
import json, os, signal, socket
r = {{}}
other = "{other}"
try:
    open(other).read()
    r["read"] = "ok"
except OSError as e:
    r["read"] = type(e).__name__
try:
    r["listing"] = sorted(os.listdir("{runtime}"))
except OSError as e:
    r["listing"] = type(e).__name__
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(other + ".d/ipc-1")
    r["connect"] = "ok"
except OSError as e:
    r["connect"] = type(e).__name__
try:
    os.kill({other_pid}, 0)
    r["signal"] = "ok"
except OSError as e:
    r["signal"] = type(e).__name__
r["own_key"] = bool(json.load(open("{mine}"))["key"])
print(json.dumps(r))
"#,
            other = other["connection_file"].as_str().unwrap(),
            mine = mine["connection_file"].as_str().unwrap(),
        );
        let r = k.probe(me, &code);
        assert_eq!(r["read"], "FileNotFoundError", "{me}: {r}");
        assert_eq!(r["connect"], "FileNotFoundError", "{me}: {r}");
        assert_ne!(r["signal"], "ok", "{me}: {r}");
        assert_eq!(r["own_key"], true, "{me}: {r}");
        let own = Path::new(mine["connection_file"].as_str().unwrap())
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            r["listing"],
            json!([own.clone(), format!("{own}.d")]),
            "{me}: {r}"
        );
    }
}

/// A raw HTTP/1.1 request to Jupyter Server on loopback: (status, body).
fn http(port: u16, token: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: token {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = common::status_of(&text);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Collects a child's stderr lines in the background.
fn collect(stderr: impl Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let kept = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            kept.lock().unwrap().push(line);
        }
    });
    lines
}

/// The port from the launcher's "ready at http://127.0.0.1:PORT/" line (bounded wait).
fn ready_port(lines: &Arc<Mutex<Vec<String>>>, limit: Duration) -> u16 {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(port) = lines.lock().unwrap().iter().find_map(|l| {
            l.split("ready at http://127.0.0.1:")
                .nth(1)?
                .split('/')
                .next()?
                .parse()
                .ok()
        }) {
            return port;
        }
        assert!(
            Instant::now() < deadline,
            "the launcher was not ready: {:?}",
            lines.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn launch_serves_jupyter_mcp_server_to_a_real_mcp_client_and_leaves_nothing_running() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = relocate(&compose_ok(&dir.path().join("b"), &[]), dir.path());
    let token_file = dir.path().join("token");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/driver.py");
    let mut driver = Command::new(common::python())
        .arg(script)
        .arg("legacy")
        .arg(common::sandgate_bin())
        .args(["jupyter", "launch", "--bundle"])
        .arg(&bundle)
        .arg("--token-file")
        .arg(&token_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = collect(driver.stderr.take().unwrap());
    let mut stdin = driver.stdin.take().unwrap();
    let (tx, lines) = mpsc::channel();
    let stdout = driver.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = || -> Value {
        let line = lines
            .recv_timeout(Duration::from_secs(90))
            .unwrap_or_else(|_| panic!("the MCP client did not answer: {:?}", log.lock().unwrap()));
        serde_json::from_str(&line).unwrap()
    };
    let hello = next();
    assert!(hello["protocol_version"].is_string(), "{hello}");
    let port = ready_port(&log, Duration::from_secs(5));
    let token = std::fs::read_to_string(&token_file).unwrap();
    let mut call = |tool: &str, args: Value| -> Value {
        writeln!(stdin, "{}", json!({"call": tool, "args": args})).unwrap();
        let r = next();
        assert!(r["protocol_error"].is_null(), "{r}");
        r
    };
    let kernels = call("list_kernels", json!({}));
    let listing = kernels["text"].as_str().unwrap().to_owned();
    for want in ["python3-low", "python3-high", "Python 3 (sandgate: low)"] {
        assert!(listing.contains(want), "{listing}");
    }
    let r = call("execute_code", json!({"code": "print(6 * 7)"}));
    assert_eq!(r["text"].as_str().unwrap().trim(), "42", "{r}");
    // By default in the low kernel; the high one by its id from list_kernels.
    let home = "import os; print(os.environ['HOME'])";
    let r = call("execute_code", json!({"code": home}));
    assert!(
        r["text"].as_str().unwrap().trim().ends_with("/state/low/home"),
        "{r}"
    );
    let high = listing
        .lines()
        .find(|l| l.contains("\tpython3-high\t"))
        .and_then(|l| l.split('\t').next())
        .unwrap_or_else(|| panic!("{listing}"))
        .to_owned();
    let r = call("execute_code", json!({"code": home, "kernel_id": high}));
    assert!(
        r["text"].as_str().unwrap().trim().ends_with("/state/high/home"),
        "{r}"
    );
    let workspace = bundle.canonicalize().unwrap().join("workspace");
    let secret = dir.path().join("host-secret.txt");
    std::fs::write(&secret, "host-secret-3c1f").unwrap();
    let checkpoints = dir.path().join("checkpoints");
    std::fs::create_dir(&checkpoints).unwrap();
    // The agent's code runs in the low kernel: no network; and, turned attacker, it plants
    // symlinks for the server (outside every sandbox) to follow.
    let code = format!(
        "import os, socket\ntry:\n    socket.create_connection(('192.0.2.1', 80), timeout=2)\n    print('net ok')\nexcept OSError as e:\n    print('no network', type(e).__name__)\nos.symlink('{}', '{ws}/token-link')\nos.symlink('{}', '{ws}/secret-link')\nos.symlink('{}', '{ws}/dir-link')\nos.symlink('{}', '{ws}/.ipynb_checkpoints')\nprint(os.getcwd())",
        token_file.display(),
        secret.display(),
        dir.path().display(),
        checkpoints.display(),
        ws = workspace.display()
    );
    let r = call("execute_code", json!({"code": code}));
    let out = r["text"].as_str().unwrap();
    assert!(out.contains("no network"), "{r}");
    assert!(
        out.contains(workspace.to_str().unwrap()),
        "the kernel's cwd is the workspace: {r}"
    );
    // (A 404 page carries the token itself, for the client that sent it: the content of
    // the files is what must not come back.)
    for path in [
        "/api/contents/token-link",
        "/api/contents/secret-link",
        "/api/contents/dir-link/host-secret.txt",
        "/files/token-link",
        "/files/secret-link",
        "/files/dir-link/host-secret.txt",
    ] {
        let (status, body) = http(port, &token, "GET", path, "");
        assert_eq!(status, 404, "{path}: {body}");
        assert!(!body.contains("host-secret-3c1f"), "{path}: {body}");
    }
    let (status, body) = http(
        port,
        &token,
        "PUT",
        "/api/contents/dir-link/planted.txt",
        r#"{"type":"file","format":"text","content":"x"}"#,
    );
    assert_eq!(status, 404, "{body}");
    assert!(!dir.path().join("planted.txt").exists());
    // A notebook's checkpoints would land in the planted .ipynb_checkpoints link: saving
    // (which makes one) and making one are refused, and nothing lands there.
    let (status, body) = http(
        port,
        &token,
        "PUT",
        "/api/contents/n.ipynb",
        r#"{"type":"notebook","format":"json","content":{"cells":[],"metadata":{},"nbformat":4,"nbformat_minor":5}}"#,
    );
    assert_eq!(status, 404, "{body}");
    let (status, body) = http(port, &token, "POST", "/api/contents/n.ipynb/checkpoints", "");
    assert_eq!(status, 404, "{body}");
    assert_eq!(std::fs::read_dir(&checkpoints).unwrap().count(), 0);
    // Only the bundle's kernelspecs exist and can start; no terminals.
    let (status, body) = http(port, &token, "GET", "/api/kernelspecs", "");
    assert_eq!(status, 200);
    let specs: Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&String> = specs["kernelspecs"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["python3-high", "python3-low"], "{body}");
    assert_eq!(specs["default"], "python3-low");
    for name in ["python3", "python3-nope"] {
        let (status, body) = http(
            port,
            &token,
            "POST",
            "/api/kernels",
            &json!({"name": name}).to_string(),
        );
        assert_eq!(status, 404, "{name}: {body}");
    }
    let (status, _) = http(port, &token, "GET", "/api/terminals", "");
    assert_eq!(status, 404);
    let (status, _) = http(port, "wrong", "GET", "/api/kernels", "");
    assert_eq!(status, 403);

    // The client goes away: jupyter-mcp-server ends, then everything else.
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(30);
    while driver.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the client did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = none_left(bundle.to_str().unwrap(), Duration::from_secs(30));
    assert!(left.is_empty(), "{left:?}");
    assert!(!token_file.exists(), "the dead token is removed");
    let log = log.lock().unwrap().join("\n");
    assert!(!log.contains(&token), "the token was printed");
    assert!(log.contains("kernel python3-high started"), "{log}");
}

/// `jupyter launch --no-mcp` in the background; its stderr lines.
fn launch_no_mcp(bundle: &Path, token_file: &Path) -> (Child, Arc<Mutex<Vec<String>>>) {
    let mut child = Command::new(common::sandgate_bin())
        .args(["jupyter", "launch", "--no-mcp", "--bundle"])
        .arg(bundle)
        .arg("--token-file")
        .arg(token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = collect(child.stderr.take().unwrap());
    (child, log)
}

/// The runtime directory of the Jupyter Server serving `bundle` (from its environment).
fn runtime_of_server(bundle: &str) -> PathBuf {
    let config = format!("--config={bundle}/jupyter/config/jupyter_server_config.py");
    let line = processes_with(&config)
        .into_iter()
        .find(|p| p.contains("-m jupyter_server"))
        .expect("the server runs");
    let pid = line.split(':').next().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let var = environ
        .split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(b"JUPYTER_RUNTIME_DIR="))
        .expect("JUPYTER_RUNTIME_DIR");
    PathBuf::from(String::from_utf8(var.to_vec()).unwrap())
}

#[test]
fn launch_stops_everything_on_sigterm_and_when_the_launcher_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = compose_ok(&dir.path().join("b"), &[]);
    let needle = bundle.to_str().unwrap().to_owned();
    let mut killed_runtime: Option<PathBuf> = None;
    // kill -9 first: the next launch removes the runtime directory it left.
    for signal in ["-KILL", "-TERM"] {
        let token_file = dir.path().join("token");
        let (mut launcher, log) = launch_no_mcp(&bundle, &token_file);
        let port = ready_port(&log, Duration::from_secs(60));
        let token = std::fs::read_to_string(&token_file).unwrap();
        let (status, body) = http(port, &token, "POST", "/api/kernels", r#"{"name": "python3-low"}"#);
        assert_eq!(status, 201, "{body}");
        let (status, body) = http(port, &token, "GET", "/api/kernels", "");
        assert_eq!(status, 200, "{body}");
        assert!(
            !processes_with(&format!("{needle}/kernels/python3-low/../../bin/sandgate run")).is_empty(),
            "the kernel runs through sandgate run: {:?}",
            processes_with(&needle)
        );
        if let Some(dir) = killed_runtime.take() {
            assert!(!dir.exists(), "{} was not swept", dir.display());
        }
        let runtime = runtime_of_server(&needle);
        assert!(runtime.is_dir(), "{}", runtime.display());
        Command::new("kill")
            .args([signal, &launcher.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = launcher.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "{signal}: the launcher did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        if signal == "-TERM" {
            assert!(status.success(), "{status}: {:?}", log.lock().unwrap());
            assert!(!runtime.exists(), "the runtime directory is removed");
        } else {
            killed_runtime = Some(runtime);
        }
        // After kill -9 the server gets SIGTERM from the guard (parent-death signal) and
        // shuts its kernels down itself.
        let left = none_left(&needle, Duration::from_secs(30));
        assert!(left.is_empty(), "{signal}: {left:?}");
        let _ = std::fs::remove_file(&token_file);
    }
}

#[test]
fn kernels_run_as_an_ordinary_user() {
    use std::os::unix::fs::PermissionsExt;
    if !common::is_root() {
        // The other tests already ran as an ordinary user.
        return;
    }
    // nobody cannot run the venv's interpreter (it lives under /root); a venv of Debian's
    // python3 reads the same site-packages through a .pth file, as nobody.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let as_nobody = |program: &Path| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(program)
            .env("HOME", "/tmp")
            .env("TMPDIR", "/tmp")
            .current_dir(dir.path());
        c
    };
    let venv = dir.path().join("venv");
    let o = as_nobody(Path::new("/usr/bin/python3"))
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let site = String::from_utf8(
        Command::new(common::python())
            .args([
                "-c",
                "import ipykernel, os; print(os.path.dirname(os.path.dirname(ipykernel.__file__)))",
            ])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    std::fs::write(
        venv.join("lib/python3.11/site-packages/test-venv.pth"),
        site.trim(),
    )
    .unwrap();
    let bin = dir.path().join("sandgate");
    common::place_binary(common::sandgate_bin(), &bin);
    let bundle = dir.path().join("bundle");
    let python = venv.join("bin/python");
    let o = as_nobody(&bin)
        .args(["jupyter", "compose", "--out"])
        .arg(&bundle)
        .arg("--python")
        .arg(&python)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let runtime = tempfile::tempdir().unwrap();
    std::fs::set_permissions(runtime.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut k = Kernels::start_with(as_nobody(&python), &bundle, runtime);
    k.start_kernel("python3-low", "a");
    let r = k.probe(
        "a",
        "import json, os, socket\ntry:\n    socket.create_connection(('192.0.2.1', 80), timeout=2)\n    n = 'ok'\nexcept OSError as e:\n    n = type(e).__name__\nprint(json.dumps({'uid': os.getuid(), 'net': n, 'sum': 6 * 7}))",
    );
    assert_eq!(r["sum"], 42, "{r}");
    assert_ne!(r["net"], "ok", "{r}");
    assert_eq!(r["uid"], 65534, "{r}");
}

/// Issue 28, item 1: the launcher run by a client in a person's terminal, its stderr that
/// terminal (the Python MCP SDK's default) and the terminal its session's. A kernel holds
/// none of it: no descriptor on the terminal (Jupyter Server's output, which kernels
/// inherit, is a pipe the launcher copies), no controlling terminal, no `/dev/tty`; and the
/// profile's limits hold, with no CPU-time limit.
#[test]
fn a_kernel_cannot_reach_the_terminal_the_launcher_runs_in() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = relocate(&compose_ok(&dir.path().join("b"), &[]), dir.path());
    let driver_py = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/driver.py");
    let with_terminal = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/with_terminal.py");
    let python = common::python();
    let mut driver = Command::new(&python)
        .arg(driver_py)
        .arg("legacy")
        .args([&python, with_terminal, "--stderr"])
        .arg(common::sandgate_bin())
        .args(["jupyter", "launch", "--bundle"])
        .arg(&bundle)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = driver.stdin.take().unwrap();
    let mut stdout = BufReader::new(driver.stdout.take().unwrap());
    let mut next = || -> Value {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    let hello = next();
    assert!(hello["protocol_version"].is_string(), "{hello}");
    let probe = r#"
import errno, json, os, resource
stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
# Every descriptor: ipykernel moves fds 1 and 2 aside to capture output, keeping copies.
fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
r = {"ttys": [fd for fd in fds if os.isatty(fd)], "tty_nr": int(stat[4])}
try:
    os.open("/dev/tty", os.O_RDWR)
    r["dev_tty"] = "opened"
except OSError as e:
    r["dev_tty"] = errno.errorcode[e.errno]
r["cpu"] = resource.getrlimit(resource.RLIMIT_CPU)[0]
s = os.statvfs("/tmp")
r["tmp_bytes"] = s.f_blocks * s.f_frsize
print(json.dumps(r))
"#;
    writeln!(
        stdin,
        "{}",
        json!({"call": "execute_code", "args": {"code": probe}})
    )
    .unwrap();
    let r = next();
    let text = r["text"].as_str().unwrap_or_default();
    let seen: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {r}"));
    assert_eq!(seen["ttys"], json!([]), "a kernel holds the terminal: {r}");
    assert_eq!(seen["tty_nr"], 0, "{r}");
    assert_eq!(seen["dev_tty"], "ENXIO", "{r}");
    assert_eq!(seen["cpu"], -1, "no CPU-time limit for a kernel: {r}");
    assert_eq!(seen["tmp_bytes"], 1u64 << 30, "{r}");
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(30);
    while driver.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the client did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = none_left(bundle.to_str().unwrap(), Duration::from_secs(30));
    assert!(left.is_empty(), "{left:?}");
}

/// The kernel turned attacker, through the workspace it writes: a module it plants there
/// must never run outside its sandbox. `python -m jupyter_server` puts its working directory
/// (the workspace) first on `sys.path`, and `python -c` (the launcher's probe of its Python)
/// the launcher's own; so the launcher runs both isolated (`-I`), else the next launch would
/// import the kernel's `jupyter_server.py` or `json.py` as the user, unsandboxed.
#[test]
fn modules_a_kernel_plants_in_the_workspace_never_run_outside_a_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = compose_ok(&dir.path().join("b"), &[]);
    let ws = bundle.join("workspace");
    let marker = dir.path().join("escaped");
    for module in ["jupyter_server", "json", "traitlets"] {
        std::fs::write(
            ws.join(format!("{module}.py")),
            format!(
                "open({:?}, 'a').write('{module}\\n')\nraise SystemExit('planted {module} ran')\n",
                marker.display().to_string()
            ),
        )
        .unwrap();
    }
    let token_file = dir.path().join("token");
    let mut child = Command::new(common::sandgate_bin())
        .args(["jupyter", "launch", "--no-mcp", "--bundle"])
        .arg(&bundle)
        .arg("--token-file")
        .arg(&token_file)
        // The launcher run from the workspace, as a person may.
        .current_dir(&ws)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = collect(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let ready = loop {
        if log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("ready at http://127.0.0.1:"))
        {
            break true;
        }
        if child.try_wait().unwrap().is_some() || Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(ran.is_empty(), "planted modules ran outside any sandbox: {ran}");
    assert!(ready, "{status}: {:?}", log.lock().unwrap());
    assert!(status.success(), "{status}: {:?}", log.lock().unwrap());
}

/// The venv of the tests' Python (`sys.prefix`).
fn venv_of(python: &str) -> PathBuf {
    let o = Command::new(python)
        .args(["-I", "-c", "import sys; print(sys.prefix)"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    PathBuf::from(String::from_utf8(o.stdout).unwrap().trim())
}

/// Packages of the tests' venv that other tests use and no kernel here imports: 400 of its
/// 655 MB (pyarrow 170, kubernetes_validate 108).
const NOT_CARRIED: [&str; 6] = [
    "pyarrow",
    "kubernetes_validate",
    "selenium",
    "faker",
    "babel",
    "jupyterlab",
];

/// A venv to carry (`--python-env copy`): the tests' own, hard-linked into `dir` (quick,
/// and target/venv is untouched when it goes), without [`NOT_CARRIED`]. Two tests copying
/// all of it at once took more than the two minutes a test may take on the loaded CI
/// machine (the clean-clone CI of 33c6ad8; 37-77 s in the runs before it).
fn slim_venv(dir: &Path) -> PathBuf {
    let source = dir.join("source-venv");
    let o = Command::new("cp")
        .arg("-al")
        .arg(venv_of(&common::python()))
        .arg(&source)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    for lib in std::fs::read_dir(source.join("lib")).unwrap().flatten() {
        let site = lib.path().join("site-packages");
        for entry in std::fs::read_dir(&site).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().to_lowercase();
            let heavy = NOT_CARRIED.iter().any(|h| {
                name == *h
                    || name
                        .strip_prefix(&format!("{h}-"))
                        .is_some_and(|v| v.ends_with(".dist-info"))
            });
            if heavy {
                std::fs::remove_dir_all(entry.path()).unwrap();
            }
        }
    }
    source
}

/// `--python-env copy`: the bundle carries a copy of the venv in `env/`. Composed from a
/// venv that is then deleted, and moved, it still starts kernels (through jupyter_client
/// and under `jupyter launch`) whose interpreter, packages and scripts are the bundle's
/// own, at its new path.
#[test]
fn a_carried_environment_moves_with_its_bundle_and_outlives_its_source_venv() {
    let dir = tempfile::tempdir().unwrap();
    // A venv of its own to compose from, deleted once composed.
    let source = slim_venv(dir.path());
    let out = dir.path().join("b");
    let python = source.join("bin/python");
    let o = compose_with(&out, python.to_str().unwrap(), &["--python-env", "copy"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("kernels run {}/env/bin/python", out.display())),
        "{}",
        text(&o)
    );
    // Nothing names the source venv or where the bundle was composed.
    for f in [
        "kernels/python3-low/kernel.json",
        "kernels/python3-high/kernel.json",
        "policies/low/policy.yaml",
        "policies/high/policy.yaml",
        "mcp/jupyter_mcp_launcher.yaml",
        "env/pyvenv.cfg",
        "env/bin/pip",
        "env/bin/jupyter",
    ] {
        let t = std::fs::read_to_string(out.join(f)).unwrap();
        for path in [&source, &out, &venv_of(&common::python())] {
            assert!(
                !t.contains(path.to_str().unwrap()),
                "{f} names {}:\n{t}",
                path.display()
            );
        }
    }
    assert!(!out.join("env/bin/activate").exists());
    std::fs::remove_dir_all(&source).unwrap();
    let bundle = relocate(&out, dir.path());
    let real = bundle.canonicalize().unwrap();

    let mut k = Kernels::start(&bundle);
    k.start_kernel("python3-low", "a");
    let code = format!(
        r#"{WRITE_FN}
import ipykernel, json, os, subprocess, sys
pip = subprocess.run([os.path.join(sys.prefix, "bin", "pip"), "--version"], capture_output=True, text=True)
print(json.dumps({{"sum": 6 * 7, "executable": sys.executable, "prefix": sys.prefix,
                  "ipykernel": ipykernel.__file__, "env": write("{env}/pwned"),
                  "pip": pip.stdout + pip.stderr}}))
"#,
        env = real.join("env").display()
    );
    let r = k.probe("a", &code);
    assert_eq!(r["sum"], 42, "{r}");
    let env = real.join("env");
    assert_eq!(r["prefix"], env.to_str().unwrap(), "{r}");
    assert_eq!(r["executable"], env.join("bin/python").to_str().unwrap(), "{r}");
    assert!(
        r["ipykernel"]
            .as_str()
            .unwrap()
            .starts_with(env.to_str().unwrap()),
        "{r}"
    );
    assert_ne!(
        r["env"], "ok",
        "the carried environment is read-only to kernels: {r}"
    );
    // A script of the venv (its shebang rewritten) runs the bundle's interpreter, in the
    // sandbox too.
    assert!(
        r["pip"]
            .as_str()
            .unwrap()
            .contains(&format!("from {}", env.display())),
        "{r}"
    );
    drop(k);

    // The launcher from the new path, under a real MCP client: Jupyter Server from the
    // carried interpreter, and code run in its kernels.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/driver.py");
    let mut driver = Command::new(common::python())
        .arg(script)
        .arg("legacy")
        .arg(bundle.join("bin/sandgate"))
        .args(["jupyter", "launch", "--bundle"])
        .arg(&bundle)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = collect(driver.stderr.take().unwrap());
    let mut stdin = driver.stdin.take().unwrap();
    let mut stdout = BufReader::new(driver.stdout.take().unwrap()).lines();
    let mut next = || -> Value {
        let line = stdout.next().and_then(Result::ok);
        let line = line.unwrap_or_else(|| panic!("the MCP client ended: {:?}", log.lock().unwrap()));
        serde_json::from_str(&line).unwrap()
    };
    assert!(next()["protocol_version"].is_string());
    let server = format!("{}/bin/python -I -m jupyter_server", env.display());
    assert!(
        !processes_with(&server).is_empty(),
        "{:?}",
        processes_with(real.to_str().unwrap())
    );
    let code = "import sys; print(6 * 7, sys.prefix)";
    writeln!(
        stdin,
        "{}",
        json!({"call": "execute_code", "args": {"code": code}})
    )
    .unwrap();
    let r = next();
    assert_eq!(
        r["text"].as_str().unwrap_or_default().trim(),
        format!("42 {}", env.display()),
        "{r}"
    );
    drop(stdin);
    let (status, _) = common::exit_of(driver, Duration::from_secs(30), "the MCP client");
    assert!(status.success(), "{status}: {:?}", log.lock().unwrap());
    let left = none_left(real.to_str().unwrap(), Duration::from_secs(30));
    assert!(left.is_empty(), "{left:?}");
}

/// The kernel's own start (what a carried-environment kernelspec runs): its exit status
/// and output, given a connection file that exists.
fn kernel_start(bundle: &Path, dir: &Path) -> Output {
    let connection = dir.join("kernel-1.json");
    std::fs::write(&connection, "{}").unwrap();
    let _ = std::fs::create_dir(dir.join("kernel-1.json.d"));
    Command::new(bundle.join("bin/sandgate"))
        .args(["jupyter", "kernel", "--bundle"])
        .arg(bundle)
        .args(["--profile", "low", "--connection-file"])
        .arg(&connection)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The carried environment tampered with to reach out of the bundle: refused at launch and
/// at each kernel's start, before any of it runs (a planted `sitecustomize.py` or stdlib
/// would otherwise run outside any sandbox, in the launcher's probe); and a policy that
/// lets kernels write the Python that Jupyter Server runs is refused, carried or not.
#[test]
fn a_carried_environment_tampered_to_reach_out_of_the_bundle_is_refused_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let python = slim_venv(dir.path()).join("bin/python");
    let bundle = dir.path().join("b");
    let o = compose_with(&bundle, python.to_str().unwrap(), &["--python-env", "copy"]);
    assert!(o.status.success(), "{}", text(&o));
    let env = bundle.join("env");
    let ws = bundle.join("workspace");
    let marker = dir.path().join("ran");
    let plant = |path: &Path| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            path,
            format!(
                "open({:?}, 'a').write('{}\\n')\n",
                marker.display().to_string(),
                path.display()
            ),
        )
        .unwrap();
    };
    let b = bundle.to_str().unwrap();
    let refused = |want: &str, code: i32| {
        let o = sandgate(&["jupyter", "launch", "--bundle", b]);
        assert_eq!(o.status.code(), Some(code), "{want}: {}", text(&o));
        assert!(text(&o).contains(want), "want {want:?}: {}", text(&o));
        let o = kernel_start(&bundle, dir.path());
        assert_eq!(o.status.code(), Some(code), "{want}: {}", text(&o));
        assert!(text(&o).contains(want), "want {want:?}: {}", text(&o));
        let ran = std::fs::read_to_string(&marker).unwrap_or_default();
        assert!(ran.is_empty(), "{want}: ran outside any sandbox: {ran}");
    };
    let site = std::fs::read_dir(env.join("lib"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .unwrap()
        .path()
        .join("site-packages");

    // env a link to a directory outside: every kernel's policy would bind that directory.
    let outside = dir.path().join("outside-env");
    std::fs::rename(&env, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &env).unwrap();
    refused("env is a symbolic link", 64);
    std::fs::remove_file(&env).unwrap();
    std::fs::rename(&outside, &env).unwrap();

    // A link in it to a file in the workspace (kernels write there): site imports
    // sitecustomize at every start, the unsandboxed ones included.
    plant(&ws.join("sitecustomize.py"));
    std::os::unix::fs::symlink(ws.join("sitecustomize.py"), site.join("sitecustomize.py")).unwrap();
    refused("is a symbolic link out of the carried environment", 64);
    std::fs::remove_file(site.join("sitecustomize.py")).unwrap();

    // Its base Python moved into the workspace, a stdlib planted there.
    let cfg = std::fs::read_to_string(env.join("pyvenv.cfg")).unwrap();
    let home = cfg
        .lines()
        .find_map(|l| l.strip_prefix("home = "))
        .unwrap()
        .to_owned();
    plant(&ws.join("py/lib/python3.11/os.py"));
    let moved_home = ws.join("py/bin");
    std::fs::write(
        env.join("pyvenv.cfg"),
        cfg.replace(&home, moved_home.to_str().unwrap()),
    )
    .unwrap();
    std::fs::create_dir_all(&moved_home).unwrap();
    refused("is inside the bundle", 64);

    // Another machine without the base Python: unavailable, naming it.
    std::fs::write(env.join("pyvenv.cfg"), cfg.replace(&home, "/nonexistent/py/bin")).unwrap();
    refused("/nonexistent/py/bin (version 3.11", 69);
    std::fs::write(env.join("pyvenv.cfg"), &cfg).unwrap();

    // A policy that makes the Python writable to kernels: refused at compose and launch,
    // for a carried environment and an external venv alike.
    let policy = bundle.join("policies/low/policy.yaml");
    let low = std::fs::read_to_string(&policy).unwrap();
    let venv = venv_of(&common::python());
    // The external venv's policy: the same, without the carried environment.
    let external = low.replace("    - \"${BUNDLE}/env\"\n", "");
    for (base, writable, extra, want) in [
        (
            &low,
            "\"${BUNDLE}/env\"",
            vec!["--python-env", "copy"],
            "env is writable and overlaps",
        ),
        (
            &external,
            venv.to_str().unwrap(),
            vec![],
            "is writable and overlaps the kernel's Python",
        ),
    ] {
        let text_of = base.replace("  write_paths:\n", &format!("  write_paths:\n    - {writable}\n"));
        let file = dir.path().join("writable.yaml");
        std::fs::write(&file, &text_of).unwrap();
        let flag = format!("low={}", file.display());
        let mut args = vec!["--profile", &flag];
        args.extend(extra);
        let o = compose(&dir.path().join("never"), &args);
        assert_eq!(o.status.code(), Some(64), "{}", text(&o));
        assert!(text(&o).contains(want), "want {want:?}: {}", text(&o));
    }
    std::fs::write(
        &policy,
        low.replace("  write_paths:\n", "  write_paths:\n    - \"${BUNDLE}/env\"\n"),
    )
    .unwrap();
    let o = sandgate(&["jupyter", "launch", "--bundle", b]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    assert!(text(&o).contains("env is writable and overlaps"), "{}", text(&o));
    assert!(!dir.path().join("never").exists());
}
