//! `sandgate run` as a new user meets it, with the real bubblewrap: a default PATH (Python's
//! venv works), shell exit statuses for commands that cannot run, the DNS files in
//! `net.mode: all`, a bridged port with nothing behind it, upstream failures in the
//! summary, every request of a command that exits at once on record, stale state swept by
//! lock, and secret-looking environment withheld. The last
//! test reruns this binary as `nobody`.

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

use common::runtime;
use sandbox_support::{allowlist, base, run, text, write_policy};
use sandgate_testkit::closed::ClosedPort;
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;

/// The base policy without `PATH` in `env.set`.
fn without_path(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("nopath.yaml");
    std::fs::write(&path, base().replace(" PATH: /usr/bin:/bin,", "") + extra).unwrap();
    path
}

#[test]
fn path_has_a_default_and_commands_that_cannot_run_exit_127_or_126() {
    let dir = tempfile::tempdir().unwrap();
    for net in ["none", "all", "allowlist\n  allow_domains: [ a.example ]"] {
        let policy = without_path(dir.path(), &format!("net:\n  mode: {net}\n"));
        let out = run(
            &policy,
            &[],
            &[
                "sh",
                "-c",
                "echo \"PATH=$PATH\"; python3 -m venv --without-pip /tmp/venv && /tmp/venv/bin/python -c 'import sys; print(\"venv\", sys.prefix)'",
            ],
        );
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{net}: {stdout}\n{stderr}");
        assert!(
            stdout.contains("PATH=/usr/local/bin:/usr/bin:/bin"),
            "{net}: {stdout}"
        );
        assert!(stdout.contains("venv /tmp/venv"), "{net}: {stdout}\n{stderr}");
        let cases = [
            ("no-such-command-here", 127),
            ("/no/such/path", 127),
            ("/usr", 126),
            ("/usr/lib/os-release", 126),
        ];
        for (command, want) in cases {
            let out = run(&policy, &[], &[command]);
            let (_, stderr) = text(&out);
            assert_eq!(out.status.code(), Some(want), "{net}: {command}: {stderr}");
            assert!(
                stderr.contains(&format!("cannot run {command}")),
                "{net}: {stderr}"
            );
        }
    }
}

#[test]
fn net_all_gets_the_files_name_resolution_needs() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), "net:\n  mode: all\n");
    let script = "import os, socket\n\
                  print('files', [f for f in ['/etc/resolv.conf', '/etc/hosts', '/etc/nsswitch.conf'] if os.path.exists(f)])\n\
                  print('localhost', socket.gethostbyname('localhost'))\n";
    let out = run(&policy, &[], &["python3", "-c", script]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for f in ["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf"] {
        if std::path::Path::new(f).exists() {
            assert!(stdout.contains(&format!("'{f}'")), "{f} missing inside: {stdout}");
        }
    }
    assert!(stdout.contains("localhost 127.0.0.1"), "{stdout}\n{stderr}");
    // Only in `all`: the other modes have no DNS inside.
    let policy = write_policy(dir.path(), "net:\n  mode: none\n");
    let out = run(
        &policy,
        &[],
        &["sh", "-c", "test -e /etc/hosts && echo hosts || echo none"],
    );
    assert_eq!(text(&out).0, "none\n");
}

#[test]
fn a_bridged_port_with_nothing_listening_fails_closed_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let closed = ClosedPort::new();
    let port = closed.port();
    let policy = write_policy(
        dir.path(),
        &format!("net:\n  mode: loopback\n  loopback_ports: [ {port} ]\n"),
    );
    let marker = dir.path().join("ran");
    let out = run(&policy, &[], &["touch", marker.to_str().unwrap()]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(70), "{stderr}");
    assert!(
        stderr.contains(&format!("host loopback port {port} (net.loopback_ports)")),
        "{stderr}"
    );
    assert!(!marker.exists(), "the command ran without its bridge");
    // A port that goes away after the start: the command's connection is reset, not
    // answered with an empty reply.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let closer = std::thread::spawn(move || {
        let _probe = listener.accept();
    });
    let policy = write_policy(
        dir.path(),
        &format!("net:\n  mode: loopback\n  loopback_ports: [ {port} ]\n"),
    );
    let out = run(
        &policy,
        &[],
        &[
            "sh",
            "-c",
            &format!("sleep 0.5; curl -sS -m 5 http://127.0.0.1:{port}/; echo \"curl=$?\""),
        ],
    );
    closer.join().unwrap();
    let (stdout, stderr) = text(&out);
    // The reset reaches curl while it connects (7) or once it has sent the request (56),
    // depending on timing; never an empty reply (52).
    assert!(
        (stdout.contains("curl=56") || stdout.contains("curl=7")) && !stderr.contains("Empty reply"),
        "{stdout}\n{stderr}"
    );
}

#[test]
fn the_summary_lists_upstream_failures_with_their_reason() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new().with("down.test", &["127.0.0.1"])));
    let closed = ClosedPort::new();
    let port = closed.port();
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        &allowlist(
            dns.addr(),
            &[format!("down.test:{port}"), format!("gone.test:{port}")],
        ),
    );
    let script = format!(
        "curl -s -o /dev/null http://down.test:{port}/; curl -s -o /dev/null http://gone.test:{port}/; curl -s -o /dev/null http://other.test:{port}/; true"
    );
    let out = run(&policy, &[], &["sh", "-c", &script]);
    let (_, stderr) = text(&out);
    for want in [
        format!("blocked: other.test:{port} (not allowlisted), once"),
        format!("failed: down.test:{port} (connection refused), once"),
        format!("failed: gone.test:{port} (dns), once"),
    ] {
        assert!(stderr.contains(&want), "missing {want:?}:\n{stderr}");
    }
}

/// A command that ends the moment its last requests are answered (a burst in parallel,
/// plain HTTP through the proxy and tunnels through its SOCKS5 port) cannot get one of them
/// off the record: when `sandgate run` returns, its kept audit log holds the decision and
/// the close of every one. The runner leaves its runtime without joining its threads, so
/// this is what an exit that came before the proxy's stop and flush would lose.
#[test]
fn every_request_of_a_command_that_exits_at_once_is_on_record_when_run_returns() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("burst.test", &["127.0.0.1"])));
    let port = origin.port();
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        &allowlist(dns.addr(), &[format!("burst.test:{port}")]),
    );
    const EACH: usize = 12;
    // Every curl waited for by its pid: one that failed fails the command.
    let script = format!(
        "pids=''; for i in $(seq {EACH}); do curl -fsS -o /dev/null http://burst.test:{port}/http-$i & pids=\"$pids $!\"; curl -fsS -o /dev/null --socks5-hostname 127.0.0.1:1080 http://burst.test:{port}/socks-$i & pids=\"$pids $!\"; done; for p in $pids; do wait $p || exit 9; done"
    );
    for round in 0..3 {
        let audit = dir.path().join(format!("audit-{round}.jsonl"));
        let out = run(
            &policy,
            &["--quiet", "--audit-log", audit.to_str().unwrap()],
            &["sh", "-c", &script],
        );
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let events = common::read_audit(&audit);
        // Per front end (plain HTTP through the HTTP proxy, tunnels through the SOCKS5
        // port): each request allowed once and closed once, under the same request id.
        for scheme in ["http", "socks5"] {
            let ids = |event: &str| {
                let mut ids: Vec<&str> = events
                    .iter()
                    .filter(|e| e["event"] == event && e["scheme"] == scheme)
                    .filter(|e| event != "decision" || e["decision"] == "allow")
                    .filter_map(|e| e["request_id"].as_str())
                    .collect();
                ids.sort_unstable();
                ids
            };
            let (decided, closed) = (ids("decision"), ids("close"));
            assert_eq!(
                decided.len(),
                EACH,
                "round {round}, {scheme}: {EACH} allowed:\n{stderr}\n{events:#?}"
            );
            assert_eq!(
                decided, closed,
                "round {round}, {scheme}: each decision closed on record:\n{stderr}\n{events:#?}"
            );
        }
    }
}

#[test]
fn a_403_inside_a_run_speaks_the_runs_language_and_names_its_audit_log() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new().with("other.test", &["127.0.0.1"])));
    let closed = ClosedPort::new();
    let port = closed.port();
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        &format!(
            "net:\n  mode: allowlist\n  allow_domains: [ \"allowed.test\" ]\n  resolver: {{ servers: [ \"{}\" ] }}\n",
            dns.addr()
        ),
    );
    let audit = dir.path().join("kept.jsonl");
    let script = format!("curl -s http://other.test:{port}/; true");
    let out = run(
        &policy,
        &["--audit-log", audit.to_str().unwrap()],
        &["sh", "-c", &script],
    );
    let (body, stderr) = text(&out);
    assert!(
        body.contains(&format!(
            "to allow it, add other.test:{port} to the allowlist (net.allow_domains, or --allow-domain other.test:{port})"
        )),
        "{body}\n{stderr}"
    );
    assert!(
        !body.contains("spec.network") && !body.contains("--allow "),
        "{body}"
    );
    let id = common::read_audit(&audit)
        .iter()
        .find(|e| e["decision"] == "deny")
        .and_then(|e| e["request_id"].as_str().map(str::to_owned))
        .unwrap();
    assert!(
        body.contains(&format!(
            "(sandgate explain --request-id {id} --audit-log {})",
            audit.display()
        )),
        "{body}"
    );
}

#[test]
fn the_sweep_removes_only_state_whose_lock_is_free() {
    let tmp = tempfile::tempdir().unwrap();
    // A run in another PID namespace: its pid means nothing here, but its lock is held.
    let absent_pid = (999_999..)
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap();
    let live = tmp.path().join(format!("sandgate-run-{absent_pid}-elsewhere"));
    let dead = tmp.path().join(format!("sandgate-run-{absent_pid}-gone"));
    for d in [&live, &dead] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("audit.jsonl"), "").unwrap();
    }
    let lock = std::fs::File::open(&live).unwrap();
    lock.lock().unwrap();
    let policy = write_policy(tmp.path(), "net:\n  mode: none\n");
    let out = Command::new(common::sandgate_bin())
        .args(["run", "--policy", policy.to_str().unwrap(), "--", "true"])
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(live.is_dir(), "a live run's state was swept");
    assert!(!dead.exists(), "an unlocked run's state was left");
    drop(lock);
}

#[test]
fn secret_looking_environment_is_withheld_and_a_bare_star_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("env.yaml");
    std::fs::write(
        &policy,
        base().replace(
            "env:\n  set:",
            "env:\n  passthrough: [ \"APP_*\", EXACT_PWD ]\n  set:",
        ) + "net:\n  mode: none\n",
    )
    .unwrap();
    let out = Command::new(common::sandgate_bin())
        .args([
            "run",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "env | sort",
        ])
        .env("APP_MODE", "fine")
        .env("APP_PATH", "/opt/app")
        .env("APP_GITHUB_PAT", "ghp-secret")
        .env("APP_MYSQL_PWD", "pwd-secret")
        .env("APP_DATABASE_URL", "postgres://app:url-secret@db/app")
        .env("EXACT_PWD", "listed-by-name")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("APP_MODE=fine") && stdout.contains("APP_PATH=/opt/app"),
        "{stdout}"
    );
    assert!(stdout.contains("EXACT_PWD=listed-by-name"), "{stdout}");
    for secret in ["ghp-secret", "pwd-secret", "url-secret"] {
        assert!(!stdout.contains(secret), "{secret} passed: {stdout}");
    }
    for name in ["APP_GITHUB_PAT", "APP_MYSQL_PWD", "APP_DATABASE_URL"] {
        assert!(stderr.contains(&format!("not passing {name}")), "{stderr}");
    }
    std::fs::write(
        &policy,
        base().replace("env:\n  set:", "env:\n  passthrough: [ \"*\" ]\n  set:"),
    )
    .unwrap();
    let out = run(&policy, &[], &["true"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out).1.contains("env.passthrough: \"*\""),
        "{:?}",
        text(&out)
    );
}

/// `--print-argv` prints only what a run would start: a policy the run refuses (its read
/// paths hold the temporary directory, where runs keep their bridge sockets) is refused the
/// same way, exit 64, with nothing printed. Before, it printed a bwrap command line and
/// exited 0 for a run that would not start.
#[test]
fn print_argv_refuses_what_a_run_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let doc = base().replace(
        "read_paths: [ ",
        &format!("read_paths: [ \"{}\", ", dir.path().display()),
    );
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, doc).unwrap();
    for args in [&["--print-argv"][..], &[]] {
        let out = sandbox_support::run_command(&policy, args, &["true"])
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stdout}\n{stderr}");
        assert!(
            stdout.is_empty() && stderr.contains("bridge sockets"),
            "{args:?}: {stdout}\n{stderr}"
        );
    }
}

/// This whole binary again as `nobody` when the tests run as root.
#[test]
fn the_usability_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody(
        "sandbox_usability_e2e",
        "the_usability_suite_passes_as_an_ordinary_user",
        8,
    );
}
