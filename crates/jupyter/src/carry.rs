//! The carried environment (`--python-env copy`): a copy of a venv in the bundle's `env/`,
//! so the bundle moves with its Python, to another path or to another machine with the
//! same OS and the same base Python.
//!
//! Python finds a venv from the path it was started by (`pyvenv.cfg` beside or above
//! `bin/python`), so a copied venv works wherever it is, as long as its base Python is
//! where `pyvenv.cfg`'s `home` says: that base (and the links `bin/python*` to it) is what a
//! bundle needs from the machine. What else in a venv is absolute, the copy makes whole:
//! - `pyvenv.cfg`'s `command` (the source venv's path, for information) is dropped;
//! - the activate scripts, which set `VIRTUAL_ENV` to the source, are left out (they are
//!   for shells; the launcher runs `python -m`);
//! - a script whose shebang names a Python by absolute path (the venv's own, where it was
//!   made) gets a `/bin/sh` trampoline instead, which runs the interpreter beside the
//!   script, wherever it is (a kernel's `!pip list`);
//! - every file keeps its modification time, so the compiled `.pyc` files stay valid.
//!
//! [`check`] runs before anything of the carried environment runs, on the copy at compose
//! and at every launch and kernel start: `env/` is the bundle's own directory (every
//! kernel's policy binds it, so a symbolic link there would put what it points to in every
//! sandbox), its base Python is here and outside the bundle (where kernels write), and no
//! symbolic link in it leaves it but the interpreter's, to that base. It does not make a
//! tampered bundle safe to run: `env/` is code, like `bin/sandgate`, and whoever can write
//! the bundle outside a sandbox decides what runs.

use std::fs::FileType;
use std::path::{Path, PathBuf};

use crate::JupyterError;
use crate::bundle::{Layout, read_small};

/// `--python-env`: where the bundle's Python comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonEnv {
    /// The interpreter stays where it is; the bundle names it by its absolute path.
    External,
    /// The interpreter's venv is copied into the bundle's `env/`.
    Copy,
}

impl PythonEnv {
    pub fn parse(text: &str) -> Result<PythonEnv, JupyterError> {
        match text {
            "external" => Ok(PythonEnv::External),
            "copy" => Ok(PythonEnv::Copy),
            _ => Err(JupyterError::Usage(format!(
                "--python-env {text:?}: expected external or copy"
            ))),
        }
    }
}

/// What the copy and the check need of `pyvenv.cfg`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VenvConfig {
    /// `home`: the directory of the base interpreter.
    pub home: PathBuf,
    /// `version`, when given (for messages).
    pub version: Option<String>,
}

impl VenvConfig {
    /// `key = value` lines, as Python's own reader takes them; `home` must be absolute.
    pub fn parse(text: &str) -> Result<VenvConfig, String> {
        let value = |key: &str| {
            text.lines()
                .filter_map(|l| l.split_once('='))
                .find(|(k, _)| k.trim() == key)
                .map(|(_, v)| v.trim().to_owned())
        };
        let home = value("home").ok_or("pyvenv.cfg has no home")?;
        if !Path::new(&home).is_absolute() {
            return Err(format!("pyvenv.cfg: home {home:?} is not an absolute path"));
        }
        Ok(VenvConfig {
            home: PathBuf::from(home),
            version: value("version"),
        })
    }
}

/// `pyvenv.cfg` as the bundle carries it: without `command`, which names the source venv.
pub fn carried_config(text: &str) -> String {
    text.lines()
        .filter(|l| l.split_once('=').is_none_or(|(k, _)| k.trim() != "command"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// A script whose shebang names a Python by absolute path, `#!/.../bin/python3` (pip's
/// form: the venv's interpreter where the venv was made, which may not be where it was
/// copied from), with a `/bin/sh` trampoline instead that runs the `python` beside the
/// script, wherever it is (the form pip writes for long paths, made relative); None for
/// anything else (`#!/usr/bin/env python3` finds the carried one on PATH). The string on
/// lines 2-3 is the module's docstring to Python and an `exec` to the shell.
pub fn trampoline(script: &[u8]) -> Option<Vec<u8>> {
    let (first, rest) = script.split_at(script.iter().position(|b| *b == b'\n')? + 1);
    let first = std::str::from_utf8(first).ok()?.trim_end();
    let interpreter = Path::new(first.strip_prefix("#!")?);
    let version = interpreter.file_name()?.to_str()?.strip_prefix("python")?;
    if !interpreter.is_absolute() || !version.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let mut out = TRAMPOLINE.to_vec();
    out.extend_from_slice(rest);
    Some(out)
}

/// The first lines of a trampolined script.
const TRAMPOLINE: &[u8] =
    b"#!/bin/sh\n'''exec' \"$(dirname -- \"$(realpath -- \"$0\")\")/python\" \"$0\" \"$@\"\n' '''\n";

/// May a symbolic link at `rel` (from the environment's root) resolve to `real`? Inside the
/// environment, always; out of it, only an interpreter link in `bin/` to the base Python.
pub fn link_allowed(rel: &Path, real: &Path, env_real: &Path, home_real: &Path) -> bool {
    real.starts_with(env_real) || (rel.parent() == Some(Path::new("bin")) && real.starts_with(home_real))
}

/// Every entry under `root` (not following links), parents first, as a path relative to it.
fn walk(
    root: &Path,
    visit: &mut dyn FnMut(&Path, FileType) -> Result<(), JupyterError>,
) -> Result<(), JupyterError> {
    let mut stack = vec![PathBuf::new()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(root.join(&dir))
            .map_err(|e| JupyterError::Failed(format!("cannot read {}: {e}", root.join(&dir).display())))?;
        for entry in entries {
            let entry = entry.map_err(|e| JupyterError::Failed(format!("{}: {e}", root.display())))?;
            let kind = entry
                .file_type()
                .map_err(|e| JupyterError::Failed(format!("{}: {e}", entry.path().display())))?;
            let rel = dir.join(entry.file_name());
            visit(&rel, kind)?;
            if kind.is_dir() {
                stack.push(rel);
            }
        }
    }
    Ok(())
}

/// Copies the venv at `source` (its `sys.prefix`) to `dest` (new); see the module docs.
/// Links are copied as they are: [`check`] then refuses one that leaves the copy.
pub fn copy_venv(source: &Path, dest: &Path) -> Result<(), JupyterError> {
    let fail = |what: &Path| {
        let what = what.to_path_buf();
        move |e: std::io::Error| JupyterError::Failed(format!("cannot copy {}: {e}", what.display()))
    };
    let source = std::fs::canonicalize(source).map_err(fail(source))?;
    let cfg_text = read_small(&source.join("pyvenv.cfg")).map_err(|e| {
        JupyterError::Usage(format!(
            "--python-env copy: {} is not a venv ({e} reading its pyvenv.cfg)",
            source.display()
        ))
    })?;
    std::fs::create_dir(dest).map_err(fail(dest))?;
    walk(&source, &mut |rel, kind| {
        let (from, to) = (source.join(rel), dest.join(rel));
        let in_bin = rel.parent() == Some(Path::new("bin"));
        let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if kind.is_dir() {
            std::fs::create_dir(&to).map_err(fail(&to))?;
            let mode = std::fs::metadata(&from).map_err(fail(&from))?.permissions();
            return std::fs::set_permissions(&to, mode).map_err(fail(&to));
        }
        if kind.is_symlink() {
            let target = std::fs::read_link(&from).map_err(fail(&from))?;
            return std::os::unix::fs::symlink(target, &to).map_err(fail(&to));
        }
        if !kind.is_file() {
            return Err(JupyterError::Usage(format!(
                "--python-env copy: {} is not a file, a directory or a link",
                from.display()
            )));
        }
        if in_bin && (name.starts_with("activate") || name == "Activate.ps1") {
            return Ok(());
        }
        if rel == Path::new("pyvenv.cfg") {
            return std::fs::write(&to, carried_config(&cfg_text)).map_err(fail(&to));
        }
        let rewritten = if in_bin {
            let head = std::fs::read(&from).map_err(fail(&from))?;
            trampoline(&head)
        } else {
            None
        };
        match rewritten {
            Some(text) => {
                std::fs::write(&to, text).map_err(fail(&to))?;
                let mode = std::fs::metadata(&from).map_err(fail(&from))?.permissions();
                std::fs::set_permissions(&to, mode).map_err(fail(&to))?;
            }
            None => {
                std::fs::copy(&from, &to).map_err(fail(&from))?;
            }
        }
        keep_mtime(&from, &to)
    })
}

/// `to` gets `from`'s modification time: a `.pyc` records its source's, and Python
/// recompiles (writing into the bundle) when they differ.
fn keep_mtime(from: &Path, to: &Path) -> Result<(), JupyterError> {
    let fail = |e: std::io::Error| JupyterError::Failed(format!("cannot copy {}: {e}", from.display()));
    let modified = std::fs::metadata(from).and_then(|m| m.modified()).map_err(fail)?;
    std::fs::File::open(to)
        .and_then(|f| f.set_modified(modified))
        .map_err(fail)
}

/// Checks the carried environment of the bundle at `layout` (its root canonical) before
/// any of it runs; see the module docs. Usage errors name what is wrong; a base Python
/// missing on this machine is "unavailable".
pub fn check(layout: &Layout) -> Result<(), JupyterError> {
    let env = layout.env_dir();
    let tampered = |what: String| tampered(layout, what);
    match std::fs::symlink_metadata(&env) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(tampered(
                "env is a symbolic link, not the bundle's own directory: every kernel's policy binds env, and would bind what it points to".into(),
            ));
        }
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(tampered("env is not a directory".into())),
        Err(e) => return Err(tampered(format!("env: {e}"))),
    }
    let cfg = read_small(&env.join("pyvenv.cfg"))
        .map_err(|e| e.to_string())
        .and_then(|t| VenvConfig::parse(&t))
        .map_err(|e| tampered(format!("env/pyvenv.cfg: {e}")))?;
    let home_real = std::fs::canonicalize(&cfg.home).map_err(|e| {
        JupyterError::Unavailable(format!(
            "the bundle's Python environment is built on the Python in {} (version {}), which is not on this machine ({e}): install that Python at that path, or compose the bundle again here",
            cfg.home.display(),
            cfg.version.as_deref().unwrap_or("unknown")
        ))
    })?;
    if home_real.starts_with(&layout.root) {
        return Err(tampered(format!(
            "env/pyvenv.cfg: home {} is inside the bundle (a base Python must be outside it, away from what kernels write)",
            cfg.home.display()
        )));
    }
    links_stay_inside(layout, &cfg.home, &home_real)?;
    match std::fs::metadata(layout.env_python()) {
        Ok(m) if m.is_file() => Ok(()),
        _ => Err(tampered("env/bin/python is missing".into())),
    }
}

/// Every symbolic link in `env/` resolves inside it, or is an interpreter link to the base
/// Python in `home` ([`link_allowed`]); a link that points nowhere is refused too.
fn links_stay_inside(layout: &Layout, home: &Path, home_real: &Path) -> Result<(), JupyterError> {
    let env = layout.env_dir();
    let env_real = std::fs::canonicalize(&env).map_err(|e| tampered(layout, format!("env: {e}")))?;
    walk(&env, &mut |rel, kind| {
        if !kind.is_symlink() {
            return Ok(());
        }
        let shown = Path::new("env").join(rel);
        let real = std::fs::canonicalize(env.join(rel)).map_err(|e| {
            let what = format!("{}: a symbolic link that points nowhere ({e})", shown.display());
            tampered(layout, what)
        })?;
        if link_allowed(rel, &real, &env_real, home_real) {
            return Ok(());
        }
        Err(tampered(
            layout,
            format!(
                "{} is a symbolic link out of the carried environment (to {}); only bin/python* may leave it, for the base Python in {}",
                shown.display(),
                real.display(),
                home.display()
            ),
        ))
    })
}

/// A carried environment that fails its check: a usage error naming the bundle and what.
fn tampered(layout: &Layout, what: String) -> JupyterError {
    JupyterError::Usage(format!(
        "{}: {what}; compose the bundle again (docs/jupyter.md, \"The carried environment\")",
        layout.root.display()
    ))
}

#[cfg(test)]
#[path = "carry_tests.rs"]
mod tests;
