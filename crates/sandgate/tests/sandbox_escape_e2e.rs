//! The sandbox half of the second hostile review (issue 28), as the attacker would try it,
//! with the real bubblewrap: taking over PID 1 through /proc/1/mem, descriptors the caller
//! left open, VSOCK and the other socket families, nested user namespaces, a fork bomb, a
//! memory fill, a tmpfs fill and a CPU burner, the terminal of a `--no-terminal` run, and a
//! workspace whose parent became a symlink after it was checked. Each test also runs as
//! `nobody` (the last test reruns this binary so).

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

use std::process::{Command, Stdio};

use sandbox_support::{HOST_PYTHON, run, text, write_policy};

/// Every net mode, and one with a bridged loopback port (where the init holds a bridge) to
/// `host`, a listener the caller keeps open for as long as it uses them.
fn modes(host: &std::net::TcpListener) -> Vec<String> {
    let port = host.local_addr().unwrap().port();
    vec![
        "none".into(),
        "loopback".into(),
        format!("loopback\n  loopback_ports: [ {port} ]"),
        "all".into(),
        "allowlist\n  allow_domains: [ a.example ]".into(),
    ]
}

/// Runs `python3 -c script` in every mode; returns each mode with its policy and stdout.
fn in_every_mode(script: &str) -> Vec<(String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut shown = Vec::new();
    for net in modes(&host) {
        let policy = dir.path().join(format!("policy-{}.yaml", shown.len()));
        std::fs::write(
            &policy,
            format!("{}net:\n  mode: {net}\n", sandbox_support::base()),
        )
        .unwrap();
        let out = run(&policy, &[], &["python3", "-c", script]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{net}: {stdout}\n{stderr}");
        shown.push((net, stdout));
    }
    shown
}

/// Inside: PID 1's command line, whether /proc/1/mem opens for writing, and the Seccomp
/// mode of every process the sandbox can see.
const PID1: &str = r#"
import os
print("pid1", open("/proc/1/cmdline", "rb").read().replace(b"\0", b" ").decode())
try:
    fd = os.open("/proc/1/mem", os.O_RDWR)
    print("mem OPENED")
except OSError as e:
    print("mem refused", e.errno)
for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        continue
    mode = [l.split()[1] for l in status.splitlines() if l.startswith("Seccomp:")]
    print("seccomp", pid, mode[0] if mode else "?")
"#;

/// Finding 1: in `none`, `loopback` and `all` PID 1 was bubblewrap's reaper, unfiltered and
/// dumpable: the command wrote code into it through /proc/1/mem. Now PID 1 is sandgate's
/// init in every mode, not dumpable, and every process shows the filter.
#[test]
fn pid_1_is_sandgates_filtered_undumpable_init_in_every_mode() {
    for (net, stdout) in in_every_mode(PID1) {
        assert!(
            stdout.contains("pid1 /run/sandgate-init sandbox-init"),
            "{net}: PID 1 is not sandgate's init:\n{stdout}"
        );
        assert!(
            stdout.contains("mem refused 13"),
            "{net}: /proc/1/mem opened for writing:\n{stdout}"
        );
        let modes: Vec<&str> = stdout.lines().filter(|l| l.starts_with("seccomp ")).collect();
        assert!(modes.len() >= 2, "{net}: {stdout}");
        assert!(
            modes.iter().all(|l| l.ends_with(" 2")),
            "{net}: a process inside runs without the filter:\n{stdout}"
        );
    }
}

/// Finding 3: a directory descriptor the caller leaks (here the host's `/`, without
/// close-on-exec) reaches the command, which reads and writes the host through it (runc's
/// CVE-2024-21626 class). The command now starts with 0, 1 and 2 only.
#[test]
fn descriptors_the_caller_left_open_do_not_reach_the_command() {
    let dir = tempfile::tempdir().unwrap();
    for net in ["none", "allowlist\n  allow_domains: [ a.example ]"] {
        let policy = write_policy(dir.path(), &format!("net:\n  mode: {net}\n"));
        let inside = "import os\nfor fd in range(3, 256):\n    try:\n        os.fstat(fd)\n        print('open', fd, os.readlink(f'/proc/self/fd/{fd}'))\n    except OSError:\n        pass\nprint('done')\n";
        // The caller: opens the host's root and a socket, inheritable, then starts the run.
        let caller = r#"
import os, socket, subprocess, sys
root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
os.set_inheritable(root, True)
s = socket.socket(); os.set_inheritable(s.fileno(), True)
r = subprocess.run(sys.argv[1:], close_fds=False, capture_output=True, text=True, timeout=60)
print(r.stdout); print(r.stderr, file=sys.stderr); sys.exit(r.returncode)
"#;
        let out = Command::new(HOST_PYTHON)
            .args(["-c", caller])
            .arg(common::sandgate_bin())
            .args(["run", "--policy"])
            .arg(&policy)
            .args(["--", "python3", "-c", inside])
            .env("XDG_STATE_HOME", sandbox_support::state_home())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success() && stdout.contains("done"),
            "{net}: {stdout}\n{stderr}"
        );
        assert!(
            !stdout.contains("open "),
            "{net}: the command holds descriptors it was not given:\n{stdout}"
        );
    }
}

/// Sockets of each family, and a new user namespace, tried from inside.
const FAMILIES: &str = r#"
import errno, socket
def sock(name, family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
sock("vsock", 40, socket.SOCK_STREAM)
sock("packet", 17, socket.SOCK_RAW)
sock("bluetooth", 31, socket.SOCK_STREAM)
sock("alg", 38, socket.SOCK_SEQPACKET)
sock("tipc", 30, socket.SOCK_RDM)
sock("inet", socket.AF_INET, socket.SOCK_STREAM)
sock("inet6", socket.AF_INET6, socket.SOCK_STREAM)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER
    print("userns ok")
else:
    print("userns", errno.errorcode.get(ctypes.get_errno(), "?"))
import subprocess
r = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True)
print("unshare(1)", "made one" if r.returncode == 0 else "refused")
"#;

/// Finding 5 and the low item: AF_VSOCK (which no network namespace isolates) and every
/// family beyond IP, routing netlink and opted-in Unix are refused; so are nested user
/// namespaces, from Python and from unshare(1) (which uses clone3 or unshare).
#[test]
fn vsock_other_families_and_nested_user_namespaces_are_refused() {
    for (net, stdout) in in_every_mode(FAMILIES) {
        for want in [
            "vsock EAFNOSUPPORT",
            "packet EAFNOSUPPORT",
            "bluetooth EAFNOSUPPORT",
            "alg EAFNOSUPPORT",
            "tipc EAFNOSUPPORT",
            "inet ok",
            "inet6 ok",
        ] {
            assert!(stdout.contains(want), "{net}: missing {want}:\n{stdout}");
        }
        assert!(
            stdout.contains("userns EPERM") || stdout.contains("userns ENOSPC"),
            "{net}: a nested user namespace was made:\n{stdout}"
        );
        assert!(
            stdout.contains("unshare(1) refused"),
            "{net}: unshare(1) made a user namespace:\n{stdout}"
        );
    }
}

/// Forks until refused, up to 400, each child sleeping; prints how many it got.
const FORK_BOMB: &str = r#"
import os, signal, time
kids = []
for i in range(400):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    kids.append(pid)
print("forked", len(kids))
for k in kids:
    os.kill(k, signal.SIGKILL)
for k in kids:
    os.waitpid(k, 0)
"#;

/// Finding 7: no limit on processes, memory, /tmp or CPU. A bounded fork bomb gets no more
/// than its limit, a memory fill gets MemoryError, a /tmp fill gets ENOSPC, and a CPU burner
/// is ended at its CPU limit; the host (this test) stays responsive throughout.
#[test]
fn a_fork_bomb_a_memory_fill_a_tmp_fill_and_a_cpu_burner_meet_their_limits() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        "net:\n  mode: none\nlimits:\n  processes: 64\n  memory: 256MiB\n  tmpfs: 16MiB\n  cpu_seconds: 2\n",
    );

    let out = run(&policy, &[], &["python3", "-c", FORK_BOMB]);
    let (stdout, stderr) = text(&out);
    let forked: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("forked ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{stdout}\n{stderr}"));
    assert!(
        forked < 64,
        "the fork bomb made {forked} processes past a limit of 64:\n{stderr}"
    );

    let fill = "try:\n    b = b'x' * (1 << 30)\n    print('allocated')\nexcept MemoryError:\n    print('MemoryError')\n";
    let out = run(&policy, &[], &["python3", "-c", fill]);
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains("MemoryError") || out.status.code() == Some(137),
        "1 GiB allocated under a 256 MiB limit: {stdout}\n{stderr}"
    );

    let tmp = "import errno\ntry:\n    f = open('/tmp/fill', 'wb')\n    for i in range(64):\n        f.write(b'x' * (1 << 20)); f.flush()\n    print('filled')\nexcept OSError as e:\n    print('tmp', errno.errorcode.get(e.errno))\n";
    let out = run(&policy, &[], &["python3", "-c", tmp]);
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains("tmp ENOSPC"),
        "/tmp took 64 MiB under a 16 MiB limit: {stdout}\n{stderr}"
    );

    // The CPU burner: ends by SIGXCPU (or SIGKILL at the hard limit), well before its own
    // bound of 60 s of work.
    let burn = "import time\nend = time.time() + 60\nwhile time.time() < end:\n    pass\nprint('burned')\n";
    let started = std::time::Instant::now();
    let out = run(&policy, &[], &["python3", "-c", burn]);
    let (stdout, stderr) = text(&out);
    assert!(
        !stdout.contains("burned") && matches!(out.status.code(), Some(152 | 137)),
        "the CPU burner was not stopped at 2 s of CPU ({:?}): {stdout}\n{stderr}",
        out.status
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(55));

    // A limit on the command line wins over the policy's, and a bad one is refused.
    let out = run(
        &policy,
        &["--limit", "processes=off", "--limit", "cpu=off"],
        &["python3", "-c", FORK_BOMB],
    );
    let (stdout, _) = text(&out);
    assert!(stdout.contains("forked 400"), "--limit processes=off: {stdout}");
    let out = run(&policy, &["--limit", "swap=1G"], &["true"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("\"swap\" is not a limit"), "{stderr}");
}

/// Finding 2 (for `sandgate run`): with `--no-terminal`, a command given a terminal by its
/// caller can neither open /dev/tty nor share the caller's session.
#[test]
fn a_no_terminal_run_has_no_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), "net:\n  mode: none\n");
    let driver = r#"
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
out = b""
while True:
    try:
        d = os.read(fd, 4096)
    except OSError:
        break
    if not d:
        break
    out += d
os.waitpid(pid, 0)
print(out.decode(errors="replace"))
print("caller-sid", os.getsid(0))
"#;
    let inside = "import os\ntry:\n    open('/dev/tty', 'w').write('over your screen')\n    print('tty OPENED')\nexcept OSError as e:\n    print('tty refused', e.errno)\nprint('stdin-tty', os.isatty(0))\nprint('out-tty', os.isatty(1), os.isatty(2))\n";
    for (flags, wants_tty) in [(vec!["--no-terminal"], false), (vec![], true)] {
        let out = Command::new("timeout")
            .args(["60", HOST_PYTHON, "-c", driver])
            .arg(common::sandgate_bin())
            .args(["run", "--policy"])
            .arg(&policy)
            .args(&flags)
            .args(["--", "python3", "-c", inside])
            .env("XDG_STATE_HOME", sandbox_support::state_home())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        if wants_tty {
            // Without the flag the terminal is shared (the check above proves something).
            assert!(stdout.contains("tty OPENED"), "{stdout}\n{stderr}");
        } else {
            assert!(
                stdout.contains("tty refused 6"),
                "--no-terminal: /dev/tty opened:\n{stdout}\n{stderr}"
            );
            assert!(
                stdout.contains("stdin-tty False"),
                "--no-terminal: stdin is the terminal:\n{stdout}"
            );
            // Its output still shows, relayed by sandgate, but through no descriptor of the
            // terminal (which it could read the person's keys from, or change the modes of).
            assert!(
                stdout.contains("out-tty False False"),
                "--no-terminal: output is the terminal:\n{stdout}"
            );
        }
    }
    // --ask needs the terminal that --no-terminal gives up.
    let out = run(&policy, &["--no-terminal", "--ask"], &["true"]);
    assert_eq!(out.status.code(), Some(64), "{:?}", text(&out));
}

/// Double-forks 60 short-lived processes, one after another: each orphan comes to PID 1
/// and, unless reaped there, stays a zombie that counts against the process limit.
const ORPHANS: &str = r#"
import os, time
for i in range(60):
    try:
        pid = os.fork()
    except OSError as e:
        print("fork failed at", i, e.errno); break
    if pid == 0:
        if os.fork() == 0:
            os._exit(0)
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.02)
else:
    print("all 60")
"#;

/// The review of the fixes: the new PID 1 must reap orphans (zombies would use up the
/// process limit of a long-lived MCP or Jupyter sandbox); /dev/shm and /dev must not be a
/// way around the tmpfs size; a datagram socket pair must not reach a host socket.
#[test]
fn orphans_are_reaped_dev_is_sized_and_datagram_pairs_reach_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        "net:\n  mode: none\nlimits: { processes: 20, tmpfs: 16MiB }\n",
    );
    let out = run(&policy, &[], &["python3", "-c", ORPHANS]);
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains("all 60"),
        "orphans were left as zombies: {stdout}\n{stderr}"
    );

    let fill = "import errno\nfor path in ['/dev/shm/fill', '/dev/fill']:\n    try:\n        f = open(path, 'wb')\n        for i in range(64):\n            f.write(b'x' * (1 << 20)); f.flush()\n        print(path, 'filled')\n    except OSError as e:\n        print(path, errno.errorcode.get(e.errno))\n";
    let out = run(&policy, &[], &["python3", "-c", fill]);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("/dev/shm/fill ENOSPC"), "{stdout}\n{stderr}");
    assert!(stdout.contains("/dev/fill EROFS"), "{stdout}\n{stderr}");

    // A host datagram socket on an abstract name, which `net.mode: all` shares.
    use std::os::linux::net::SocketAddrExt;
    let name = format!("sandgate-test-dgram-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let host = std::os::unix::net::UnixDatagram::bind_addr(&addr).unwrap();
    host.set_nonblocking(true).unwrap();
    let all = write_policy(dir.path(), "net:\n  mode: all\n");
    let send = "import errno, socket, sys\ntry:\n    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n    a.sendto(b'escaped', b'\\0' + sys.argv[1].encode())\n    print('sent')\nexcept OSError as e:\n    print('pair', errno.errorcode.get(e.errno))\n";
    let out = run(&all, &[], &["python3", "-c", send, &name]);
    let (stdout, stderr) = text(&out);
    let mut buf = [0u8; 16];
    let heard = host.recv(&mut buf).is_ok();
    assert!(
        !heard && stdout.contains("pair EAFNOSUPPORT"),
        "a datagram pair reached a host socket (heard: {heard}): {stdout}\n{stderr}"
    );
}

/// `sandgate run` of `command` under `policy` with `HOME` at `home` (and no
/// `XDG_STATE_HOME`, so the kept logs go under that home).
fn run_at_home(policy: &std::path::Path, home: &std::path::Path, command: &[&str]) -> std::process::Output {
    Command::new(common::sandgate_bin())
        .args(["run", "--policy"])
        .arg(policy)
        .arg("--")
        .args(command)
        .env("HOME", home)
        .env_remove("XDG_STATE_HOME")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The review of the fixes: a run whose write paths cover the runs directory (a writable
/// home) removes an earlier run's kept log and plants a file beside it.
#[test]
fn earlier_runs_logs_cannot_be_erased_or_planted_from_a_writable_home() {
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let h = home.path().display().to_string();
    let policy = home.path().join("policy.yaml");
    let doc = sandbox_support::base().replace("fs:\n", &format!("fs:\n  write_paths: [ \"{h}\" ]\n"));
    std::fs::write(
        &policy,
        format!("{doc}net:\n  mode: allowlist\n  allow_domains: [ a.example ]\n"),
    )
    .unwrap();
    let go = |command: &[&str]| run_at_home(&policy, home.path(), command);
    let first = go(&["true"]);
    assert!(first.status.success(), "{:?}", text(&first));
    let runs = home.path().join(".local/state/sandgate/runs");
    let logs = || -> Vec<_> {
        std::fs::read_dir(&runs)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    };
    let before = logs();
    assert_eq!(before.len(), 1, "{before:?}");
    let out = go(&[
        "sh",
        "-c",
        &format!(
            "rm -f {r}/run-*.jsonl; touch {r}/run-1-ffffffffffffffff.jsonl {r}/x; echo tried",
            r = runs.display()
        ),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("tried"), "{stdout}\n{stderr}");
    let after = logs();
    assert!(
        after
            .iter()
            .all(|n| n.to_string_lossy().starts_with("run-") && !n.to_string_lossy().starts_with("run-1-")),
        "planted: {after:?}"
    );
    assert!(
        before.iter().all(|b| after.contains(b)),
        "an earlier run's log was removed: {before:?} -> {after:?}"
    );
}

/// Another run, in allowlist mode, started with `TMPDIR` at `tmp` in a directory of its own
/// (readable by anyone) and sleeping; with that directory, `tmp`, the run and its proxy's
/// bridge socket once it is there.
fn another_run_with_a_bridge(
    stderr: Stdio,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::process::Child,
    std::path::PathBuf,
) {
    another_run_running(stderr, &["sleep", "20"], |_| String::new())
}

/// [`another_run_with_a_bridge`] running `command`, its policy's read paths with those
/// `read` gives for the directory.
fn another_run_running(
    stderr: Stdio,
    command: &[&str],
    read: impl FnOnce(&std::path::Path) -> String,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::process::Child,
    std::path::PathBuf,
) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    // The other run: an allowlist run whose bridge sockets wait in `tmp` while it runs.
    let doc =
        sandbox_support::base().replace("read_paths: [ ", &format!("read_paths: [ {}", read(dir.path())));
    let other = dir.path().join("policy.yaml");
    std::fs::write(
        &other,
        format!("{doc}net:\n  mode: allowlist\n  allow_domains: [ a.example ]\n"),
    )
    .unwrap();
    let mut b = sandbox_support::run_command(&other, &[], command)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let socket = || -> Option<std::path::PathBuf> {
        std::fs::read_dir(&tmp)
            .ok()?
            .flatten()
            .map(|e| e.path().join("bridge/proxy.sock"))
            .find(|p| p.exists())
    };
    if !sandbox_support::eventually(std::time::Duration::from_secs(15), || socket().is_some()) {
        let _ = b.kill();
        let _ = b.wait();
        panic!("the other run's bridge never appeared");
    }
    let socket = socket().unwrap();
    (dir, tmp, b, socket)
}

/// A hostile review (2026-11-28): a run that may write where another run's state is (its
/// paths hold that run's `TMPDIR`) renamed that run's bridge socket and put its own in its
/// place; the other run's init connects by path, so the other run's next request went to
/// this run, off its record. Each bridge file is now bound on its own, and a mount stays on
/// the file it was made of: the other run's request still reaches its own proxy (a 403 for
/// a host it does not allow). Before, it printed what this run answered.
#[test]
fn a_renamed_bridge_socket_does_not_redirect_the_run_that_made_it() {
    // The other run waits for the swap, then asks its proxy for a host it does not allow.
    let ask = r#"
import os, socket, time
for _ in range(1500):
    if os.path.exists(os.environ['SIGNAL']):
        break
    time.sleep(0.01)
s = socket.create_connection(('127.0.0.1', 3128))
s.sendall(b'GET http://b.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n')
print('answered', s.recv(200))
"#;
    let signal_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        signal_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let signal = signal_dir.path().join("swapped");
    let s_dir = signal_dir.path().display().to_string();
    let set_signal = format!("SIGNAL={}", signal.display());
    let (dir, _tmp, victim, socket) = another_run_running(
        Stdio::piped(),
        &["env", &set_signal, HOST_PYTHON, "-c", ask],
        |_| format!("\"{s_dir}\", "),
    );
    // This run: no network, Unix sockets allowed, the other run's directory and the signal's
    // writable, a temporary directory of its own elsewhere (so the check at load time passes).
    let own_tmp = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let doc = sandbox_support::base().replace(
        "fs:\n",
        &format!("fs:\n  write_paths: [ \"{d}\", \"{s_dir}\" ]\n"),
    );
    let attacker = attacker_policy(own_tmp.path(), &doc);
    let swap = format!(
        r#"
import os, socket
path = {sock:?}
os.rename(path, path + '.old')
l = socket.socket(socket.AF_UNIX)
l.bind(path)
l.listen(1)
open({signal:?}, 'w').close()
l.settimeout(20)
c, _ = l.accept()
c.sendall(b'\x00HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nhijacked')
c.recv(100)
"#,
        sock = socket.display().to_string(),
        signal = signal.display().to_string(),
    );
    let mut attack = sandbox_support::run_command(&attacker, &[], &[HOST_PYTHON, "-c", &swap])
        .env("TMPDIR", own_tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = victim.wait_with_output().unwrap();
    let _ = attack.kill();
    let attack = attack.wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(
        signal.exists(),
        "the swap did not happen: {}",
        String::from_utf8_lossy(&attack.stderr)
    );
    assert!(
        !stdout.contains("hijacked"),
        "the other run's request went to this run: {stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("answered") && stdout.contains("403"),
        "the other run's proxy did not answer: {stdout}\n{stderr}"
    );
}

/// The attacking run's policy, written to `dir/attacker.yaml`: `doc` (the base with its own
/// paths), no network, Unix sockets allowed.
fn attacker_policy(dir: &std::path::Path, doc: &str) -> std::path::PathBuf {
    let path = dir.join("attacker.yaml");
    std::fs::write(
        &path,
        format!("{doc}net:\n  mode: none\nplatform:\n  seccomp: {{ allow_unix_sockets: true }}\n"),
    )
    .unwrap();
    path
}

/// A Python program that connects to the Unix socket at `socket` and prints the first byte
/// it is answered with (`b''` when the other end closes without one).
fn reach(socket: &std::path::Path) -> String {
    format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({:?})\nprint('connected', s.recv(1))\n",
        socket.display().to_string()
    )
}

/// A hostile review (2026-11-28), as a run without a network: runs keep their bridge
/// sockets in the temporary directory, and a run whose read paths held it (and that may
/// make Unix sockets) could connect to another run's proxy socket, the way to that run's
/// proxy and allowlist (and, with write paths there, rename its sockets). Any run that
/// would hold that directory is refused now (exit 64); before, this run connected and the
/// other run's bridge answered.
#[test]
fn a_run_that_would_hold_other_runs_bridge_sockets_is_refused() {
    let (dir, tmp, mut b, socket) = another_run_with_a_bridge(Stdio::null());
    // The attacker: no network, Unix sockets allowed, the directory above `tmp` readable.
    let d = dir.path().display().to_string();
    let doc = sandbox_support::base().replace("read_paths: [ ", &format!("read_paths: [ \"{d}\", "));
    let attacker = attacker_policy(dir.path(), &doc);
    let out = sandbox_support::run_command(&attacker, &[], &[HOST_PYTHON, "-c", &reach(&socket)])
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = b.kill();
    let _ = b.wait();
    let (stdout, stderr) = text(&out);
    assert!(
        !stdout.contains("connected"),
        "a run without a network reached another run's bridge: {stdout}"
    );
    assert_eq!(out.status.code(), Some(64), "{stdout}\n{stderr}");
    assert!(stderr.contains("bridge sockets"), "{stderr}");
}

/// The bridge check at load time covers the temporary directory of the run being started,
/// `/tmp` and `/var/tmp`; another run of the same user started with another `TMPDIR` keeps
/// its bridge sockets elsewhere, and a policy may list that place. Each bridge now serves
/// only processes of its own run (`SO_PEERCRED`, the peer's parents read up to the runner):
/// this run reaches the socket, connects, and is closed on without a byte. Before, the other
/// run's bridge answered with its ready byte, the way to that run's proxy and allowlist. A
/// flood of such connections does not flood the other run's stderr with warnings.
#[test]
fn another_runs_bridge_closes_on_a_process_of_this_run() {
    let (dir, _tmp, mut b, socket) = another_run_with_a_bridge(Stdio::piped());
    // This run: no network, Unix sockets allowed, the other run's directory readable, and a
    // temporary directory of its own elsewhere, so the check at load time passes.
    let own_tmp = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let doc = sandbox_support::base().replace("read_paths: [ ", &format!("read_paths: [ \"{d}\", "));
    let attacker = attacker_policy(own_tmp.path(), &doc);
    // Then 299 more: the other run warns at each power of two, not for each one.
    let flood = format!(
        "{}for _ in range(299):\n    t = socket.socket(socket.AF_UNIX)\n    t.connect({:?})\n    t.recv(1)\n    t.close()\n",
        reach(&socket),
        socket.display().to_string()
    );
    let out = sandbox_support::run_command(&attacker, &[], &[HOST_PYTHON, "-c", &flood])
        .env("TMPDIR", own_tmp.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = b.kill();
    let other_run = b.wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("connected b''"),
        "another run's bridge answered this run: {stdout}\n{stderr}"
    );
    let other_stderr = String::from_utf8_lossy(&other_run.stderr);
    assert!(
        other_stderr.contains("not in this run's sandbox"),
        "the other run did not say it refused a stranger: {other_stderr}"
    );
    let warnings = other_stderr.matches("not in this run's sandbox").count();
    assert!(
        (1..=9).contains(&warnings),
        "300 refusals, {warnings} warnings (1, 2, 4 .. 256 are 9): {other_stderr}"
    );
}

/// A hostile review (2026-11-28): the kept logs' directory was protected only once it
/// existed, and only proxied runs made it. A first run without a network (nothing kept)
/// and a writable home could make it and plant logs named for a time to come, which later
/// runs would count as the newest and keep in place of real ones. Now every run makes it
/// first and binds it read-only. And a directory that is a link to another place (made
/// before) keeps nothing: logs would land where that place's owner reads or removes them.
#[test]
fn the_kept_logs_directory_cannot_be_made_first_or_redirected_from_a_writable_home() {
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let h = home.path().display().to_string();
    let runs = home.path().join(".local/state/sandgate/runs");
    let go = |net: &str, command: &[&str]| {
        let policy = home.path().join("policy.yaml");
        let doc = sandbox_support::base().replace("fs:\n", &format!("fs:\n  write_paths: [ \"{h}\" ]\n"));
        std::fs::write(&policy, format!("{doc}{net}")).unwrap();
        run_at_home(&policy, home.path(), command)
    };
    let plant = format!(
        "mkdir -p {r}; touch {r}/run-1-ffffffffffffffff.jsonl; echo tried",
        r = runs.display()
    );
    let out = go("net:\n  mode: none\n", &["sh", "-c", &plant]);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("tried"), "{stdout}\n{stderr}");
    let planted: Vec<_> = std::fs::read_dir(&runs)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        planted.is_empty(),
        "planted in the kept logs' directory: {planted:?}"
    );

    // Made a link to elsewhere (as a command could have before this fix): nothing is kept.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::remove_dir(&runs).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), &runs).unwrap();
    let out = go(
        "net:\n  mode: allowlist\n  allow_domains: [ a.example ]\n",
        &["true"],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        std::fs::read_dir(elsewhere.path()).unwrap().next().is_none(),
        "a log was kept where the link leads"
    );
    assert!(
        stderr.contains("audit log is not kept") && stderr.contains("symbolic link"),
        "{stderr}"
    );
}

/// A hostile review (2026-11-28): a policy that lists the host's `/proc` (or `/`, which
/// brings it along) put it over the sandbox's own, and the command followed
/// `/proc/PID/root` of a process of the same user outside (here the test itself) to the
/// host's whole file system, past every bind. Such a policy is refused now, in every mode,
/// before anything runs; before, this run printed the secret.
#[test]
fn the_hosts_proc_listed_in_a_policy_is_refused_not_bound() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("not-bound.txt");
    std::fs::write(&secret, "secret-outside-the-sandbox").unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let through = format!("/proc/{}/root{}", std::process::id(), secret.display());
    for (paths, mode) in [("/proc", "none"), ("/proc/self", "none"), ("/", "all")] {
        let doc = sandbox_support::base().replace("read_paths: [ ", &format!("read_paths: [ {paths}, "));
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, format!("{doc}net:\n  mode: {mode}\n")).unwrap();
        let out = run(&policy, &[], &["cat", &through]);
        let (stdout, stderr) = text(&out);
        assert!(
            !stdout.contains("secret-outside-the-sandbox"),
            "{paths} ({mode}): the command read a file outside the sandbox through the host's /proc"
        );
        assert_eq!(
            out.status.code(),
            Some(64),
            "{paths} ({mode}): {stdout}\n{stderr}"
        );
        assert!(
            stderr.contains("/proc"),
            "{paths} ({mode}): the refusal does not name /proc: {stderr}"
        );
    }
}

/// The escape an earlier hostile review found in `sandgate mcp`: the server checks the
/// workspace an agent names (under an allowed root), then starts `sandgate run` with its
/// canonical path as `WORKSPACE`; a concurrent run that can write a parent directory swaps
/// a component for a symlink before the run binds it. Made deterministic here: the swap is
/// done before `sandgate run` starts, with the path that was checked. Before the fix the
/// run bound the directory the symlink led to, writable, and the command wrote there.
#[test]
fn a_workspace_whose_parent_became_a_symlink_after_its_check_is_not_bound() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    for d in ["allowed/ws", "outside/ws"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let policy = write_policy(&root, "  write_paths: [ \"${WORKSPACE}\" ]\n");
    let checked = root.join("allowed/ws");
    let param = format!("WORKSPACE={}", checked.display());
    let write = |name: &str| {
        run(
            &policy,
            &["--param", &param],
            &[
                "sh",
                "-c",
                &format!("echo x > \"$SANDGATE_WORKSPACE/{name}\" && echo wrote"),
            ],
        )
    };
    // The workspace as checked: bound (through the descriptor sandgate opened), writable.
    let out = write("mine");
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(checked.join("mine").exists());
    // The swap: `allowed` moved aside, a symlink to `outside` in its place.
    std::fs::rename(root.join("allowed"), root.join("allowed.old")).unwrap();
    std::os::unix::fs::symlink(root.join("outside"), root.join("allowed")).unwrap();
    let out = write("pwned");
    let (stdout, stderr) = text(&out);
    assert!(
        !root.join("outside/ws/pwned").exists(),
        "the command wrote outside the checked workspace:\n{stdout}\n{stderr}"
    );
    assert_eq!(out.status.code(), Some(64), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "the workspace {} (WORKSPACE) is not canonical: {} resolves to {}",
            checked.display(),
            checked.display(),
            root.join("outside/ws").display()
        )),
        "{stderr}"
    );
    assert!(!stdout.contains("wrote"), "{stdout}");
}

/// This whole binary again as `nobody` when the tests run as root.
#[test]
fn the_escape_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody(
        "sandbox_escape_e2e",
        "the_escape_suite_passes_as_an_ordinary_user",
        13,
    );
}
