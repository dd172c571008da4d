//! Tests of the carried environment: its pure parts, and a copy and check of a venv made of
//! plain files (no Python needed: Python's own use of the copy is in the e2e tests).

use std::os::unix::fs::symlink;
use std::process::Command;
use std::time::{Duration, SystemTime};

use super::*;

#[test]
fn the_option_and_pyvenv_cfg_parse() {
    assert_eq!(PythonEnv::parse("copy").unwrap(), PythonEnv::Copy);
    assert_eq!(PythonEnv::parse("external").unwrap(), PythonEnv::External);
    assert_eq!(PythonEnv::parse("venv").unwrap_err().exit_code(), 64);
    let cfg = "home = /opt/py/bin\ninclude-system-site-packages = false\nversion = 3.11.7\ncommand = /opt/py/bin/python3 -m venv /src/v\n";
    assert_eq!(
        VenvConfig::parse(cfg).unwrap(),
        VenvConfig {
            home: "/opt/py/bin".into(),
            version: Some("3.11.7".into())
        }
    );
    assert!(
        VenvConfig::parse("version = 3\n")
            .unwrap_err()
            .contains("no home")
    );
    assert!(
        VenvConfig::parse("home = bin\n")
            .unwrap_err()
            .contains("not an absolute path")
    );
    assert_eq!(
        carried_config(cfg),
        "home = /opt/py/bin\ninclude-system-site-packages = false\nversion = 3.11.7\n"
    );
}

#[test]
fn a_script_of_the_venv_runs_the_interpreter_beside_it_wherever_it_is() {
    let script = b"#!/src/v/bin/python3\n# -*- coding: utf-8 -*-\nimport sys\n";
    let out = trampoline(script).unwrap();
    let text = String::from_utf8(out.clone()).unwrap();
    assert!(text.starts_with("#!/bin/sh\n'''exec' "), "{text}");
    assert!(
        text.ends_with("' '''\n# -*- coding: utf-8 -*-\nimport sys\n"),
        "{text}"
    );
    assert!(!text.contains("/src/v"), "{text}");
    assert!(trampoline(b"#!/made/elsewhere/bin/python3.11 \nx\n").is_some());
    for other in [
        &b"#!/usr/bin/env python3\nx\n"[..],
        b"#!/src/v/bin/python3",
        b"#!python3\nx\n",
        b"#!/src/v/bin/python3 -E\nx\n",
        b"#!/src/v/bin/pythonw\nx\n",
        b"#!/bin/sh\nx\n",
        b"\x7fELF",
    ] {
        assert_eq!(trampoline(other), None, "{}", String::from_utf8_lossy(other));
    }
    // Run it: the shell executes the interpreter beside the script, with the script and
    // its arguments, through a link to the script too.
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("moved/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("python"), "#!/bin/sh\necho \"ran $0 with $*\"\n").unwrap();
    std::fs::write(bin.join("tool"), &out).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for f in ["python", "tool"] {
        std::fs::set_permissions(bin.join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    symlink(bin.join("tool"), dir.path().join("link")).unwrap();
    for started in [bin.join("tool"), dir.path().join("link")] {
        let o = Command::new(&started).args(["a", "b c"]).output().unwrap();
        let said = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            said.trim(),
            format!("ran {}/python with {} a b c", bin.display(), started.display()),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn only_the_interpreter_links_may_leave_the_environment() {
    let (env, home) = (Path::new("/b/env"), Path::new("/opt/py/bin"));
    for (rel, real, ok) in [
        ("lib64", "/b/env/lib", true),
        ("bin/python3", "/opt/py/bin/python3.11", true),
        ("bin/python3", "/usr/bin/python3.11", false),
        ("lib/python3.11/site-packages/pkg", "/opt/py/bin/x", false),
        ("bin/python3", "/b/workspace/python3", false),
    ] {
        assert_eq!(
            link_allowed(Path::new(rel), Path::new(real), env, home),
            ok,
            "{rel} -> {real}"
        );
    }
}

/// A venv of plain files in `dir`: `base/bin/python3.11` as its base, `src/` the venv.
fn fake_venv(dir: &Path) -> PathBuf {
    let base = dir.join("base/bin");
    let src = dir.join("src");
    for d in [
        &base,
        &src.join("bin"),
        &src.join("lib/python3.11/site-packages/pkg/__pycache__"),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(base.join("python3.11"), "#!/bin/sh\n").unwrap();
    std::fs::write(
        src.join("pyvenv.cfg"),
        format!(
            "home = {}\nversion = 3.11.7\ncommand = {}/python3.11 -m venv {}\n",
            base.display(),
            base.display(),
            src.display()
        ),
    )
    .unwrap();
    symlink(base.join("python3.11"), src.join("bin/python3")).unwrap();
    symlink("python3", src.join("bin/python")).unwrap();
    symlink("lib", src.join("lib64")).unwrap();
    std::fs::write(
        src.join("bin/activate"),
        format!("VIRTUAL_ENV={}\n", src.display()),
    )
    .unwrap();
    std::fs::write(
        src.join("bin/tool"),
        format!("#!{}/bin/python3\nimport pkg\n", src.display()),
    )
    .unwrap();
    let pyc = src.join("lib/python3.11/site-packages/pkg/__pycache__/__init__.cpython-311.pyc");
    std::fs::write(&pyc, b"\x00pyc").unwrap();
    let old = SystemTime::now() - Duration::from_secs(86_400 * 30);
    std::fs::File::open(&pyc).unwrap().set_modified(old).unwrap();
    src
}

#[test]
fn a_copied_venv_names_nothing_of_its_source_and_passes_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let src = fake_venv(&dir);
    let root = dir.join("bundle");
    std::fs::create_dir(&root).unwrap();
    let layout = Layout::new(&root);
    copy_venv(&src, &layout.env_dir()).unwrap();
    check(&layout).unwrap();
    let env = layout.env_dir();
    assert!(!env.join("bin/activate").exists());
    assert_eq!(
        std::fs::read_link(env.join("bin/python3")).unwrap(),
        dir.join("base/bin/python3.11")
    );
    assert_eq!(std::fs::read_link(env.join("lib64")).unwrap(), Path::new("lib"));
    let pyc = "lib/python3.11/site-packages/pkg/__pycache__/__init__.cpython-311.pyc";
    let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    assert_eq!(mtime(&env.join(pyc)), mtime(&src.join(pyc)));
    for f in ["pyvenv.cfg", "bin/tool"] {
        let text = std::fs::read_to_string(env.join(f)).unwrap();
        assert!(!text.contains(src.to_str().unwrap()), "{f}: {text}");
    }
    // A directory that is not a venv is refused, naming it.
    let e = copy_venv(&dir.join("base"), &dir.join("other")).unwrap_err();
    assert_eq!(e.exit_code(), 64);
    assert!(e.to_string().contains("is not a venv"), "{e}");
}

#[test]
fn a_tampered_carried_environment_is_refused_and_a_missing_base_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let src = fake_venv(&dir);
    let root = dir.join("bundle");
    std::fs::create_dir_all(root.join("workspace")).unwrap();
    let layout = Layout::new(&root);
    let env = layout.env_dir();
    copy_venv(&src, &env).unwrap();
    let refused = |want: &str| {
        let e = check(&layout).unwrap_err();
        assert_eq!(e.exit_code(), 64, "{e}");
        assert!(e.to_string().contains(want), "want {want:?}: {e}");
    };

    // env itself a link (to a venv outside): every kernel would bind what it points to.
    std::fs::rename(&env, dir.join("outside")).unwrap();
    symlink(dir.join("outside"), &env).unwrap();
    refused("env is a symbolic link");
    std::fs::remove_file(&env).unwrap();
    std::fs::rename(dir.join("outside"), &env).unwrap();
    check(&layout).unwrap();

    // A link out of it, into the workspace (kernels write there), to the host, or nowhere.
    let planted = env.join("lib/python3.11/site-packages/planted");
    for (to, want) in [
        (
            root.join("workspace"),
            "is a symbolic link out of the carried environment",
        ),
        (
            PathBuf::from("/etc"),
            "is a symbolic link out of the carried environment",
        ),
        (dir.join("nowhere"), "points nowhere"),
    ] {
        symlink(&to, &planted).unwrap();
        refused(want);
        std::fs::remove_file(&planted).unwrap();
    }
    // bin/python3 retargeted away from the base that pyvenv.cfg names.
    std::fs::remove_file(env.join("bin/python3")).unwrap();
    symlink("/bin/sh", env.join("bin/python3")).unwrap();
    refused("env/bin/python3 is a symbolic link out");
    std::fs::remove_file(env.join("bin/python3")).unwrap();
    symlink(dir.join("base/bin/python3.11"), env.join("bin/python3")).unwrap();
    check(&layout).unwrap();

    // home inside the bundle, where kernels write.
    let cfg = std::fs::read_to_string(env.join("pyvenv.cfg")).unwrap();
    let base = dir.join("base/bin").display().to_string();
    std::fs::write(
        env.join("pyvenv.cfg"),
        cfg.replace(&base, &root.join("workspace").display().to_string()),
    )
    .unwrap();
    refused("is inside the bundle");
    std::fs::write(env.join("pyvenv.cfg"), "version = 3\n").unwrap();
    refused("pyvenv.cfg has no home");

    // The base Python not on this machine: unavailable, naming it.
    std::fs::write(env.join("pyvenv.cfg"), &cfg).unwrap();
    std::fs::rename(dir.join("base"), dir.join("base-gone")).unwrap();
    let e = check(&layout).unwrap_err();
    assert_eq!(e.exit_code(), 69, "{e}");
    assert!(e.to_string().contains(&format!("{base} (version 3.11.7)")), "{e}");
}
