//! Shared harness for the end-to-end tests: runs the real `sandgate` binary on 127.0.0.1:0,
//! learns its port from the start-up log, and reads its audit log.

#![allow(dead_code, reason = "each test file uses a different part of the harness")]

pub mod control;
pub mod world;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running `sandgate proxy`; killed when dropped.
pub struct ProxyProcess {
    pub child: Child,
    pub addr: SocketAddr,
    pub audit_path: PathBuf,
    /// Every stderr line so far (the start-up log names each listener).
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl ProxyProcess {
    /// Starts the proxy with `args` (plus a listen address and an audit file).
    pub fn start(args: &[&str]) -> ProxyProcess {
        ProxyProcess::start_with(Command::new(sandgate_bin()), args)
    }

    /// Starts the proxy as user `nobody` (tests run as root), from a copy of the binary in a
    /// directory that user can read, so the unprivileged path is exercised. When the tests
    /// already run unprivileged, this is the same as [`ProxyProcess::start`].
    pub fn start_unprivileged(args: &[&str]) -> (ProxyProcess, tempfile::TempDir) {
        let (cmd, bin_dir) = unprivileged_sandgate();
        (ProxyProcess::start_with(cmd, args), bin_dir)
    }

    /// Starts `command` (which must end by running sandgate) with `proxy`, a listen address,
    /// an audit file and `args` appended.
    pub fn start_with(command: Command, args: &[&str]) -> ProxyProcess {
        ProxyProcess::start_with_audit(command, None, args)
    }

    /// As [`ProxyProcess::start_with`], writing the audit log at `audit_path` when given.
    pub fn start_with_audit(command: Command, audit_path: Option<PathBuf>, args: &[&str]) -> ProxyProcess {
        ProxyProcess::spawn(command, audit_path, &["--listen", "127.0.0.1:0"], args)
    }

    /// Starts `command` with `proxy`, an audit file and `args` only: its listeners are
    /// what `args`, its environment and its policy say (`addr` is the first one logged).
    pub fn start_as_configured(command: Command, args: &[&str]) -> ProxyProcess {
        ProxyProcess::spawn(command, None, &[], args)
    }

    fn spawn(
        mut command: Command,
        audit_path: Option<PathBuf>,
        listen: &[&str],
        args: &[&str],
    ) -> ProxyProcess {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        // World-writable so an unprivileged proxy can write its audit log here.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let audit_path = audit_path.unwrap_or_else(|| dir.path().join("audit.jsonl"));
        // A directory of its own unless the caller chose one: without --policy the proxy
        // reads ./sandgate.yaml, and a stray one in a shared directory must not change a test.
        if command.get_current_dir().is_none() {
            command.current_dir(dir.path());
        }
        let mut child = command
            .arg("proxy")
            .args(listen)
            .arg("--audit-log")
            .arg(&audit_path)
            .args(args)
            .env("SANDGATE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sandgate");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let addr = loop {
            let line = match lines.next() {
                Some(Ok(line)) => line,
                _ => panic!(
                    "sandgate exited before listening: {:?}\n{}",
                    child.wait(),
                    log.lock().unwrap().join("\n")
                ),
            };
            log.lock().unwrap().push(line.clone());
            if let Some(rest) = line.split("addr=").nth(1) {
                break rest.split_whitespace().next().unwrap().parse().unwrap();
            }
        };
        // Keep draining stderr so the proxy never blocks on a full pipe.
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in lines.by_ref().map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        ProxyProcess {
            child,
            addr,
            audit_path,
            log,
            _dir: dir,
        }
    }

    /// Waits (up to 5 s) for a stderr line containing `needle` and returns it.
    pub fn log_line(&self, needle: &str) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(l) = self.log.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return Some(l.clone());
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every address the start-up log says the proxy listens on, the metrics listener's
    /// included (waits up to 5 s for `n` of them).
    pub fn listening(&self, n: usize) -> Vec<SocketAddr> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let found: Vec<SocketAddr> = self
                .log
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains("listening"))
                .filter_map(|l| l.split("addr=").nth(1)?.split_whitespace().next()?.parse().ok())
                .collect();
            if found.len() >= n || Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The address of the first listener whose `listening` line (one per listener, in the
    /// order --listen, spec.listeners, --socks-listen) carries every `key=value` of `fields`,
    /// e.g. `role=socks5`, `task=t-1`, `auth=basic`; waits up to 5 s for it. This is how a
    /// test learns a port the proxy was given as 0.
    pub fn listener(&self, fields: &[&str]) -> SocketAddr {
        let wanted = |l: &String| {
            let tokens: Vec<&str> = l.split_whitespace().collect();
            // Not the admin listener's line (`admin listening`): that is [`Self::admin`].
            tokens.contains(&"listening")
                && !tokens.contains(&"admin")
                && fields.iter().all(|f| tokens.contains(f))
        };
        self.logged_addr(wanted)
            .unwrap_or_else(|| panic!("no listener with {fields:?} in the log:\n{}", self.log_text()))
    }

    /// The admin listener's address, from its `admin listening` line (waits up to 5 s).
    pub fn admin(&self) -> SocketAddr {
        self.logged_addr(|l| l.contains("admin listening"))
            .unwrap_or_else(|| panic!("no admin listener in the log:\n{}", self.log_text()))
    }

    /// The `addr=` of the first log line `wanted` picks (waits up to 5 s for one).
    fn logged_addr(&self, wanted: impl Fn(&String) -> bool) -> Option<SocketAddr> {
        let line = {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                if let Some(l) = self.log.lock().unwrap().iter().find(|l| wanted(l)) {
                    break l.clone();
                }
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        line.split("addr=")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// Every stderr line so far, one string.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "proxy did not stop after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the proxy dead (SIGSTOP) and returns once the kernel says it is stopped: it
    /// answers nothing more, yet keeps its ports, which a killed proxy would give up to
    /// whatever another test binds next (a client still dialling the old address would then
    /// be answered by that). The drop kills it.
    pub fn freeze(&mut self) {
        let pid = self.child.id();
        Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .expect("kill");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
            // The state follows the command's closing parenthesis.
            let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
            if state == Some(Some('T')) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "proxy not stopped after SIGSTOP: {stat}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every audit event written so far (the writer flushes when its queue is empty, so
    /// poll briefly until `want` events are there).
    pub fn audit_events(&self, want: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let events = read_audit(&self.audit_path);
            if events.len() >= want || Instant::now() > deadline {
                return events;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (at most `limit`) for `child` to exit on its own, as a process refused at start
/// should; returns its status and stderr (piped). Kills it and fails when it runs on.
pub fn exit_of(mut child: Child, limit: Duration, what: &str) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    (status, stderr)
}

/// A runtime for the fixtures (DNS server, origins), on threads of its own so the test
/// thread can drive blocking clients.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The sandgate binary under test. `SANDGATE_TEST_BIN` overrides it, for runs of a test
/// binary copied where an unprivileged user can execute it.
pub fn sandgate_bin() -> String {
    std::env::var("SANDGATE_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_sandgate").to_owned())
}

/// Puts the binary `from` at `to`: a hard link where both are on one file system, else a
/// copy. The debug binaries are hundreds of megabytes, and a dozen tests place one at a
/// time; links keep the run's disk use to the build's own.
pub fn place_binary(from: impl AsRef<std::path::Path>, to: &std::path::Path) {
    let from = from.as_ref();
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    }
}

/// A command that runs sandgate as user `nobody` when the tests run as root (else as the
/// tests' user), from a copy of the binary (and `sandgate-init` beside it, as installed) in
/// a directory that user can read (kept while
/// the directory lives), and in that directory.
pub fn unprivileged_sandgate() -> (Command, tempfile::TempDir) {
    use std::os::unix::fs::PermissionsExt;
    let bin_dir = tempfile::tempdir().expect("tempdir");
    let bin = bin_dir.path().join("sandgate");
    place_binary(env!("CARGO_BIN_EXE_sandgate"), &bin);
    place_binary(
        env!("CARGO_BIN_EXE_sandgate-init"),
        &bin_dir.path().join("sandgate-init"),
    );
    std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut cmd = if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    cmd.current_dir(bin_dir.path());
    (cmd, bin_dir)
}

/// True when the tests run as root.
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// The audit log's lines so far. A line the writer is still appending (no newline yet) is
/// not one yet: read while the proxy runs, the file may end in the middle of one.
pub fn read_audit(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    whole
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
        .collect()
}

/// Runs curl through `proxy` and returns (exit code, stdout, stderr).
pub fn curl(proxy: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--noproxy", "", "-x", proxy])
        .args(args)
        .output()
        .expect("run curl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Sends raw bytes to the proxy and reads until it closes (bounded by a timeout).
pub fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect proxy");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The status code of the first response in `text`.
pub fn status_of(text: &str) -> u16 {
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Runs the calling test again inside a fresh network namespace (`unshare -rn`, loopback
/// up), so that no bug can send a packet off this machine. Returns true in the outer process
/// (which has then already checked the inner run passed) and false inside, where the test
/// body should run.
pub fn rerun_in_private_netns(test_name: &str) -> bool {
    rerun_in_private_netns_with(test_name, "")
}

/// As [`rerun_in_private_netns`], running the shell commands `setup` inside the namespace
/// first (for example a dummy interface that swallows packets).
pub fn rerun_in_private_netns_with(test_name: &str, setup: &str) -> bool {
    if std::env::var_os("SANDGATE_IN_PRIVATE_NETNS").is_some() {
        return false;
    }
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--", "sh", "-c"])
        .arg(format!("set -e; ip link set lo up; {setup}\nexec \"$0\" \"$@\""))
        .arg(exe)
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env("SANDGATE_IN_PRIVATE_NETNS", "1")
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "inner run failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "inner run did not run the test:\n{stdout}\n{stderr}"
    );
    true
}

/// Runs the calling test binary again as `nobody` (tests run as root in CI), skipping
/// `skip` (the caller), and checks at least `min_passed` tests passed. A no-op when the tests
/// already run unprivileged, or inside that run.
pub fn rerun_as_nobody(binary: &str, skip: &str, min_passed: usize) {
    as_nobody(binary, &["--skip", skip], min_passed);
}

fn as_nobody(binary: &str, args: &[&str], min_passed: usize) {
    use std::os::unix::fs::PermissionsExt;
    if std::env::var_os("SANDGATE_AS_NOBODY").is_some() || !is_root() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let tests = dir.path().join(binary);
    let bin = dir.path().join("sandgate");
    place_binary(std::env::current_exe().expect("test binary"), &tests);
    place_binary(sandgate_bin(), &bin);
    // Installed as built: the sandbox's small init beside the binary.
    place_binary(
        env!("CARGO_BIN_EXE_sandgate-init"),
        &dir.path().join("sandgate-init"),
    );
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&tests)
        .arg("--test-threads=2")
        .args(args)
        .env("SANDGATE_TEST_BIN", &bin)
        .env("SANDGATE_AS_NOBODY", "1")
        .env("HOME", "/tmp")
        .env("TMPDIR", "/tmp")
        .current_dir(dir.path())
        .output()
        .expect("run as nobody");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "as nobody:\n{stdout}\n{stderr}");
    let passed = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("test result: ok. ")
                .and_then(|r| r.split(' ').next()?.parse::<usize>().ok())
        })
        .unwrap_or(0);
    assert!(
        passed >= min_passed,
        "as nobody, only {passed} tests ran:\n{stdout}"
    );
}

/// The Python the tests use as a real client: `SANDGATE_TEST_PYTHON`, else the venv that
/// `scripts/test` makes under target/ (with prometheus_client, selenium, PySocks, mcp).
pub fn python() -> String {
    if let Ok(p) = std::env::var("SANDGATE_TEST_PYTHON") {
        return p;
    }
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/venv/bin/python");
    assert!(
        std::path::Path::new(venv).exists(),
        "run ./scripts/test once: it installs the Python clients into target/venv"
    );
    venv.to_owned()
}

/// Runs `cmd` (a sandgate command line) with no input: (exit code, stdout, stderr).
pub fn outcome(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.stdin(Stdio::null()).output().expect("run sandgate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Checks that a learned policy's run saw no deny and nothing let through by learning;
/// returns how many requests its entries allowed.
pub fn allowlisted_without_deny(events: &[Value]) -> usize {
    assert!(
        events
            .iter()
            .all(|e| e["decision"] != "deny" && e["reason_code"] != "report_only"),
        "{events:#?}"
    );
    events
        .iter()
        .filter(|e| e["reason_code"] == "allowlisted")
        .count()
}

/// The whole answer to `GET /metrics` on `admin`.
pub fn metrics_text(admin: SocketAddr) -> String {
    raw(
        admin,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
}

/// The value of one metric sample from `/metrics` on `admin` (plain text, no labels).
pub fn metric(admin: SocketAddr, name: &str) -> f64 {
    let text = metrics_text(admin);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}
