//! Host paths named by a policy. Each is resolved by the host filesystem to its canonical
//! form (symlinks followed, `.`, `..` and repeated slashes gone) before any check, and the
//! canonical path is what gets bound, so no spelling (`//tmp`, `/tmp/.`, `/var/../tmp`, a
//! symlink to `/run`) can pass a check that its target would fail.
//!
//! The resolution itself is injected ([`Resolve`]; `std::fs::canonicalize` in the runner,
//! a table in tests), so the policy stays pure. Where the path as written differs from its
//! target (`/lib` is `usr/lib` on merged-/usr systems), the sandbox gets a symlink at the
//! written place pointing to the bound target: an [`Alias`].

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use crate::error::PolicyError;

/// "What is this host path's canonical form?", as `std::fs::canonicalize` answers it.
pub type Resolve<'a> = &'a dyn Fn(&Path) -> std::io::Result<PathBuf>;

/// A symlink inside the sandbox: `at` (as the policy wrote it) points to `target`, the
/// canonical path that is bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    pub at: PathBuf,
    pub target: PathBuf,
}

/// The path with repeated slashes and `.` removed (what `Path::components` yields); `..` is
/// kept, since only the filesystem knows what it leads to.
pub fn lexical(path: &Path) -> PathBuf {
    path.components().collect()
}

/// Resolves one policy path: absolute, existing, canonical. Returns the canonical path and,
/// when the written path differs and names a place of its own, the alias to create there.
pub fn resolve(
    field: &str,
    value: &str,
    resolve: Resolve<'_>,
) -> Result<(PathBuf, Option<Alias>), PolicyError> {
    let written = PathBuf::from(value);
    if !written.is_absolute() {
        return Err(PolicyError(format!("{field}: {value:?} is not an absolute path")));
    }
    let canonical = resolve(&written).map_err(|e| match e.kind() {
        ErrorKind::NotFound => PolicyError(format!("{field}: {value:?} does not exist")),
        _ => PolicyError(format!("{field}: {value:?}: {e}")),
    })?;
    let at = lexical(&written);
    // A `..` in the written path has no place of its own to put a symlink at.
    let alias = (at != canonical && !at.components().any(|c| c == Component::ParentDir)).then(|| Alias {
        at,
        target: canonical.clone(),
    });
    Ok((canonical, alias))
}

/// Directories that hold, or are ancestors of, host Unix sockets (docker.sock, an SSH agent,
/// D-Bus, X11). Checked on canonical paths only.
const SOCKET_DIRS: [&str; 6] = ["/", "/run", "/var", "/var/run", "/tmp", "/tmp/.X11-unix"];

/// May binding this canonical path expose host Unix sockets?
pub fn may_hold_host_sockets(canonical: &Path) -> bool {
    SOCKET_DIRS.iter().any(|d| canonical == Path::new(d))
        || canonical.starts_with("/run")
        || canonical.starts_with("/var/run")
}

/// Why binding this canonical path would put the host's own over the sandbox's `/proc`
/// (bound after it): the host's `/proc` (or any path in it, `/proc/self` resolving to the
/// runner's) lets the command follow `/proc/PID/root` of the user's other processes to the
/// host's whole file system, writable where the user may write, past every bind; and `/`,
/// bound as a listed path, brings the host's `/proc` and `/dev` along. `None` for any
/// other path. Every network mode: this is the file system's boundary, not the network's.
pub fn shadows_the_sandboxs_own(canonical: &Path) -> Option<&'static str> {
    if canonical == Path::new("/") {
        Some(
            "would cover the sandbox's own /proc and /dev with the host's; fs.allow_read_all or fs.allow_write_all give the whole file system without them",
        )
    } else if canonical.starts_with("/proc") {
        Some(
            "is the host's /proc, whose /proc/PID/root reaches the host's whole file system; the sandbox has a /proc of its own",
        )
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A host with merged /usr, /var/run -> /run, and a user's symlink to /run.
    fn host(path: &Path) -> std::io::Result<PathBuf> {
        let links: BTreeMap<&str, &str> = [
            ("/lib", "/usr/lib"),
            ("/var/run", "/run"),
            ("/home/u/sock-dir", "/run/user/1000"),
            ("/home/u/proj", "/data/proj"),
        ]
        .into();
        let mut out = PathBuf::from("/");
        for c in path.components() {
            match c {
                Component::RootDir | Component::CurDir => {}
                Component::ParentDir => {
                    out.pop();
                }
                Component::Normal(n) => {
                    out.push(n);
                    if let Some(t) = out.to_str().and_then(|s| links.get(s)) {
                        out = PathBuf::from(t);
                    }
                }
                Component::Prefix(_) => unreachable!(),
            }
        }
        if out.starts_with("/nope") {
            return Err(ErrorKind::NotFound.into());
        }
        Ok(out)
    }

    #[test]
    fn every_spelling_of_a_socket_directory_is_caught() {
        for spelling in [
            "/tmp",
            "//tmp",
            "/tmp/.",
            "/tmp/",
            "/./tmp",
            "/var/../tmp",
            "/usr/../tmp",
            "/run",
            "/run/",
            "/var/run",
            "/var/run/dbus",
            "/var/run/../run",
            "/home/u/sock-dir",
            "/home/u/sock-dir/bus",
            "/",
            "//",
            "/usr/..",
            "/var",
            "/tmp/.X11-unix",
        ] {
            let (canonical, _) = resolve("fs.read_paths", spelling, &host).unwrap();
            assert!(
                may_hold_host_sockets(&canonical),
                "{spelling} -> {}",
                canonical.display()
            );
        }
        for fine in [
            "/usr",
            "/lib",
            "/home/u/proj",
            "/etc/ssl",
            "/runner",
            "/var/lib",
            "/tmpfoo",
        ] {
            let (canonical, _) = resolve("fs.read_paths", fine, &host).unwrap();
            assert!(!may_hold_host_sockets(&canonical), "{fine}");
        }
    }

    #[test]
    fn symlinks_bind_their_target_and_leave_an_alias() {
        let (canonical, alias) = resolve("fs.read_paths", "/lib", &host).unwrap();
        assert_eq!(canonical, Path::new("/usr/lib"));
        assert_eq!(
            alias,
            Some(Alias {
                at: "/lib".into(),
                target: "/usr/lib".into()
            })
        );
        let (canonical, alias) = resolve("fs.write_paths", "/home/u/proj/", &host).unwrap();
        assert_eq!(canonical, Path::new("/data/proj"));
        assert_eq!(alias.unwrap().at, Path::new("/home/u/proj"));
        assert_eq!(resolve("x", "//usr/./", &host).unwrap(), ("/usr".into(), None));
        assert_eq!(resolve("x", "/etc/../usr", &host).unwrap(), ("/usr".into(), None));
    }

    #[test]
    fn relative_and_missing_paths_are_errors_naming_the_field() {
        let e = resolve("fs.read_paths", "usr", &host).unwrap_err().0;
        assert_eq!(e, "fs.read_paths: \"usr\" is not an absolute path");
        let e = resolve("fs.write_paths", "/nope/x", &host).unwrap_err().0;
        assert_eq!(e, "fs.write_paths: \"/nope/x\" does not exist");
    }
}
