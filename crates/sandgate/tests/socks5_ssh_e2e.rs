//! `git ls-remote` over SSH through SOCKS5, with real tools: Debian's sshd behind a loopback
//! port P the test holds (`sshd -i` per connection), run as an ordinary user of its own
//! (`sandgate-ci`, created by scripts/test), OpenSSH's client with
//! `ProxyCommand nc -X 5 -x SOCKS %h %p` (netcat-openbsd), and git. Through `sandgate proxy --socks-listen` and from inside
//! `sandgate run` (its SOCKS5 port, named by `ALL_PROXY`): allowed only by an entry naming
//! the port, `git.test:P`; a bare `git.test` allows 80 and 443 only, so it refuses, and the
//! audit log says so.

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

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::world::{base_args, strs};
use common::{ProxyProcess, runtime};
use sandgate_testkit::dns::{DnsServer, Zone};
use serde_json::Value;

/// The ordinary user sshd runs as when the tests run as root (scripts/test creates it).
const SSHD_USER: &str = "sandgate-ci";
/// The name the tests give the SSH server (the test DNS answers 127.0.0.1).
const HOST: &str = "git.test";

fn sh(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A user's sshd behind 127.0.0.1:`port`, serving one bare repository with one commit. The
/// test holds the listening socket (bound to port 0, so the port is never free for another
/// process to take) and starts `sshd -i` (inetd mode) for each connection, the connection
/// as its standard input and output. Sessions are killed when dropped.
struct Sshd {
    port: u16,
    user: String,
    repo: PathBuf,
    commit: String,
    log: PathBuf,
    sessions: Arc<Mutex<Vec<Child>>>,
    stop: Arc<AtomicBool>,
    _files: tempfile::TempDir,
    _log_dir: tempfile::TempDir,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // Wake the accept loop so that it sees the stop and lets the listener go.
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
        for child in self.sessions.lock().unwrap().iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Sshd {
    /// Serves `authorized` (a public key line), as [`SSHD_USER`] when the tests run as root,
    /// else as the current user. Checks the configuration first (`sshd -t`).
    fn start(authorized: &str) -> Sshd {
        let user = if common::is_root() {
            let known = Command::new("id").arg(SSHD_USER).output().unwrap();
            assert!(
                known.status.success(),
                "user {SSHD_USER} does not exist: run scripts/test, which creates it (useradd) and installs openssh-server, netcat-openbsd and git"
            );
            SSHD_USER.to_owned()
        } else {
            String::from_utf8(sh("id", &["-un"]).stdout)
                .unwrap()
                .trim()
                .to_owned()
        };
        assert!(
            Path::new("/usr/sbin/sshd").exists(),
            "no /usr/sbin/sshd: run scripts/test (it installs openssh-server)"
        );
        let files = tempfile::tempdir().unwrap();
        let dir = files.path();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let host_key = dir.join("host_key");
        sh(
            "ssh-keygen",
            &["-q", "-t", "ed25519", "-N", "", "-f", host_key.to_str().unwrap()],
        );
        let keys = dir.join("authorized_keys");
        std::fs::write(&keys, authorized).unwrap();
        let (repo, commit) = bare_repository(dir);
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "HostKey {}\nAuthorizedKeysFile {}\n\
                 UsePAM no\nStrictModes no\nPidFile none\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nAllowUsers {user}\n",
                host_key.display(),
                keys.display()
            ),
        )
        .unwrap();
        if common::is_root() {
            sh("chown", &["-R", &format!("{SSHD_USER}:"), dir.to_str().unwrap()]);
        }
        let log_dir = tempfile::tempdir().unwrap();
        let log = log_dir.path().join("sshd.log");
        std::fs::write(&log, "").unwrap();
        let checked = sshd_command(&config).arg("-t").output().unwrap();
        assert!(
            checked.status.success(),
            "sshd -t: {}",
            String::from_utf8_lossy(&checked.stderr)
        );
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let sessions = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (kept, stopping, session_log) = (sessions.clone(), stop.clone(), log.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let stderr = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&session_log)
                    .unwrap();
                let input = OwnedFd::from(conn.try_clone().unwrap());
                let session = sshd_command(&config)
                    .args(["-i", "-e"])
                    .stdin(Stdio::from(input))
                    .stdout(Stdio::from(OwnedFd::from(conn)))
                    .stderr(stderr)
                    .spawn()
                    .expect("start sshd -i");
                kept.lock().unwrap().push(session);
            }
        });
        Sshd {
            port,
            user,
            repo,
            commit,
            log,
            sessions,
            stop,
            _files: files,
            _log_dir: log_dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn url(&self) -> String {
        format!("ssh://{}@{HOST}:{}{}", self.user, self.port, self.repo.display())
    }
}

/// `/usr/sbin/sshd -f config`, as [`SSHD_USER`] when the tests run as root. Not root, sshd
/// neither separates privileges nor needs /run/sshd: it serves only the user it runs as.
/// setpriv executes it in place (runuser would stay its parent, and killing runuser would
/// leave sshd running).
fn sshd_command(config: &Path) -> Command {
    let mut command = if common::is_root() {
        let id = |flag: &str| String::from_utf8(sh("id", &[flag, SSHD_USER]).stdout).unwrap();
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={}", id("-u").trim()))
            .arg(format!("--regid={}", id("-g").trim()))
            .args(["--init-groups", "--", "/usr/sbin/sshd"]);
        c
    } else {
        Command::new("/usr/sbin/sshd")
    };
    command.arg("-f").arg(config);
    command
}

/// `dir/repo.git`, bare, with one commit on `main`; and that commit's id.
fn bare_repository(dir: &Path) -> (PathBuf, String) {
    let work = dir.join("work");
    let repo = dir.join("repo.git");
    let git = |args: &[&str]| {
        let mut all = vec!["-c", "user.name=sandgate", "-c", "user.email=ci@sandgate.test"];
        all.extend_from_slice(args);
        sh("git", &all)
    };
    git(&["init", "-q", "-b", "main", work.to_str().unwrap()]);
    git(&[
        "-C",
        work.to_str().unwrap(),
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "one",
    ]);
    git(&[
        "clone",
        "-q",
        "--bare",
        work.to_str().unwrap(),
        repo.to_str().unwrap(),
    ]);
    let commit = git(&["-C", work.to_str().unwrap(), "rev-parse", "HEAD"]).stdout;
    (repo, String::from_utf8(commit).unwrap().trim().to_owned())
}

/// A client key pair in its own directory, readable only by `owner` (a uid) when given.
fn client_key(owner: Option<u32>) -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = dir.path().join("id_ed25519");
    sh(
        "ssh-keygen",
        &[
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "sandgate-test",
            "-f",
            key.to_str().unwrap(),
        ],
    );
    if let Some(uid) = owner {
        sh("chown", &[&format!("{uid}:{uid}"), key.to_str().unwrap()]);
    }
    let public = std::fs::read_to_string(dir.path().join("id_ed25519.pub")).unwrap();
    (dir, key, public)
}

/// The `GIT_SSH_COMMAND` that reaches the server through the SOCKS5 proxy at `socks`
/// (`HOST:PORT`), which is given the name unresolved (`nc -X 5`).
fn ssh_command(key: &Path, socks: &str) -> String {
    format!(
        "ssh -F /dev/null -i {} -o IdentitiesOnly=yes -o BatchMode=yes -o ConnectTimeout=10 \
         -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR \
         -o ProxyCommand='nc -X 5 -x {socks} %h %p'",
        key.display()
    )
}

/// Waits at most 30 s for `child`, then kills it; returns (success, stdout, stderr).
fn finish(mut child: Child) -> (bool, String, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn decisions(events: &[Value]) -> Vec<(String, u64, String)> {
    events
        .iter()
        .filter(|e| e["event"] == "decision" && e["scheme"] == "socks5")
        .map(|e| {
            (
                e["destination_host"].as_str().unwrap_or_default().to_owned(),
                e["destination_port"].as_u64().unwrap_or_default(),
                e["reason_code"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn ls_remote_via(sshd: &Sshd, key: &Path, socks: SocketAddr) -> (bool, String, String) {
    let child = Command::new("git")
        .args(["ls-remote", &sshd.url()])
        .env("GIT_SSH_COMMAND", ssh_command(key, &socks.to_string()))
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish(child)
}

#[test]
fn git_ls_remote_over_ssh_through_socks5_needs_the_port_listed() {
    let (_keys, key, public) = client_key(None);
    let sshd = Sshd::start(&public);
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new().with(HOST, &["127.0.0.1"])));
    let port = sshd.port;
    for (entry, allowed) in [(format!("{HOST}:{port}"), true), (HOST.to_owned(), false)] {
        let mut args = base_args(&dns);
        args.extend([
            "--allow".into(),
            entry.clone(),
            "--socks-listen".into(),
            "127.0.0.1:0".into(),
        ]);
        // The proxy as an ordinary user (nobody) when the tests run as root.
        let (proxy, _bin) = ProxyProcess::start_unprivileged(&strs(&args));
        assert_eq!(proxy.listening(2).len(), 2);
        let socks = proxy.listener(&["role=socks5"]);
        let (ok, stdout, stderr) = ls_remote_via(&sshd, &key, socks);
        let events = proxy.audit_events(if allowed { 2 } else { 1 });
        let seen = decisions(&events);
        if allowed {
            assert!(ok, "{entry}: {stderr}\nsshd:\n{}", sshd.log());
            assert_eq!(
                stdout,
                format!(
                    "{commit}\tHEAD\n{commit}\trefs/heads/main\n",
                    commit = sshd.commit
                ),
                "{stderr}"
            );
            // nc sends the name: the proxy resolves and decides it.
            assert_eq!(
                seen,
                [(HOST.to_owned(), u64::from(port), "allowlisted".to_owned())],
                "{events:#?}"
            );
            assert!(
                events
                    .iter()
                    .any(|e| e["event"] == "close" && e["outcome"] == "ok"),
                "{events:#?}"
            );
        } else {
            assert!(!ok, "a bare entry allowed port {port}:\n{stdout}");
            assert_eq!(
                seen,
                [(HOST.to_owned(), u64::from(port), "not_allowlisted".to_owned())],
                "{events:#?}"
            );
            assert!(events.iter().all(|e| e["decision"] != "allow"), "{events:#?}");
        }
    }
}

#[test]
fn git_ls_remote_over_ssh_from_inside_sandgate_run() {
    // Inside, as outside: `nobody` when the tests run as root (sshd stays sandgate-ci's).
    let unprivileged = common::is_root();
    let (keys, key, public) = client_key(unprivileged.then_some(65534));
    let sshd = Sshd::start(&public);
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new().with(HOST, &["127.0.0.1"])));
    let port = sshd.port;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin = dir.path().join("sandgate");
    common::place_binary(common::sandgate_bin(), &bin);
    // The SOCKS5 address comes from the environment the sandbox is given.
    let script = format!(
        "socks=${{ALL_PROXY#socks5h://}}; echo \"socks=$socks\"; \
         GIT_SSH_COMMAND=\"{}\" GIT_TERMINAL_PROMPT=0 git ls-remote {}",
        ssh_command(&key, "$socks"),
        sshd.url()
    );
    for (entry, allowed) in [(format!("{HOST}:{port}"), true), (HOST.to_owned(), false)] {
        let policy = dir.path().join("policy.yaml");
        // ssh needs the user's passwd entry; the client key is read from its directory.
        std::fs::write(
            &policy,
            format!(
                "{}net:\n  mode: allowlist\n  allow_domains: [ \"{entry}\" ]\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\n  proxy: {{ all_proxy: socks5 }}\n",
                sandbox_support::base().replace(
                    "/etc/alternatives",
                    &format!("/etc/alternatives, /etc/passwd, \"{}\"", keys.path().display()),
                ),
                dns.addr()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).unwrap();
        let audit = dir.path().join(format!("audit-{allowed}.jsonl"));
        let mut command = if unprivileged {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        let child = command
            .args(["run", "--policy", policy.to_str().unwrap(), "--audit-log"])
            .arg(&audit)
            .args(["--", "sh", "-c", &script])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (ok, stdout, stderr) = finish(child);
        let events = common::read_audit(&audit);
        let seen = decisions(&events);
        assert!(stdout.starts_with("socks=127.0.0.1:1080\n"), "{stdout}\n{stderr}");
        if allowed {
            assert!(ok, "{entry}: {stdout}\n{stderr}\nsshd:\n{}", sshd.log());
            assert!(
                stdout.ends_with(&format!(
                    "{commit}\tHEAD\n{commit}\trefs/heads/main\n",
                    commit = sshd.commit
                )),
                "{stdout}\n{stderr}"
            );
            assert_eq!(
                seen,
                [(HOST.to_owned(), u64::from(port), "allowlisted".to_owned())],
                "{events:#?}"
            );
            assert!(
                events
                    .iter()
                    .all(|e| e["task_id"].as_str().is_some_and(|t| t.starts_with("run-"))),
                "{events:#?}"
            );
        } else {
            assert!(!ok, "a bare entry allowed port {port}:\n{stdout}");
            assert_eq!(
                seen,
                [(HOST.to_owned(), u64::from(port), "not_allowlisted".to_owned())],
                "{events:#?}"
            );
            assert!(
                stderr.contains(&format!("blocked: {HOST}:{port} (not allowlisted), once")),
                "{stderr}"
            );
        }
    }
}
