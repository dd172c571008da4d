//! `sandgate jupyter kernel --bundle DIR --profile NAME --connection-file F` (internal): what
//! the kernelspecs of a bundle with a carried environment run.
//!
//! It finds the bundle's canonical place, checks the carried environment
//! ([`crate::carry::check`]) and executes, in place, the profile's `sandgate run` line
//! ([`crate::render::run_argv`], the line an external Python's kernelspec holds as it is)
//! with the interpreter `BUNDLE/env/bin/python`. The kernelspec cannot name that path
//! itself: Jupyter knows the bundle only as `{resource_dir}/../..`, which does not resolve
//! inside the sandbox, where `kernels/` is not mounted. No sandbox logic here.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use crate::JupyterError;
use crate::bundle::{BundlePython, LauncherSettings, Layout};
use crate::carry;
use crate::profile::ProfileName;
use crate::render;

/// How Jupyter started the kernel.
#[derive(Debug, Clone)]
pub struct KernelOptions {
    pub bundle: PathBuf,
    pub profile: String,
    pub connection_file: PathBuf,
}

/// The `sandgate run` line of this kernel, every path canonical.
pub fn argv(opts: &KernelOptions) -> Result<Vec<String>, JupyterError> {
    let root = std::fs::canonicalize(&opts.bundle)
        .map_err(|e| JupyterError::Usage(format!("--bundle {}: {e}", opts.bundle.display())))?;
    let layout = Layout::new(root);
    let settings = LauncherSettings::load(&layout)?;
    let profile = ProfileName::parse(&opts.profile)?;
    if !settings.profiles.contains(&profile) {
        return Err(JupyterError::Usage(format!(
            "--profile {profile}: the bundle {} has no such profile",
            layout.root.display()
        )));
    }
    if settings.python == BundlePython::Carried {
        carry::check(&layout)?;
    }
    let text = |p: &Path| {
        p.to_str()
            .map(str::to_owned)
            .ok_or_else(|| JupyterError::Usage(format!("{} is not UTF-8", p.display())))
    };
    Ok(render::run_argv(
        &text(&layout.root)?,
        &profile,
        &text(&settings.python.path(&layout))?,
        &text(&opts.connection_file)?,
    ))
}

/// Executes the kernel's `sandgate run` line; returns only on failure.
pub fn run(opts: &KernelOptions) -> Result<i32, JupyterError> {
    let argv = argv(opts)?;
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| JupyterError::Failed("no command".into()))?;
    let error = std::process::Command::new(program).args(args).exec();
    Err(JupyterError::Failed(format!("cannot run {program}: {error}")))
}
