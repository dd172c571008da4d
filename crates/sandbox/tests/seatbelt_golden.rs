//! The Seatbelt (macOS) rendering of sandbox policies, checked against golden files: one per
//! network mode, and one with every `platform.seatbelt` key of the design and the run's own
//! facts (private tmp, protected files, trace tag). The facts are fixed here, so the files do
//! not depend on the machine.
//! `SANDGATE_UPDATE_GOLDEN=1 cargo test -p sandgate-sandbox --test seatbelt_golden` rewrites
//! them after a deliberate change; review the diff.

#![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

use std::collections::BTreeMap;
use std::path::PathBuf;

use sandgate_sandbox::{policy, seatbelt};

const BASE: &str = "env:\n  set: { HOME: /work }\nfs:\n  read_paths: [ /usr, \"${PROJECT}\" ]\n  write_paths: [ \"${PROJECT}/out\" ]\n";

/// What a run on a Mac of user `dev` would know.
fn facts() -> seatbelt::Facts {
    seatbelt::Facts {
        tmp: Some("/private/var/folders/xy/T/sandgate-run-0123456789/tmp".into()),
        user_fonts: Some("/Users/dev/Library/Fonts".into()),
        fontconfig_cache: Some("/Users/dev/.cache/fontconfig".into()),
        protected: Vec::new(),
        trace_tag: None,
        ca_files: Vec::new(),
    }
}

fn golden_with(mode_yaml: &str, name: &str, facts: &seatbelt::Facts) {
    let params: BTreeMap<String, String> = [("PROJECT".to_owned(), "/Users/dev/project".to_owned())].into();
    let p = policy::parse(
        &format!("{BASE}{mode_yaml}"),
        &params,
        &|p| Ok(p.to_path_buf()),
        None,
    )
    .unwrap();
    let profile = seatbelt::render_with(&p, facts);
    let rendered = format!(
        "{}\n;; {}\n",
        profile.text,
        seatbelt::command_line(
            &profile,
            "sandgate.sb",
            &["python3".to_owned(), "agent.py".to_owned()]
        )
    );
    let path = format!("{}/tests/golden/seatbelt-{name}.sb", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("SANDGATE_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &rendered).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (set SANDGATE_UPDATE_GOLDEN=1 once)"));
    assert_eq!(
        rendered, want,
        "{name} profile changed; review and update the golden file"
    );
}

fn golden(mode_yaml: &str, name: &str) {
    golden_with(mode_yaml, name, &facts());
}

#[test]
fn none() {
    golden("net:\n  mode: none\n", "none");
}

#[test]
fn loopback() {
    golden("net:\n  mode: loopback\n  loopback_ports: [ 5432 ]\n", "loopback");
}

#[test]
fn all() {
    golden("net:\n  mode: all\n", "all");
}

#[test]
fn allowlist() {
    golden(
        "net:\n  mode: allowlist\n  allow_domains: [ api.openai.com ]\n  proxy: { listen: 127.0.0.1:3130 }\n",
        "allowlist",
    );
}

/// The design's `platform.seatbelt`, every key, beside a `platform.bwrap` section (which the
/// profile ignores), with the run's protected files, trace tag and interception CA files.
#[test]
fn design_keys() {
    let ca_files = vec![
        PathBuf::from("/private/var/folders/xy/T/sandgate-run-0123456789/ca.pem"),
        PathBuf::from("/private/var/folders/xy/T/sandgate-run-0123456789/ca-bundle.pem"),
    ];
    let mut protected = vec![
        PathBuf::from("/Users/dev/project/policy.yaml"),
        PathBuf::from("/Users/dev/.local/state/sandgate/runs"),
    ];
    // A run protects its CA files as it protects its other files.
    protected.extend(ca_files.iter().cloned());
    let facts = seatbelt::Facts {
        protected,
        trace_tag: Some("sandgate-run-42-0000000000000001".into()),
        ca_files,
        ..facts()
    };
    golden_with(
        "net:\n  mode: proxy\n  allow_domains: [ pypi.org ]\n  loopback_ports: [ 8888 ]\n\
         platform:\n  bwrap: { ro_bind: [ /etc ], unshare: { pid: true } }\n\
         \x20 seatbelt:\n    trace: true\n    extra_allow:\n      mach-lookup: [ com.apple.fonts, com.apple.FontObjectsServer ]\n      system-socket: true\n      dev: { allow_tty_writes: true }\n      file_read_extra: [ /opt/homebrew/share, \"/Users/dev/Library/Application Support/x\" ]\n",
        "design",
        &facts,
    );
}
