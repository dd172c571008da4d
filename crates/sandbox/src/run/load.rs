//! Reading a run's policy (`--net`, `--allow-domain`, `--limit` applied; errors located as
//! `file:line: field: message`), the `--path-param` values, and the run's own files that
//! the command may not change.

use std::path::{Path, PathBuf};

use super::{RunError, RunOptions};
use crate::policy::{self, SandboxPolicy};

/// Loads the policy, with the command line's `--net` and `--allow-domain` applied; every
/// path canonicalised by the host filesystem.
pub fn load_policy(opts: &RunOptions) -> Result<SandboxPolicy, RunError> {
    let text = std::fs::read_to_string(&opts.policy_path)
        .map_err(|e| RunError::Usage(format!("cannot read {}: {e}", opts.policy_path.display())))?;
    let file = opts.policy_path.display().to_string();
    let resolve = |path: &std::path::Path| std::fs::canonicalize(path);
    let mut p = policy::parse_at(
        &text,
        &opts.params,
        &resolve,
        opts.net,
        &file,
        sandgate_proxy::unix_now(),
    )
    .map_err(|e| RunError::Usage(locate(&e.0, &text, &file)))?;
    for w in &p.warnings {
        eprintln!("{w}");
    }
    for d in &opts.allow_domains {
        let pattern = sandgate_policy::Pattern::parse(d)
            .map_err(|e| RunError::Usage(format!("invalid --allow-domain {d:?}: {e}")))?;
        p.allow.push(pattern);
    }
    if !p.net.proxied() && !opts.allow_domains.is_empty() {
        return Err(RunError::Usage("--allow-domain needs net mode allowlist".into()));
    }
    if !p.net.proxied() && opts.learn {
        return Err(RunError::Usage(format!(
            "--learn needs net mode allowlist or proxy (here {}): only the run's proxy can learn",
            p.net.name()
        )));
    }
    if let Some(feed) = p.exceptions.as_mut() {
        let dir = opts.policy_path.parent().unwrap_or(Path::new("."));
        feed.token_file = dir.join(&feed.token_file);
        feed.ca = feed.ca.as_ref().map(|ca| dir.join(ca));
    }
    if let Some(path) = egress_policy_path(opts, &p) {
        p.egress = Some(Box::new(crate::egress::load(&path)?));
    }
    for spec in &opts.limits {
        p.limits.apply_override(spec).map_err(RunError::Usage)?;
    }
    Ok(p)
}

/// Where the `net.egress_policy` file is: beside the policy that names it.
fn egress_policy_path(opts: &RunOptions, policy: &SandboxPolicy) -> Option<PathBuf> {
    let dir = opts.policy_path.parent().unwrap_or(Path::new("."));
    policy.egress_policy.as_ref().map(|written| dir.join(written))
}

/// The run's own files that the command must not change: the policy file, the egress policy
/// it names, the run's audit log and the directory of kept run logs; canonical, those that
/// exist; and every `--protect` path, which must exist.
pub(super) fn protected_files(
    opts: &RunOptions,
    policy: &SandboxPolicy,
    audit: Option<&Path>,
) -> Result<Vec<PathBuf>, RunError> {
    let mut out: Vec<PathBuf> = [
        Some(opts.policy_path.clone()),
        egress_policy_path(opts, policy),
        policy.exceptions.as_ref().map(|e| e.token_file.clone()),
        audit.map(Path::to_path_buf),
        crate::runlog::protected_dir(),
    ]
    .into_iter()
    .flatten()
    .filter_map(|p| std::fs::canonicalize(p).ok())
    .collect();
    for path in &opts.protect {
        let canonical = std::fs::canonicalize(path)
            .map_err(|e| RunError::Usage(format!("--protect {}: {e}", path.display())))?;
        out.push(canonical);
    }
    Ok(out)
}

/// Refuses a run whose sandbox would hold a directory where runs keep their bridge sockets
/// (`tmp`, canonical: this run's temporary directory; and `/tmp` and `/var/tmp`, where runs
/// started with another `TMPDIR` usually keep theirs), or one above it, in any network
/// mode. Another run's `bridge/` is a directory of the same user: a command that could
/// write there could rename its sockets (sending that run's traffic to a third run's proxy,
/// or, with Unix sockets allowed, to a listener of its own, off the record), and one that
/// could read there could connect to them (another run's proxy, from a run without a
/// network). Under bubblewrap the whole file system (`fs.allow_read_all`,
/// `allow_write_all`) passes only where the sandbox's private `/tmp` hides `tmp`. A run
/// whose `TMPDIR` is elsewhere still is not seen (docs/sandbox.md, "Other runs' bridges").
pub(super) fn refuse_covering_run_state(policy: &SandboxPolicy, tmp: &Path) -> Result<(), RunError> {
    let usual = ["/tmp", "/var/tmp"].map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| PathBuf::from(d)));
    let held: Vec<&Path> = std::iter::once(tmp)
        .chain(usual.iter().map(PathBuf::as_path))
        .collect();
    let listed = [
        ("fs.read_paths", &policy.read_paths),
        ("fs.write_paths", &policy.write_paths),
        ("platform.bwrap.ro_bind", &policy.extra_ro_binds),
        ("platform.bwrap.rw_bind", &policy.extra_rw_binds),
    ];
    for (field, paths) in listed {
        let found = paths
            .iter()
            .find_map(|p| held.iter().find(|h| h.starts_with(p)).map(|h| (p, h)));
        if let Some((p, h)) = found {
            return Err(RunError::Usage(format!(
                "{field}: {} holds {}, where runs keep their bridge sockets: the command could redirect or use other runs' traffic; bind something narrower (and for a temporary directory of its own, fs.tmp: private gives the sandbox one)",
                p.display(),
                h.display()
            )));
        }
    }
    let whole = policy.allow_read_all || policy.allow_write_all;
    if cfg!(target_os = "linux") && whole && !(policy.private_tmp && tmp.starts_with("/tmp")) {
        return Err(RunError::Usage(format!(
            "fs.allow_read_all/allow_write_all: the whole file system holds {}, where runs keep their bridge sockets, and the sandbox's private /tmp does not hide it: the command could redirect or use other runs' traffic; keep fs.tmp private (the default) and TMPDIR under /tmp, or list read and write paths",
            tmp.display()
        )));
    }
    Ok(())
}

/// A policy error as `file:line: field: message`: errors of the YAML layer and of entries
/// name the file and line already; for the others (`field: message`), the line where that
/// field is written, when it can be found.
fn locate(message: &str, text: &str, file: &str) -> String {
    if message.starts_with(&format!("{file}:")) {
        return message.to_owned();
    }
    let field = message.split_once(": ").map(|(f, _)| f).filter(|f| {
        !f.is_empty()
            && f.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    });
    match field.and_then(|f| crate::flow::line_of(text, f)) {
        Some(line) => format!("{file}:{line}: {message}"),
        None => format!("{file}: {message}"),
    }
}

/// `--path-param NAME=PATH`: a parameter whose value is a host path in its canonical form
/// (symlinks, `.` and `..` resolved by `resolve`; it must exist). A policy may then use it in
/// `env.set` values, which are not paths the sandbox resolves: a Jupyter kernelspec passes
/// `{resource_dir}/../..`, and inside the sandbox `..` would cross directories that are not
/// there.
pub fn path_param(spec: &str, resolve: crate::paths::Resolve<'_>) -> Result<(String, String), RunError> {
    let (name, path) = spec
        .split_once('=')
        .filter(|(name, path)| !name.is_empty() && !path.is_empty())
        .ok_or_else(|| RunError::Usage(format!("invalid --path-param {spec:?}: expected NAME=PATH")))?;
    let canonical = resolve(std::path::Path::new(path))
        .map_err(|e| RunError::Usage(format!("--path-param {name}: {path:?}: {e}")))?;
    let value = canonical
        .to_str()
        .ok_or_else(|| RunError::Usage(format!("--path-param {name}: {path:?} is not UTF-8")))?;
    Ok((name.to_owned(), value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn host(path: &Path) -> std::io::Result<PathBuf> {
        match path.to_str() {
            Some("/b/kernels/python3-low/../..") => Ok("/b".into()),
            _ => Err(std::io::ErrorKind::NotFound.into()),
        }
    }

    #[test]
    fn errors_name_the_line_of_their_field() {
        let text =
            "apiVersion: sandgate.dev/v1\nkind: SandboxPolicy\nfs:\n  read_paths: [ /nope ]\n  tmp: shared\n";
        assert_eq!(
            locate("fs.tmp: \"shared\": use private or none", text, "p.yaml"),
            "p.yaml:5: fs.tmp: \"shared\": use private or none"
        );
        assert_eq!(
            locate("fs.read_paths: \"/nope\": does not exist", text, "p.yaml"),
            "p.yaml:4: fs.read_paths: \"/nope\": does not exist"
        );
        assert_eq!(
            locate("net mode \"x\": use none", text, "p.yaml"),
            "p.yaml: net mode \"x\": use none"
        );
        assert_eq!(locate("p.yaml:3: fs: bad", text, "p.yaml"), "p.yaml:3: fs: bad");
    }

    #[test]
    fn a_path_param_is_canonical_and_must_exist() {
        assert_eq!(
            path_param("BUNDLE=/b/kernels/python3-low/../..", &host).unwrap(),
            ("BUNDLE".to_owned(), "/b".to_owned())
        );
        for bad in ["BUNDLE", "=/b", "BUNDLE=", ""] {
            let Err(RunError::Usage(m)) = path_param(bad, &host) else {
                panic!("{bad:?} accepted");
            };
            assert!(m.contains("expected NAME=PATH"), "{m}");
        }
        let Err(RunError::Usage(m)) = path_param("B=/nope", &host) else {
            panic!("a missing path accepted");
        };
        assert!(m.starts_with("--path-param B: \"/nope\": "), "{m}");
    }
}
