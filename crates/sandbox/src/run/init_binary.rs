//! Which program starts first inside the sandbox: `sandgate-init`, the small binary built
//! and installed beside `sandgate` (`crates/sandgate/src/bin/sandgate-init.rs`), which reads
//! only the two internal steps ([`crate::steps`]); or, where it is not there or not to be
//! trusted, `sandgate` itself, which reads them the same way. Every run executes it once,
//! as the sandbox's PID 1 (or before the command where there is no init), and a program of
//! a few megabytes starts about 0.8 ms sooner than the whole `sandgate` (fewer pages for
//! the dynamic loader to relocate and fault in; docs/benchmarks.md, "Sandbox start-up").
//!
//! It loads the sandbox's filter into PID 1, so it is trusted exactly as `sandgate` is, and
//! no more: only where nobody but `sandgate`'s owner (or root) could have put it there or
//! could change it ([`untrusted`]). A file another user created in a shared directory (a
//! sticky `/tmp`) is never run.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The small init's file name, beside `sandgate`.
pub const INIT_BINARY: &str = "sandgate-init";

/// The program bound into the sandbox at [`crate::argv::INIT_PATH`]: `sandgate-init` in
/// `sandgate_exe`'s directory where [`untrusted`] finds nothing against it, else
/// `sandgate_exe`.
pub fn init_binary(sandgate_exe: &Path) -> PathBuf {
    let beside = sandgate_exe.with_file_name(INIT_BINARY);
    if untrusted(sandgate_exe, &beside).is_none() {
        beside
    } else {
        sandgate_exe.to_path_buf()
    }
}

/// Why the `sandgate-init` beside `sandgate_exe` is not used, where one is there (for
/// `sandgate doctor`); `None` when it is used or there is none.
pub fn init_not_used(sandgate_exe: &Path) -> Option<String> {
    let beside = sandgate_exe.with_file_name(INIT_BINARY);
    std::fs::symlink_metadata(&beside).ok()?;
    untrusted(sandgate_exe, &beside).map(|why| format!("{} is not used: {why}", beside.display()))
}

/// What stops `init` standing in for `sandgate_exe`, if anything. It may when: both paths
/// are absolute (a relative one would be looked up in the working directory); the directory
/// holding them belongs to root or to `sandgate`'s owner and no one else may write it (so no
/// one else can create, rename or replace an entry in it, sticky bit or not); every
/// directory above it belongs to root or that owner and no one else may write it, or is
/// sticky (so no one else can rename a directory on the way and put another in its place
/// between this check and bwrap's mount); `init` is a regular file, not a link, of that same
/// owner or root, that no one else may write; and this process may execute it.
fn untrusted(sandgate_exe: &Path, init: &Path) -> Option<&'static str> {
    let (Some(dir), Ok(exe)) = (sandgate_exe.parent(), std::fs::metadata(sandgate_exe)) else {
        return Some("sandgate's own path is unknown");
    };
    if !sandgate_exe.is_absolute() {
        return Some("sandgate's own path is not absolute");
    }
    let owners = |uid: u32| uid == 0 || uid == exe.uid();
    let private = |meta: &std::fs::Metadata| owners(meta.uid()) && meta.mode() & 0o022 == 0;
    if !std::fs::metadata(dir).is_ok_and(|d| d.is_dir() && private(&d)) {
        return Some("its directory belongs to another user or others may write it");
    }
    let sticky = |meta: &std::fs::Metadata| owners(meta.uid()) && meta.mode() & 0o1000 != 0;
    if !dir
        .ancestors()
        .skip(1)
        .all(|above| std::fs::metadata(above).is_ok_and(|d| private(&d) || sticky(&d)))
    {
        return Some(
            "a directory above it belongs to another user, or others may write it and it is not sticky",
        );
    }
    if !std::fs::symlink_metadata(init).is_ok_and(|f| f.file_type().is_file() && private(&f)) {
        return Some("it is not a regular file of sandgate's owner or root that only its owner may write");
    }
    if rustix::fs::access(init, rustix::fs::Access::EXEC_OK).is_err() {
        return Some("this user may not execute it");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn the_small_init_is_taken_only_as_an_executable_file_beside_sandgate() {
        let dir = tempfile::tempdir().unwrap();
        mode(dir.path(), 0o755);
        let exe = dir.path().join("sandgate");
        std::fs::write(&exe, b"").unwrap();
        assert_eq!(init_binary(&exe), exe, "nothing beside");
        let init = dir.path().join(INIT_BINARY);
        std::fs::write(&init, b"").unwrap();
        mode(&init, 0o644);
        assert_eq!(init_binary(&exe), exe, "not executable");
        mode(&init, 0o755);
        assert_eq!(init_binary(&exe), init);
        assert_eq!(
            init_binary(Path::new("sandgate")),
            Path::new("sandgate"),
            "a relative path: never one from the working directory"
        );
        std::fs::remove_file(&init).unwrap();
        std::fs::create_dir(&init).unwrap();
        assert_eq!(init_binary(&exe), exe, "a directory");
        std::fs::remove_dir(&init).unwrap();
        let elsewhere = dir.path().join("real-init");
        std::fs::write(&elsewhere, b"").unwrap();
        mode(&elsewhere, 0o755);
        std::os::unix::fs::symlink(&elsewhere, &init).unwrap();
        assert_eq!(init_binary(&exe), exe, "a link");
    }

    /// What another user could have made or could change is never taken: a directory
    /// others may write (a sticky /tmp included), an init others may write.
    #[test]
    fn an_init_others_could_plant_or_change_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("sandgate");
        std::fs::write(&exe, b"").unwrap();
        let init = dir.path().join(INIT_BINARY);
        std::fs::write(&init, b"").unwrap();
        mode(&init, 0o755);
        for (dir_mode, init_mode) in [
            (0o1777, 0o755),
            (0o775, 0o755),
            (0o757, 0o755),
            (0o755, 0o775),
            (0o755, 0o757),
        ] {
            mode(dir.path(), dir_mode);
            mode(&init, init_mode);
            assert_eq!(
                init_binary(&exe),
                exe,
                "directory {dir_mode:o}, init {init_mode:o}"
            );
        }
        mode(dir.path(), 0o755);
        mode(&init, 0o755);
        assert_eq!(init_binary(&exe), init);
    }

    /// A directory above that others may write and that is not sticky lets them rename the
    /// binaries' directory away and put their own in its place between the check and the
    /// mount (a race a reviewer won 10 times in 40): not taken. Sticky, they cannot.
    #[test]
    fn an_init_under_a_directory_others_could_rename_is_not_taken() {
        let top = tempfile::tempdir().unwrap();
        let bin = top.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        mode(&bin, 0o755);
        let exe = bin.join("sandgate");
        std::fs::write(&exe, b"").unwrap();
        let init = bin.join(INIT_BINARY);
        std::fs::write(&init, b"").unwrap();
        mode(&init, 0o755);
        mode(top.path(), 0o777);
        assert_eq!(init_binary(&exe), exe, "a parent others may write");
        assert!(init_not_used(&exe).is_some_and(|why| why.contains("above")));
        mode(top.path(), 0o1777);
        assert_eq!(init_binary(&exe), init, "a sticky parent");
        assert_eq!(init_not_used(&exe), None);
        mode(top.path(), 0o755);
    }
}
