//! The sandbox steps' build identity (`SANDGATE_STEPS_BUILD`): a hash of the sources that
//! make the sandbox's init (the `.rs` files of this crate and of the workspace crates it is
//! built from, but not their unit tests' `*_tests.rs`; their manifests; Cargo.lock).
//! `sandgate run` passes it on the init's command line and the init refuses another
//! (`crate::steps`), so a `sandgate-init` left from another build (an
//! upgrade that replaced only `sandgate`, a `cargo run` that rebuilt only `sandgate`) runs
//! nothing instead of holding the sandbox with another filter.
//!
//! Reruns when a file under those directories changes; this crate is rebuilt then anyway,
//! since it depends on all of them.

use std::hash::Hasher;
use std::path::{Path, PathBuf};

/// The workspace crates the init is built from, beside this one (`crates/NAME`).
const CRATES: [&str; 5] = ["sandbox", "policy", "proxy", "audit", "relay"];

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let crates = here.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut roots: Vec<PathBuf> = CRATES
        .iter()
        .flat_map(|c| [crates.join(c).join("src"), crates.join(c).join("Cargo.toml")])
        .collect();
    roots.push(crates.join("..").join("Cargo.lock"));
    let mut hasher = std::hash::DefaultHasher::new();
    for root in &roots {
        println!("cargo:rerun-if-changed={}", root.display());
        let mut files = Vec::new();
        collect(root, &mut files);
        // What goes into the binary: sources and manifests, not unit tests (`*_tests.rs`)
        // or an editor's files beside them.
        files.retain(|f| {
            let name = f.file_name().unwrap_or_default().to_string_lossy();
            (name.ends_with(".rs") && !name.ends_with("_tests.rs"))
                || name == "Cargo.toml"
                || name == "Cargo.lock"
        });
        files.sort();
        for file in files {
            hasher.write(
                file.strip_prefix(&crates)
                    .unwrap_or(&file)
                    .to_string_lossy()
                    .as_bytes(),
            );
            hasher.write(&std::fs::read(&file).unwrap_or_default());
        }
    }
    println!("cargo:rustc-env=SANDGATE_STEPS_BUILD={:016x}", hasher.finish());
}

/// Every file under `path` (itself when it is one).
fn collect(path: &Path, files: &mut Vec<PathBuf>) {
    match std::fs::read_dir(path) {
        Ok(entries) => {
            for entry in entries.flatten() {
                collect(&entry.path(), files);
            }
        }
        Err(_) if path.is_file() => files.push(path.to_path_buf()),
        Err(_) => {}
    }
}
