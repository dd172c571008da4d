//! The sandbox as people first meet it, against the real binary and bubblewrap (issue 30):
//! - a working directory the sandbox lacks is said in one line; `--chdir` and `fs.cwd`;
//! - `ALL_PROXY` is the HTTP proxy by default, so httpx (the OpenAI and Anthropic SDKs'
//!   client) works without `socksio`; SOCKS5 where the policy asks;
//! - `--net none|loopback|all` wins over the policy's network fields, with one note.
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

use std::path::PathBuf;
use std::process::Command;

use sandbox_design_support::{Fixture, run_in};
use sandbox_support::{base, text, write_policy};

/// A working directory the sandbox does not have is said in one line (before, the command
/// silently started in HOME, here /tmp, and `cat agent.py` failed with its own "No such
/// file"); bound, it is where the command starts, without a line; `--chdir DIR` and
/// `fs.cwd` choose one, and one outside the sandbox is refused.
#[test]
fn the_working_directory_is_said_when_the_sandbox_lacks_it_and_can_be_chosen() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("agent.py"), "agent\n").unwrap();
    let project = project.canonicalize().unwrap();
    let script = ["sh", "-c", "pwd; cat agent.py"];

    // Not bound: HOME (/tmp, the private one), and one line saying so.
    let policy = write_policy(dir.path(), "");
    let out = run_in(&project, &policy, &[], &script);
    let (stdout, stderr) = text(&out);
    assert!(stdout.starts_with("/tmp\n"), "{stdout}\n{stderr}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("working directory"))
        .collect();
    assert_eq!(
        said,
        [format!(
            "sandgate: the working directory {} is not in the sandbox (no read or write path covers it, or a tmpfs hides it); starting in /tmp (HOME) instead; --chdir DIR or fs.cwd chooses another",
            project.display()
        )],
        "{stderr}"
    );
    // --quiet: no line.
    let out = run_in(&project, &policy, &["--quiet"], &script);
    assert!(!text(&out).1.contains("working directory"), "{}", text(&out).1);

    // Bound: the command starts there, nothing said.
    let bound = dir.path().join("bound.yaml");
    std::fs::write(
        &bound,
        base().replace("/etc/ssl,", &format!("/etc/ssl, \"{}\",", project.display())),
    )
    .unwrap();
    for (cwd, args) in [
        (project.as_path(), vec![]),
        (dir.path(), vec!["--chdir", project.to_str().unwrap()]),
    ] {
        let out = run_in(cwd, &bound, &args, &script);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{args:?}: {stdout}\n{stderr}");
        assert_eq!(
            stdout,
            format!("{}\nagent\n", project.display()),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("working directory"), "{args:?}: {stderr}");
    }
    // A relative --chdir is taken from the caller's directory.
    let out = run_in(dir.path(), &bound, &["--chdir", "project"], &script);
    assert_eq!(
        text(&out).0,
        format!("{}\nagent\n", project.display()),
        "{}",
        text(&out).1
    );

    // fs.cwd in the policy.
    let with_cwd = dir.path().join("cwd.yaml");
    std::fs::write(
        &with_cwd,
        std::fs::read_to_string(&bound)
            .unwrap()
            .replace("fs:\n", &format!("fs:\n  cwd: \"{}\"\n", project.display())),
    )
    .unwrap();
    let out = run_in(dir.path(), &with_cwd, &[], &script);
    let (stdout, stderr) = text(&out);
    assert_eq!(stdout, format!("{}\nagent\n", project.display()), "{stderr}");

    // Outside the sandbox: refused, naming the flag or the field (and its line).
    let out = run_in(
        dir.path(),
        &policy,
        &["--chdir", project.to_str().unwrap()],
        &script,
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--chdir {0}: {0} is not in the sandbox",
            project.display()
        )),
        "{stderr}"
    );
    let unbound = dir.path().join("unbound.yaml");
    std::fs::write(
        &unbound,
        base().replace("fs:\n", &format!("fs:\n  cwd: \"{}\"\n", project.display())),
    )
    .unwrap();
    let out = run_in(dir.path(), &unbound, &[], &script);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "unbound.yaml:6: fs.cwd: {} is not in the sandbox",
            project.display()
        )),
        "{stderr}"
    );
}

/// The Python venv of the tests, with httpx and without socksio: its `bin/python` (its
/// directory canonical, the link itself kept: it is what makes the venv), and the venv and
/// the interpreter it points to, as read paths.
fn venv_paths() -> (String, Vec<PathBuf>) {
    let given = PathBuf::from(common::python());
    let bin = given.parent().unwrap().canonicalize().unwrap();
    let python = bin.join(given.file_name().unwrap()).to_str().unwrap().to_owned();
    let out = Command::new(&python)
        .args([
            "-c",
            "import sys, httpx; print(sys.prefix); print(sys.base_prefix)",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let prefixes: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| PathBuf::from(l).canonicalize().unwrap())
        .collect();
    let socksio = Command::new(&python)
        .args(["-c", "import socksio"])
        .output()
        .unwrap();
    assert!(
        !socksio.status.success(),
        "the test's point is a client without socksio; this venv has it"
    );
    (python, prefixes)
}

/// httpx, as the OpenAI and Anthropic SDKs use it (a client built from the environment),
/// reaches an allowed origin through the run's proxy in both proxied modes. Before issue
/// 30, `ALL_PROXY=socks5h://...` made `httpx.Client()` raise ImportError ("Using SOCKS
/// proxy, but the 'socksio' package is not installed"). `net.proxy.all_proxy: socks5` still
/// names the SOCKS5 port.
#[test]
fn httpx_without_socksio_reaches_an_allowed_origin_through_the_runs_proxy() {
    let f = Fixture::new(&[]);
    let (python, prefixes) = venv_paths();
    let dir = tempfile::tempdir().unwrap();
    let reads: Vec<String> = prefixes.iter().map(|p| format!("\"{}\"", p.display())).collect();
    let code = format!(
        "import os, httpx\n\
         print('ALL_PROXY=' + os.environ['ALL_PROXY'])\n\
         with httpx.Client(timeout=10) as c:\n    \
             print('allowed', c.get('http://{}/httpx').status_code)\n    \
             print('denied', c.get('http://denied.test:{}/httpx').status_code)\n",
        f.allowed(),
        f.origin.port()
    );
    for mode in ["allowlist", "proxy"] {
        let policy = dir.path().join(format!("{mode}.yaml"));
        std::fs::write(
            &policy,
            format!(
                "{}net:\n  mode: {mode}\n  allow_domains: [ \"{}\" ]\n{}",
                base().replace("/etc/ssl,", &format!("/etc/ssl, {},", reads.join(", "))),
                f.allowed(),
                f.reach()
            ),
        )
        .unwrap();
        let out = run_in(dir.path(), &policy, &[], &[&python, "-c", &code]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{mode}: {stdout}\n{stderr}");
        assert_eq!(
            stdout, "ALL_PROXY=http://127.0.0.1:3128\nallowed 200\ndenied 403\n",
            "{mode}: {stderr}"
        );
    }
    let socks = write_policy(
        dir.path(),
        "net:\n  mode: allowlist\n  proxy: { all_proxy: socks5 }\n",
    );
    let out = run_in(
        dir.path(),
        &socks,
        &[],
        &["sh", "-c", "echo \"$ALL_PROXY $all_proxy\""],
    );
    assert_eq!(
        text(&out).0,
        "socks5h://127.0.0.1:1080 socks5h://127.0.0.1:1080\n",
        "{}",
        text(&out).1
    );
}

/// `--net none|loopback|all` on a policy with network fields: the flag wins, the fields are
/// set aside, and one note names them. Before issue 30: exit 64 ("need net.mode
/// allowlist"), with no line number.
#[test]
fn the_net_flag_wins_over_the_policys_network_fields_with_one_note() {
    let f = Fixture::new(&[]);
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        &format!(
            "net:\n  mode: allowlist\n  allow_domains: [ \"{}\" ]\n  denylist: [ evil.example ]\n  presets: [ python-packages ]\n{}",
            f.allowed(),
            f.reach()
        ),
    );
    let host = format!("http://127.0.0.1:{}/host", f.origin.port());
    let script = format!(
        "curl -sS -m 5 -o /dev/null -w 'host=%{{http_code}}\\n' {host} || echo host=exit$?; echo \"proxy=$HTTP_PROXY\""
    );
    for (mode, want) in [
        ("none", "host=exit7"),
        ("loopback", "host=exit7"),
        ("all", "host=200"),
    ] {
        let out = run_in(dir.path(), &policy, &["--net", mode], &["sh", "-c", &script]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{mode}: {stdout}\n{stderr}");
        assert!(
            stdout.contains(want) && stdout.contains("proxy=\n"),
            "{mode}: {stdout}\n{stderr}"
        );
        let notes: Vec<&str> = stderr.lines().filter(|l| l.contains("note:")).collect();
        assert_eq!(
            notes,
            [format!(
                "{}: note: --net {mode} wins over the policy's network fields; ignoring net.allow_domains, net.denylist, net.presets, net.allow_ranges, net.resolver",
                policy.display()
            )],
            "{mode}: {stderr}"
        );
    }
}
