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
//! could change it ([`trusted`]). A file another user created in a shared directory (a
//! sticky `/tmp`) is never run.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The small init's file name, beside `sandgate`.
pub const INIT_BINARY: &str = "sandgate-init";

/// The program bound into the sandbox at [`crate::argv::INIT_PATH`]: `sandgate-init` in
/// `sandgate_exe`'s directory where [`trusted`] accepts it, else `sandgate_exe`.
pub fn init_binary(sandgate_exe: &Path) -> PathBuf {
    let beside = sandgate_exe.with_file_name(INIT_BINARY);
    if trusted(sandgate_exe, &beside) {
        beside
    } else {
        sandgate_exe.to_path_buf()
    }
}

/// `init` may stand in for `sandgate_exe` when: both paths are absolute (a relative one
/// would be looked up in the working directory); the directory holding them belongs to
/// root or to `sandgate`'s owner and no one else may write it (so no one else can create,
/// rename or replace an entry in it, sticky bit or not); `init` is a regular file, not a
/// link, of that same owner or root, that no one else may write; and this process may
/// execute it (its effective user, as bwrap will).
fn trusted(sandgate_exe: &Path, init: &Path) -> bool {
    let (Some(dir), Ok(exe)) = (sandgate_exe.parent(), std::fs::metadata(sandgate_exe)) else {
        return false;
    };
    let owners = |uid: u32| uid == 0 || uid == exe.uid();
    let private = |meta: &std::fs::Metadata| owners(meta.uid()) && meta.mode() & 0o022 == 0;
    sandgate_exe.is_absolute()
        && std::fs::metadata(dir).is_ok_and(|d| d.is_dir() && private(&d))
        && std::fs::symlink_metadata(init).is_ok_and(|f| f.file_type().is_file() && private(&f))
        && rustix::fs::access(init, rustix::fs::Access::EXEC_OK).is_ok()
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
}
