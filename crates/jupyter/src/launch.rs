//! `sandgate jupyter launch`: Jupyter Server from a bundle, then jupyter-mcp-server on stdio.
//!
//! 1. Preflight: the bundle is whole, its carried environment (if it has one) passes
//!    [`crate::carry::check`] before any of it runs, its Python has what the server, the
//!    kernels and jupyter-mcp-server import (else the pip command is named), bubblewrap is
//!    there, and every profile's policy passes its check again, now against this launch's
//!    runtime directory (a policy edited to bind too much is refused here, not discovered
//!    later).
//! 2. A private runtime directory (0700, removed at exit) for the server's files, the
//!    kernels' connection files and sockets, and a random token (never printed; written to
//!    `--token-file` on request). It stays locked (`flock`) while the launcher or Jupyter
//!    Server (which inherits the lock) lives; a later launch removes those left unlocked
//!    by a `kill -9`.
//! 3. Jupyter Server on 127.0.0.1, its readiness seen in its server file and `/api/status`
//!    (bounded), a kernel of each profile started, then jupyter-mcp-server attached to the
//!    default profile's kernel, with the launcher's stdin and stdout as the MCP channel.
//! 4. Until jupyter-mcp-server ends (the client went away), a signal (SIGINT, SIGTERM,
//!    SIGHUP) or the server dies; then teardown: jupyter-mcp-server, then the server (which
//!    shuts its kernels down), each SIGTERM then SIGKILL after a grace period; the launcher
//!    is a child subreaper, so whatever is left below it (a kernel the server orphaned) is
//!    killed last. A `kill -9` of the launcher reaches its children through the guard's
//!    parent-death signal ([`crate::guard`]).

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use crate::JupyterError;
use crate::bundle::{BundlePython, LauncherSettings, Layout, read_small};
use crate::carry;
use crate::profile::{self, ProfileName};
use crate::python::{self, KERNEL_PACKAGES, MCP_PACKAGES, SERVER_PACKAGES};
use crate::server::{self, Api, Launch};

/// How `sandgate jupyter launch` was asked to run.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    pub bundle: PathBuf,
    pub port: Option<u16>,
    pub token_file: Option<PathBuf>,
    pub no_mcp: bool,
    /// This binary (the guard step runs it).
    pub sandgate: PathBuf,
}

/// How long Jupyter Server may take to answer.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// The longest Unix socket path (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;
/// The longest socket path of a kernel, past the runtime directory.
const SOCKET_SUFFIX: &str = "/kernel-00000000-0000-0000-0000-000000000000.json.d/ipc-5";

/// Why the launcher stopped waiting.
#[derive(Debug)]
enum Outcome {
    /// jupyter-mcp-server exited with this status (its client went away).
    McpExited(i32),
    /// A signal asked the launcher to stop.
    Signal,
}

/// Runs the launch; the exit status (jupyter-mcp-server's, or 0 when a signal stopped it).
pub fn launch(opts: &LaunchOptions) -> Result<i32, JupyterError> {
    if opts.no_mcp && opts.token_file.is_none() {
        return Err(JupyterError::Usage(
            "--no-mcp needs --token-file F: the token is never printed, and a client needs it".into(),
        ));
    }
    let root = std::fs::canonicalize(&opts.bundle)
        .map_err(|e| JupyterError::Usage(format!("--bundle {}: {e}", opts.bundle.display())))?;
    let layout = Layout::new(root);
    let settings = LauncherSettings::load(&layout)?;
    if settings.python == BundlePython::Carried {
        carry::check(&layout)?;
    }
    let python = settings.python.path(&layout);
    let roots = preflight(&python, opts.no_mcp)?;
    let tmp = std::env::temp_dir();
    sweep_stale_runtimes(&tmp);
    let runtime = Runtime::create(&tmp)?;
    let runtime_path = std::fs::canonicalize(runtime.dir.path())
        .map_err(|e| JupyterError::Unavailable(format!("{}: {e}", runtime.dir.path().display())))?;
    check_runtime(&runtime_path)?;
    for p in &settings.profiles {
        let path = layout.policy(p);
        let text = read_small(&path).map_err(|e| JupyterError::Usage(format!("{}: {e}", path.display())))?;
        profile::check(&text, &layout.root, &runtime_path, &roots, &|p| {
            std::fs::canonicalize(p)
        })
        .map_err(|e| JupyterError::Usage(format!("{}: {e}", path.display())))?;
    }
    let token = random_token()?;
    let launch = Launch {
        sandgate: opts.sandgate.clone(),
        python,
        parent: std::process::id(),
        token_file: runtime_path.join("token"),
        runtime: runtime_path,
        port: opts.port.unwrap_or(0),
    };
    write_secret(&launch.token_file, &token, true)?;
    if let Some(f) = &opts.token_file {
        write_secret(f, &token, false)?;
    }
    for d in ["home", "mcp"] {
        std::fs::create_dir(launch.runtime.join(d))
            .map_err(|e| JupyterError::Unavailable(format!("{}: {e}", launch.runtime.display())))?;
    }
    let result = supervise(&layout, &settings, &launch, &token, opts);
    drop(runtime);
    result
}

/// The runtime directory's name prefix, in the temporary directory.
const RUNTIME_PREFIX: &str = "sandgate-jupyter-";

/// The launch's runtime directory, locked while it lives (and removed when dropped).
struct Runtime {
    // Dropped first: the directory is removed while the lock is still held.
    dir: tempfile::TempDir,
    _lock: std::fs::File,
}

impl Runtime {
    fn create(tmp: &Path) -> Result<Runtime, JupyterError> {
        let fail = |e: std::io::Error| {
            JupyterError::Unavailable(format!(
                "cannot make the runtime directory in {}: {e}",
                tmp.display()
            ))
        };
        let dir = tempfile::Builder::new()
            .prefix(RUNTIME_PREFIX)
            .tempdir_in(tmp)
            .map_err(fail)?;
        let lock = std::fs::File::open(dir.path()).map_err(fail)?;
        lock.try_lock()
            .map_err(|e| fail(std::io::Error::other(e.to_string())))?;
        // Jupyter Server inherits the locked descriptor: the directory stays in use while it
        // lives, even when the launcher was killed.
        rustix::io::fcntl_setfd(&lock, rustix::io::FdFlags::empty()).map_err(|e| fail(e.into()))?;
        Ok(Runtime { dir, _lock: lock })
    }
}

/// Removes runtime directories no launch holds any more (their lock can be taken).
fn sweep_stale_runtimes(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(RUNTIME_PREFIX)
            || !entry.file_type().is_ok_and(|t| t.is_dir())
        {
            continue;
        }
        let path = entry.path();
        if let Ok(lock) = std::fs::File::open(&path)
            && lock.try_lock().is_ok()
            && std::fs::remove_dir_all(&path).is_ok()
        {
            tracing::info!(path = %path.display(), "removed the runtime directory of a launch that is gone");
        }
    }
}

/// The Python has what this launch imports, bubblewrap is there; the Python's directories
/// (for the policies' check).
fn preflight(python: &Path, no_mcp: bool) -> Result<Vec<PathBuf>, JupyterError> {
    let mut wanted: Vec<&str> = SERVER_PACKAGES.iter().chain(&KERNEL_PACKAGES).copied().collect();
    if !no_mcp {
        wanted.extend(MCP_PACKAGES);
    }
    let facts = python::probe(python, &wanted)?;
    let missing = facts.missing(&wanted);
    if !missing.is_empty() {
        let message = python::missing_message(python, &missing);
        return Err(JupyterError::Unavailable(message));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if !std::env::split_paths(&path).any(|d| d.join("bwrap").is_file()) {
        return Err(JupyterError::Unavailable(
            "bubblewrap (bwrap) is not installed, and every kernel runs under it: apt-get install -y bubblewrap".into(),
        ));
    }
    Ok(facts.roots)
}

/// The runtime directory must fit kernels' socket paths, and be bindable into a sandbox.
fn check_runtime(runtime: &Path) -> Result<(), JupyterError> {
    let longest = runtime.as_os_str().len() + SOCKET_SUFFIX.len();
    if longest > MAX_SOCKET_PATH {
        return Err(JupyterError::Unavailable(format!(
            "the runtime directory {} is too long for the kernels' Unix socket paths ({longest} of at most {MAX_SOCKET_PATH} bytes); set TMPDIR to a shorter directory",
            runtime.display()
        )));
    }
    if sandgate_sandbox::paths::may_hold_host_sockets(runtime) {
        return Err(JupyterError::Unavailable(format!(
            "the runtime directory {} is under a directory of host sockets, which no sandbox may bind; set TMPDIR=/tmp",
            runtime.display()
        )));
    }
    Ok(())
}

/// 32 random bytes, hex.
fn random_token() -> Result<String, JupyterError> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| JupyterError::Unavailable(format!("cannot read /dev/urandom: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes a secret, mode 0600, never through a symlink; `new` refuses an existing file.
fn write_secret(path: &Path, secret: &str, new: bool) -> Result<(), JupyterError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).mode(0o600).custom_flags(libc::O_NOFOLLOW);
    if new {
        options.create_new(true);
    } else {
        options.create(true).truncate(true);
    }
    let fail =
        |e: std::io::Error| JupyterError::Usage(format!("cannot write the token to {}: {e}", path.display()));
    let mut file = options.open(path).map_err(fail)?;
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(fail)?;
    file.write_all(secret.as_bytes()).map_err(fail)
}

/// Steps 3 and 4 of the module docs, and the teardown.
fn supervise(
    layout: &Layout,
    settings: &LauncherSettings,
    launch: &Launch,
    token: &str,
    opts: &LaunchOptions,
) -> Result<i32, JupyterError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| JupyterError::Failed(format!("cannot start the runtime: {e}")))?;
    // Signals are watched before any child exists, so none is missed.
    let mut signals = {
        let _entered = rt.enter();
        Signals::new()?
    };
    sandgate_sandbox::processes::become_subreaper();
    let host: Vec<(String, String)> = std::env::vars().collect();
    let mut server = server::spawn(
        &server::server_argv(layout, launch),
        &server::server_env(layout, launch, &host),
        &layout.workspace(),
        false,
        true,
    )
    .map_err(|e| JupyterError::Failed(format!("cannot start Jupyter Server: {e}")))?;
    let mut mcp: Option<Child> = None;
    let outcome = rt.block_on(async {
        let api = match ready(&mut server, launch, token, &mut signals).await? {
            Some(api) => api,
            None => return Ok(Outcome::Signal),
        };
        eprintln!(
            "sandgate: Jupyter Server is ready at {}/ (bundle {}; kernels {})",
            api.base,
            layout.root.display(),
            settings
                .profiles
                .iter()
                .map(ProfileName::kernel_name)
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !opts.no_mcp {
            let kernel = prestart(&api, settings)?;
            let child = server::spawn(
                &server::mcp_argv(launch, &api.base, &kernel),
                &server::mcp_env(launch, token, &host),
                &launch.runtime.join("mcp"),
                true,
                false,
            )
            .map_err(|e| JupyterError::Failed(format!("cannot start jupyter-mcp-server: {e}")))?;
            mcp = Some(child);
        }
        watch(&mut server, &mut mcp, &mut signals).await
    });
    // First what needs no waiting: the token dies with the server, and an MCP client gives
    // its server a few seconds before it kills it.
    if let Some(f) = &opts.token_file
        && std::fs::read_to_string(f).is_ok_and(|t| t == token)
    {
        let _ = std::fs::remove_file(f);
    }
    if let Some(child) = &mut mcp {
        server::stop(child, Duration::from_secs(5));
    }
    server::stop(&mut server, Duration::from_secs(20));
    sandgate_sandbox::processes::kill_leftovers();
    match outcome? {
        Outcome::McpExited(code) => Ok(code),
        Outcome::Signal => Ok(0),
    }
}

/// Waits for the server's port and a 200 from `/api/status`; None when a signal came first.
async fn ready(
    server: &mut Child,
    launch: &Launch,
    token: &str,
    signals: &mut Signals,
) -> Result<Option<Api>, JupyterError> {
    let deadline = Instant::now() + READY_WITHIN;
    let mut port = None;
    loop {
        if let Ok(Some(status)) = server.try_wait() {
            return Err(JupyterError::Failed(format!(
                "Jupyter Server exited before it was ready ({status}); its messages are above"
            )));
        }
        if Instant::now() > deadline {
            return Err(JupyterError::Failed(format!(
                "Jupyter Server did not answer within {} s",
                READY_WITHIN.as_secs()
            )));
        }
        if port.is_none() {
            port = server::port_from_server_file(&launch.runtime, server.id());
        }
        if let Some(p) = port {
            let api = Api::new(p, token);
            if api.call("GET", "/api/status", None).is_ok() {
                return Ok(Some(api));
            }
        }
        tokio::select! {
            _ = signals.next() => return Ok(None),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// A kernel of every profile, the default's first; the default's id.
fn prestart(api: &Api, settings: &LauncherSettings) -> Result<String, JupyterError> {
    let mut default = None;
    let others = settings
        .profiles
        .iter()
        .filter(|p| **p != settings.default_profile);
    for p in std::iter::once(&settings.default_profile).chain(others) {
        let id = api
            .start_kernel(&p.kernel_name())
            .map_err(|e| JupyterError::Failed(format!("cannot start a {} kernel: {e}", p.kernel_name())))?;
        eprintln!("sandgate: kernel {} started ({id})", p.kernel_name());
        default.get_or_insert(id);
    }
    default.ok_or_else(|| JupyterError::Failed("no profile to start".into()))
}

/// Until jupyter-mcp-server exits, a signal, or the server dies.
async fn watch(
    server: &mut Child,
    mcp: &mut Option<Child>,
    signals: &mut Signals,
) -> Result<Outcome, JupyterError> {
    loop {
        if let Ok(Some(status)) = server.try_wait() {
            return Err(JupyterError::Failed(format!("Jupyter Server exited ({status})")));
        }
        if let Some(child) = mcp
            && let Ok(Some(status)) = child.try_wait()
        {
            use std::os::unix::process::ExitStatusExt;
            return Ok(Outcome::McpExited(
                status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
            ));
        }
        tokio::select! {
            _ = signals.next() => return Ok(Outcome::Signal),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP, each a request to stop.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals, JupyterError> {
        use tokio::signal::unix::{SignalKind, signal};
        let watch =
            |kind| signal(kind).map_err(|e| JupyterError::Failed(format!("cannot watch signals: {e}")));
        Ok(Signals {
            int: watch(SignalKind::interrupt())?,
            term: watch(SignalKind::terminate())?,
            hup: watch(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_directory_must_fit_socket_paths_and_not_hold_host_sockets() {
        assert!(check_runtime(Path::new("/tmp/sandgate-jupyter-abc123")).is_ok());
        let long = format!("/tmp/{}", "d".repeat(60));
        let e = check_runtime(Path::new(&long)).unwrap_err().to_string();
        assert!(e.contains("set TMPDIR to a shorter directory"), "{e}");
        let e = check_runtime(Path::new("/run/user/1000/sandgate-jupyter-x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("TMPDIR=/tmp"), "{e}");
    }

    #[test]
    fn tokens_are_random_hex_and_secrets_refuse_symlinks() {
        let a = random_token().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, random_token().unwrap());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        write_secret(&file, "t1", true).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(
            write_secret(&file, "t2", true).is_err(),
            "a new secret never replaces a file"
        );
        write_secret(&file, "t3", false).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "t3");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).unwrap();
        assert!(write_secret(&link, "t4", false).is_err());
        assert!(!dir.path().join("elsewhere").exists());
    }

    #[test]
    fn a_live_runtime_survives_the_sweep_and_a_killed_ones_does_not() {
        let tmp = tempfile::tempdir().unwrap();
        let live = Runtime::create(tmp.path()).unwrap();
        let dead = Runtime::create(tmp.path()).unwrap();
        // What kill -9 leaves: the directory, unlocked.
        let dead_path = dead.dir.keep();
        drop(dead._lock);
        sweep_stale_runtimes(tmp.path());
        assert!(live.dir.path().is_dir());
        assert!(!dead_path.exists());
        let live_path = live.dir.path().to_path_buf();
        drop(live);
        assert!(!live_path.exists());
    }

    #[test]
    fn no_mcp_needs_a_token_file() {
        let e = launch(&LaunchOptions {
            bundle: "/nonexistent".into(),
            port: None,
            token_file: None,
            no_mcp: true,
            sandgate: "/bin/true".into(),
        })
        .unwrap_err();
        assert_eq!(e.exit_code(), 64);
        assert!(e.to_string().contains("--token-file"), "{e}");
    }
}
