//! The tools behind the deployment tests (deploy_e2e.rs): finding each validator, running
//! it, reading YAML through PyYAML, rendering kustomize overlays, reading the proxy's real
//! flags, and telling a static ELF binary from a dynamic one. A missing tool fails the test
//! with what installs it; nothing is skipped. The one tool that may be missing is kustomize
//! (kubectl): the overlays are then rendered by kustomize.py, which is compared with kubectl
//! wherever kubectl exists.

#![allow(dead_code, reason = "each test uses a different part of the support")]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `name` on PATH (or in the system directories), else a failure naming what installs it.
pub fn tool(name: &str, installs: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not found: {installs}"))
}

/// A program of the test venv (target/venv, made by scripts/test).
pub fn venv_bin(name: &str) -> PathBuf {
    let python = std::env::var("SANDGATE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo().join("target/venv/bin/python"));
    let bin = python.with_file_name(name);
    assert!(
        bin.is_file(),
        "{} not found: run ./scripts/test once, it installs {name} into target/venv",
        bin.display()
    );
    bin
}

/// A command for one of the repository's scripts that may run cargo (scripts/build-image,
/// when it is handed no binary), with the environment cargo and nextest give a test removed:
/// build scripts track some of those variables (ring's reads CARGO_MANIFEST_DIR), and a
/// build under them would not match one made from a shell, so cargo would rebuild.
pub fn script(name: &str) -> Command {
    let mut cmd = Command::new(repo().join("scripts").join(name));
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let injected = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_TARGET_TMPDIR",
            "CARGO_PRIMARY_PACKAGE",
            "NEXTEST",
            "__NEXTEST",
            "RUST_TEST_",
        ]
        .iter()
        .any(|p| key.starts_with(p));
        if injected || key == "OUT_DIR" {
            cmd.env_remove(key.as_ref());
        }
    }
    // nextest and cargo test put the build's library directories in front.
    match std::env::var_os("NEXTEST_LD_LIBRARY_PATH") {
        Some(original) => cmd.env("LD_LIBRARY_PATH", original),
        None => cmd.env_remove("LD_LIBRARY_PATH"),
    };
    cmd
}

/// Runs `cmd`, fails the test with its output unless it succeeds, and returns stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd` with no input and returns its output, whatever its status.
pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Every document of a YAML stream, as JSON values (PyYAML's safe loader, from the venv).
pub fn yaml_docs(text: &str) -> Vec<Value> {
    use std::io::Write;
    let mut child = Command::new(venv_bin("python"))
        .args([
            "-c",
            "import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d is not None], sys.stdout)",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write YAML");
    let out = child.wait_with_output().expect("python");
    assert!(
        out.status.success(),
        "YAML did not parse: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let Value::Array(docs) = serde_json::from_slice(&out.stdout).expect("JSON from python") else {
        panic!("expected a list of documents");
    };
    docs
}

/// The real kustomize, when this machine has one: a stand-alone `kustomize build`, else
/// `kubectl kustomize` (this project's VM image has kubectl, from google-cloud-sdk). None when
/// neither is on PATH, or when SANDGATE_TEST_NO_KUBECTL is set (to run the fallback on a
/// machine that has them). Debian has no kustomize new enough for deploy/kubernetes
/// (kubernetes-client is 1.20: no `labels`, no `patches`), PyPI and npm none at all.
pub fn real_kustomize() -> Option<Command> {
    if std::env::var_os("SANDGATE_TEST_NO_KUBECTL").is_some_and(|v| !v.is_empty()) {
        return None;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = |n: &str| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    };
    if let Some(k) = found("kustomize") {
        let mut c = Command::new(k);
        c.arg("build");
        return Some(c);
    }
    found("kubectl").map(|k| {
        let mut c = Command::new(k);
        c.arg("kustomize");
        c
    })
}

/// deploy_support/kustomize.py, the renderer for machines without kubectl: exactly the
/// kustomize features deploy/kubernetes uses, and an error for anything else. deploy_e2e.rs
/// holds it to kubectl's output.
pub fn python_kustomize() -> Command {
    let mut c = Command::new(venv_bin("python"));
    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/deploy_support/kustomize.py"));
    c
}

/// The overlay in deploy/kubernetes/`name`, rendered by the real kustomize when there is one
/// (real_kustomize), else by deploy_support/kustomize.py.
pub fn kustomize(name: &str) -> String {
    let dir = repo().join("deploy/kubernetes").join(name);
    let mut cmd = real_kustomize().unwrap_or_else(python_kustomize);
    run_ok(cmd.arg(dir))
}

/// Whether two rendered streams hold the same objects, in any order; else what differs, object
/// by object (kind, namespace, name), for a test's failure message.
pub fn same_objects(left: (&str, &[Value]), right: (&str, &[Value])) -> Result<(), String> {
    let id = |d: &Value| {
        format!(
            "{} {}/{}",
            d["kind"].as_str().unwrap_or("?"),
            d["metadata"]["namespace"].as_str().unwrap_or(""),
            d["metadata"]["name"].as_str().unwrap_or("?")
        )
    };
    let sorted = |docs: &[Value]| {
        let mut v: Vec<(String, String)> = docs
            .iter()
            .map(|d| (id(d), serde_json::to_string(d).expect("JSON")))
            .collect();
        v.sort();
        v
    };
    let (l, r) = (sorted(left.1), sorted(right.1));
    if l == r {
        return Ok(());
    }
    let mut report = String::new();
    for (name, mine, theirs) in [(left.0, &l, &r), (right.0, &r, &l)] {
        for (obj, json) in mine.iter().filter(|o| !theirs.contains(o)) {
            report.push_str(&format!("only {name} renders this {obj}:\n  {json}\n"));
        }
    }
    Err(report)
}

/// The one document of `kind` named `name`.
pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered manifests"))
}

/// Every flag `sandgate proxy --help` documents (the binary under test).
pub fn proxy_flags() -> (BTreeSet<String>, String) {
    let help = run_ok(Command::new(env!("CARGO_BIN_EXE_sandgate")).args(["proxy", "--help"]));
    let flags = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_owned()
        })
        .collect();
    (flags, help)
}

/// The flag names (`--name`, without `=value`) among command-line arguments.
pub fn flag_names<'a>(args: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    args.into_iter()
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_owned())
        .collect()
}

/// Whether an ELF file has no program interpreter (PT_INTERP), i.e. is statically linked.
pub fn is_static_elf(path: &Path) -> bool {
    let bytes = std::fs::read(path).expect("read the binary");
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[o..o + 8]);
        u64::from_le_bytes(b) as usize
    };
    assert_eq!(&bytes[..4], b"\x7fELF", "{} is not ELF", path.display());
    assert_eq!(bytes[4], 2, "expected a 64-bit ELF file");
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    const PT_INTERP: u32 = 3;
    !(0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]) == PT_INTERP
    })
}

/// The `[Service]` settings of a systemd unit, continuation lines joined, in file order.
pub fn unit_settings(text: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut settings = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() && pending.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_suffix('\\') {
            pending.push_str(rest);
            pending.push(' ');
            continue;
        }
        let full = std::mem::take(&mut pending) + line;
        if full.starts_with('[') {
            section = full;
        } else if section == "[Service]"
            && let Some((k, v)) = full.split_once('=')
        {
            settings.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    settings
}
