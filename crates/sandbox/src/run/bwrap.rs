//! What the run reads from the bwrap it found: whether it has `--disable-userns`, and
//! whether it has `--bind-fd` (then every bind source is handed over as a descriptor:
//! [`super::sources`]).

use std::path::Path;

/// The options of the bwrap found that the run uses when there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BwrapOptions {
    /// `--disable-userns` (bubblewrap 0.8.0).
    pub disable_userns: bool,
    /// `--bind-fd` and `--ro-bind-fd`: upstream since 0.10.0, and backported by
    /// distributions to older versions (Debian 12's 0.8.0-2+deb12u1, for Flatpak's
    /// CVE-2024-42472).
    pub bind_fd: bool,
}

/// What this bwrap has. Every bwrap that has an option carries its name in its binary (its
/// option parser and usage text), and reading the file (70 KB) once costs a tenth of
/// executing it: found there, yes. Not found (an older bwrap, or a wrapper in front of the
/// real one), its version says.
pub fn bwrap_options(bwrap: &Path) -> BwrapOptions {
    use std::io::Read;
    let mut bytes = Vec::new();
    let read = std::fs::File::open(bwrap).and_then(|f| f.take(16 << 20).read_to_end(&mut bytes));
    let named = |option: &[u8]| read.is_ok() && holds(&bytes, option);
    let mut options = BwrapOptions {
        disable_userns: named(b"--disable-userns"),
        bind_fd: named(b"--ro-bind-fd"),
    };
    if !(options.disable_userns && options.bind_fd) {
        let version = bwrap_version(bwrap);
        options.disable_userns |= version >= vec![0, 8, 0];
        options.bind_fd |= version >= vec![0, 10, 0];
    }
    options
}

/// Does `haystack` hold `needle`? Compared only where the first byte matches (a window
/// compared at every offset cost a tenth of a millisecond on a 70 KB bwrap).
fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    haystack
        .iter()
        .enumerate()
        .any(|(i, &b)| b == first && haystack.get(i + 1..).is_some_and(|tail| tail.starts_with(rest)))
}

/// What `bwrap --version` says, as numbers (`[0, 8, 0]`); empty when it says nothing
/// readable, which compares below every version.
fn bwrap_version(bwrap: &Path) -> Vec<u32> {
    let Ok(out) = std::process::Command::new(bwrap).arg("--version").output() else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .last()
        .unwrap_or_default()
        .split('.')
        .map_while(|n| n.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::holds;

    #[test]
    fn an_option_is_found_wherever_it_sits_and_only_whole() {
        let text = b"\0--disable\0--disable-user\0x--disable-userns\0";
        assert!(holds(text, b"--disable-userns"));
        assert!(holds(b"--disable-userns", b"--disable-userns"));
        assert!(!holds(b"\0--disable-user\0--disable-usern", b"--disable-userns"));
        assert!(!holds(b"", b"--disable-userns"));
    }
}
