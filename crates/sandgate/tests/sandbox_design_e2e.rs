//! The design's sandbox policy as written (design 003, "Policy YAML"), against the real
//! binary and bubblewrap (issue 30):
//! - `net.mode: proxy` with `proxy: { listen: 127.0.0.1:0, upstream: null }` is a proxy the
//!   run manages, filtering by `allow_domains`; `upstream: HOST:PORT` is resolved once at
//!   start through the run's resolver (a name only the test's DNS server knows);
//! - `platform.bwrap.unshare.net` is the network mode in the design's spelling;
//! - the design's example file loads with `check-config` and runs as the design says.
//!
//! Every server is the test's own, on loopback.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;
mod sandbox_design_support;
mod sandbox_support;

use std::path::{Path, PathBuf};

use sandbox_design_support::{Fixture, lib64, run_in, sandgate_in};
use sandbox_support::{base, text, write_policy};

/// `net.mode: proxy` as the design writes it: no upstream, the run's own proxy, filtering by
/// `allow_domains`. Before issue 30 the policy was refused ("needs net.proxy.upstream").
#[test]
fn proxy_mode_without_an_upstream_is_the_runs_own_filtering_proxy() {
    let f = Fixture::new(&[]);
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        &format!(
            "net:\n  mode: proxy\n  allow_domains: [ \"{}\" ]\n  proxy: {{ listen: 127.0.0.1:0, upstream: null }}\n{}",
            f.allowed(),
            f.reach()
        ),
    );
    let checked = sandgate_in(
        dir.path(),
        dir.path(),
        &["check-config", policy.to_str().unwrap()],
    );
    let (stdout, stderr) = text(&checked);
    assert!(checked.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("net mode proxy"), "{stdout}");
    let audit = dir.path().join("audit.jsonl");
    let script = format!(
        "echo \"HTTP_PROXY=$HTTP_PROXY\"\n{}{}",
        f.curl("allowed", "allowed.test"),
        f.curl("denied", "denied.test")
    );
    let out = run_in(
        dir.path(),
        &policy,
        &["--audit-log", audit.to_str().unwrap()],
        &["sh", "-c", &script],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for want in ["HTTP_PROXY=http://127.0.0.1:3128", "allowed=200", "denied=403"] {
        assert!(stdout.contains(want), "missing {want}:\n{stdout}\n{stderr}");
    }
    let events = common::read_audit(&audit);
    let decided: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["event"] == "decision")
        .map(|e| {
            (
                e["destination_host"].as_str().unwrap_or_default(),
                e["decision"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        decided,
        [("allowed.test", "allow"), ("denied.test", "deny")],
        "{events:#?}"
    );
}

/// `upstream: HOST:PORT`: the name is known only to the test's DNS server (the policy's
/// `net.resolver`), so only the run's own resolver can find it; the upstream proxy then sees
/// the allowed request. A name with no answer stops the run before the command starts.
/// Before issue 30 any name was refused ("is not IP:PORT").
#[test]
fn an_upstream_proxy_named_by_host_is_resolved_through_the_runs_resolver() {
    let f = Fixture::new(&[("upstream.test", "127.0.0.1")]);
    let dns = f.dns.addr().to_string();
    let allow = f.allowed();
    let upstream = common::ProxyProcess::start(&[
        "--dns-server",
        &dns,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &allow,
    ]);
    let dir = tempfile::tempdir().unwrap();
    let policy_for = |host: &str| {
        write_policy(
            dir.path(),
            &format!(
                "net:\n  mode: proxy\n  allow_domains: [ \"{allow}\" ]\n  proxy: {{ upstream: \"{host}:{}\" }}\n  resolver: {{ servers: [ \"{dns}\" ] }}\n",
                upstream.addr.port()
            ),
        )
    };
    let policy = policy_for("upstream.test");
    let script = format!(
        "{}{}",
        f.curl("chained", "allowed.test"),
        f.curl("local", "denied.test")
    );
    let out = run_in(dir.path(), &policy, &[], &["sh", "-c", &script]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("chained=200"), "{stdout}\n{stderr}");
    // The run's own allowlist refuses first; the upstream never sees that one.
    assert!(stdout.contains("local=403"), "{stdout}\n{stderr}");
    let events = upstream.audit_events(1);
    let seen: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "decision")
        .map(|e| e["destination_host"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(seen, ["allowed.test"], "{events:#?}");
    assert!(f.dns.questions_about("upstream.test") >= 1);

    let policy = policy_for("nowhere.test");
    let out = run_in(dir.path(), &policy, &[], &["sh", "-c", "echo started"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(69), "{stdout}\n{stderr}");
    assert!(!stdout.contains("started"), "{stdout}");
    assert!(
        stderr.contains("net.proxy.upstream: cannot resolve nowhere.test"),
        "{stderr}"
    );
}

/// The design's `platform.bwrap.unshare.net`: `false` shares the host's network (mode all),
/// `true` is a network of the sandbox's own; alone it decides the mode, beside `net.mode` it
/// must agree (an error naming the field and its line). Before issue 30 it was refused as
/// `platform.bwrap.net: unknown field`.
#[test]
fn unshare_net_is_the_designs_spelling_of_the_network_mode() {
    let f = Fixture::new(&[]);
    let dir = tempfile::tempdir().unwrap();
    let origin = format!("http://127.0.0.1:{}/host", f.origin.port());
    let script =
        format!("curl -sS -m 5 -o /dev/null -w 'host=%{{http_code}}\\n' {origin} || echo host=exit$?");
    for (unshare, want) in [("false", "host=200"), ("true", "host=exit7")] {
        let policy = write_policy(
            dir.path(),
            &format!("platform:\n  bwrap:\n    unshare:\n      net: {unshare}\n"),
        );
        let out = run_in(dir.path(), &policy, &[], &["sh", "-c", &script]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{unshare}: {stdout}\n{stderr}");
        assert!(stdout.contains(want), "{unshare}: {stdout}\n{stderr}");
    }
    let policy = write_policy(
        dir.path(),
        "net:\n  mode: allowlist\nplatform:\n  bwrap:\n    unshare:\n      net: false\n",
    );
    let out = run_in(dir.path(), &policy, &[], &["true"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    let line = base().lines().count() + 6;
    assert!(
        stderr.contains(&format!(
            "policy.yaml:{line}: platform.bwrap.unshare.net: false is the host's network (net.mode all), but net.mode is allowlist"
        )),
        "{stderr}"
    );
}

/// The design's policy, field for field as design 003 lists them (`env`, `fs`, `net` with
/// `proxy: { listen: 127.0.0.1:0, upstream: null }`, both `platform` sections), with its
/// paths as parameters. No `apiVersion`/`kind`: the design has none (read with a warning).
fn design_policy(bundle: &Path, work: &Path, allow: &str, reach: &str) -> String {
    format!(
        r#"env:
  set: {{ JUPYTER_CONFIG_DIR: "{b}/jupyter/config", JUPYTER_DATA_DIR: "{w}/jupyter", HOME: "{w}", PYTHONPYCACHEPREFIX: /tmp/pycache, MPLCONFIGDIR: /tmp/mpl, PATH: "{b}/bin:/usr/bin:/bin" }}
  passthrough: [ OPENAI_API_KEY, HTTP_PROXY, HTTPS_PROXY ]
fs:
  allow_write_all: false
  allow_read_all: false
  read_paths: [ /usr, /lib, /bin, /etc/ssl{lib64}, "{b}" ]
  write_paths: [ "{w}" ]
net:
  mode: proxy
  allow_domains: [ {allow} ]
  proxy: {{ listen: 127.0.0.1:0, upstream: null }}
{reach}platform:
  seatbelt: {{ trace: false, extra_allow: {{ mach-lookup: [ com.apple.fonts ], system-socket: false, dev: {{ allow_tty_writes: false }}, file_read_extra: [ /Library/Fonts ] }} }}
  bwrap: {{ ro_bind: [ "{b}/kernels" ], rw_bind: [ ], tmpfs: [ "{w}/.cache" ], unshare: {{ net: true, pid: true, ipc: true }}, devices: [ null, urandom, random ] }}
"#,
        b = bundle.display(),
        w = work.display(),
        lib64 = lib64(),
    )
}

/// The design's example loads with `check-config` as written, and `sandgate run` does what
/// the design says: the proxy is spawned and named by `HTTP(S)_PROXY` inside (over the
/// host's passed-through values), filters by `allow_domains`, and is torn down on exit;
/// read paths are read-only, write paths writable, the tmpfs hides what is there, the
/// devices are there. Before issue 30 it was refused (`net.mode proxy needs
/// net.proxy.upstream`; then `platform.seatbelt`, `unshare.net`).
#[test]
fn the_designs_example_policy_loads_and_runs_as_the_design_says() {
    let f = Fixture::new(&[]);
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("control");
    let work = dir.path().join("work");
    std::fs::create_dir_all(bundle.join("kernels")).unwrap();
    std::fs::create_dir_all(bundle.join("bin")).unwrap();
    std::fs::create_dir_all(work.join(".cache")).unwrap();
    std::fs::write(work.join(".cache/hidden"), "host cache").unwrap();
    let (bundle, work) = (bundle.canonicalize().unwrap(), work.canonicalize().unwrap());

    let as_written = dir.path().join("design.yaml");
    std::fs::write(&as_written, design_policy(&bundle, &work, "api.openai.com", "")).unwrap();
    let checked = sandgate_in(
        dir.path(),
        dir.path(),
        &["check-config", as_written.to_str().unwrap()],
    );
    let (stdout, stderr) = text(&checked);
    assert!(checked.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("net mode proxy"), "{stdout}");
    assert!(stderr.contains("warning: no apiVersion and kind"), "{stderr}");
    let out = run_in(
        dir.path(),
        &as_written,
        &[],
        &["sh", "-c", &f.curl("denied", "denied.test")],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("denied=403"), "{stdout}\n{stderr}");

    // The same file with the test's origin allowed and its DNS server and loopback range.
    let policy = dir.path().join("design-test.yaml");
    std::fs::write(
        &policy,
        design_policy(&bundle, &work, &format!("\"{}\"", f.allowed()), &f.reach()),
    )
    .unwrap();
    let script = format!(
        "echo \"HTTP_PROXY=$HTTP_PROXY HTTPS_PROXY=$HTTPS_PROXY HOME=$HOME\"\n\
         echo \"JUPYTER_CONFIG_DIR=$JUPYTER_CONFIG_DIR\"\n\
         echo out > {w}/out && echo wrote-work\n\
         echo x > {b}/x 2>/dev/null || echo bundle-read-only\n\
         cat {w}/.cache/hidden 2>/dev/null || echo cache-hidden\n\
         head -c 4 /dev/urandom | wc -c\n\
         {allowed}{denied}",
        w = work.display(),
        b = bundle.display(),
        allowed = f.curl("allowed", "allowed.test"),
        denied = f.curl("denied", "denied.test"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let out = sandgate_in(
        dir.path(),
        tmp.path(),
        &[
            "run",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for want in [
        format!(
            "HTTP_PROXY=http://127.0.0.1:3128 HTTPS_PROXY=http://127.0.0.1:3128 HOME={}",
            work.display()
        ),
        format!("JUPYTER_CONFIG_DIR={}/jupyter/config", bundle.display()),
        "wrote-work".to_owned(),
        "bundle-read-only".to_owned(),
        "cache-hidden".to_owned(),
        "4".to_owned(),
        "allowed=200".to_owned(),
        "denied=403".to_owned(),
    ] {
        assert!(
            stdout.lines().any(|l| l == want),
            "missing {want}:\n{stdout}\n{stderr}"
        );
    }
    assert_eq!(std::fs::read_to_string(work.join("out")).unwrap(), "out\n");
    assert!(!bundle.join("x").exists());
    // Torn down: the run's state (its proxy's bridge sockets) is gone with it.
    let left: Vec<PathBuf> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
