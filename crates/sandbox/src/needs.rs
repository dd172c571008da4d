//! What a command needs to read on this machine, for `sandgate init --for CMD`: the
//! program (found on `PATH` as `execvp` would), every symlink on the way to it, its `#!`
//! interpreter (through `/usr/bin/env NAME` too), the shared libraries of each ELF file as
//! the dynamic loader lists them (`ldd`), Python's `sys.path` and prefix when the
//! interpreter is a Python, and the directories of arguments that are files (the script).
//!
//! The answer is a list of directories as the host spells them (the sandbox policy resolves
//! symlinks itself and adds the aliases). Each outside command (`ldd`, the Python) runs with
//! a time limit, and nothing it prints is trusted beyond being a path that exists.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long `ldd` or the Python may take to answer.
const ASK_LIMIT: Duration = Duration::from_secs(10);
/// `#!` interpreters followed at most (a script run by a script run by ...).
const MAX_INTERPRETERS: usize = 4;

/// Why a command's needs cannot be found.
#[derive(Debug, thiserror::Error)]
pub enum NeedsError {
    #[error("--for: an empty command")]
    Empty,
    #[error("--for: {0:?} is not on PATH (give its path)")]
    NotFound(String),
    #[error("--for: cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
}

/// What the command needs: the program as found, and directories to bind read-only.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// The program's path as found (on PATH or as given).
    pub program: PathBuf,
    /// Directories to put first on the command's PATH: the program's, and the real
    /// interpreter's when the program is a launcher (a pyenv shim, a venv link).
    pub path_dirs: Vec<PathBuf>,
    /// Directories (absolute, as the host spells them), without one under another.
    pub read_dirs: Vec<PathBuf>,
}

/// Finds `name` as `execvp` would: a name with a `/` as it is, else the first executable
/// file of that name in `path`.
pub fn find_program(name: &str, path: Option<&std::ffi::OsStr>, cwd: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if name.contains('/') {
        let p = cwd.join(name);
        return p.is_file().then_some(p);
    }
    let path = path?;
    std::env::split_paths(path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// The needs of `command` (a program and its arguments) on this machine.
pub fn of_command(command: &[String]) -> Result<Needs, NeedsError> {
    let name = command.first().ok_or(NeedsError::Empty)?;
    let cwd = std::env::current_dir().map_err(|source| NeedsError::Read {
        path: ".".to_owned(),
        source,
    })?;
    let path = std::env::var_os("PATH");
    let program =
        find_program(name, path.as_deref(), &cwd).ok_or_else(|| NeedsError::NotFound(name.clone()))?;
    let mut files: Vec<PathBuf> = Vec::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut path_dirs: Vec<PathBuf> = program.parent().map(Path::to_path_buf).into_iter().collect();
    let mut current = program.clone();
    let mut python = is_python(&program).then(|| program.clone());
    for _ in 0..MAX_INTERPRETERS {
        files.extend(symlink_chain(&current));
        files.extend(shared_libraries(&current));
        if python.is_none() && is_python(&current) {
            python = Some(current.clone());
        }
        match interpreter(&current)? {
            Some(next) => current = next,
            None => break,
        }
    }
    // A Python says where it really is (behind a pyenv shim or a venv's link) and what it
    // imports from.
    if let Some((executable, imports)) = python.as_deref().and_then(python_facts) {
        files.extend(symlink_chain(&executable));
        files.extend(shared_libraries(&executable));
        dirs.extend(imports);
        path_dirs.extend(executable.parent().map(Path::to_path_buf));
        path_dirs.reverse();
    }
    // Arguments that are files (the script) bring their directory; a relative one is
    // found from the working directory, which bwrap keeps when it is bound.
    for arg in command.iter().skip(1) {
        let p = cwd.join(arg);
        if !arg.starts_with('-') && p.is_file() {
            dirs.extend(
                std::fs::canonicalize(&p)
                    .ok()
                    .and_then(|c| c.parent().map(Path::to_path_buf)),
            );
            if !Path::new(arg).is_absolute() {
                dirs.push(cwd.clone());
            }
        }
    }
    dirs.extend(files.iter().filter_map(|f| f.parent().map(Path::to_path_buf)));
    path_dirs.dedup();
    Ok(Needs {
        program,
        path_dirs,
        read_dirs: outermost(dirs),
    })
}

/// `path` and every link on the way to its target, each as spelled.
fn symlink_chain(path: &Path) -> Vec<PathBuf> {
    let mut out = vec![path.to_path_buf()];
    let mut current = path.to_path_buf();
    for _ in 0..32 {
        let Ok(target) = std::fs::read_link(&current) else {
            break;
        };
        let parent = current.parent().unwrap_or(Path::new("/"));
        current = parent.join(target);
        out.push(current.clone());
    }
    out
}

/// The `#!` interpreter of a script, `/usr/bin/env NAME` followed to NAME on PATH.
fn interpreter(path: &Path) -> Result<Option<PathBuf>, NeedsError> {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|source| NeedsError::Read {
            path: path.display().to_string(),
            source,
        })?;
    let head = head.get(..n).unwrap_or_default();
    let Some(line) = head.strip_prefix(b"#!") else {
        return Ok(None);
    };
    let line = line.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let Some(first) = words.next() else {
        return Ok(None);
    };
    if Path::new(first).file_name().is_some_and(|n| n == "env") {
        let name = words.find(|w| !w.starts_with('-'));
        let path_var = std::env::var_os("PATH");
        let found = name.and_then(|n| find_program(n, path_var.as_deref(), Path::new("/")));
        return Ok(found.map_or_else(|| Some(PathBuf::from(first)), Some));
    }
    Ok(Some(PathBuf::from(first)))
}

fn is_elf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

fn is_python(path: &Path) -> bool {
    std::fs::canonicalize(path)
        .ok()
        .and_then(|c| c.file_name().map(|n| n.to_string_lossy().starts_with("python")))
        .unwrap_or(false)
        || path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("python"))
}

/// The shared libraries (and the loader) of an ELF file, from `ldd`'s list.
fn shared_libraries(path: &Path) -> Vec<PathBuf> {
    if !is_elf(path) {
        return Vec::new();
    }
    let Some(out) = ask(Command::new("ldd").arg(path)) else {
        return Vec::new();
    };
    parse_ldd(&out)
        .into_iter()
        .flat_map(|lib| symlink_chain(&lib))
        .collect()
}

/// The paths in `ldd` output: `libc.so.6 => /lib/.../libc.so.6 (0x...)` and
/// `/lib64/ld-linux-x86-64.so.2 (0x...)`; `linux-vdso.so.1` and missing libraries have none.
pub fn parse_ldd(out: &str) -> Vec<PathBuf> {
    out.lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = l.split_once("=>").map_or(l, |(_, right)| right.trim());
            let path = path.split(" (").next()?.trim();
            Some(PathBuf::from(path)).filter(|p| p.is_absolute())
        })
        .collect()
}

/// A Python's real executable (`sys.executable`), and what it imports from: its prefix
/// when it is a virtual environment (for `pyvenv.cfg`) and `sys.path`.
fn python_facts(python: &Path) -> Option<(PathBuf, Vec<PathBuf>)> {
    let script = "import sys\nprint(sys.executable)\nprint(sys.prefix if sys.prefix != sys.base_prefix else '')\nfor p in sys.path:\n    print(p)";
    let out = ask(Command::new(python).args(["-I", "-c", script]))?;
    let mut lines = out.lines().map(PathBuf::from);
    let executable = lines.next().filter(|p| p.is_absolute() && p.is_file())?;
    let dirs = lines
        .filter(|p| p.is_absolute() && p.exists())
        .map(|p| {
            if p.is_dir() {
                p
            } else {
                p.parent().map(Path::to_path_buf).unwrap_or(p)
            }
        })
        .collect();
    Some((executable, dirs))
}

/// Runs `cmd` with no input, for at most [`ASK_LIMIT`]; its stdout when it succeeded.
fn ask(cmd: &mut Command) -> Option<String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout.by_ref().take(1 << 20).read_to_end(&mut out);
        out
    });
    let deadline = Instant::now() + ASK_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let out = reader.join().ok()?;
    status
        .filter(|s| s.success())
        .map(|_| String::from_utf8_lossy(&out).into_owned())
}

/// The directories that are not under another in the list, sorted; `/` itself is never
/// one (a policy cannot bind it outside `net.mode: all`).
pub fn outermost(dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let set: BTreeSet<PathBuf> = dirs
        .into_iter()
        .filter(|d| d.is_absolute() && d.parent().is_some())
        .collect();
    let mut out: Vec<PathBuf> = Vec::new();
    for d in set {
        if !out.iter().any(|kept| d.starts_with(kept)) {
            out.push(d);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_libraries_and_the_loader() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\tlibgone.so => not found\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(out),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
    }

    #[test]
    fn only_the_outermost_directories_are_kept() {
        let dirs = ["/usr/lib/python3", "/usr/lib", "/usr/lib/x", "/lib64", "/", "rel"]
            .map(PathBuf::from)
            .to_vec();
        assert_eq!(
            outermost(dirs),
            [PathBuf::from("/lib64"), PathBuf::from("/usr/lib")]
        );
    }
}
