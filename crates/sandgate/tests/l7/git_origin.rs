//! A git smart-HTTP origin for the clone/push tests, and git as their client. The origin is
//! `git_http_server.py` (git's own `http-backend` behind a small HTTP/1.1 server) serving
//! two bare repositories, `myorg/repo.git` and `other/repo.git`, that accept pushes; it
//! reports every request it receives, so a test sees what reached it; [`GitOrigin::start_tls`]
//! serves the same over HTTPS with a test CA's certificate. The client is the
//! real git, with no system or global configuration and no proxy variables from the
//! environment: the proxy is whatever the test passes.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// The repositories the origin serves, relative to its root.
pub const REPOS: [&str; 2] = ["myorg/repo.git", "other/repo.git"];

/// A running git origin on 127.0.0.1; stopped when dropped.
pub struct GitOrigin {
    child: Child,
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
    root: tempfile::TempDir,
    /// The certificate and key of an HTTPS origin, outside the repositories' root.
    _tls: Option<tempfile::TempDir>,
}

impl GitOrigin {
    /// Makes the repositories (one commit on `main` each) and starts the server.
    pub fn start() -> GitOrigin {
        GitOrigin::serve(None)
    }

    /// As [`GitOrigin::start`], serving HTTPS with the leaf certificate of `ca`.
    #[allow(dead_code, reason = "only l7_tls_e2e.rs uses it")]
    pub fn start_tls(ca: &sandgate_testkit::tls::TestCa) -> GitOrigin {
        GitOrigin::serve(Some(ca))
    }

    fn serve(ca: Option<&sandgate_testkit::tls::TestCa>) -> GitOrigin {
        let root = tempfile::tempdir().unwrap();
        let seed = tempfile::tempdir().unwrap();
        run_git(seed.path(), None, &["init", "-q", "-b", "main", "."]);
        std::fs::write(seed.path().join("README"), "seed\n").unwrap();
        run_git(seed.path(), None, &["add", "README"]);
        run_git(seed.path(), None, &["commit", "-q", "-m", "seed"]);
        for repo in REPOS {
            let bare = root.path().join(repo);
            let bare = bare.to_str().unwrap();
            run_git(root.path(), None, &["init", "-q", "--bare", "-b", "main", bare]);
            // http-backend serves receive-pack only to a logged-in user unless this is set.
            run_git(
                root.path(),
                None,
                &["-C", bare, "config", "http.receivepack", "true"],
            );
            run_git(seed.path(), None, &["push", "-q", bare, "main"]);
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/l7/git_http_server.py");
        let tls = ca.map(|ca| {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("cert.pem"), &ca.leaf_pem).unwrap();
            std::fs::write(dir.path().join("key.pem"), &ca.leaf_key_pem).unwrap();
            dir
        });
        let files = tls
            .iter()
            .flat_map(|dir| [dir.path().join("cert.pem"), dir.path().join("key.pem")]);
        let mut child = Command::new(crate::sandbox_support::HOST_PYTHON)
            .arg(script)
            .arg(root.path())
            .args(files)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
            let _ = tx.send(lines.next());
            for line in lines {
                if let Some(request) = line.strip_prefix("REQ ") {
                    seen.lock().unwrap().push(request.to_owned());
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(15))
            .ok()
            .flatten()
            .and_then(|l| l.trim().parse().ok())
            .expect("the git origin printed no port");
        GitOrigin {
            child,
            port,
            requests,
            root,
            _tls: tls,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `METHOD TARGET HOST` of every request received so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// How many `method` requests received so far for a path ending in `suffix` (query
    /// aside) named `host` (no port) in their Host field.
    pub fn received(&self, host: &str, method: &str, suffix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| {
                let fields: Vec<&str> = r.split(' ').collect();
                let [m, target, h] = fields[..] else { return false };
                let path = target.split('?').next().unwrap_or("");
                m == method && path.ends_with(suffix) && h.split(':').next() == Some(host)
            })
            .count()
    }

    /// Every ref of the bare repository `repo` with what it points at.
    pub fn refs(&self, repo: &str) -> String {
        let bare = self.root.path().join(repo);
        let out = run_git(&bare, None, &["for-each-ref"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for GitOrigin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs git in `dir` through `proxy` (none: directly), bounded to 120 s; fails the test when
/// git fails.
pub fn run_git(dir: &Path, proxy: Option<SocketAddr>, args: &[&str]) -> Output {
    succeeded(git(dir, proxy, args), args)
}

/// Runs git in `dir` through `proxy` (none: directly), bounded to 120 s (`timeout`), and
/// returns what it did.
pub fn git(dir: &Path, proxy: Option<SocketAddr>, args: &[&str]) -> Output {
    command(dir, proxy, args).output().unwrap()
}

/// As [`run_git`], git trusting only the CA certificates in `cainfo` for HTTPS.
#[allow(dead_code, reason = "only l7_tls_e2e.rs uses it")]
pub fn run_git_trusting(dir: &Path, proxy: Option<SocketAddr>, cainfo: &Path, args: &[&str]) -> Output {
    succeeded(git_trusting(dir, proxy, cainfo, args), args)
}

/// As [`git`], git trusting only the CA certificates in `cainfo` for HTTPS: its
/// `GIT_SSL_CAINFO`, which would otherwise come from the environment the tests run in.
#[allow(dead_code, reason = "only l7_tls_e2e.rs uses it")]
pub fn git_trusting(dir: &Path, proxy: Option<SocketAddr>, cainfo: &Path, args: &[&str]) -> Output {
    command(dir, proxy, args)
        .env("GIT_SSL_CAINFO", cainfo)
        .output()
        .unwrap()
}

fn succeeded(out: Output, args: &[&str]) -> Output {
    assert!(
        out.status.success(),
        "git {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// git with `args` in `dir` through `proxy` (none: directly), bounded to 120 s (`timeout`),
/// with no configuration but the repository's and no proxy variables from the environment.
fn command(dir: &Path, proxy: Option<SocketAddr>, args: &[&str]) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "5", "120", "git"]);
    if let Some(p) = proxy {
        cmd.arg("-c").arg(format!("http.proxy=http://{p}"));
    }
    for var in [
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "no_proxy",
        "NO_PROXY",
    ] {
        cmd.env_remove(var);
    }
    cmd.args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_AUTHOR_NAME", "l7 test")
        .env("GIT_AUTHOR_EMAIL", "l7@test.invalid")
        .env("GIT_COMMITTER_NAME", "l7 test")
        .env("GIT_COMMITTER_EMAIL", "l7@test.invalid")
        .stdin(Stdio::null());
    cmd
}

/// In the clone at `dir`: a new commit adding `file`; returns its id.
pub fn commit(dir: &Path, file: &str) -> String {
    std::fs::write(dir.join(file), format!("{file}\n")).unwrap();
    run_git(dir, None, &["add", file]);
    run_git(dir, None, &["commit", "-q", "-m", file]);
    let out = run_git(dir, None, &["rev-parse", "HEAD"]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Shell lines for a sandbox: push a control commit through the unrestricted `open.test`,
/// clone through the fetch-only `git.test`, and try to push there (printing `CONTROL=`,
/// `CLONED`, then `PUSHED` or `REFUSED=` and git's error). `SCHEME` and `PORT` are filled by
/// [`sandboxed_git_script`].
const GIT_LINES: &str = r#"set -u
export GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0
export GIT_AUTHOR_NAME=l7 GIT_AUTHOR_EMAIL=l7@test.invalid GIT_COMMITTER_NAME=l7 GIT_COMMITTER_EMAIL=l7@test.invalid
g() { timeout -k 5 60 git "$@"; }
cd /tmp
g clone -q SCHEME://open.test:PORT/myorg/repo.git open || exit 11
cd open && echo control > control && git add control && git commit -qm control || exit 12
g push -q origin main || exit 13
echo "CONTROL=$(git rev-parse HEAD)"
cd /tmp
g clone -q SCHEME://git.test:PORT/myorg/repo.git fetch || exit 14
cd fetch && test -f control && echo CLONED
echo refused > refused && git add refused && git commit -qm refused || exit 15
if g push origin main 2>/tmp/push.err; then echo PUSHED; else echo "REFUSED=$(git rev-parse HEAD)"; cat /tmp/push.err; fi
"#;

/// [`GIT_LINES`] for `scheme` (`http`, `https`) and the origin's `port`.
pub fn sandboxed_git_script(scheme: &str, port: u16) -> String {
    GIT_LINES
        .replace("SCHEME", scheme)
        .replace("PORT", &port.to_string())
}

/// Asserts that `out`, a push through the fetch-only entries, was refused with 403 and that
/// the origin's refs are still `refs` with no receive-pack for `git.test` received.
pub fn assert_push_refused(origin: &GitOrigin, out: &Output, refs: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the push went through:\n{stderr}");
    assert!(stderr.contains("403"), "{stderr}");
    assert_eq!(
        origin.refs("myorg/repo.git"),
        refs,
        "the refused push changed the origin"
    );
    assert_eq!(
        origin.received("git.test", "POST", "/git-receive-pack"),
        0,
        "a refused receive-pack reached the origin: {:?}",
        origin.requests()
    );
}
