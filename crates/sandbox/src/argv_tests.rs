//! The bwrap command line for each mode, checked as text.

use super::*;
use std::collections::BTreeMap;

fn policy(text: &str) -> SandboxPolicy {
    crate::policy::parse(text, &BTreeMap::new(), &|p| Ok(crate::paths::lexical(p)), None).unwrap()
}

fn facts() -> RunFacts {
    RunFacts {
        init_exe: "/opt/sandgate".into(),
        bridge_dir: Some("/tmp/sg-1/bridge".into()),
        bridge_data: Vec::new(),
        dns_files: vec![("/run/resolv/stub.conf".into(), "/etc/resolv.conf".into())],
        protected: Vec::new(),
        disable_userns: true,
        new_session: false,
        rlimits: vec!["nproc=512".into()],
        command: vec!["curl".into(), "https://a.example/".into()],
    }
}

/// The command line as one string, this build's identity written `BUILD`.
fn joined(v: &[OsString]) -> String {
    v.iter()
        .map(|s| s.to_string_lossy().into_owned())
        .map(|s| {
            if s == crate::steps::BUILD {
                "BUILD".into()
            } else {
                s
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn allowlist_mode_routes_through_the_init_and_the_bridge() {
    let p = policy(
        "fs:\n  read_paths: [ /usr ]\n  write_paths: [ /srv/out ]\nnet:\n  mode: allowlist\n  allow_domains: [ a.example ]\n",
    );
    let s = joined(&bwrap_argv(&p, &facts()));
    assert!(
        s.starts_with(
            "bwrap --die-with-parent --unshare-user --unshare-uts --unshare-cgroup-try --cap-drop ALL"
        ),
        "{s}"
    );
    assert!(s.contains("--unshare-net"));
    assert!(
        s.contains("--proc /proc --dev /dev --size 1073741824 --tmpfs /dev/shm --size 1073741824 --tmpfs /tmp --ro-bind /usr /usr --bind /srv/out /srv/out"),
        "{s}"
    );
    assert!(s.contains(" --disable-userns "), "{s}");
    assert!(
        s.contains(
            "--ro-bind /tmp/sg-1/bridge/proxy.sock /run/sandgate/proxy.sock --ro-bind /tmp/sg-1/bridge/socks.sock /run/sandgate/socks.sock --ro-bind /opt/sandgate /run/sandgate-init --remount-ro /dev --remount-ro / --as-pid-1"
        ),
        "{s}"
    );
    assert!(
        !s.contains("--setenv") && !s.contains("--clearenv") && !s.contains("HTTP_PROXY"),
        "{s}"
    );
    assert!(s.ends_with(
        "-- /run/sandgate-init sandbox-init --build BUILD --rlimit nproc=512 --forward 127.0.0.1:3128=/run/sandgate/proxy.sock --forward 127.0.0.1:1080=/run/sandgate/socks.sock -- curl https://a.example/"
    ), "{s}");
}

#[test]
fn the_socks5_port_has_its_own_forward_in_the_proxied_modes() {
    let ports = policy(
        "net:\n  mode: allowlist\n  loopback_ports: [ 5432 ]\n  allow_domains: [ a.example ]\n  proxy: { listen: \"127.0.0.1:8080\", socks_listen: \"127.0.0.1:9050\" }\n",
    );
    let s = joined(&bwrap_argv(&ports, &facts()));
    assert!(
        s.contains(
            "sandbox-init --build BUILD --rlimit nproc=512 --forward 127.0.0.1:8080=/run/sandgate/proxy.sock --forward 127.0.0.1:9050=/run/sandgate/socks.sock --forward 127.0.0.1:5432=/run/sandgate/port-5432.sock --"
        ),
        "{s}"
    );
    // Chained too: the run's proxy asks the upstream proxy for each SOCKS5 tunnel.
    let chained = policy(
        "net:\n  mode: proxy\n  proxy: { upstream: \"10.0.0.1:3128\" }\n  allow_domains: [ a.example ]\n",
    );
    let s = joined(&bwrap_argv(&chained, &facts()));
    assert!(
        s.contains(
            "sandbox-init --build BUILD --rlimit nproc=512 --forward 127.0.0.1:3128=/run/sandgate/proxy.sock --forward 127.0.0.1:1080=/run/sandgate/socks.sock -- "
        ),
        "{s}"
    );
}

#[test]
fn none_and_all_modes_start_the_command_through_the_init_which_confines_it() {
    // PID 1 is always sandgate's init (never bwrap's own reaper, which loads no filter),
    // without bridges where the mode has none.
    let s = joined(&bwrap_argv(&policy("net:\n  mode: none\n"), &facts()));
    assert!(
        s.contains("--unshare-net") && !s.contains("--forward") && !s.contains("/run/sandgate "),
        "{s}"
    );
    assert!(!s.contains("socks.sock"), "{s}");
    assert!(
        s.contains("--ro-bind /opt/sandgate /run/sandgate-init --remount-ro /dev --remount-ro / --as-pid-1"),
        "{s}"
    );
    assert!(
        s.ends_with(
            "-- /run/sandgate-init sandbox-init --build BUILD --rlimit nproc=512 -- curl https://a.example/"
        ),
        "{s}"
    );
    // Without a PID namespace (`pid: false`, net all only) there is no PID 1 to be.
    let nopid = joined(&bwrap_argv(
        &policy("net:\n  mode: all\nplatform:\n  bwrap: { unshare: { pid: false } }\n"),
        &facts(),
    ));
    assert!(
        !nopid.contains("sandbox-init") && !nopid.contains("--as-pid-1"),
        "{nopid}"
    );
    // The filter step is then the command's first.
    assert!(
        nopid.ends_with(
            "-- /run/sandgate-init sandbox-exec --build BUILD --rlimit nproc=512 -- curl https://a.example/"
        ),
        "{nopid}"
    );
    assert!(
        !s.contains("resolv"),
        "no DNS files without the host's network: {s}"
    );
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: all\nfs:\n  read_paths: [ /usr ]\n"),
        &facts(),
    ));
    assert!(!s.contains("--unshare-net"));
    assert!(
        s.contains("--ro-bind /run/resolv/stub.conf /etc/resolv.conf"),
        "{s}"
    );
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: all\nfs:\n  allow_read_all: true\n"),
        &facts(),
    ));
    assert!(s.contains("--ro-bind / /") && !s.contains("resolv"), "{s}");
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: all\nfs:\n  allow_write_all: true\n"),
        &facts(),
    ));
    assert!(s.contains("--bind / /") && !s.contains("--remount-ro / "), "{s}");
}

#[test]
fn unix_sockets_opt_in_reaches_the_filter_step() {
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: none\nplatform:\n  seccomp: { allow_unix_sockets: true }\n"),
        &facts(),
    ));
    assert!(
        s.ends_with(
            "sandbox-init --build BUILD --allow-unix-sockets --rlimit nproc=512 -- curl https://a.example/"
        ),
        "{s}"
    );
}

#[test]
fn loopback_ports_are_forwarded_by_the_init() {
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: loopback\n  loopback_ports: [ 5432 ]\n"),
        &facts(),
    ));
    assert!(
        s.contains("--unshare-net") && !s.contains("HTTP_PROXY") && !s.contains("socks.sock"),
        "{s}"
    );
    assert!(
        s.ends_with("sandbox-init --build BUILD --rlimit nproc=512 --forward 127.0.0.1:5432=/run/sandgate/port-5432.sock -- curl https://a.example/"),
        "{s}"
    );
    // The socket itself is bound, not the directory it is in.
    assert!(
        s.contains("--ro-bind /tmp/sg-1/bridge/port-5432.sock /run/sandgate/port-5432.sock ")
            && !s.contains("/tmp/sg-1/bridge "),
        "{s}"
    );
}

#[test]
fn nothing_of_the_host_unless_listed() {
    let s = joined(&bwrap_argv(
        &policy("net:\n  mode: none\nfs:\n  tmp: none\n"),
        &facts(),
    ));
    assert!(!s.contains("--bind") && s.matches("--tmpfs").count() == 1, "{s}");
    assert!(s.contains("--tmpfs /dev/shm"), "only a sized /dev/shm: {s}");
    assert_eq!(s.matches("--ro-bind").count(), 1, "only the sandgate binary: {s}");
}

#[test]
fn aliases_become_symlinks_unless_a_bind_already_shows_them() {
    let mut p = policy("fs:\n  read_paths: [ /usr ]\n");
    p.read_paths.push("/usr/lib".into());
    p.read_paths.push("/usr/lib/x86_64-linux-gnu".into());
    p.aliases = vec![
        crate::paths::Alias {
            at: "/lib".into(),
            target: "/usr/lib".into(),
        },
        crate::paths::Alias {
            at: "/lib/x86_64-linux-gnu".into(),
            target: "/usr/lib/x86_64-linux-gnu".into(),
        },
        crate::paths::Alias {
            at: "/usr/lib64".into(),
            target: "/usr/lib".into(),
        },
    ];
    let s = joined(&bwrap_argv(&p, &facts()));
    assert!(s.contains("--symlink /usr/lib /lib"), "{s}");
    assert_eq!(
        s.matches("--ro-bind /usr").count(),
        1,
        "binds under /usr are covered: {s}"
    );
    assert_eq!(s.matches("--symlink").count(), 1, "{s}");
}

/// The position of `needle` in `s` (which must hold it).
fn at(s: &str, needle: &str) -> usize {
    s.find(needle).unwrap_or_else(|| panic!("no {needle:?} in {s}"))
}

/// The attacker's way around a narrower mount: bwrap makes mounts in argv order and a later
/// bind of a parent hides an earlier mount under it, so a read-only `.git` listed inside a
/// writable project, or a tmpfs over `~/.ssh` inside a readable home, must come after the
/// parent's bind or it is not there at all.
#[test]
fn a_narrower_mount_inside_a_wider_one_comes_after_it() {
    let mut p = policy(
        "fs:\n  read_paths: [ /home/u, /proj/.git ]\n  write_paths: [ /proj ]\nplatform:\n  bwrap: { tmpfs: [ /home/u/.ssh ] }\n",
    );
    p.read_paths.push("/proj/.git/objects".into());
    p.write_paths.push("/proj/.git/objects/tmp".into());
    let s = joined(&bwrap_argv(&p, &facts()));
    assert!(
        at(&s, "--bind /proj /proj") < at(&s, "--ro-bind /proj/.git /proj/.git"),
        "{s}"
    );
    assert!(
        at(&s, "--ro-bind /home/u /home/u") < at(&s, "--tmpfs /home/u/.ssh"),
        "{s}"
    );
    // Inside the read-only .git, a read-only path changes nothing; a writable one under it
    // comes after it.
    assert!(!s.contains("--ro-bind /proj/.git/objects "), "{s}");
    assert!(
        at(&s, "--ro-bind /proj/.git") < at(&s, "--bind /proj/.git/objects/tmp"),
        "{s}"
    );
    // Every mount's parents are mounted before it.
    let mounts: Vec<(usize, &str)> = [
        "/home/u ",
        "/home/u/.ssh",
        "/proj ",
        "/proj/.git ",
        "/proj/.git/objects/tmp",
    ]
    .iter()
    .map(|m| (at(&s, m), *m))
    .collect();
    for (i, outer) in &mounts {
        for (j, inner) in &mounts {
            if inner.trim_end().starts_with(&format!("{}/", outer.trim_end())) {
                assert!(i < j, "{outer} after {inner}: {s}");
            }
        }
    }
}

#[test]
fn a_path_listed_as_read_and_write_is_writable_and_binds_under_tmp_show_through() {
    let p = policy("fs:\n  read_paths: [ /data, /tmp/in ]\n  write_paths: [ /data ]\n");
    let s = joined(&bwrap_argv(&p, &facts()));
    assert!(
        at(&s, "--ro-bind /data /data") < at(&s, "--bind /data /data"),
        "{s}"
    );
    assert!(
        at(&s, "--tmpfs /tmp") < at(&s, "--ro-bind /tmp/in /tmp/in"),
        "{s}"
    );
}

/// The run's own files are bound read-only over themselves only where a write path covers
/// them: elsewhere they stay hidden (or are read-only already).
#[test]
fn the_runs_own_files_are_read_only_under_a_write_path_and_hidden_elsewhere() {
    let p = policy("fs:\n  read_paths: [ /etc/team, /proj/.git, /proj/conf/ro ]\n  write_paths: [ /proj ]\n");
    let mut f = facts();
    f.protected = vec![
        "/proj/sandgate.yaml".into(),
        "/proj/conf/team/egress.yaml".into(),
        "/proj/.git/audit.jsonl".into(),
        "/etc/team/policy.yaml".into(),
        "/home/u/.local/state/sandgate/runs/run-1.jsonl".into(),
    ];
    let s = joined(&bwrap_argv(&p, &f));
    assert!(
        at(&s, "--bind /proj /proj") < at(&s, "--ro-bind /proj/sandgate.yaml /proj/sandgate.yaml"),
        "{s}"
    );
    // The directories between the write path and a file deeper down are pinned (bound over
    // themselves, in order), so they cannot be renamed away; then the file, read-only.
    let pins = [
        "--bind /proj/conf /proj/conf",
        "--bind /proj/conf/team /proj/conf/team",
        "--ro-bind /proj/conf/team/egress.yaml /proj/conf/team/egress.yaml",
    ];
    assert!(at(&s, "--bind /proj /proj") < at(&s, pins[0]), "{s}");
    assert!(
        at(&s, pins[0]) < at(&s, pins[1]) && at(&s, pins[1]) < at(&s, pins[2]),
        "{s}"
    );
    // A pin comes before the mounts inside it.
    assert!(at(&s, pins[0]) < at(&s, "--ro-bind /proj/conf/ro"), "{s}");
    for elsewhere in ["/proj/.git/audit.jsonl", "/etc/team/policy.yaml", "/home/u/"] {
        assert!(!s.contains(&format!("--ro-bind {elsewhere}")), "{elsewhere}: {s}");
    }
}

/// The runs directory and the run's own log inside it, both under a writable home (the
/// review's finding: the log's pins made the directory writable again over its read-only
/// bind, and the command removed other runs' logs).
#[test]
fn a_protected_directory_stays_read_only_with_a_protected_file_inside() {
    let p = policy("fs:\n  write_paths: [ /home/u ]\n");
    let mut f = facts();
    let runs = "/home/u/.local/state/sandgate/runs";
    // In either order.
    for protected in [
        vec![format!("{runs}/run-1.jsonl").into(), runs.into()],
        vec![runs.into(), format!("{runs}/run-1.jsonl").into()],
    ] {
        f.protected = protected;
        let s = joined(&bwrap_argv(&p, &f));
        assert!(s.contains(&format!("--ro-bind {runs} {runs}")), "{s}");
        assert!(
            !s.contains(&format!("--bind {runs} {runs}")),
            "the runs directory pinned writable: {s}"
        );
        assert!(
            !s.contains(&format!("{runs}/run-1.jsonl")),
            "the log needs nothing more: {s}"
        );
        // The directories above it, between it and the write path, are pinned first.
        assert!(
            at(&s, "--bind /home/u/.local /home/u/.local") < at(&s, &format!("--ro-bind {runs} {runs}")),
            "{s}"
        );
    }
}

#[test]
fn limits_size_every_tmpfs_and_a_no_terminal_run_gets_a_session_of_its_own() {
    let p = policy(
        "fs:\n  read_paths: [ /usr ]\nplatform:\n  bwrap: { tmpfs: [ /usr/cache ] }\nlimits: { tmpfs: 16MiB }\n",
    );
    let mut f = facts();
    f.new_session = true;
    f.disable_userns = false;
    let s = joined(&bwrap_argv(&p, &f));
    assert!(s.contains("--size 16777216 --tmpfs /tmp "), "{s}");
    assert!(s.contains("--size 16777216 --tmpfs /usr/cache"), "{s}");
    assert!(
        s.contains(" --new-session ") && !s.contains("--disable-userns"),
        "{s}"
    );
    let p = policy("limits: { tmpfs: off }\n");
    let s = joined(&bwrap_argv(&p, &facts()));
    assert!(!s.contains("--size") && !s.contains("--new-session"), "{s}");
}

/// The start directory is always bwrap's `--chdir` once chosen, after the mounts (so it is
/// there), before the command; never left to bwrap's fallback to HOME or `/`.
#[test]
fn the_start_directory_is_given_to_bwrap() {
    let mut p = policy("fs:\n  read_paths: [ /usr ]\n  write_paths: [ /srv/p ]\n  cwd: /srv/p\n");
    let s = joined(&bwrap_argv(&p, &facts()));
    assert!(
        s.contains(
            "--remount-ro / --chdir /srv/p --as-pid-1 -- /run/sandgate-init sandbox-init --build BUILD"
        ),
        "{s}"
    );
    p.cwd = None;
    assert!(!joined(&bwrap_argv(&p, &facts())).contains("--chdir"));
}

/// An intercepting run's CA files come to bwrap as data from the descriptors the runner
/// made; they are never bound from the host's bridge directory, the sockets still are.
#[test]
fn the_interception_cas_files_are_data_not_host_files() {
    let p = policy(
        "net:\n  mode: allowlist\n  allowlist:\n    - host: ro.example\n      ports: [443]\n      read_only: true\n",
    );
    assert!(p.intercepts());
    let mut f = facts();
    f.bridge_data = vec![(super::CA_CERT, 7), (super::CA_BUNDLE, 8)];
    let s = joined(&bwrap_argv(&p, &f));
    assert!(
        s.contains("--ro-bind /tmp/sg-1/bridge/proxy.sock /run/sandgate/proxy.sock ")
            && s.contains(
                "--ro-bind-data 7 /run/sandgate/ca.pem --ro-bind-data 8 /run/sandgate/ca-bundle.pem "
            ),
        "{s}"
    );
    assert!(!s.contains("/tmp/sg-1/bridge/ca"), "{s}");
    // `--print-argv` has no descriptors: it still prints data, never a host path (it
    // printed `--ro-bind /tmp/sg-1/bridge/ca.pem ...`, which the run does not do).
    let printed = joined(&bwrap_argv(&p, &facts()));
    assert!(
        printed.contains(
            "--ro-bind-data FD /run/sandgate/ca.pem --ro-bind-data FD /run/sandgate/ca-bundle.pem "
        ),
        "{printed}"
    );
    assert!(!printed.contains("/tmp/sg-1/bridge/ca"), "{printed}");
}
