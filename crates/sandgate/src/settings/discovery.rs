//! Where a command finds its file when none is named, as kubectl finds its kubeconfig and
//! systemd units their drop-ins: `sandgate proxy`'s policy (`./sandgate.yaml`, else
//! `/etc/sandgate/policy.yaml`), `sandgate run`'s (`./sandbox.yaml`, the file `sandgate init
//! --for` writes), and the newest run log for `sandgate audit tail --last-run`.
//!
//! A name given on the command line or in the environment always wins, and the file found is
//! always said (the proxy's log, run's stderr), so a stray file in the working directory is
//! never read silently. A name counts as present when anything stands there (a dangling
//! link, a directory, a file this user cannot read): loading it then fails with its name,
//! rather than the proxy starting on defaults past a file that was meant to be read. Which
//! names exist comes in through [`Env`], so tests hand in their own answers.

use std::path::{Path, PathBuf};

use super::Env;

/// `sandgate proxy`'s policy in the working directory.
pub const LOCAL_POLICY: &str = "./sandgate.yaml";
/// `sandgate proxy`'s policy for the host (deploy/systemd installs one there).
pub const SYSTEM_POLICY: &str = "/etc/sandgate/policy.yaml";
/// `sandgate run`'s policy in the working directory: what `sandgate init --for` writes.
pub const SANDBOX_POLICY: &str = "./sandbox.yaml";

/// The policy file `sandgate proxy` reads when neither `--policy` nor `SANDGATE_POLICY`
/// names one: the first of [`LOCAL_POLICY`] and [`SYSTEM_POLICY`] present, or none (the
/// proxy then runs on its flags and environment alone, as before).
pub fn proxy_policy(env: &dyn Env) -> Option<PathBuf> {
    [LOCAL_POLICY, SYSTEM_POLICY]
        .into_iter()
        .map(Path::new)
        .find(|p| env.exists(p))
        .map(Path::to_path_buf)
}

/// The line `sandgate proxy` logs, and `sandgate run` prints, for a policy it found.
pub fn found(path: &Path) -> String {
    format!("policy: {} (found; --policy names another)", path.display())
}

/// `sandgate run`'s policy: `given`, else [`SANDBOX_POLICY`] when present (with the line to
/// say so), else a usage error that names both ways to give one.
pub fn sandbox_policy(given: Option<PathBuf>, env: &dyn Env) -> Result<(PathBuf, Option<String>), String> {
    if let Some(path) = given {
        return Ok((path, None));
    }
    let local = Path::new(SANDBOX_POLICY);
    if env.exists(local) {
        return Ok((local.to_path_buf(), Some(found(local))));
    }
    Err(format!(
        "no policy: pass --policy FILE, or run where {SANDBOX_POLICY} is (`sandgate init --for 'COMMAND'` writes one)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment with no variables, in which exactly `present` exist.
    struct Files(&'static [&'static str]);

    impl Env for Files {
        fn get(&self, _key: &str) -> Option<String> {
            None
        }
        fn exists(&self, path: &Path) -> bool {
            self.0.iter().any(|p| Path::new(p) == path)
        }
    }

    #[test]
    fn the_working_directory_wins_over_etc_and_neither_means_none() {
        let both = Files(&[LOCAL_POLICY, SYSTEM_POLICY]);
        assert_eq!(proxy_policy(&both), Some(PathBuf::from("./sandgate.yaml")));
        let etc = Files(&[SYSTEM_POLICY]);
        assert_eq!(
            proxy_policy(&etc),
            Some(PathBuf::from("/etc/sandgate/policy.yaml"))
        );
        // sandbox.yaml is run's, never the proxy's.
        assert_eq!(proxy_policy(&Files(&[SANDBOX_POLICY])), None);
        assert_eq!(proxy_policy(&Files(&[])), None);
        assert_eq!(
            found(Path::new(LOCAL_POLICY)),
            "policy: ./sandgate.yaml (found; --policy names another)"
        );
    }

    #[test]
    fn run_takes_its_flag_then_sandbox_yaml_and_else_says_how() {
        let here = Files(&[SANDBOX_POLICY, LOCAL_POLICY]);
        let (path, said) = sandbox_policy(Some("p.yaml".into()), &here).unwrap();
        assert_eq!((path, said), (PathBuf::from("p.yaml"), None));
        let (path, said) = sandbox_policy(None, &here).unwrap();
        assert_eq!(path, PathBuf::from("./sandbox.yaml"));
        assert_eq!(
            said.as_deref(),
            Some("policy: ./sandbox.yaml (found; --policy names another)")
        );
        // The proxy's file is not a sandbox policy.
        let err = sandbox_policy(None, &Files(&[LOCAL_POLICY])).unwrap_err();
        assert!(
            err.contains("--policy FILE") && err.contains("./sandbox.yaml") && err.contains("init --for"),
            "{err}"
        );
    }
}
