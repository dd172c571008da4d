//! Bind sources opened once: the command line rewritten to descriptors, a swapped path
//! refused, and a workspace that no longer names itself refused.

use super::*;
use std::path::PathBuf;

fn words(v: &[OsString]) -> Vec<String> {
    v.iter().map(|w| w.to_string_lossy().into_owned()).collect()
}

/// bwrap's command line binding `source` read-only at `dest`, and nothing else.
fn ro_bind(source: &Path, dest: impl AsRef<Path>) -> Vec<OsString> {
    vec![
        "bwrap".into(),
        "--ro-bind".into(),
        source.into(),
        dest.as_ref().into(),
    ]
}

/// A canonical temporary directory holding `real/ws` and `elsewhere/ws`.
fn tree() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    for d in ["real/ws", "elsewhere/ws"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    (dir, root)
}

#[test]
fn each_bind_before_the_separator_becomes_a_descriptor_of_the_same_place() {
    let (_dir, root) = tree();
    let ws = root.join("real/ws");
    let argv: Vec<OsString> = vec![
        "bwrap".into(),
        "--ro-bind".into(),
        "/usr".into(),
        "/usr".into(),
        "--bind".into(),
        ws.clone().into(),
        ws.clone().into(),
        "--".into(),
        "sh".into(),
        "--bind".into(),
        "x".into(),
    ];
    let (out, sources) = open(argv, None).unwrap();
    let fds = sources.raw();
    assert_eq!(fds.len(), 2);
    let ws_text = ws.display().to_string();
    assert_eq!(
        words(&out),
        [
            "bwrap",
            "--ro-bind-fd",
            &fds[0].to_string(),
            "/usr",
            "--bind-fd",
            &fds[1].to_string(),
            &ws_text,
            "--",
            "sh",
            "--bind",
            "x"
        ]
    );
    let real = std::fs::read_link(format!("/proc/self/fd/{}", fds[1])).unwrap();
    assert_eq!(real, ws);
}

#[test]
fn a_source_whose_parent_became_a_symlink_is_refused_naming_both_paths() {
    let (_dir, root) = tree();
    let checked = root.join("real/ws");
    // The attacker's swap: `real` moved aside, a symlink to `elsewhere` in its place.
    std::fs::rename(root.join("real"), root.join("moved")).unwrap();
    std::os::unix::fs::symlink(root.join("elsewhere"), root.join("real")).unwrap();
    let argv: Vec<OsString> = vec![
        "bwrap".into(),
        "--bind".into(),
        checked.clone().into(),
        checked.clone().into(),
        "--".into(),
        "true".into(),
    ];
    let Err(RunError::Usage(m)) = open(argv, None) else {
        panic!("a swapped source was opened");
    };
    let now = root.join("elsewhere/ws");
    assert!(
        m.contains(&format!(
            "the bind source {} is now {}",
            checked.display(),
            now.display()
        )),
        "{m}"
    );
}

#[test]
fn a_source_that_is_gone_is_refused() {
    let (_dir, root) = tree();
    let gone = root.join("real/nothing");
    let Err(RunError::Usage(m)) = open(ro_bind(&gone, &gone), None) else {
        panic!("a missing source was opened");
    };
    assert!(m.starts_with("cannot open the bind source"), "{m}");
    // A bridge socket the runner made, gone before bwrap got it (removed by a process that
    // may write the run's state directory): the run's state failed, not the policy (69, not
    // the usage error 64 it was).
    let argv = ro_bind(&root.join("proxy.sock"), "/run/sandgate/proxy.sock");
    let Err(RunError::Unavailable(m)) = open(argv, Some(&root)) else {
        panic!("a missing bridge socket was not the run's failure");
    };
    assert!(m.starts_with("cannot open the bind source"), "{m}");
    // Known by where it comes from, not where it goes: a path of the policy's that is
    // gone stays the usage error it is, wherever it is bound.
    let argv = ro_bind(&gone, "/run/sandgate/mine");
    assert!(matches!(
        open(argv, Some(&root.join("bridge"))),
        Err(RunError::Usage(_))
    ));
}

fn policy_with(write: &str, links: &[(&str, &str)]) -> SandboxPolicy {
    let links: Vec<(PathBuf, PathBuf)> = links.iter().map(|(a, b)| (a.into(), b.into())).collect();
    let resolve = move |p: &Path| {
        let p = crate::paths::lexical(p);
        Ok(links
            .iter()
            .find_map(|(at, to)| p.strip_prefix(at).ok().map(|rest| to.join(rest)))
            .unwrap_or(p))
    };
    let text = format!("fs:\n  write_paths: [ \"{write}\" ]\n");
    crate::policy::parse(&text, &BTreeMap::new(), &resolve, None).unwrap()
}

fn workspace(value: &str) -> BTreeMap<String, String> {
    [(WORKSPACE_PARAM.to_owned(), value.to_owned())].into()
}

#[test]
fn a_workspace_bound_where_it_still_names_itself_runs() {
    let p = policy_with("/srv/work/a", &[("/lib", "/usr/lib")]);
    assert!(check_workspace(&p, &workspace("/srv/work/a")).is_ok());
    assert!(check_workspace(&p, &BTreeMap::new()).is_ok());
}

#[test]
fn a_workspace_that_resolves_elsewhere_is_refused_naming_it() {
    // `/srv/work` became a symlink to `/home/victim` after the workspace was checked.
    let p = policy_with("/srv/work/a", &[("/srv/work", "/home/victim")]);
    let Err(RunError::Usage(m)) = check_workspace(&p, &workspace("/srv/work/a")) else {
        panic!("a workspace resolving elsewhere was accepted");
    };
    assert!(
        m.starts_with(
            "the workspace /srv/work/a (WORKSPACE) is not canonical: /srv/work/a resolves to /home/victim/a."
        ),
        "{m}"
    );
    // A path bound under the workspace is held to it too.
    let p = policy_with("/srv/work/a/sub", &[("/srv/work/a/sub", "/etc")]);
    assert!(check_workspace(&p, &workspace("/srv/work/a")).is_err());
}

/// A bridge socket is bound only when this process listens on it: one a process outside
/// (here a child, as a run that may write the state directory would) renamed onto its
/// name before bwrap's descriptors were opened is refused, naming the process.
#[test]
fn a_bridge_socket_someone_else_listens_on_is_refused() {
    let (_dir, root) = tree();
    let ours = root.join("proxy.sock");
    let _listening = std::os::unix::net::UnixListener::bind(&ours).unwrap();
    assert!(open(ro_bind(&ours, "/run/sandgate/proxy.sock"), Some(&root)).is_ok());

    let theirs = root.join("socks.sock");
    let mut child = crate::test_support::python_until_told(&format!(
        "s = socket.socket(socket.AF_UNIX)\ns.bind({:?})\ns.listen(1)",
        theirs.display().to_string()
    ));
    let refused = open(ro_bind(&theirs, "/run/sandgate/socks.sock"), Some(&root));
    drop(child.stdin.take());
    let _ = child.wait();
    match refused {
        Err(RunError::Unavailable(why)) => {
            assert!(why.contains("is not this run's: process"), "{why}")
        }
        other => panic!("bound a socket another process listens on: {other:?}"),
    }
}
