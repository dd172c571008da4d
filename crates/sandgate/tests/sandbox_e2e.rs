//! `sandgate run` with the real bubblewrap: allowlist mode with curl and Python inside,
//! none and all modes, environment and filesystem, exit codes and signals, teardown after
//! `kill -9`, and an ordinary user.

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
use std::time::{Duration, Instant};

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;

use common::runtime;
use sandbox_support::{allowlist, base, run, running, text, wait_bounded, write_policy};

#[test]
fn allowlist_mode_curl_and_python_go_through_the_proxy_only() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("denied.test", &["127.0.0.1"]),
    ));
    let dir = tempfile::tempdir().unwrap();
    let port = origin.port();
    let policy = write_policy(
        dir.path(),
        &allowlist(dns.addr(), &[format!("allowed.test:{port}")]),
    );
    let audit = dir.path().join("audit.jsonl");
    let script = format!(
        r#"
set -u
curl -sS -o /dev/null -w "allowed=%{{http_code}}\n" http://allowed.test:{port}/in-sandbox
curl -sS -o /dev/null -w "denied=%{{http_code}}\n" http://denied.test:{port}/
python3 - <<'PY'
import socket, urllib.request, urllib.error
r = urllib.request.urlopen("http://allowed.test:{port}/from-python", timeout=10)
print("python", r.status)
try:
    urllib.request.urlopen("http://denied.test:{port}/", timeout=10)
except urllib.error.HTTPError as e:
    print("python-denied", e.code)
try:
    socket.create_connection(("10.1.2.3", 80), timeout=2)
    print("raw-connect succeeded")
except OSError as e:
    print("raw-connect failed")
try:
    socket.getaddrinfo("allowed.test", 80)
    print("dns worked")
except OSError:
    print("no dns")
PY
"#
    );
    let out = run(
        &policy,
        &["--audit-log", audit.to_str().unwrap()],
        &["sh", "-c", &script],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for want in [
        "allowed=200",
        "denied=403",
        "python 200",
        "python-denied 403",
        "raw-connect failed",
        "no dns",
    ] {
        assert!(stdout.contains(want), "missing {want}:\n{stdout}\n{stderr}");
    }
    assert!(
        stderr.contains(&format!("blocked: denied.test:{port} (not allowlisted), 2 times")),
        "{stderr}"
    );
    let events = common::read_audit(&audit);
    let allowed: Vec<_> = events.iter().filter(|e| e["decision"] == "allow").collect();
    assert_eq!(allowed.len(), 2, "{events:#?}");
    assert!(
        allowed
            .iter()
            .all(|e| e["task_id"].as_str().is_some_and(|t| t.starts_with("run-")))
    );
}

#[test]
fn none_and_all_modes() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{}/direct", origin.port());
    let policy = write_policy(dir.path(), "net:\n  mode: none\n");
    let probe = format!("curl -sS -m 5 -o /dev/null -w '%{{http_code}}' {url} || echo unreachable");
    let out = run(&policy, &[], &["sh", "-c", &probe]);
    assert!(text(&out).0.contains("unreachable"), "{:?}", text(&out));
    // The sandbox's own loopback works in none mode too.
    let inside = "python3 -m http.server 18080 --bind 127.0.0.1 >/dev/null 2>&1 & for i in 1 2 3 4 5 6 7 8 9 10; do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18080/ && break; sleep 0.3; done";
    let out = run(&policy, &["--net", "loopback"], &["sh", "-c", inside]);
    assert!(text(&out).0.ends_with("200"), "{:?}", text(&out));
    let out = run(&policy, &["--net", "all"], &["sh", "-c", &probe]);
    assert_eq!(text(&out).0, "200", "{:?}", text(&out));
}

#[test]
fn environment_and_filesystem_are_explicit() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let ro_dir = dir.path().join("ro");
    std::fs::create_dir(&ro_dir).unwrap();
    std::fs::write(ro_dir.join("input"), "data").unwrap();
    let policy = dir.path().join("policy.yaml");
    let policy_text = base()
        .replace(
            "env:\n  set:",
            "env:\n  passthrough: [ PASS_ME, SECRET_* ]\n  set:",
        )
        .replace("/etc/ssl", &format!("/etc/ssl, \"{}\"", ro_dir.display()))
        + "  write_paths: [ \"${OUT}\" ]\nnet:\n  mode: none\n";
    std::fs::write(&policy, policy_text).unwrap();
    let script = format!(
        "env | sort; cat {ro}/input; echo; echo new > {ro}/x 2>/dev/null && echo ro-writable || echo ro-refused; \
         echo out > {out}/result && echo rw-ok; cat /etc/passwd 2>/dev/null || echo no-passwd; ls /root 2>/dev/null || echo no-root",
        ro = ro_dir.display(),
        out = out_dir.display()
    );
    let out = run(
        &policy,
        &["--param", &format!("OUT={}", out_dir.display())],
        &["sh", "-c", &script],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("PASS_ME=visible") && stdout.contains("HOME=/tmp"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("do-not-leak"),
        "a secret-looking variable passed by prefix: {stdout}"
    );
    assert!(stderr.contains("not passing SECRET_TOKEN"), "{stderr}");
    assert!(
        !stdout.contains("CARGO") && !stdout.contains("USER="),
        "host environment leaked: {stdout}"
    );
    for want in ["data", "ro-refused", "rw-ok", "no-passwd", "no-root"] {
        assert!(stdout.contains(want), "missing {want}: {stdout}");
    }
    assert_eq!(std::fs::read_to_string(out_dir.join("result")).unwrap(), "out\n");
}

#[test]
fn exit_codes_signals_and_teardown() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        "net:\n  mode: allowlist\n  allow_domains: [ a.example ]\n",
    );
    assert_eq!(run(&policy, &[], &["sh", "-c", "exit 7"]).status.code(), Some(7));
    assert_eq!(
        run(&policy, &[], &["sh", "-c", "kill -TERM $$"]).status.code(),
        Some(143)
    );
    // SIGTERM to sandgate reaches the command, which exits on its own terms.
    let mut child = Command::new(common::sandgate_bin())
        .args([
            "run",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "trap 'exit 42' TERM; while :; do sleep 0.1; done",
        ])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = wait_bounded(&mut child);
    assert_eq!(status.code(), Some(42));
    // kill -9 of sandgate leaves nothing running. Its state directory lives under a TMPDIR of
    // this test's own: any run of the same user sweeps dead runs' directories, and runs of
    // other tests must not sweep this one before it is looked at.
    let private_tmp = dir.path().join("tmp");
    std::fs::create_dir(&private_tmp).unwrap();
    let marker = format!("sleep 3{}", std::process::id() % 1000);
    let mut child = Command::new(common::sandgate_bin())
        .env("TMPDIR", &private_tmp)
        .args([
            "run",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &format!("{marker}; true"),
        ])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert!(running(&marker), "the command should be running");
    let state = sandbox_support::state_dir_of(child.id());
    Command::new("kill")
        .args(["-KILL", &child.id().to_string()])
        .status()
        .unwrap();
    let state = state.expect("the run holds its state directory open");
    let _ = wait_bounded(&mut child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(&marker) {
        assert!(Instant::now() < deadline, "{marker} survived kill -9 of sandgate");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The dead process could not remove its state directory; its lock died with it, and the
    // next run sweeps it.
    assert!(state.is_dir(), "kill -9 leaves the run's state directory");
    let next = Command::new(common::sandgate_bin())
        .env("TMPDIR", &private_tmp)
        .args([
            "run",
            "--quiet",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(next.code(), Some(0));
    assert!(!state.exists(), "the next run swept {}", state.display());
}

#[test]
fn bad_policies_and_missing_paths_fail_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, format!("{}  write_paths: [ /does/not/exist ]\n", base())).unwrap();
    let out = run(&policy, &[], &["touch", marker.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out).1.contains("\"/does/not/exist\" does not exist"),
        "{:?}",
        text(&out)
    );
    assert!(!marker.exists());
    let out = run(&policy, &["--param", "X"], &["true"]);
    assert_eq!(out.status.code(), Some(64));
    // A subject that is not an id (it goes into audit lines and a header): refused.
    std::fs::write(&policy, base()).unwrap();
    let out = run(
        &policy,
        &["--subject", "a b\r\nx: y"],
        &["touch", marker.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(64), "{:?}", text(&out));
    assert!(text(&out).1.contains("--subject"), "{:?}", text(&out));
    assert!(!marker.exists());
}

#[test]
fn an_ordinary_user_runs_a_proxied_sandbox() {
    use std::os::unix::fs::PermissionsExt;
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("allowed.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("sandgate");
    common::place_binary(common::sandgate_bin(), &bin);
    let port = origin.port();
    let policy = write_policy(
        dir.path(),
        &allowlist(dns.addr(), &[format!("allowed.test:{port}")]),
    );
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut cmd = if common::is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    let out = cmd
        .args(["run", "--policy", policy.to_str().unwrap(), "--", "sh", "-c"])
        .arg(format!(
            "id -u; curl -sS -o /dev/null -w '%{{http_code}}' http://allowed.test:{port}/"
        ))
        .current_dir(dir.path())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.ends_with("200"), "{stdout}\n{stderr}");
}

/// The run's state directory is made under TMPDIR, and its bridge directory is a bind
/// source, opened and compared with its canonical path before bwrap gets it: a TMPDIR
/// reached through a symlink must still give a working sandbox.
#[test]
fn a_tmpdir_reached_through_a_symlink_still_binds_the_bridges() {
    let dir = tempfile::tempdir().unwrap();
    let (real, link) = (dir.path().join("real"), dir.path().join("link"));
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let policy = write_policy(
        dir.path(),
        "net:\n  mode: allowlist\n  allow_domains: [ a.example ]\n",
    );
    let out = sandbox_support::run_command(&policy, &["--no-audit-log"], &["ls", "/run/sandgate"])
        .env("TMPDIR", &link)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("proxy.sock"), "{stdout}\n{stderr}");
}

/// A bwrap without `--bind-fd` (before 0.10.0, with no backport: here a wrapper in front of
/// the real one, whose file names no option and whose version is the real one's, 0.8) still
/// runs the command, its bind sources given as paths, and a bound directory is written.
#[test]
fn a_bwrap_without_bind_fd_is_given_the_paths() {
    let dir = tempfile::tempdir().unwrap();
    let real = std::process::Command::new("sh")
        .args(["-c", "command -v bwrap"])
        .output()
        .unwrap();
    let real = String::from_utf8_lossy(&real.stdout).trim().to_owned();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let wrapper = bin.join("bwrap");
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec {real} \"$@\"\n")).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let policy = write_policy(
        dir.path(),
        &format!("  write_paths: [ {} ]\nnet:\n  mode: none\n", work.display()),
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let script = format!("echo written > {}/out", work.display());
    let out = sandbox_support::run_command(&policy, &["--no-audit-log"], &["sh", "-c", &script])
        .env("PATH", &path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let written = std::fs::read_to_string(work.join("out")).unwrap_or_default();
    assert_eq!(written, "written\n", "{stdout}\n{stderr}");
}

#[test]
fn loopback_mode_bridges_only_the_listed_host_ports() {
    let rt = runtime();
    let bridged = rt.block_on(Origin::http());
    let other = rt.block_on(Origin::http());
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        &format!(
            "net:\n  mode: loopback\n  loopback_ports: [ {} ]\n",
            bridged.port()
        ),
    );
    let script = format!(
        "curl -sS -m 5 -o /dev/null -w 'bridged=%{{http_code}} ' http://127.0.0.1:{}/; \
         curl -sS -m 5 -o /dev/null -w 'other=%{{http_code}}' http://127.0.0.1:{}/ 2>/dev/null || echo other=unreachable",
        bridged.port(),
        other.port()
    );
    let out = run(&policy, &[], &["sh", "-c", &script]);
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains("bridged=200") && stdout.contains("other=unreachable"),
        "{stdout}\n{stderr}"
    );
    // The init's readiness check opens one connection through the bridge before the command
    // starts; the command's request is the second.
    assert_eq!(bridged.connections(), 2);
    assert_eq!(other.connections(), 0, "an unlisted host port was reached");
}

#[test]
fn host_unix_sockets_are_not_reachable_from_a_restricted_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("agent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock_path).unwrap();
    let policy = write_policy(
        dir.path(),
        "net:\n  mode: allowlist\n  allow_domains: [ a.example ]\n",
    );
    let script = format!(
        "import socket, os, errno\n\
         try:\n    s = socket.socket(socket.AF_UNIX)\n\
         except OSError as e:\n    print('no-unix-socket', errno.errorcode[e.errno])\n\
         else:\n    try:\n        s.connect({:?}); print('connected')\n    except OSError: print('unreachable')\n\
         print('run-dirs', [p for p in ['/run/user', '/var/run', '/run/dbus', '/var/run/docker.sock'] if os.path.exists(p)])\n",
        sock_path.to_str().unwrap()
    );
    // The seccomp filter refuses the socket itself; with the opt-in, the path is still not
    // in the sandbox.
    let out = run(&policy, &[], &["python3", "-c", &script]);
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains("no-unix-socket EAFNOSUPPORT"),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("run-dirs []"), "{stdout}");
    let opted_in = dir.path().join("unix.yaml");
    std::fs::write(
        &opted_in,
        format!("{}net:\n  mode: allowlist\n  allow_domains: [ a.example ]\nplatform:\n  seccomp: {{ allow_unix_sockets: true }}\n", base()),
    )
    .unwrap();
    let out = run(&opted_in, &[], &["python3", "-c", &script]);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("unreachable"), "{stdout}\n{stderr}");
    // And a policy that would expose them is refused before anything runs.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        format!("{}  write_paths: [ /run ]\nnet:\n  mode: none\n", base()),
    )
    .unwrap();
    let out = run(&bad, &[], &["true"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out).1.contains("may hold host Unix sockets"),
        "{:?}",
        text(&out)
    );
}

#[test]
fn print_profile_seatbelt_renders_the_same_policy() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        "net:\n  mode: allowlist\n  allow_domains: [ pypi.org ]\n",
    );
    let out = run(
        &policy,
        &["--print-profile", "seatbelt"],
        &["pip", "install", "x"],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.starts_with("(version 1)") && stdout.contains("(deny default)"),
        "{stdout}"
    );
    assert!(
        // Only the run's proxy ports: HTTP, and SOCKS5 (its default port in allowlist mode).
        stdout.contains(
            "(allow network-outbound (remote ip \"localhost:3128\") (remote ip \"localhost:1080\"))"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("-D READ_0=/usr"), "{stdout}");
    let out = run(&policy, &["--print-profile", "apparmor"], &["true"]);
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn proxy_mode_chains_the_sandbox_through_an_upstream_proxy() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("allowed.test", &["127.0.0.1"])));
    let port = origin.port();
    let dns_addr = dns.addr().to_string();
    let allow = format!("allowed.test:{port}");
    let central = common::ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &allow,
    ]);
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        &format!(
            "net:\n  mode: proxy\n  allow_domains: [ \"{allow}\" ]\n  proxy: {{ upstream: \"{}\" }}\n",
            central.addr
        ),
    );
    let out = run(
        &policy,
        &[],
        &[
            "sh",
            "-c",
            &format!("curl -sS -o /dev/null -w '%{{http_code}}' http://{allow}/via-central"),
        ],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(stdout, "200", "{stderr}");
    let events = central.audit_events(2);
    assert!(
        events
            .iter()
            .any(|e| e["decision"] == "allow" && e["destination_host"] == "allowed.test"),
        "{events:#?}"
    );
}

/// The whole sandbox suite again as `nobody`, when the tests run as root (as in CI). When
/// they already run unprivileged, the suite itself is that run.
#[test]
fn the_sandbox_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody("sandbox_e2e", "the_sandbox_suite_passes_as_an_ordinary_user", 11);
}
