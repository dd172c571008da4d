//! `sandgate jupyter`: Jupyter kernels in sandgate sandboxes, driven by an agent through
//! jupyter-mcp-server.
//!
//! - `profile.rs`: profile names, `--profile NAME=FILE`, the default policies (`low`,
//!   `high`), and the check every kernel policy must pass (pure; host paths through an
//!   injected resolver).
//! - `python.rs`: what the kernels' Python is (its prefixes, its packages), asked of the
//!   interpreter itself, bounded in time.
//! - `bundle.rs`: the bundle's layout and the launcher's settings
//!   (`mcp/jupyter_mcp_launcher.yaml`).
//! - `render.rs`: the files compose writes: kernel.json, jupyter_server_config.py (its
//!   Python is `server_config.py`), the launcher's YAML (pure).
//! - `carry.rs`: the carried environment (`--python-env copy`): a venv copied into the
//!   bundle's `env/`, and the check it passes before any of it runs.
//! - `compose.rs`: writes a bundle in a staging directory and renames it into place.
//! - `kernel.rs`: what a carried-environment kernelspec runs: the profile's `sandgate run`
//!   line with the interpreter found from the bundle's place.
//! - `server.rs`: Jupyter Server and jupyter-mcp-server as children: command lines and
//!   environments (pure), start, readiness, the REST calls, stop.
//! - `launch.rs`: the launcher: preflight, a private runtime directory and token, the
//!   server, jupyter-mcp-server on stdio, teardown on exit or signal.
//! - `guard.rs`: the step between the launcher and each child: the parent-death signal,
//!   then exec.
//!
//! There is no sandbox logic here: each kernelspec's argv wraps its kernel in `sandgate
//! run` with its profile's policy. Jupyter Server's configuration only decides where each
//! kernel's sockets go (a directory of its own) and that no other kernelspec can start.

pub mod bundle;
pub mod carry;
pub mod compose;
pub mod guard;
pub mod kernel;
pub mod launch;
pub mod profile;
pub mod python;
pub mod render;
pub mod server;

pub use carry::PythonEnv;
pub use compose::{ComposeOptions, compose};
pub use kernel::KernelOptions;
pub use launch::{LaunchOptions, launch};

/// Why a `sandgate jupyter` command failed; [`JupyterError::exit_code`] maps it.
#[derive(Debug, thiserror::Error)]
pub enum JupyterError {
    /// Bad flags, a bad profile or policy, a bundle that is not one: exit 64.
    #[error("{0}")]
    Usage(String),
    /// Something needed is missing here (a Python package, bubblewrap): exit 69.
    #[error("{0}")]
    Unavailable(String),
    /// Jupyter Server or jupyter-mcp-server failed, or could not be stopped: exit 70.
    #[error("{0}")]
    Failed(String),
}

impl JupyterError {
    /// sysexits: EX_USAGE, EX_UNAVAILABLE, EX_SOFTWARE.
    pub fn exit_code(&self) -> u8 {
        match self {
            JupyterError::Usage(_) => 64,
            JupyterError::Unavailable(_) => 69,
            JupyterError::Failed(_) => 70,
        }
    }
}

/// The versions this was built and tested with; the pip hints name them.
pub const PIP_PACKAGES: &str =
    "jupyter_server==2.21.1 jupyter_client==8.10.0 ipykernel==7.4.0 jupyter-mcp-server==2.2.4";
