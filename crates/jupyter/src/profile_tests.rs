use super::*;

/// Every path exists as written, except under /nope.
fn host(path: &Path) -> std::io::Result<PathBuf> {
    if path.starts_with("/nope") {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    Ok(sandgate_sandbox::paths::lexical(path))
}

fn name(n: &str) -> ProfileName {
    ProfileName::parse(n).unwrap()
}

fn python() -> KernelPython {
    KernelPython {
        executable: "/venv/bin/python".into(),
        roots: vec!["/venv".into(), "/opt/py".into(), "/usr/lib/python3.11".into()],
    }
}

fn host_paths() -> HostPaths {
    HostPaths {
        system: vec!["/usr".into(), "/lib".into(), "/bin".into()],
    }
}

const RUNTIME: &str = "/tmp/sandgate-jupyter-abc";

fn check_text(text: &str) -> Result<SandboxPolicy, String> {
    check(text, Path::new("/b"), Path::new(RUNTIME), &python().roots, &host)
}

fn low() -> String {
    default_policy(&name("low"), &python(), &host_paths(), Path::new("/b"))
        .unwrap()
        .unwrap()
}

#[test]
fn profile_names_are_narrow() {
    for good in ["low", "high", "gpu_2", "a", "0day", "x-y", &"a".repeat(32)] {
        assert!(ProfileName::parse(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        "Low",
        "-x",
        "_x",
        "a b",
        "a.b",
        "a/b",
        "é",
        "${X}",
        &"a".repeat(33),
    ] {
        let e = ProfileName::parse(bad).unwrap_err();
        assert_eq!(e.exit_code(), 64, "{bad}");
    }
    assert_eq!(name("low").kernel_name(), "python3-low");
    let (n, f) = parse_flag("gpu=/etc/p.yaml").unwrap();
    assert_eq!((n.as_str(), f.as_path()), ("gpu", Path::new("/etc/p.yaml")));
    for bad in ["gpu", "gpu=", "=/p.yaml", "G=/p.yaml"] {
        assert!(parse_flag(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_default_policies_pass_their_check_and_differ_only_in_network() {
    let low_text = low();
    let high_text = default_policy(&name("high"), &python(), &host_paths(), Path::new("/b"))
        .unwrap()
        .unwrap();
    let low = check_text(&low_text).unwrap();
    let high = check_text(&high_text.replace("/state/high", "/state/low")).unwrap();
    assert_eq!(low.net, NetMode::None);
    assert_eq!(high.net, NetMode::Allowlist);
    assert!(!high.allow_entries.is_empty(), "the python-packages preset");
    assert_eq!(low.write_paths, high.write_paths);
    let want: Vec<PathBuf> = vec![
        "/b/workspace".into(),
        "/b/state/low".into(),
        format!("{RUNTIME}/kernel-00000000-0000-4000-8000-000000000000.json.d").into(),
    ];
    assert_eq!(low.write_paths, want);
    assert!(low.allow_unix_sockets && low.private_tmp && low.unshare_pid);
    assert_eq!(low.env_set["HOME"], "/b/state/low/home");
    assert_eq!(low.env_set["PYTHONPYCACHEPREFIX"], "/b/state/low/pycache");
    assert_eq!(low.env_set["PATH"], "/venv/bin:/usr/local/bin:/usr/bin:/bin");
    assert!(low.env_passthrough.is_empty());
    // Bounded, but for CPU time: a kernel lives as long as its notebook.
    let limits = sandgate_sandbox::policy::Limits {
        processes: Some(256),
        memory: Some(8 << 30),
        tmpfs: Some(1 << 30),
        cpu_seconds: None,
        open_files: None,
    };
    assert_eq!((low.limits, high.limits), (limits, limits));
    // A root under a system path is not listed twice.
    assert_eq!(low_text.matches("/usr/lib/python3.11").count(), 0, "{low_text}");
    assert!(
        default_policy(&name("gpu"), &python(), &host_paths(), Path::new("/b"))
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_python_path_with_quotes_is_quoted_and_one_with_a_parameter_is_refused() {
    let odd = KernelPython {
        executable: "/opt/my \"py\"/bin/python".into(),
        roots: vec!["/opt/my \"py\"".into()],
    };
    let text = default_policy(&name("low"), &odd, &host_paths(), Path::new("/b"))
        .unwrap()
        .unwrap();
    let p = check(&text, Path::new("/b"), Path::new(RUNTIME), &odd.roots, &host).unwrap();
    assert!(p.read_paths.contains(&PathBuf::from("/opt/my \"py\"")));
    // A carried environment (under the bundle) is named through ${BUNDLE}.
    let carried = KernelPython {
        executable: "/b/env/bin/python".into(),
        roots: vec!["/b/env".into(), "/opt/py".into()],
    };
    let text = default_policy(&name("low"), &carried, &host_paths(), Path::new("/b"))
        .unwrap()
        .unwrap();
    assert!(text.contains("    - \"${BUNDLE}/env\"\n"), "{text}");
    assert!(
        text.contains("PATH: \"${BUNDLE}/env/bin:/usr/local/bin"),
        "{text}"
    );
    assert!(!text.contains("\"/b/"), "{text}");
    let p = check(
        &text,
        Path::new("/moved"),
        Path::new(RUNTIME),
        &["/moved/env".into()],
        &host,
    )
    .unwrap();
    assert!(p.read_paths.contains(&PathBuf::from("/moved/env")));
    assert_eq!(p.env_set["PATH"], "/moved/env/bin:/usr/local/bin:/usr/bin:/bin");
    let bad = KernelPython {
        executable: "/opt/${X}/bin/python".into(),
        roots: vec!["/opt/${X}".into()],
    };
    assert!(default_policy(&name("low"), &bad, &host_paths(), Path::new("/b")).is_err());
}

#[test]
fn every_hole_in_a_kernel_policy_is_refused_naming_it() {
    let base = low();
    let cases: Vec<(String, &str)> = vec![
        (base.replace("mode: none", "mode: all"), "net.mode all"),
        (
            base.replace("allow_unix_sockets: true", "allow_unix_sockets: false"),
            "allow_unix_sockets must be true",
        ),
        (
            base.replace("    - \"${CONNECTION_FILE}\"\n", ""),
            "must list \"${CONNECTION_FILE}\"",
        ),
        (
            base.replace("    - \"${CONNECTION_FILE}.d\"\n", ""),
            "must list \"${CONNECTION_FILE}.d\"",
        ),
        (
            base.replace(
                "    - \"${CONNECTION_FILE}.d\"\n",
                "    - \"${CONNECTION_FILE}.d\"\n    - /tmp/sandgate-jupyter-abc\n",
            ),
            "other kernels' connection files",
        ),
        (
            base.replace(
                "    - \"${CONNECTION_FILE}.d\"\n",
                "    - \"${CONNECTION_FILE}.d\"\n    - /tmp/sandgate-jupyter-abc/token\n",
            ),
            "other kernels' connection files",
        ),
        (
            base.replace("    - \"/venv\"\n", ""),
            "does not cover the kernel's Python (/venv)",
        ),
        (
            base.replace("  write_paths:\n", "  write_paths:\n    - /venv/lib\n"),
            "/venv/lib is writable and overlaps the kernel's Python (/venv)",
        ),
        (
            base.replace("  write_paths:\n", "  write_paths:\n    - /opt\n"),
            "/opt is writable and overlaps the kernel's Python (/opt/py)",
        ),
        (
            base.replace("env:\n", "env:\n  passthrough: [ JPY_* ]\n"),
            "JPY_* must not reach the kernel",
        ),
        (
            base.replace("env:\n", "env:\n  passthrough: [ JPY_PARENT_PID ]\n"),
            "JPY_* must not reach the kernel",
        ),
        (
            base.replace("  set:\n", "  set:\n    JPY_PARENT_PID: \"1\"\n"),
            "JPY_* must not reach the kernel",
        ),
        (
            base.replace("/b/", "/nope/").replace("${BUNDLE}", "/nope"),
            "does not exist",
        ),
        (format!("{base}bogus: 1\n"), "unknown field"),
        ("fs: [".to_owned(), "policy:1: fs:"),
    ];
    for (text, want) in cases {
        let e = check_text(&text).unwrap_err();
        assert!(e.contains(want), "want {want:?}, got {e:?}\n{text}");
    }
    // A passthrough prefix that cannot match JPY_PARENT_PID is fine.
    assert!(check_text(&base.replace("env:\n", "env:\n  passthrough: [ LC_* ]\n")).is_ok());
}
