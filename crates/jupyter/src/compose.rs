//! `sandgate jupyter compose`: writes a bundle (see [`crate::bundle`] for the layout).
//!
//! Everything is written into a staging directory beside `--out` and checked there (each
//! profile's policy as `sandgate run` will read it, [`crate::profile::check`]); only then
//! is it renamed into place, so a failed compose leaves nothing behind and a bundle on disk
//! is always whole. With `--python-env copy` the Python's venv is copied into the staging
//! directory's `env/` first ([`crate::carry`]), checked, and asked about itself from there:
//! the policies then name it through `${BUNDLE}`.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::JupyterError;
use crate::bundle::{BundlePython, LauncherSettings, Layout, read_small};
use crate::carry::{self, PythonEnv};
use crate::profile::{self, DEFAULT_PROFILES, HostPaths, KernelPython, ProfileName};
use crate::python::{self, KERNEL_PACKAGES, MCP_PACKAGES, SERVER_PACKAGES};
use crate::render;

/// How `sandgate jupyter compose` was asked to compose.
#[derive(Debug, Clone)]
pub struct ComposeOptions {
    pub out: PathBuf,
    /// `--profile NAME=FILE`, as given; none means the defaults.
    pub profiles: Vec<String>,
    /// `--python`; `python3` on PATH when absent.
    pub python: Option<PathBuf>,
    /// `--python-env`: name that Python, or carry a copy of its venv.
    pub python_env: PythonEnv,
    /// This binary, linked (or copied) into the bundle's `bin/`.
    pub sandgate: PathBuf,
}

/// A bundle on disk.
#[derive(Debug, Clone)]
pub struct Composed {
    pub root: PathBuf,
    pub settings: LauncherSettings,
    /// Packages the launcher will need that the Python lacks (the kernels have theirs).
    pub missing_for_launch: Vec<&'static str>,
    /// The interpreter the kernels run now (in the bundle, for a carried environment).
    pub python: PathBuf,
    /// Directories a carried environment reads outside the bundle and its base Python (an
    /// editable install, a `.pth` file): wherever the bundle goes, they must be too.
    pub outside: Vec<PathBuf>,
}

/// A profile and where its policy comes from: the operator's file, or the default.
struct Profile {
    name: ProfileName,
    source: Option<(PathBuf, String)>,
}

fn profiles(flags: &[String]) -> Result<Vec<Profile>, JupyterError> {
    if flags.is_empty() {
        return DEFAULT_PROFILES
            .iter()
            .map(|n| {
                Ok(Profile {
                    name: ProfileName::parse(n)?,
                    source: None,
                })
            })
            .collect();
    }
    let mut out: Vec<Profile> = Vec::new();
    for flag in flags {
        let (name, file) = profile::parse_flag(flag)?;
        if out.iter().any(|p| p.name == name) {
            return Err(JupyterError::Usage(format!("--profile {name} is given twice")));
        }
        let text = read_small(&file).map_err(|e| {
            JupyterError::Usage(format!("--profile {name}: cannot read {}: {e}", file.display()))
        })?;
        out.push(Profile {
            name,
            source: Some((file, text)),
        });
    }
    Ok(out)
}

/// `--out`, absolute; it must be new (its parent existing) or an empty directory.
fn target(out: &Path) -> Result<PathBuf, JupyterError> {
    let out = std::path::absolute(out).map_err(|e| JupyterError::Usage(format!("--out: {e}")))?;
    match std::fs::read_dir(&out).map(|mut entries| entries.next().is_none()) {
        Ok(true) => {}
        Ok(false) => {
            return Err(JupyterError::Usage(format!(
                "--out {}: the directory is not empty; choose a new one",
                out.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(JupyterError::Usage(format!("--out {}: {e}", out.display()))),
    }
    let parent = match out.parent() {
        Some(parent) if parent.is_dir() => parent,
        _ => {
            return Err(JupyterError::Usage(format!(
                "--out {}: its parent directory does not exist",
                out.display()
            )));
        }
    };
    let canonical = std::fs::canonicalize(parent)
        .map_err(|e| JupyterError::Usage(format!("--out {}: {e}", out.display())))?
        .join(out.file_name().unwrap_or_default());
    plain(&canonical, "--out")?;
    Ok(out)
}

/// The bundle's path is a parameter of its policies (`${BUNDLE}`), which `sandgate run`
/// takes only when plain.
pub fn plain(path: &Path, what: &str) -> Result<(), JupyterError> {
    if path.to_str().is_some_and(sandgate_sandbox::policy::safe_param) {
        return Ok(());
    }
    Err(JupyterError::Usage(format!(
        "{what} {}: a bundle's path (a policy parameter) may hold only letters, digits and / . _ - + = ~",
        path.display()
    )))
}

fn io(what: &Path) -> impl Fn(std::io::Error) -> JupyterError + '_ {
    move |e| JupyterError::Failed(format!("cannot write {}: {e}", what.display()))
}

/// Writes the bundle; see the module docs.
pub fn compose(opts: &ComposeOptions) -> Result<Composed, JupyterError> {
    let profiles = profiles(&opts.profiles)?;
    let out = target(&opts.out)?;
    let python_path = python::locate(opts.python.as_deref().unwrap_or(Path::new("python3")))?;
    let wanted: Vec<&str> = KERNEL_PACKAGES
        .iter()
        .chain(&SERVER_PACKAGES)
        .chain(&MCP_PACKAGES)
        .copied()
        .collect();
    let facts = python::probe(&python_path, &wanted)?;
    let missing = facts.missing(&KERNEL_PACKAGES);
    if !missing.is_empty() {
        return Err(JupyterError::Unavailable(python::missing_message(
            &facts.executable,
            &missing,
        )));
    }
    let missing_for_launch = facts.missing(&wanted);
    if opts.python_env == PythonEnv::Copy && !facts.is_venv() {
        return Err(JupyterError::Usage(format!(
            "--python-env copy: {} is not in a venv (its sys.prefix is its installation's, {}); make one with `python3 -m venv DIR`, or use --python-env external",
            facts.executable.display(),
            facts.prefix.display()
        )));
    }
    let parent = out.parent().unwrap_or(Path::new("/"));
    let staging = tempfile::Builder::new()
        .prefix(".sandgate-jupyter-")
        .tempdir_in(parent)
        .map_err(io(parent))?;
    let root = staging.path().canonicalize().map_err(io(staging.path()))?;
    let layout = Layout::new(&root);
    skeleton(&layout, &profiles)?;
    link(&opts.sandgate, &layout.sandgate())?;
    // The sandbox's small init beside it, where this sandgate has one it trusts: the
    // bundle's runs then start as quickly as the installed ones.
    let init = sandgate_sandbox::run::init_binary(&opts.sandgate);
    if init != opts.sandgate {
        link(
            &init,
            &layout
                .sandgate()
                .with_file_name(sandgate_sandbox::run::INIT_BINARY),
        )?;
    }
    let (bundle_python, facts, outside) = match opts.python_env {
        PythonEnv::External => (
            BundlePython::External(facts.executable.clone()),
            facts,
            Vec::new(),
        ),
        PythonEnv::Copy => {
            let (facts, outside) = carry_env(&layout, &facts, &wanted)?;
            (BundlePython::Carried, facts, outside)
        }
    };
    let kernel_python = KernelPython {
        executable: facts.executable.clone(),
        roots: facts.roots.clone(),
    };
    let host = HostPaths::here();
    let check_dir = std::env::temp_dir().join("sandgate-jupyter-check");
    for p in &profiles {
        let text = match &p.source {
            Some((_, text)) => text.clone(),
            None => profile::default_policy(&p.name, &kernel_python, &host, &root)?
                .ok_or_else(|| JupyterError::Usage(format!("profile {}: no policy", p.name)))?,
        };
        let path = layout.policy(&p.name);
        std::fs::write(&path, &text).map_err(io(&path))?;
        profile::check(&text, &root, &check_dir, &kernel_python.roots, &|p| {
            std::fs::canonicalize(p)
        })
        .map_err(|e| match &p.source {
            Some((file, _)) => JupyterError::Usage(format!("--profile {}: {}: {e}", p.name, file.display())),
            None => JupyterError::Failed(format!(
                "the default policy of {} does not pass its check: {e}",
                p.name
            )),
        })?;
        let spec = layout.kernelspec(&p.name);
        std::fs::write(&spec, render::kernelspec(&p.name, &bundle_python)).map_err(io(&spec))?;
    }
    let names: Vec<ProfileName> = profiles.iter().map(|p| p.name.clone()).collect();
    let low = ProfileName::parse("low")?;
    let default_profile = if names.contains(&low) {
        low
    } else {
        names
            .first()
            .cloned()
            .ok_or_else(|| JupyterError::Usage("no profile".into()))?
    };
    let config = layout.server_config();
    std::fs::write(&config, render::server_config(&names, &default_profile)).map_err(io(&config))?;
    let settings = LauncherSettings {
        python: bundle_python,
        profiles: names,
        default_profile,
    };
    let launcher = layout.launcher();
    std::fs::write(&launcher, render::launcher(&settings)).map_err(io(&launcher))?;
    let kept = staging.keep();
    if let Err(e) = std::fs::rename(&kept, &out) {
        let _ = std::fs::remove_dir_all(&kept);
        return Err(JupyterError::Failed(format!(
            "cannot move the bundle to {}: {e}",
            out.display()
        )));
    }
    Ok(Composed {
        python: settings.python.path(&Layout::new(&out)),
        root: out,
        settings,
        missing_for_launch,
        outside,
    })
}

/// Copies the venv of the Python in `source` into the bundle's `env/`, checks the copy
/// ([`carry::check`]) and asks it about itself: its facts (paths in the staging directory,
/// which the policies write as `${BUNDLE}`), and the directories it reads outside the
/// bundle and its base Python.
fn carry_env(
    layout: &Layout,
    source: &python::PythonFacts,
    wanted: &[&str],
) -> Result<(python::PythonFacts, Vec<PathBuf>), JupyterError> {
    let prefix = &source.prefix;
    let within = |e: JupyterError| match e {
        JupyterError::Usage(m) => {
            JupyterError::Usage(format!("--python-env copy of {}: {m}", prefix.display()))
        }
        other => other,
    };
    carry::copy_venv(prefix, &layout.env_dir()).map_err(within)?;
    carry::check(layout).map_err(within)?;
    let facts = python::probe(&layout.env_python(), wanted)?;
    let lost = facts.missing(wanted);
    if lost.len() > source.missing(wanted).len() {
        return Err(JupyterError::Failed(format!(
            "the copy of {} in the bundle cannot import {}, which the venv can",
            prefix.display(),
            lost.join(", ")
        )));
    }
    let outside = facts
        .roots
        .iter()
        .filter(|r| !r.starts_with(&layout.root) && !r.starts_with(&facts.base_prefix))
        .cloned()
        .collect();
    Ok((facts, outside))
}

/// Every directory of the bundle; a profile's state and the audit only for their owner.
fn skeleton(layout: &Layout, profiles: &[Profile]) -> Result<(), JupyterError> {
    let mut open = std::fs::DirBuilder::new();
    open.recursive(true).mode(0o755);
    let mut private = std::fs::DirBuilder::new();
    private.recursive(true).mode(0o700);
    for d in [
        layout.root.join("bin"),
        layout.config_dir(),
        layout.data_dir(),
        layout.root.join("mcp"),
        layout.workspace(),
    ] {
        open.create(&d).map_err(io(&d))?;
    }
    private
        .create(layout.audit_dir())
        .map_err(io(&layout.audit_dir()))?;
    for p in profiles {
        for d in [
            layout.kernelspec(&p.name).parent().map(Path::to_path_buf),
            layout.policy(&p.name).parent().map(Path::to_path_buf),
        ]
        .into_iter()
        .flatten()
        {
            open.create(&d).map_err(io(&d))?;
        }
        for sub in Layout::STATE_DIRS {
            let d = layout.state(&p.name).join(sub);
            private.create(&d).map_err(io(&d))?;
        }
    }
    Ok(())
}

/// `bin/sandgate` (and `bin/sandgate-init`): a hard link to the binary, or a copy where a
/// link cannot be made (another file system). Never a symbolic link: the bundle must not
/// depend on where it was composed.
fn link(sandgate: &Path, dest: &Path) -> Result<(), JupyterError> {
    if std::fs::hard_link(sandgate, dest).is_ok() {
        return Ok(());
    }
    std::fs::copy(sandgate, dest).map_err(io(dest))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755)).map_err(io(dest))
}
