//! The bundle: where each file lives, relative to its root (so it can move), and the
//! launcher's settings, `mcp/jupyter_mcp_launcher.yaml`.
//!
//! ```text
//! bin/sandgate                              this binary (hard link, or a copy)
//! bin/sandgate-init                         the sandbox's small init, where installed beside it
//! env/                                      the carried Python environment (`--python-env copy`)
//! jupyter/config/jupyter_server_config.py   Jupyter Server's only configuration
//! jupyter/data/                             Jupyter Server's data directory
//! kernels/python3-NAME/kernel.json          one kernelspec per profile
//! policies/NAME/policy.yaml                 its sandbox policy
//! mcp/jupyter_mcp_launcher.yaml             the launcher's settings
//! workspace/                                the notebooks (Jupyter's root), every profile writes
//! state/NAME/                               one profile's HOME, IPython, caches: only its kernels write
//! audit/NAME.jsonl                          the proxy's audit of that profile's kernels
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::JupyterError;
use crate::profile::ProfileName;

/// The bundle's files, from its root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Layout {
        Layout { root: root.into() }
    }

    pub fn sandgate(&self) -> PathBuf {
        self.root.join("bin/sandgate")
    }

    /// The carried environment (`--python-env copy`): a venv, bound read-only into kernels.
    pub fn env_dir(&self) -> PathBuf {
        self.root.join(ENV_DIR)
    }

    /// The carried environment's interpreter, as the bundle's place gives it.
    pub fn env_python(&self) -> PathBuf {
        self.root.join(ENV_PYTHON)
    }

    pub fn config_dir(&self) -> PathBuf {
        self.root.join("jupyter/config")
    }

    pub fn server_config(&self) -> PathBuf {
        self.config_dir().join("jupyter_server_config.py")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.join("jupyter/data")
    }

    pub fn kernels_dir(&self) -> PathBuf {
        self.root.join("kernels")
    }

    pub fn kernelspec(&self, p: &ProfileName) -> PathBuf {
        self.kernels_dir().join(p.kernel_name()).join("kernel.json")
    }

    pub fn policy(&self, p: &ProfileName) -> PathBuf {
        self.root.join("policies").join(p.as_str()).join("policy.yaml")
    }

    pub fn launcher(&self) -> PathBuf {
        self.root.join("mcp/jupyter_mcp_launcher.yaml")
    }

    pub fn workspace(&self) -> PathBuf {
        self.root.join("workspace")
    }

    pub fn state(&self, p: &ProfileName) -> PathBuf {
        self.root.join("state").join(p.as_str())
    }

    pub fn audit_dir(&self) -> PathBuf {
        self.root.join("audit")
    }

    /// The directories each profile's kernels get in [`Layout::state`] (see the default
    /// policies' `env.set`).
    pub const STATE_DIRS: [&'static str; 8] = [
        "home",
        "ipython",
        "jupyter",
        "jupyter/config",
        "jupyter/data",
        "jupyter/runtime",
        "pycache",
        "matplotlib",
    ];
}

/// The carried environment's directory and interpreter, from the bundle's root.
pub const ENV_DIR: &str = "env";
pub const ENV_PYTHON: &str = "env/bin/python";

/// The Python that runs Jupyter Server, jupyter-mcp-server and the kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundlePython {
    /// An interpreter outside the bundle, by its absolute path (`--python-env external`).
    External(PathBuf),
    /// The bundle's own `env/bin/python`, found from where the bundle is at each start
    /// (`--python-env copy`).
    Carried,
}

impl BundlePython {
    /// The interpreter's path for a bundle at `layout`.
    pub fn path(&self, layout: &Layout) -> PathBuf {
        match self {
            BundlePython::External(p) => p.clone(),
            BundlePython::Carried => layout.env_python(),
        }
    }
}

/// The API version and kind of the launcher's file.
pub const API_VERSION: &str = "sandgate.dev/v1";
pub const KIND: &str = "JupyterLauncher";

/// `mcp/jupyter_mcp_launcher.yaml`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LauncherSettings {
    /// Runs Jupyter Server, jupyter-mcp-server and (through `sandgate run`) the kernels.
    pub python: BundlePython,
    pub profiles: Vec<ProfileName>,
    /// jupyter-mcp-server's own kernel, and Jupyter Server's default kernel.
    pub default_profile: ProfileName,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    spec: RawSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    python: String,
    profiles: Vec<String>,
    default_profile: String,
}

impl LauncherSettings {
    /// Parses the file's text; errors name the field.
    pub fn parse(text: &str) -> Result<LauncherSettings, String> {
        let raw: Raw = serde_saphyr::from_str(text).map_err(|e| {
            let line = e.location().map_or(0, |l| l.line());
            format!(
                "line {line}: {}",
                e.to_string().lines().next().unwrap_or("invalid YAML")
            )
        })?;
        if raw.api_version != API_VERSION || raw.kind != KIND {
            return Err(format!("expected apiVersion {API_VERSION} and kind {KIND}"));
        }
        let python = if raw.spec.python == ENV_PYTHON {
            BundlePython::Carried
        } else if Path::new(&raw.spec.python).is_absolute() {
            BundlePython::External(PathBuf::from(&raw.spec.python))
        } else {
            return Err(format!(
                "spec.python: {:?} is neither an absolute path nor {ENV_PYTHON} (the bundle's own environment)",
                raw.spec.python
            ));
        };
        let mut profiles = Vec::new();
        for p in &raw.spec.profiles {
            let name = ProfileName::parse(p).map_err(|e| format!("spec.profiles: {e}"))?;
            if profiles.contains(&name) {
                return Err(format!("spec.profiles: {p:?} is listed twice"));
            }
            profiles.push(name);
        }
        let default_profile = ProfileName::parse(&raw.spec.default_profile)
            .map_err(|e| format!("spec.default_profile: {e}"))?;
        if !profiles.contains(&default_profile) {
            return Err(format!(
                "spec.default_profile: {default_profile:?} is not in spec.profiles"
            ));
        }
        Ok(LauncherSettings {
            python,
            profiles,
            default_profile,
        })
    }

    /// Reads and checks a bundle: the settings, and every file they name.
    pub fn load(layout: &Layout) -> Result<LauncherSettings, JupyterError> {
        let path = layout.launcher();
        let text = read_small(&path).map_err(|e| {
            JupyterError::Usage(format!(
                "{} is not a sandgate jupyter bundle ({}: {e}); write one with `sandgate jupyter compose --out DIR`",
                layout.root.display(),
                path.display()
            ))
        })?;
        let settings = LauncherSettings::parse(&text)
            .map_err(|e| JupyterError::Usage(format!("{}: {e}", path.display())))?;
        let mut needed = vec![layout.sandgate(), layout.server_config(), layout.workspace()];
        if settings.python == BundlePython::Carried {
            needed.push(layout.env_dir().join("pyvenv.cfg"));
        }
        for p in &settings.profiles {
            needed.extend([layout.kernelspec(p), layout.policy(p), layout.state(p)]);
        }
        if let Some(missing) = needed.iter().find(|p| !p.exists()) {
            return Err(JupyterError::Usage(format!(
                "{}: {} is missing; compose the bundle again",
                layout.root.display(),
                missing.display()
            )));
        }
        Ok(settings)
    }
}

/// A small text file (a policy, the settings): at most 1 MiB.
pub fn read_small(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(1 << 20)
        .read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: sandgate.dev/v1\nkind: JupyterLauncher\nspec:\n  python: /v/bin/python\n  profiles: [ low, high ]\n  default_profile: low\n";

    #[test]
    fn the_launcher_settings_parse_and_every_error_names_its_field() {
        let s = LauncherSettings::parse(GOOD).unwrap();
        assert_eq!(s.python, BundlePython::External("/v/bin/python".into()));
        let carried = LauncherSettings::parse(&GOOD.replace("/v/bin/python", "env/bin/python")).unwrap();
        assert_eq!(carried.python, BundlePython::Carried);
        assert_eq!(
            carried.python.path(&Layout::new("/b")),
            Path::new("/b/env/bin/python")
        );
        assert_eq!(s.default_profile.as_str(), "low");
        assert_eq!(s.profiles.len(), 2);
        for (bad, want) in [
            (GOOD.replace("/v/bin/python", "python3"), "spec.python"),
            (GOOD.replace("/v/bin/python", "./env/bin/python"), "spec.python"),
            (
                GOOD.replace("/v/bin/python", "env/../../x/bin/python"),
                "spec.python",
            ),
            (GOOD.replace("[ low, high ]", "[ low, low ]"), "listed twice"),
            (GOOD.replace("[ low, high ]", "[ low, \"Hi!\" ]"), "spec.profiles"),
            (
                GOOD.replace("default_profile: low", "default_profile: mid"),
                "not in spec.profiles",
            ),
            (GOOD.replace("JupyterLauncher", "McpServer"), "kind"),
            (format!("{GOOD}  extra: 1\n"), "line"),
            ("[".to_owned(), "line"),
        ] {
            let e = LauncherSettings::parse(&bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }
}
