//! The bubblewrap command line, built by a pure function from the policy and the facts of
//! one run (where the sandgate binary and the bridge socket are). Unit-tested without bwrap;
//! `sandgate run --print-argv` prints it.
//!
//! Layout inside the sandbox: nothing of the host but the listed paths; a fresh /proc, a
//! minimal /dev, a private /tmp; in the proxied modes the bridge directory at
//! [`BRIDGE_DIR`] and the sandgate binary at [`INIT_PATH`], which runs first as the
//! sandbox's init, listens on the proxy port and starts the command.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::policy::{NetMode, SandboxPolicy};

/// Where the bridge directory (holding `proxy.sock`) appears inside the sandbox.
pub const BRIDGE_DIR: &str = "/run/sandgate";
/// Where the sandgate binary appears inside the sandbox.
pub const INIT_PATH: &str = "/run/sandgate-init";

/// The facts of one run that the policy does not hold.
#[derive(Debug, Clone)]
pub struct RunFacts {
    /// The sandgate binary, bound read-only into proxied sandboxes.
    pub sandgate_exe: PathBuf,
    /// The host directory holding the bridge socket (proxied modes).
    pub bridge_dir: Option<PathBuf>,
    /// The command's environment, complete (bwrap starts from an empty one).
    pub env: Vec<(String, String)>,
    pub command: Vec<OsString>,
}

fn push(argv: &mut Vec<OsString>, items: &[&str]) {
    argv.extend(items.iter().map(OsString::from));
}

fn bind(argv: &mut Vec<OsString>, flag: &str, path: &Path) {
    argv.push(flag.into());
    argv.push(path.into());
    argv.push(path.into());
}

/// The complete argv, starting with `bwrap`.
pub fn bwrap_argv(policy: &SandboxPolicy, facts: &RunFacts) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec!["bwrap".into()];
    push(
        &mut argv,
        &[
            "--die-with-parent",
            "--unshare-user",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ],
    );
    if policy.unshare_pid {
        push(&mut argv, &["--unshare-pid"]);
    }
    if policy.unshare_ipc {
        push(&mut argv, &["--unshare-ipc"]);
    }
    if policy.net != NetMode::All {
        // A private network namespace: bwrap brings its loopback up, nothing else exists.
        push(&mut argv, &["--unshare-net"]);
    }
    // Mount points first, then binds: a bind under /tmp must not be hidden by the tmpfs.
    if policy.allow_write_all {
        bind(&mut argv, "--bind", Path::new("/"));
    } else if policy.allow_read_all {
        bind(&mut argv, "--ro-bind", Path::new("/"));
    }
    push(&mut argv, &["--proc", "/proc", "--dev", "/dev"]);
    if policy.private_tmp {
        push(&mut argv, &["--tmpfs", "/tmp"]);
    }
    for t in &policy.extra_tmpfs {
        argv.push("--tmpfs".into());
        argv.push(t.into());
    }
    for p in policy.read_paths.iter().chain(&policy.extra_ro_binds) {
        bind(&mut argv, "--ro-bind", p);
    }
    for p in policy.write_paths.iter().chain(&policy.extra_rw_binds) {
        bind(&mut argv, "--bind", p);
    }
    let proxied = policy.net.proxied();
    let needs_init = proxied || !policy.loopback_ports.is_empty();
    if needs_init {
        if let Some(dir) = &facts.bridge_dir {
            argv.push("--bind".into());
            argv.push(dir.into());
            argv.push(BRIDGE_DIR.into());
        }
        argv.push("--ro-bind".into());
        argv.push(facts.sandgate_exe.clone().into());
        argv.push(INIT_PATH.into());
        // Our init waits for the command itself; bwrap need not add an init of its own.
        if policy.unshare_pid {
            push(&mut argv, &["--as-pid-1"]);
        }
    }
    push(&mut argv, &["--clearenv"]);
    for (k, v) in &facts.env {
        argv.push("--setenv".into());
        argv.push(k.into());
        argv.push(v.into());
    }
    if proxied {
        let proxy = format!("http://127.0.0.1:{}", policy.proxy_port);
        for k in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            push(&mut argv, &["--setenv", k, &proxy]);
        }
        for k in ["NO_PROXY", "no_proxy"] {
            push(&mut argv, &["--setenv", k, "localhost,127.0.0.1,::1"]);
        }
    }
    argv.push("--".into());
    if needs_init {
        argv.push(INIT_PATH.into());
        push(&mut argv, &["sandbox-init"]);
        if proxied {
            push(
                &mut argv,
                &[
                    "--forward",
                    &format!("127.0.0.1:{}={BRIDGE_DIR}/proxy.sock", policy.proxy_port),
                ],
            );
        }
        for port in &policy.loopback_ports {
            push(
                &mut argv,
                &[
                    "--forward",
                    &format!("127.0.0.1:{port}={BRIDGE_DIR}/port-{port}.sock"),
                ],
            );
        }
        argv.push("--".into());
    }
    argv.extend(facts.command.iter().cloned());
    argv
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn policy(text: &str) -> SandboxPolicy {
        crate::policy::parse(text, &BTreeMap::new(), &|_| true).unwrap()
    }

    fn facts() -> RunFacts {
        RunFacts {
            sandgate_exe: "/opt/sandgate".into(),
            bridge_dir: Some("/tmp/sg-1".into()),
            env: vec![("HOME".into(), "/work".into())],
            command: vec!["curl".into(), "https://a.example/".into()],
        }
    }

    fn joined(v: &[OsString]) -> String {
        v.iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn allowlist_mode_routes_through_the_init_and_the_bridge() {
        let p = policy(
            "fs:\n  read_paths: [ /usr ]\n  write_paths: [ /srv/out ]\nnet:\n  mode: allowlist\n  allow_domains: [ a.example ]\n",
        );
        let s = joined(&bwrap_argv(&p, &facts()));
        assert!(s.starts_with("bwrap --die-with-parent --unshare-user"), "{s}");
        assert!(s.contains("--unshare-net"));
        assert!(
            s.contains("--proc /proc --dev /dev --tmpfs /tmp --ro-bind /usr /usr --bind /srv/out /srv/out")
        );
        assert!(s.contains(
            "--bind /tmp/sg-1 /run/sandgate --ro-bind /opt/sandgate /run/sandgate-init --as-pid-1"
        ));
        assert!(s.contains("--clearenv --setenv HOME /work --setenv HTTP_PROXY http://127.0.0.1:3128"));
        assert!(s.contains("--setenv NO_PROXY localhost,127.0.0.1,::1"));
        assert!(s.ends_with(
            "-- /run/sandgate-init sandbox-init --forward 127.0.0.1:3128=/run/sandgate/proxy.sock -- curl https://a.example/"
        ));
    }

    #[test]
    fn none_and_all_modes() {
        let s = joined(&bwrap_argv(&policy("net:\n  mode: none\n"), &facts()));
        assert!(s.contains("--unshare-net") && !s.contains("sandbox-init") && !s.contains("HTTP_PROXY"));
        assert!(s.ends_with("-- curl https://a.example/"));
        let s = joined(&bwrap_argv(
            &policy("net:\n  mode: all\nfs:\n  allow_read_all: true\n"),
            &facts(),
        ));
        assert!(!s.contains("--unshare-net") && s.contains("--ro-bind / /"));
    }

    #[test]
    fn loopback_ports_are_forwarded_by_the_init() {
        let s = joined(&bwrap_argv(
            &policy("net:\n  mode: loopback\n  loopback_ports: [ 5432 ]\n"),
            &facts(),
        ));
        assert!(s.contains("--unshare-net") && !s.contains("HTTP_PROXY"), "{s}");
        assert!(
            s.ends_with("sandbox-init --forward 127.0.0.1:5432=/run/sandgate/port-5432.sock -- curl https://a.example/"),
            "{s}"
        );
    }

    #[test]
    fn nothing_of_the_host_unless_listed() {
        let s = joined(&bwrap_argv(
            &policy("net:\n  mode: none\nfs:\n  tmp: none\n"),
            &facts(),
        ));
        assert!(!s.contains("--bind") && !s.contains("--tmpfs"), "{s}");
    }
}
