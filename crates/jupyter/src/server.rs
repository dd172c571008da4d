//! Jupyter Server and jupyter-mcp-server as the launcher's children.
//!
//! Their command lines and environments are built by pure functions from the bundle and the
//! launch's facts. Both Pythons run isolated (`-I`): `python -m` would put the working
//! directory first on `sys.path`, and Jupyter Server's is the workspace, which kernels
//! write; a module planted there would run outside any sandbox at the next launch. Each child starts behind `sandgate jupyter guard` (the parent-death
//! signal, [`crate::guard`]) in a process group of its own, with an environment of exactly
//! what it needs: the token reaches Jupyter Server as a file (`JUPYTER_TOKEN_FILE`) and
//! jupyter-mcp-server in its environment, never on a command line, which every local user
//! can read in /proc. Jupyter Server's output goes to the launcher's stderr (stdout
//! belongs to the MCP client) through a pipe the launcher copies: the kernels inherit
//! Jupyter Server's stdout and stderr, and the launcher's stderr may be a person's terminal,
//! which a kernel must never hold (it could read what is typed there).

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandgate_control::client::{AdminClient, AdminError, AdminUrl, Limits};
use serde_json::Value;

use crate::bundle::Layout;

/// What one launch knows besides the bundle.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The sandgate binary that guards the children (the launcher's own).
    pub sandgate: PathBuf,
    /// The bundle's Python, as this launch found it (the carried one from the bundle's place).
    pub python: PathBuf,
    /// The launcher's pid: a child whose parent is gone exits.
    pub parent: u32,
    /// The private runtime directory (0700): connection files, sockets, the token.
    pub runtime: PathBuf,
    /// The file holding the token.
    pub token_file: PathBuf,
    /// Jupyter Server's port on 127.0.0.1; 0 for a free one.
    pub port: u16,
}

fn guarded(launch: &Launch, command: Vec<OsString>) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec![
        launch.sandgate.clone().into(),
        "jupyter".into(),
        "guard".into(),
        "--parent".into(),
        launch.parent.to_string().into(),
        "--".into(),
    ];
    argv.extend(command);
    argv
}

/// Jupyter Server's command line: the bundle's configuration file only, loopback, the
/// port (no retries on another one), through the guard.
pub fn server_argv(layout: &Layout, launch: &Launch) -> Vec<OsString> {
    let mut config = OsString::from("--config=");
    config.push(layout.server_config());
    guarded(
        launch,
        vec![
            launch.python.clone().into(),
            "-I".into(),
            "-m".into(),
            "jupyter_server".into(),
            config,
            "--ServerApp.ip=127.0.0.1".into(),
            format!("--ServerApp.port={}", launch.port).into(),
            "--ServerApp.port_retries=0".into(),
            "--ServerApp.open_browser=False".into(),
        ],
    )
}

/// Host variables the server passes on: `sandgate run` (each kernel's wrapper) reads
/// `TMPDIR` for its state and `SANDGATE_LOG` for its diagnostics; the kernels' own
/// environment comes from their policies alone.
const SERVER_PASSTHROUGH: [&str; 4] = ["PATH", "LANG", "TMPDIR", "SANDGATE_LOG"];

/// Jupyter Server's environment: the bundle's directories only (`JUPYTER_NO_CONFIG` with
/// `--config`: no user, environment or system configuration; `JUPYTER_PATH` the bundle;
/// its own data and runtime directories), the token as a file, `HOME` inside the runtime
/// directory so no `~` lookup reaches the user's own files.
pub fn server_env(layout: &Layout, launch: &Launch, host: &[(String, String)]) -> Vec<(String, OsString)> {
    let mut env: Vec<(String, OsString)> = host
        .iter()
        .filter(|(k, _)| SERVER_PASSTHROUGH.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.into()))
        .collect();
    let dirs: [(&str, PathBuf); 7] = [
        ("JUPYTER_CONFIG_DIR", layout.config_dir()),
        ("JUPYTER_PATH", layout.root.clone()),
        ("JUPYTER_DATA_DIR", layout.data_dir()),
        ("JUPYTER_RUNTIME_DIR", launch.runtime.clone()),
        ("JUPYTER_TOKEN_FILE", launch.token_file.clone()),
        ("HOME", launch.runtime.join("home")),
        ("IPYTHONDIR", launch.runtime.join("home/.ipython")),
    ];
    env.extend(dirs.into_iter().map(|(k, v)| (k.to_owned(), v.into())));
    env.push(("JUPYTER_NO_CONFIG".to_owned(), "1".into()));
    env.push(("PYTHONNOUSERSITE".to_owned(), "1".into()));
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".to_owned(), sandgate_sandbox::env::DEFAULT_PATH.into()));
    }
    env
}

/// jupyter-mcp-server on stdio, attached to `kernel` (its default for every tool), told to
/// start no kernel of its own (it would ask for `python3`, which the bundle refuses) and
/// not to look for JupyterLab.
pub fn mcp_argv(launch: &Launch, url: &str, kernel: &str) -> Vec<OsString> {
    guarded(
        launch,
        [
            launch.python.as_os_str(),
            "-I".as_ref(),
            "-m".as_ref(),
            "jupyter_mcp_server".as_ref(),
            "--transport".as_ref(),
            "stdio".as_ref(),
            "--jupyter-url".as_ref(),
            url.as_ref(),
            "--jupyterlab".as_ref(),
            "false".as_ref(),
            "--start-new-code-sandbox".as_ref(),
            "false".as_ref(),
            "--code-sandbox-id".as_ref(),
            kernel.as_ref(),
        ]
        .iter()
        .map(|s| s.to_os_string())
        .collect(),
    )
}

/// jupyter-mcp-server's environment: it reads many variables (`PORT`, `TRANSPORT`, ...), so
/// only these: the token, and a HOME of its own for its caches.
pub fn mcp_env(launch: &Launch, token: &str, host: &[(String, String)]) -> Vec<(String, OsString)> {
    let mut env: Vec<(String, OsString)> = host
        .iter()
        .filter(|(k, _)| k == "PATH" || k == "LANG")
        .map(|(k, v)| (k.clone(), v.into()))
        .collect();
    env.push(("HOME".to_owned(), launch.runtime.join("mcp").into()));
    env.push(("JUPYTER_TOKEN".to_owned(), token.into()));
    env.push(("PYTHONNOUSERSITE".to_owned(), "1".into()));
    env
}

/// Starts `argv` in `cwd`, in a process group of its own, with exactly `env`;
/// `relay_output` decides whether its stdout and stderr are a pipe copied to the launcher's
/// stderr (Jupyter Server, whose kernels inherit them) or the launcher's own
/// (jupyter-mcp-server: stdout the MCP channel). Call from the main thread: the guard's
/// parent-death signal is tied to the thread that forks.
pub fn spawn(
    argv: &[OsString],
    env: &[(String, OsString)],
    cwd: &Path,
    stdin_from_parent: bool,
    relay_output: bool,
) -> std::io::Result<Child> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(if stdin_from_parent {
            Stdio::inherit()
        } else {
            Stdio::null()
        });
    if relay_output {
        let (mut reader, writer) = std::io::pipe()?;
        cmd.stdout(writer.try_clone()?).stderr(writer);
        // Ends when the last holder of the write end (the server or a kernel) is gone; the
        // launcher holds none once `cmd` is dropped.
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::stderr()));
    }
    cmd.spawn()
}

/// Jupyter Server's REST API with the token, on loopback, through the shared admin client
/// (`sandgate_control::client`: bounded in time and size; the token as a bearer token,
/// which Jupyter Server takes as it takes `token`).
#[derive(Debug, Clone)]
pub struct Api {
    pub base: String,
    client: AdminClient,
}

impl Api {
    pub fn new(port: u16, token: &str) -> Api {
        let url = AdminUrl::from(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        let limits = Limits {
            max_body: 1 << 20,
            ..Limits::default()
        };
        Api {
            base: url.to_string(),
            client: AdminClient::with_limits(url, token, limits),
        }
    }

    /// One call (`GET`, else a `POST` of `body`, `{}` when there is none); the JSON of a
    /// 2xx answer, else the status and the server's message.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, AdminError> {
        match method {
            "GET" => self.client.get(path),
            _ => self.client.post(path, body.unwrap_or(&serde_json::json!({}))),
        }
    }

    /// Starts a kernel of `kernel_name` in the workspace (path `""`: Jupyter's root); its id.
    pub fn start_kernel(&self, kernel_name: &str) -> Result<String, String> {
        let body = serde_json::json!({ "name": kernel_name, "path": "" });
        let answer = self
            .call("POST", "/api/kernels", Some(&body))
            .map_err(|e| e.to_string())?;
        let id = answer.get("id").and_then(Value::as_str).unwrap_or_default();
        // An id goes onto jupyter-mcp-server's command line: only what a UUID is made of.
        if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return Err(format!("unexpected kernel id {id:?}"));
        }
        Ok(id.to_owned())
    }
}

/// The port Jupyter Server wrote in its server file (`jpserver-PID.json` in the runtime
/// directory), once it is there.
pub fn port_from_server_file(runtime: &Path, pid: u32) -> Option<u16> {
    let text = std::fs::read_to_string(runtime.join(format!("jpserver-{pid}.json"))).ok()?;
    let info: Value = serde_json::from_str(&text).ok()?;
    info.get("port")?.as_u64().and_then(|p| u16::try_from(p).ok())
}

/// Waits (bounded) for `child` to exit; true if it did.
pub fn wait_bounded(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() > deadline => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// SIGTERM, up to `grace` to exit, then SIGKILL; always reaped.
pub fn stop(child: &mut Child, grace: Duration) {
    if let Ok(None) = child.try_wait() {
        if let Some(pid) = i32::try_from(child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if !wait_bounded(child, grace) {
            let _ = child.kill();
        }
    }
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            sandgate: "/b/bin/sandgate".into(),
            python: "/v/bin/python".into(),
            parent: 42,
            runtime: "/tmp/sandgate-jupyter-x".into(),
            token_file: "/tmp/sandgate-jupyter-x/token".into(),
            port: 0,
        }
    }

    fn strings(v: &[OsString]) -> Vec<String> {
        v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn the_server_runs_guarded_with_the_bundle_config_only_and_no_token_on_its_command_line() {
        let layout = Layout::new("/b");
        let argv = strings(&server_argv(&layout, &launch()));
        assert_eq!(
            argv,
            [
                "/b/bin/sandgate",
                "jupyter",
                "guard",
                "--parent",
                "42",
                "--",
                "/v/bin/python",
                "-I",
                "-m",
                "jupyter_server",
                "--config=/b/jupyter/config/jupyter_server_config.py",
                "--ServerApp.ip=127.0.0.1",
                "--ServerApp.port=0",
                "--ServerApp.port_retries=0",
                "--ServerApp.open_browser=False"
            ]
        );
        let host = [
            ("PATH", "/usr/bin"),
            ("JUPYTER_CONFIG_DIR", "/home/u/.jupyter"),
            ("JUPYTER_TOKEN", "leak"),
            ("JPY_PARENT_PID", "1"),
            ("HOME", "/home/u"),
            ("TMPDIR", "/tmp"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let env = server_env(&layout, &launch(), &host);
        let get = |k: &str| {
            env.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(get("JUPYTER_CONFIG_DIR").as_deref(), Some("/b/jupyter/config"));
        assert_eq!(get("JUPYTER_PATH").as_deref(), Some("/b"));
        assert_eq!(get("JUPYTER_NO_CONFIG").as_deref(), Some("1"));
        assert_eq!(
            get("JUPYTER_RUNTIME_DIR").as_deref(),
            Some("/tmp/sandgate-jupyter-x")
        );
        assert_eq!(get("HOME").as_deref(), Some("/tmp/sandgate-jupyter-x/home"));
        assert_eq!(get("TMPDIR").as_deref(), Some("/tmp"));
        assert_eq!(get("JUPYTER_TOKEN"), None, "only the token file");
        assert_eq!(get("JPY_PARENT_PID"), None);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names.len(), unique.len(), "{names:?}");
    }

    #[test]
    fn the_mcp_server_gets_the_token_in_its_environment_only() {
        let argv = strings(&mcp_argv(&launch(), "http://127.0.0.1:8888", "abc-1"));
        assert!(argv.iter().all(|a| !a.contains("s3cret")));
        assert_eq!(argv[6..10], ["/v/bin/python", "-I", "-m", "jupyter_mcp_server"]);
        assert!(argv.ends_with(&["--code-sandbox-id".to_owned(), "abc-1".to_owned()]));
        let host = [("PORT", "1"), ("TRANSPORT", "http"), ("PATH", "/usr/bin")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let env = mcp_env(&launch(), "s3cret", &host);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "HOME", "JUPYTER_TOKEN", "PYTHONNOUSERSITE"]);
    }

    #[test]
    fn the_port_comes_from_the_server_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(port_from_server_file(dir.path(), 7), None);
        std::fs::write(
            dir.path().join("jpserver-7.json"),
            r#"{"port": 41234, "token": "x"}"#,
        )
        .unwrap();
        assert_eq!(port_from_server_file(dir.path(), 7), Some(41234));
        std::fs::write(dir.path().join("jpserver-8.json"), r#"{"port": 99999}"#).unwrap();
        assert_eq!(port_from_server_file(dir.path(), 8), None);
    }
}
