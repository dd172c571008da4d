//! What the run reads from the bwrap it found: whether it has `--disable-userns`.

use std::path::Path;

/// Does this bwrap have `--disable-userns` (bubblewrap 0.8.0)? Every bwrap that has it
/// carries the option's name in its binary (its option parser and usage text), and reading
/// the file (70 KB) costs a tenth of executing it: found there, yes. Not found (an older
/// bwrap, or a wrapper in front of the real one), its version says.
pub(super) fn bwrap_disables_userns(bwrap: &Path) -> bool {
    bwrap_names_option(bwrap, b"--disable-userns") || bwrap_version_has_userns(bwrap)
}

/// Does the file `bwrap` (its first 16 MiB) hold `option`?
fn bwrap_names_option(bwrap: &Path, option: &[u8]) -> bool {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(bwrap)
        .and_then(|f| f.take(16 << 20).read_to_end(&mut bytes))
        .is_ok_and(|_| holds(&bytes, option))
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

/// Does `bwrap --version` say 0.8.0 or later?
fn bwrap_version_has_userns(bwrap: &Path) -> bool {
    let Ok(out) = std::process::Command::new(bwrap).arg("--version").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let version: Vec<u32> = text
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .split('.')
        .map_while(|n| n.parse().ok())
        .collect();
    version >= vec![0, 8, 0]
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
