//! The Seatbelt (macOS) rendering of sandbox policies, checked against golden files.
//! `SANDGATE_UPDATE_GOLDEN=1 cargo test -p sandgate-sandbox --test seatbelt_golden` rewrites
//! them after a deliberate change; review the diff.

#![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

use std::collections::BTreeMap;

use sandgate_sandbox::{policy, seatbelt};

const BASE: &str = "env:\n  set: { HOME: /work }\nfs:\n  read_paths: [ /usr, \"${PROJECT}\" ]\n  write_paths: [ \"${PROJECT}/out\" ]\n";

fn golden(mode_yaml: &str, name: &str) {
    let params: BTreeMap<String, String> = [("PROJECT".to_owned(), "/Users/dev/project".to_owned())].into();
    let p = policy::parse(
        &format!("{BASE}{mode_yaml}"),
        &params,
        &|p| Ok(p.to_path_buf()),
        None,
    )
    .unwrap();
    let profile = seatbelt::render(&p);
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
