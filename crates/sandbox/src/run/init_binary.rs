//! Which program starts first inside the sandbox: `sandgate-init`, the small binary built
//! and installed beside `sandgate` (`crates/sandgate/src/bin/sandgate-init.rs`), which reads
//! only the two internal steps ([`crate::steps`]); or, where it is not there, `sandgate`
//! itself, which reads them the same way. Every run executes it once, as the sandbox's PID 1
//! (or before the command where there is no init), and a program of a few megabytes starts
//! about 0.8 ms sooner than the whole `sandgate` (fewer pages for the dynamic loader to
//! relocate and fault in; docs/benchmarks.md, "Sandbox start-up").

use std::path::{Path, PathBuf};

/// The small init's file name, beside `sandgate`.
pub const INIT_BINARY: &str = "sandgate-init";

/// The program bound into the sandbox at [`crate::argv::INIT_PATH`]: `sandgate-init` in
/// `sandgate_exe`'s directory when it is a regular file someone may execute (its real path,
/// so the bind checks it as it checks every source), else `sandgate_exe`.
pub fn init_binary(sandgate_exe: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let beside = sandgate_exe.with_file_name(INIT_BINARY);
    match std::fs::canonicalize(&beside).and_then(|p| Ok((std::fs::metadata(&p)?, p))) {
        Ok((meta, real)) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => real,
        _ => sandgate_exe.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_small_init_is_taken_only_when_it_is_an_executable_file_beside_sandgate() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("sandgate");
        std::fs::write(&exe, b"").unwrap();
        assert_eq!(init_binary(&exe), exe, "nothing beside");
        let init = dir.path().join(INIT_BINARY);
        std::fs::write(&init, b"").unwrap();
        std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(init_binary(&exe), exe, "not executable");
        std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(init_binary(&exe), init.canonicalize().unwrap());
        std::fs::remove_file(&init).unwrap();
        std::fs::create_dir(&init).unwrap();
        assert_eq!(init_binary(&exe), exe, "a directory");
        std::fs::remove_dir(&init).unwrap();
        let elsewhere = dir.path().join("real-init");
        std::fs::write(&elsewhere, b"").unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &init).unwrap();
        assert_eq!(
            init_binary(&exe),
            elsewhere.canonicalize().unwrap(),
            "a link: its target"
        );
    }
}
