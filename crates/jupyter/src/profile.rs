//! Profiles: a name and the sandbox policy under which the kernels of `python3-NAME` run.
//!
//! The default policies (`low`: no network; `high`: the allowlist with the python-packages
//! preset) are rendered here from the facts of the kernels' Python. Every profile's policy,
//! a default or the operator's own, must pass [`check`]: what a kernel needs (its
//! connection file, its socket directory, Unix sockets, its Python) and what must stay
//! closed (other kernels' connection files, the host's network, a parent watch that would
//! end the kernel at once, a writable Python that Jupyter Server also runs). Pure apart from the injected path resolver.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sandgate_sandbox::paths::Resolve;
use sandgate_sandbox::policy::{self, NetMode, SandboxPolicy};

use crate::JupyterError;

/// The profiles of a bundle composed without `--profile`.
pub const DEFAULT_PROFILES: [&str; 2] = ["low", "high"];

/// The parameter naming the bundle's directory (canonical: `--path-param`).
pub const BUNDLE_PARAM: &str = "BUNDLE";
/// The parameter naming the kernel's connection file; its sockets are in `FILE.d`.
pub const CONNECTION_FILE_PARAM: &str = "CONNECTION_FILE";

/// Host paths every kernel reads besides its Python (those that exist).
const SYSTEM_READ_PATHS: [&str; 5] = ["/usr", "/lib", "/lib64", "/bin", "/etc/ssl"];

/// The default profiles' `limits:`. A kernel lives as long as its notebook, so it gets no
/// CPU-time limit (`RLIMIT_CPU` would end it after that much work, whenever it came); the
/// rest bound what a runaway cell (a fork loop, a huge array, a full `/tmp`) can take from
/// the host.
const KERNEL_LIMITS: &str = "limits:\n  # A kernel lives as long as its notebook: no CPU-time limit.\n  processes: 256\n  memory: 8GiB\n  tmpfs: 1GiB\n  cpu_seconds: off\n";

/// A profile's name: ASCII lowercase letters, digits, `-` and `_`, starting with a letter or
/// a digit, at most 32 bytes. It becomes the kernel name `python3-NAME` (within Jupyter's
/// kernel-name grammar), directory names and YAML text, so nothing else is allowed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProfileName(String);

impl ProfileName {
    pub fn parse(text: &str) -> Result<ProfileName, JupyterError> {
        let ok = !text.is_empty()
            && text.len() <= 32
            && text
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if ok {
            Ok(ProfileName(text.to_owned()))
        } else {
            Err(JupyterError::Usage(format!(
                "profile name {text:?}: use 1 to 32 of a-z, 0-9, - and _, starting with a letter or digit"
            )))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The kernelspec's name, `python3-NAME`.
    pub fn kernel_name(&self) -> String {
        format!("python3-{}", self.0)
    }
}

impl std::fmt::Display for ProfileName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `--profile NAME=FILE`.
pub fn parse_flag(spec: &str) -> Result<(ProfileName, PathBuf), JupyterError> {
    let (name, file) = spec
        .split_once('=')
        .filter(|(_, file)| !file.is_empty())
        .ok_or_else(|| JupyterError::Usage(format!("invalid --profile {spec:?}: expected NAME=FILE")))?;
    Ok((ProfileName::parse(name)?, PathBuf::from(file)))
}

/// The host facts a default policy depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// [`SYSTEM_READ_PATHS`] that exist here.
    pub system: Vec<PathBuf>,
}

impl HostPaths {
    /// The system paths this host has.
    pub fn here() -> HostPaths {
        HostPaths {
            system: SYSTEM_READ_PATHS
                .iter()
                .map(PathBuf::from)
                .filter(|p| p.exists())
                .collect(),
        }
    }
}

/// The kernels' Python as the policies need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPython {
    /// The interpreter the kernelspec runs (a venv's `bin/python`, not what it links to).
    pub executable: PathBuf,
    /// Directories it reads (prefixes, the real interpreter's directory, `sys.path`).
    pub roots: Vec<PathBuf>,
}

/// A path as a YAML double-quoted scalar (JSON's escapes are YAML's); `${` is refused, as
/// the policy would read it as a parameter.
fn quoted(path: &Path) -> Result<String, JupyterError> {
    let text = path
        .to_str()
        .ok_or_else(|| JupyterError::Usage(format!("{} is not UTF-8", path.display())))?;
    if text.contains("${") {
        return Err(JupyterError::Usage(format!("{text:?} holds \"${{\"")));
    }
    serde_json::to_string(text).map_err(|e| JupyterError::Usage(e.to_string()))
}

/// A path as a policy names it: under the bundle (a carried environment) as
/// `"${BUNDLE}/..."`, so the policy moves with the bundle; else [`quoted`].
fn in_policy(path: &Path, bundle: &Path) -> Result<String, JupyterError> {
    match path.strip_prefix(bundle) {
        Ok(rel) if rel.as_os_str().is_empty() => Ok(format!("\"${{{BUNDLE_PARAM}}}\"")),
        Ok(rel) => {
            let q = quoted(rel)?;
            Ok(format!(
                "\"${{{BUNDLE_PARAM}}}/{}",
                q.get(1..).unwrap_or_default()
            ))
        }
        Err(_) => quoted(path),
    }
}

/// The default policy of `low` or `high` (None for another name), for a bundle whose
/// root is `bundle` now (the Python's paths under it are written as `${BUNDLE}`).
pub fn default_policy(
    name: &ProfileName,
    python: &KernelPython,
    host: &HostPaths,
    bundle: &Path,
) -> Result<Option<String>, JupyterError> {
    let (summary, net) = match name.as_str() {
        "low" => ("no network", "net:\n  mode: none\n"),
        "high" => (
            "the network through sandgate's proxy, only to the python-packages preset (PyPI)",
            "net:\n  mode: allowlist\n  presets: [ python-packages ]\n",
        ),
        _ => return Ok(None),
    };
    let state = format!("${{{BUNDLE_PARAM}}}/state/{name}");
    let bin = python
        .executable
        .parent()
        .map(|bin| in_policy(bin, bundle))
        .transpose()?
        .map(|q| q.trim_matches('"').to_owned());
    let path = match bin {
        Some(bin) => format!("{bin}:/usr/local/bin:/usr/bin:/bin"),
        None => "/usr/local/bin:/usr/bin:/bin".to_owned(),
    };
    let mut read: Vec<String> = Vec::new();
    for p in &host.system {
        read.push(quoted(p)?);
    }
    for root in &python.roots {
        if !host.system.iter().any(|s| root.starts_with(s)) {
            read.push(in_policy(root, bundle)?);
        }
    }
    read.push(format!("\"${{{CONNECTION_FILE_PARAM}}}\""));
    let env: Vec<(&str, String)> = vec![
        ("HOME", format!("{state}/home")),
        ("IPYTHONDIR", format!("{state}/ipython")),
        ("JUPYTER_CONFIG_DIR", format!("{state}/jupyter/config")),
        ("JUPYTER_DATA_DIR", format!("{state}/jupyter/data")),
        ("JUPYTER_RUNTIME_DIR", format!("{state}/jupyter/runtime")),
        ("PYTHONPYCACHEPREFIX", format!("{state}/pycache")),
        ("MPLCONFIGDIR", format!("{state}/matplotlib")),
        ("PATH", path),
        ("LANG", "C.UTF-8".to_owned()),
    ];
    let mut text = format!(
        "# sandgate jupyter profile \"{name}\": {summary}.\n\
         # The workspace and this profile's own state are writable, nothing else.\n\
         # Written by `sandgate jupyter compose`; kernels/{kernel}/kernel.json fills\n\
         # ${{{BUNDLE_PARAM}}} (the bundle) and ${{{CONNECTION_FILE_PARAM}}}. See docs/jupyter.md before\n\
         # editing: `sandgate jupyter launch` checks it again.\n\
         apiVersion: sandgate.dev/v1\n\
         kind: SandboxPolicy\n\
         metadata: {{ name: jupyter-{name} }}\n\
         env:\n  set:\n",
        kernel = name.kernel_name()
    );
    for (k, v) in env {
        text.push_str(&format!("    {k}: \"{v}\"\n"));
    }
    text.push_str("fs:\n  read_paths:\n");
    for r in read {
        text.push_str(&format!("    - {r}\n"));
    }
    text.push_str(&format!(
        "  write_paths:\n    - \"${{{BUNDLE_PARAM}}}/workspace\"\n    - \"{state}\"\n    - \"${{{CONNECTION_FILE_PARAM}}}.d\"\n  tmp: private\n"
    ));
    text.push_str(net);
    text.push_str(KERNEL_LIMITS);
    text.push_str(
        "platform:\n  seccomp:\n    # The kernel's ZeroMQ sockets (Jupyter's ipc transport) are Unix sockets in\n    # ${CONNECTION_FILE}.d; no other socket is mounted in, and the network namespace\n    # keeps abstract sockets apart.\n    allow_unix_sockets: true\n",
    );
    Ok(Some(text))
}

/// A connection file name of the shape Jupyter Server gives, in `runtime_dir`.
pub fn sample_connection_file(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("kernel-00000000-0000-4000-8000-000000000000.json")
}

/// Checks a profile's policy as `sandgate run` will read it for a kernel whose connection
/// file is in `runtime_dir` (the launcher's private directory, or a sample at compose time),
/// with the bundle at `bundle` (canonical). Returns what is wrong, naming the field.
pub fn check(
    text: &str,
    bundle: &Path,
    runtime_dir: &Path,
    python_roots: &[PathBuf],
    resolve: Resolve<'_>,
) -> Result<SandboxPolicy, String> {
    let connection = sample_connection_file(runtime_dir);
    let sockets = PathBuf::from(format!("{}.d", connection.display()));
    let params = BTreeMap::from([
        (BUNDLE_PARAM.to_owned(), bundle.display().to_string()),
        (CONNECTION_FILE_PARAM.to_owned(), connection.display().to_string()),
    ]);
    // The connection file and its directory exist only while a kernel runs.
    let resolve_runtime = |p: &Path| {
        if p.starts_with(runtime_dir) {
            Ok(sandgate_sandbox::paths::lexical(p))
        } else {
            resolve(p)
        }
    };
    let p = policy::parse(text, &params, &resolve_runtime, None).map_err(|e| e.0)?;
    if p.net == NetMode::All {
        return Err(
            "net.mode all: a kernel would share the host's network, its loopback (Jupyter Server's port) and its abstract Unix sockets; use none, loopback, allowlist or proxy".to_owned(),
        );
    }
    if !p.allow_unix_sockets {
        return Err(format!(
            "platform.seccomp.allow_unix_sockets must be true: the kernel's ZeroMQ sockets (Jupyter's ipc transport) are Unix sockets in ${{{CONNECTION_FILE_PARAM}}}.d"
        ));
    }
    let read: Vec<&PathBuf> = p.read_paths.iter().chain(&p.extra_ro_binds).collect();
    let write: Vec<&PathBuf> = p.write_paths.iter().chain(&p.extra_rw_binds).collect();
    if !read.iter().chain(&write).any(|b| **b == connection) {
        return Err(format!(
            "fs.read_paths must list \"${{{CONNECTION_FILE_PARAM}}}\": the kernel reads its connection file"
        ));
    }
    if !write.iter().any(|b| **b == sockets) {
        return Err(format!(
            "fs.write_paths must list \"${{{CONNECTION_FILE_PARAM}}}.d\": the kernel makes its sockets there"
        ));
    }
    // Nothing wider: the runtime directory holds every kernel's connection file and key.
    if let Some(wide) = read.iter().chain(&write).find(|b| {
        runtime_dir.starts_with(b) || (b.starts_with(runtime_dir) && ***b != connection && ***b != sockets)
    }) {
        return Err(format!(
            "{} is bound: it would show other kernels' connection files (and their keys); bind only ${{{CONNECTION_FILE_PARAM}}} and ${{{CONNECTION_FILE_PARAM}}}.d",
            wide.display()
        ));
    }
    // Jupyter Server runs the same Python outside any sandbox: a kernel that could write
    // it would run code there at the next start.
    for root in python_roots {
        if let Some(w) = write.iter().find(|w| root.starts_with(w) || w.starts_with(root)) {
            return Err(format!(
                "{} is writable and overlaps the kernel's Python ({}), which Jupyter Server runs outside any sandbox; bind it read-only",
                w.display(),
                root.display()
            ));
        }
        if !read.iter().chain(&write).any(|b| root.starts_with(b)) {
            return Err(format!(
                "fs.read_paths does not cover the kernel's Python ({}); add it",
                root.display()
            ));
        }
    }
    // ipykernel ends at once when JPY_PARENT_PID names a process it cannot see (its parent
    // is outside the sandbox's PID namespace).
    let passes_parent = p.env_passthrough.iter().any(|pat| match pat.strip_suffix('*') {
        Some(prefix) => "JPY_PARENT_PID".starts_with(prefix),
        None => pat == "JPY_PARENT_PID",
    });
    if passes_parent || p.env_set.keys().any(|k| k.starts_with("JPY_")) {
        return Err(
            "env: JPY_* must not reach the kernel (with JPY_PARENT_PID, ipykernel watches a process outside its PID namespace and exits at once)".to_owned(),
        );
    }
    Ok(p)
}

#[cfg(test)]
#[path = "profile_tests.rs"]
mod tests;
