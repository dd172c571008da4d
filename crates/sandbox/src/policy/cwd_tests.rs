//! Table tests of where the command starts: `fs.cwd` checked against what the sandbox has,
//! and the choice between `--chdir`, `fs.cwd`, the caller's directory, HOME and `/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::paths;
use crate::policy::{SandboxPolicy, parse, start_dir};

/// Every path exists and is its own canonical form.
fn as_written(p: &Path) -> std::io::Result<PathBuf> {
    Ok(paths::lexical(p))
}

fn parse_ok(text: &str) -> SandboxPolicy {
    parse(text, &BTreeMap::new(), &as_written, None).unwrap()
}

fn parse_err(text: &str) -> String {
    parse(text, &BTreeMap::new(), &as_written, None).unwrap_err().0
}

/// `fs.cwd` must be a directory the sandbox has: bound, or a tmpfs's own root.
#[test]
fn fs_cwd_must_be_in_the_sandbox() {
    let with = |cwd: &str| format!("fs:\n  read_paths: [ /usr ]\n  write_paths: [ /srv/p ]\n  cwd: {cwd}\n");
    assert_eq!(
        parse_ok(&with("/srv/p/sub")).cwd,
        Some(PathBuf::from("/srv/p/sub"))
    );
    assert_eq!(parse_ok(&with("/usr")).cwd, Some(PathBuf::from("/usr")));
    assert_eq!(parse_ok(&with("/tmp")).cwd, Some(PathBuf::from("/tmp")));
    for (cwd, want) in [
        ("/home/u", "fs.cwd: /home/u is not in the sandbox"),
        ("/tmp/x", "fs.cwd: /tmp/x is not in the sandbox"),
        ("relative", "fs.cwd: \"relative\" is not an absolute path"),
    ] {
        let err = parse_err(&with(cwd));
        assert!(err.starts_with(want), "{cwd}: {err}");
    }
    assert_eq!(parse_ok("fs:\n  read_paths: [ /usr ]\n").cwd, None);
}

/// Where the command starts: `--chdir`, `fs.cwd`, the caller's directory when bound, else
/// HOME when the sandbox has it, else `/`, with a note in those last two cases.
#[test]
fn the_start_directory_is_chosen_and_a_fallback_is_said() {
    let policy = parse_ok(
        "fs:\n  read_paths: [ /usr, /srv/ro ]\n  write_paths: [ /srv/p ]\nplatform:\n  bwrap: { tmpfs: [ /srv/p/secret ] }\n",
    );
    let env = |home: &str| vec![("HOME".to_owned(), home.to_owned())];
    let start = |chdir: Option<&str>, home: &str, cwd: Option<&str>| {
        start_dir(
            &policy,
            chdir.map(Path::new),
            &env(home),
            cwd.map(Path::new),
            &as_written,
        )
    };
    let here = start(None, "/tmp", Some("/srv/p/src")).unwrap();
    assert_eq!((here.dir, here.note), (PathBuf::from("/srv/p/src"), None));
    let ro = start(None, "/tmp", Some("/srv/ro")).unwrap();
    assert_eq!(ro.dir, PathBuf::from("/srv/ro"));
    // Not bound, hidden by a tmpfs, or the private /tmp (not the host's): HOME, said once.
    for cwd in ["/home/u/proj", "/srv/p/secret/x", "/tmp"] {
        let s = start(None, "/tmp", Some(cwd)).unwrap();
        assert_eq!(s.dir, PathBuf::from("/tmp"), "{cwd}");
        assert_eq!(
            s.note.as_deref(),
            Some(format!("the working directory {cwd} is not in the sandbox (no read or write path covers it, or a tmpfs hides it); starting in /tmp (HOME) instead; --chdir DIR or fs.cwd chooses another").as_str())
        );
    }
    let s = start(None, "/srv/p", Some("/home/u")).unwrap();
    assert_eq!(s.dir, PathBuf::from("/srv/p"));
    // A HOME the sandbox does not have: the root.
    let s = start(None, "/home/u", Some("/home/u")).unwrap();
    assert_eq!(s.dir, PathBuf::from("/"));
    assert!(s.note.unwrap().contains("starting in / (the sandbox's root)"));
    // --chdir wins, and must be in the sandbox.
    let s = start(Some("/srv/p/src"), "/tmp", Some("/home/u")).unwrap();
    assert_eq!((s.dir, s.note), (PathBuf::from("/srv/p/src"), None));
    let err = start(Some("/home/u"), "/tmp", Some("/srv/p")).unwrap_err().0;
    assert!(
        err.starts_with("--chdir /home/u: /home/u is not in the sandbox"),
        "{err}"
    );
    // fs.cwd wins over the caller's directory.
    let with_cwd = SandboxPolicy {
        cwd: Some(PathBuf::from("/srv/ro")),
        ..policy.clone()
    };
    let s = start_dir(
        &with_cwd,
        None,
        &env("/tmp"),
        Some(Path::new("/srv/p")),
        &as_written,
    )
    .unwrap();
    assert_eq!((s.dir, s.note), (PathBuf::from("/srv/ro"), None));
    // With / bound, every host directory is there.
    let all = parse_ok("fs:\n  allow_read_all: true\nnet:\n  mode: all\n");
    let s = start_dir(&all, None, &env("/tmp"), Some(Path::new("/home/u")), &as_written).unwrap();
    assert_eq!((s.dir, s.note), (PathBuf::from("/home/u"), None));
}
