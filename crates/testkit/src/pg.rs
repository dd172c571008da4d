//! Real PostgreSQL for the tests: Debian's server binaries, a throwaway cluster listening on
//! a Unix socket only (no TCP port at all), and one fresh database per test.
//!
//! One cluster serves a whole test run: `scripts/test` starts it and exports
//! `SANDGATE_TEST_PG_HOST` (its socket directory). Without that variable a test starts the
//! run's cluster itself under `target/pg-test/`, once, behind a lock file, so parallel test
//! processes share it (it then keeps running; `pg_ctl -D target/pg-test/data stop` ends it);
//! with `CI=true` a missing variable is an error, never a silent pass. Each test creates its
//! own database ([`TestDb`]), so tests are independent and run in parallel. A test that stops
//! and starts the server uses a private cluster ([`PgCluster::private`]), so it cannot take
//! the database away from the others.
//!
//! PostgreSQL refuses to run as root: run as root, the cluster belongs to `nobody`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The user (and role) the tests connect as.
pub const PG_USER: &str = "sandgate";
/// The port a cluster's socket is named for, unless it listens on TCP too.
const DEFAULT_PORT: u16 = 5432;

/// The shared cluster's socket directory, starting the cluster if this run has none.
pub fn shared_host() -> String {
    if let Ok(host) = std::env::var("SANDGATE_TEST_PG_HOST")
        && !host.is_empty()
    {
        return host;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "SANDGATE_TEST_PG_HOST is not set: run the tests through scripts/test, which starts one PostgreSQL cluster for the run"
    );
    let dir = target_dir().join("pg-test");
    std::fs::create_dir_all(&dir).expect("target/pg-test");
    let lock = std::fs::File::create(dir.join("lock")).expect("lock file");
    lock.lock().expect("lock target/pg-test");
    let cluster = PgCluster {
        data: dir.join("data"),
        socket: dir.join("socket"),
        port: DEFAULT_PORT,
        tls: None,
        _dir: None,
    };
    if !cluster.data.join("PG_VERSION").exists() {
        cluster.init();
    }
    if !cluster.running() {
        cluster.start();
    }
    cluster.socket.display().to_string()
}

/// A cluster of its own (stopped when dropped), for a test that stops and starts it.
#[derive(Debug)]
pub struct PgCluster {
    pub data: PathBuf,
    pub socket: PathBuf,
    /// The port: of the socket's name, and of a TCP listener on 127.0.0.1 with TLS.
    pub port: u16,
    /// The server's certificate and key files, for TLS on TCP (else no TCP at all).
    tls: Option<(PathBuf, PathBuf)>,
    _dir: Option<tempfile::TempDir>,
}

impl PgCluster {
    /// Creates and starts a cluster in a temporary directory.
    pub fn private() -> PgCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let cluster = PgCluster {
            data: dir.path().join("data"),
            socket: dir.path().join("socket"),
            port: DEFAULT_PORT,
            tls: None,
            _dir: Some(dir),
        };
        cluster.init();
        cluster.start();
        cluster
    }

    /// As [`PgCluster::private`], also listening on 127.0.0.1 (a free port) with TLS only
    /// there, presenting `cert_pem` (with its key, `key_pem`).
    ///
    /// PostgreSQL takes neither port 0 nor a socket it is handed, so the port is one found
    /// free. Another process may bind it before the server does; the server then fails to
    /// start ("Address already in use", it never serves a port it does not hold), and the
    /// start is tried again on another port. Once started, the server holds its port.
    pub fn private_tls(cert_pem: &str, key_pem: &str) -> PgCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let tls_dir = dir.path().join("tls");
        let (cert, key) = (tls_dir.join("server.crt"), tls_dir.join("server.key"));
        give_to_owner(&tls_dir);
        for (path, pem) in [(&cert, cert_pem), (&key, key_pem)] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::write(path, pem).expect("write TLS file");
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            if is_root() {
                std::os::unix::fs::chown(path, Some(65534), Some(65534)).expect("chown to nobody");
            }
        }
        let mut cluster = PgCluster {
            data: dir.path().join("data"),
            socket: dir.path().join("socket"),
            port: DEFAULT_PORT,
            tls: Some((cert, key)),
            _dir: Some(dir),
        };
        cluster.init();
        for attempt in 1..=5 {
            cluster.port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let _ = std::fs::remove_file(cluster.log());
            let out = cluster.start_output();
            let lost_the_port =
                || std::fs::read_to_string(cluster.log()).is_ok_and(|l| l.contains("Address already in use"));
            if out.status.success() || attempt == 5 || !lost_the_port() {
                check(&out, "pg_ctl start");
                break;
            }
        }
        cluster
    }

    /// The socket directory, as a connection string's `host`.
    pub fn host(&self) -> String {
        self.socket.display().to_string()
    }

    fn init(&self) {
        std::fs::create_dir_all(&self.socket).expect("socket dir");
        let parent = self.data.parent().expect("data dir parent");
        give_to_owner(parent);
        give_to_owner(&self.socket);
        let out = as_owner(&pg_bin("initdb"))
            .args(["--auth=trust", "--no-sync", "-E", "UTF8", "-U", PG_USER, "-D"])
            .arg(&self.data)
            .output()
            .expect("run initdb");
        check(&out, "initdb");
    }

    /// Starts the server (waits until it accepts connections, at most 30 s).
    pub fn start(&self) {
        check(&self.start_output(), "pg_ctl start");
    }

    /// The server's log (appended to at each start).
    fn log(&self) -> PathBuf {
        self.data.parent().expect("data dir parent").join("server.log")
    }

    /// `pg_ctl start`, waiting (at most 30 s) until the server accepts connections.
    fn start_output(&self) -> Output {
        let listen = match &self.tls {
            None => "-c listen_addresses=''".to_owned(),
            Some((cert, key)) => format!(
                "-c listen_addresses=127.0.0.1 -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                cert.display(),
                key.display()
            ),
        };
        let options = format!(
            "-k {} -p {} {listen} -c fsync=off -c max_connections=200",
            self.socket.display(),
            self.port
        );
        as_owner(&pg_bin("pg_ctl"))
            .args(["-w", "-t", "30", "-D"])
            .arg(&self.data)
            .args(["-o", &options, "-l"])
            .arg(self.log())
            .arg("start")
            .output()
            .expect("run pg_ctl start")
    }

    /// Stops the server at once (`-m fast`: sessions are ended, as in an outage).
    pub fn stop(&self) {
        let out = as_owner(&pg_bin("pg_ctl"))
            .args(["-w", "-t", "30", "-m", "fast", "-D"])
            .arg(&self.data)
            .arg("stop")
            .output()
            .expect("run pg_ctl stop");
        check(&out, "pg_ctl stop");
    }

    fn running(&self) -> bool {
        as_owner(&pg_bin("pg_ctl"))
            .arg("status")
            .arg("-D")
            .arg(&self.data)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self._dir.is_some() {
            let _ = as_owner(&pg_bin("pg_ctl"))
                .args(["-w", "-t", "10", "-m", "immediate", "-D"])
                .arg(&self.data)
                .arg("stop")
                .output();
        }
    }
}

/// A fresh database of its own on a cluster; dropped (with its sessions) when dropped.
#[derive(Debug)]
pub struct TestDb {
    pub host: String,
    pub port: u16,
    pub name: String,
}

impl TestDb {
    /// Creates `t_<unique>` on the cluster whose socket directory is `host`.
    pub fn create(host: &str) -> TestDb {
        TestDb::create_at(host, DEFAULT_PORT)
    }

    /// Creates `t_<unique>` on the cluster whose socket directory is `host` and port `port`.
    pub fn create_at(host: &str, port: u16) -> TestDb {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            "t_{}_{nanos}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let db = TestDb {
            host: host.to_owned(),
            port,
            name,
        };
        db.sql_on("postgres", &format!("CREATE DATABASE {}", db.name))
            .expect("CREATE DATABASE");
        db
    }

    /// The connection URL the proxy takes (`--state`).
    pub fn url(&self) -> String {
        format!(
            "postgresql:///{}?host={}&port={}&user={PG_USER}",
            self.name, self.host, self.port
        )
    }

    /// Runs SQL with psql (as someone with access to the database would); returns the
    /// unaligned output, or psql's error.
    pub fn sql(&self, sql: &str) -> Result<String, String> {
        self.sql_on(&self.name, sql)
    }

    fn sql_on(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = Command::new(pg_bin("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", &self.host])
            .args(["-p", &self.port.to_string()])
            .args(["-U", PG_USER, "-d", db, "-c", sql])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let _ = self.sql_on(
            "postgres",
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// Waits until `cond` holds, at most `limit`.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// A server binary: `SANDGATE_TEST_PG_BIN`, else the newest of Debian's
/// /usr/lib/postgresql/N/bin.
pub fn pg_bin(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("SANDGATE_TEST_PG_BIN") {
        return Path::new(&dir).join(name);
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed: apt-get install postgresql (scripts/test does)")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .max()
        .expect("no /usr/lib/postgresql/N");
    PathBuf::from(format!("/usr/lib/postgresql/{newest}/bin/{name}"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// `program`, run as the cluster's owner: `nobody` when the tests run as root.
fn as_owner(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(program);
        c.current_dir("/");
        c
    } else {
        Command::new(program)
    }
}

/// Makes `dir` the cluster owner's (when running as root) and private to it.
fn give_to_owner(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).expect("create dir");
    if is_root() {
        std::os::unix::fs::chown(dir, Some(65534), Some(65534)).expect("chown to nobody");
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
}

fn check(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn target_dir() -> PathBuf {
    match option_env!("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}
