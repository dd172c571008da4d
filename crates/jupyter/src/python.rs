//! The Python that runs the kernels, Jupyter Server and jupyter-mcp-server: what it is, as
//! the interpreter itself says (`sys.executable`, its prefixes, `sys.path`, installed
//! distributions), asked with a clean environment like the kernel's, isolated (`-I`: neither
//! the working directory nor a `PYTHON*` variable decides what it imports) and bounded in
//! time and output.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::{JupyterError, PIP_PACKAGES};

/// The distributions the launcher and the kernels need, by their import names.
pub const KERNEL_PACKAGES: [&str; 1] = ["ipykernel"];
pub const SERVER_PACKAGES: [&str; 2] = ["jupyter_server", "jupyter_client"];
pub const MCP_PACKAGES: [&str; 1] = ["jupyter_mcp_server"];

/// What the probe prints: one JSON object.
const PROBE: &str = r#"
import importlib.util, json, os, sys
names = sys.argv[1:]
roots = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
         os.path.dirname(os.path.realpath(sys.executable))]
roots += [p for p in sys.path if os.path.isabs(p) and os.path.isdir(p)]
print(json.dumps({
    "executable": sys.executable,
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
    "version": "%d.%d.%d" % sys.version_info[:3],
    "roots": roots,
    "modules": {n: importlib.util.find_spec(n) is not None for n in names},
}))
"#;

/// What the interpreter said about itself.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PythonFacts {
    /// `sys.executable`: for a venv its `bin/python`, for a pyenv shim the real one.
    pub executable: PathBuf,
    pub version: String,
    /// `sys.prefix`: for a venv the venv's directory.
    pub prefix: PathBuf,
    /// `sys.base_prefix`: the installation a venv is made from (its `prefix` otherwise).
    pub base_prefix: PathBuf,
    /// Directories it reads, absolute, none inside another.
    pub roots: Vec<PathBuf>,
    /// Import name -> importable.
    pub modules: BTreeMap<String, bool>,
}

impl PythonFacts {
    /// Is it a venv (`sys.prefix` is not the installation's)?
    pub fn is_venv(&self) -> bool {
        self.prefix != self.base_prefix
    }

    /// The wanted modules it lacks.
    pub fn missing<'a>(&self, wanted: &[&'a str]) -> Vec<&'a str> {
        wanted
            .iter()
            .filter(|m| !self.modules.get(**m).copied().unwrap_or(false))
            .copied()
            .collect()
    }
}

/// The message for missing packages, naming the pip command.
pub fn missing_message(python: &Path, missing: &[&str]) -> String {
    format!(
        "{} cannot import {}: install them with `{} -m pip install {PIP_PACKAGES}` (or pass --python with a venv that has them)",
        python.display(),
        missing.join(", "),
        python.display()
    )
}

/// `name` as a path: as given when it holds a `/` (made absolute), else found on `PATH`.
pub fn locate(name: &Path) -> Result<PathBuf, JupyterError> {
    if name.components().count() > 1 || name.is_absolute() {
        return std::path::absolute(name)
            .map_err(|e| JupyterError::Usage(format!("--python {}: {e}", name.display())));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            JupyterError::Unavailable(format!(
                "{} is not on PATH: pass --python with the interpreter that has ipykernel",
                name.display()
            ))
        })
}

/// Asks `python` about itself and whether it can import `modules`.
pub fn probe(python: &Path, modules: &[&str]) -> Result<PythonFacts, JupyterError> {
    let mut cmd = Command::new(python);
    // -I: `-c` would put the working directory first on sys.path, and the launcher may run
    // in the workspace, which kernels write.
    cmd.arg("-I")
        .arg("-c")
        .arg(PROBE)
        .args(modules)
        .env_clear()
        .env("PATH", sandgate_sandbox::env::DEFAULT_PATH)
        .env("LANG", "C.UTF-8")
        .env("PYTHONNOUSERSITE", "1");
    // A pyenv shim finds its versions through HOME.
    if let Some(home) = std::env::var_os("HOME") {
        cmd.env("HOME", home);
    }
    let out = run_bounded(&mut cmd, Duration::from_secs(30))
        .map_err(|e| JupyterError::Unavailable(format!("cannot run {}: {e}", python.display())))?;
    let mut facts: PythonFacts = serde_json::from_slice(&out).map_err(|e| {
        JupyterError::Unavailable(format!(
            "{} did not answer as Python 3 does: {e}",
            python.display()
        ))
    })?;
    facts.roots = outermost(facts.roots);
    Ok(facts)
}

/// Absolute, existing-as-given paths with those inside another dropped, in order.
fn outermost(roots: Vec<PathBuf>) -> Vec<PathBuf> {
    let roots: Vec<PathBuf> = roots
        .into_iter()
        .filter(|r| r.is_absolute())
        .map(|r| sandgate_sandbox::paths::lexical(&r))
        .collect();
    let mut out: Vec<PathBuf> = Vec::new();
    for (i, r) in roots.iter().enumerate() {
        let covered = roots
            .iter()
            .enumerate()
            .any(|(j, o)| (r.starts_with(o) && r != o) || (r == o && j < i));
        if !covered {
            out.push(r.clone());
        }
    }
    out
}

/// Runs `cmd` to completion within `limit`, stdout kept (at most 1 MiB), stdin closed,
/// stderr passed through; killed when the time is up. Fails on a non-zero exit.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<Vec<u8>, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut kept = Vec::new();
        if let Some(s) = stdout {
            let _ = s.take(1 << 20).read_to_end(&mut kept);
        }
        kept
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", limit.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e.to_string()),
        }
    };
    let kept = reader.join().unwrap_or_default();
    if !status.success() {
        return Err(format!("it exited with {status}"));
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_keep_the_outermost_in_order() {
        let roots = outermost(vec![
            "/venv".into(),
            "/opt/py".into(),
            "/venv".into(),
            "/opt/py/lib/python3.11".into(),
            "relative".into(),
            "/venv/lib/python3.11/site-packages".into(),
            "/extra//site/./".into(),
        ]);
        let want: Vec<PathBuf> = vec!["/venv".into(), "/opt/py".into(), "/extra/site".into()];
        assert_eq!(roots, want);
    }

    #[test]
    fn missing_modules_and_the_pip_hint() {
        let facts = PythonFacts {
            executable: "/v/bin/python".into(),
            version: "3.11.7".into(),
            prefix: "/v".into(),
            base_prefix: "/usr".into(),
            roots: vec![],
            modules: BTreeMap::from([
                ("ipykernel".to_owned(), true),
                ("jupyter_server".to_owned(), false),
            ]),
        };
        assert!(facts.is_venv());
        assert_eq!(
            facts.missing(&["ipykernel", "jupyter_server", "jupyter_mcp_server"]),
            ["jupyter_server", "jupyter_mcp_server"]
        );
        let m = missing_message(Path::new("/v/bin/python"), &["jupyter_server"]);
        assert!(
            m.contains("/v/bin/python -m pip install jupyter_server==2.21.1"),
            "{m}"
        );
    }

    #[test]
    fn a_bounded_run_is_killed_at_its_limit_and_a_failure_is_an_error() {
        let started = Instant::now();
        let e = run_bounded(Command::new("sleep").arg("5"), Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("no answer"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(run_bounded(&mut Command::new("false"), Duration::from_secs(5)).is_err());
        assert_eq!(
            run_bounded(Command::new("echo").arg("hi"), Duration::from_secs(5)).unwrap(),
            b"hi\n"
        );
    }
}
