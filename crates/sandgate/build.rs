//! What `sandgate --version` and the `sandgate_build_info` metric say about the build: the
//! commit (`git rev-parse --short HEAD`, or "unknown" when built from a tarball or without
//! git) and the build date (SOURCE_DATE_EPOCH when set, as reproducible builds ask; else the
//! commit's date; else "unknown"), both UTC days. Never the clock: two builds of one commit
//! are the same binary.
//!
//! Reruns only when HEAD moves (`.git/HEAD`, the ref it names, `packed-refs`) or
//! SOURCE_DATE_EPOCH changes, so an ordinary edit-and-build does not run git nor rebuild
//! anything for it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let watched = head_files(&here);
    for path in &watched {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    if watched.is_empty() {
        // Not a git checkout: nothing to watch but this file (the default would be every file
        // of the package).
        println!("cargo:rerun-if-changed=build.rs");
    }
    let commit = git(&here, &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(s) => s.trim().parse::<i64>().ok(),
        Err(_) => git(&here, &["log", "-1", "--format=%ct", "HEAD"]).and_then(|s| s.parse().ok()),
    };
    let date = epoch.map_or_else(|| "unknown".into(), utc_date);
    println!("cargo:rustc-env=SANDGATE_COMMIT={commit}");
    println!("cargo:rustc-env=SANDGATE_BUILD_DATE={date}");
}

/// `git ARGS` in `dir`: its trimmed output, or None when git is missing, fails or says nothing.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// The files whose change means HEAD names another commit: HEAD itself, the branch it points
/// to and packed-refs, those that exist (a missing one would rerun this script every build).
fn head_files(dir: &Path) -> Vec<PathBuf> {
    let path_of =
        |p: &str| git(dir, &["rev-parse", "--path-format=absolute", "--git-path", p]).map(PathBuf::from);
    let Some(head) = path_of("HEAD") else {
        return Vec::new();
    };
    let mut files = vec![head.clone()];
    if let Some(target) = std::fs::read_to_string(&head)
        .ok()
        .and_then(|h| h.strip_prefix("ref:").map(|r| r.trim().to_owned()))
        && let Some(branch) = path_of(&target)
    {
        files.push(branch);
    }
    files.extend(path_of("packed-refs"));
    files.retain(|f| f.exists());
    files
}

/// Seconds since 1970 as a UTC `YYYY-MM-DD` (Howard Hinnant's days-to-civil algorithm).
fn utc_date(epoch: i64) -> String {
    let z = epoch.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
