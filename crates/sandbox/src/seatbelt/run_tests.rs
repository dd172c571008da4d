//! Unit tests of the Seatbelt runner (`run/seatbelt`): its environment and CA files.

use super::*;

/// Another process of the user that plants a link where the CA goes: the runner
/// refuses to write, and writes nothing through it.
#[test]
fn a_link_planted_where_the_ca_goes_is_not_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let state = RunState::create(tmp.path()).unwrap();
    let target = tmp.path().join("elsewhere.pem");
    std::os::unix::fs::symlink(&target, state.path().join(crate::argv::CA_CERT)).unwrap();
    let mut env = Vec::new();
    let written = ca_files(&[(crate::argv::CA_CERT, "CERT".to_owned())], &state, &mut env);
    assert!(written.is_err(), "{written:?}");
    assert!(!target.exists());
}

/// A variable whose value is the file's path inside bwrap is pointed at the run's own
/// file; one that only contains that path is left as it is.
#[test]
fn the_ca_variables_name_the_files_written() {
    let tmp = tempfile::tempdir().unwrap();
    let state = RunState::create(tmp.path()).unwrap();
    let bundle = format!("{}/{}", crate::argv::BRIDGE_DIR, crate::argv::CA_BUNDLE);
    let mut env = vec![
        ("SSL_CERT_FILE".to_owned(), bundle.clone()),
        ("PIP_OPTS".to_owned(), format!("--cert={bundle}")),
    ];
    let files = [
        (crate::argv::CA_CERT, "CERT".to_owned()),
        (crate::argv::CA_BUNDLE, "BUNDLE".to_owned()),
    ];
    let paths = ca_files(&files, &state, &mut env).unwrap();
    let dir = std::fs::canonicalize(state.path()).unwrap();
    assert_eq!(paths, [dir.join("ca.pem"), dir.join("ca-bundle.pem")]);
    assert_eq!(std::fs::read_to_string(&paths[1]).unwrap(), "BUNDLE");
    assert_eq!(env[0].1, paths[1].display().to_string());
    assert_eq!(env[1].1, format!("--cert={bundle}"));
}

#[test]
fn the_proxy_variables_name_the_ports_the_command_has() {
    let text = "net:\n  mode: allowlist\n  proxy: { all_proxy: socks5 }\nenv:\n  set: { KEEP: \"http://127.0.0.1:3128\" }\n";
    let p = crate::policy::parse(text, &Default::default(), &|p| Ok(p.to_path_buf()), None).unwrap();
    let (env, _) = crate::env::environment(&p, &[]);
    let (moved, env) = at_front_ports(p, env, &[40001, 40002]);
    assert_eq!((moved.proxy_port, moved.socks_port), (40001, Some(40002)));
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("HTTP_PROXY"), Some("http://127.0.0.1:40001"));
    assert_eq!(get("https_proxy"), Some("http://127.0.0.1:40001"));
    assert_eq!(get("ALL_PROXY"), Some("socks5h://127.0.0.1:40002"));
    assert_eq!(get("NO_PROXY"), Some("localhost,127.0.0.1,::1"));
    // A value the policy set that happens to name the old port is not a proxy variable.
    assert_eq!(get("KEEP"), Some("http://127.0.0.1:3128"));
}
