//! Policy files at run time: loading a file together with the command line's patterns, and
//! reloading it on SIGHUP or when the file changes on disk.
//!
//! A reload parses and validates the whole file first; only a valid file replaces the rules,
//! in one atomic swap (requests already decided, and open tunnels, are not touched). An
//! invalid file leaves the old rules in force; both outcomes are logged and audited
//! (`policy_reload`). Listeners, the resolver and `allow_ranges` are read at start only; a
//! reload that changes them says so in the log.
//!
//! A reload renews no TTL: the watcher keeps the version in force, whose
//! [`PolicyFile::first_loaded`] records when each entry with a `ttl_seconds` was first loaded
//! (by the entry's text), and each reload counts those TTLs from there, not from its own
//! time. Only an entry whose text changed (or that was absent from the version in force)
//! starts its TTL again. A rejected file changes nothing, the record included. An applied
//! file's warnings that the version in force did not have (an entry whose TTL has ended) are
//! logged once.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sandgate_policy::{
    Credentials, DocError, DocErrors, FirstLoaded, Pattern, PolicyFile, Ruleset, SecretSource,
    TaskCredential, parse_policy_since,
};
use tokio::sync::mpsc;

use crate::egress::unix_now;
use crate::rules::PolicyHandle;

/// How often the file's modification time is checked.
const POLL: Duration = Duration::from_secs(1);

/// Why a policy file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{0}")]
    Invalid(DocErrors),
}

/// A policy file and the command-line patterns that join it.
#[derive(Debug, Clone)]
pub struct PolicySource {
    pub path: PathBuf,
    pub flag_allow: Vec<Pattern>,
    pub flag_deny: Vec<Pattern>,
    /// The file's modification time just before the version in force was read (see
    /// [`PolicySource::new`]): a change after that, even one made before the watcher
    /// started, is reloaded.
    pub read_at_mtime: Option<SystemTime>,
}

/// Reads and validates a policy file, including the secret files it refers to; its TTLs
/// count from now.
pub fn load_file(path: &Path) -> Result<(PolicyFile, Credentials), LoadError> {
    load_file_since(path, &FirstLoaded::new())
}

/// As [`load_file`], each TTL counting from when its entry was first loaded as `earlier`
/// records it (the version in force), else from now.
fn load_file_since(path: &Path, earlier: &FirstLoaded) -> Result<(PolicyFile, Credentials), LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let file = parse_policy_since(&text, &path.display().to_string(), unix_now(), earlier)
        .map_err(LoadError::Invalid)?;
    let credentials = credentials(&file, path)?;
    Ok((file, credentials))
}

/// Builds the task credentials, reading `secret_sha256_file`s relative to the policy file.
fn credentials(file: &PolicyFile, policy_path: &Path) -> Result<Credentials, LoadError> {
    let mut list = Vec::new();
    let mut errors = Vec::new();
    for spec in &file.task_secrets {
        let (file_name, line) = spec.origin.rsplit_once(':').unwrap_or((&spec.origin, "0"));
        let mut fail = |message: String| {
            errors.push(DocError {
                file: file_name.to_owned(),
                line: line.parse().unwrap_or(0),
                field: "spec.auth.tasks".to_owned(),
                message,
            })
        };
        let hex = match &spec.secret {
            SecretSource::Inline(hex) => hex.clone(),
            SecretSource::File(name) => {
                let full = policy_path.parent().unwrap_or(Path::new(".")).join(name);
                match std::fs::read_to_string(&full) {
                    Ok(text) => text,
                    Err(e) => {
                        fail(format!("cannot read {}: {e}", full.display()));
                        continue;
                    }
                }
            }
        };
        match TaskCredential::from_hex(spec.task.clone(), spec.project.clone(), &hex) {
            Ok(c) => list.push(c),
            Err(e) => fail(e.to_string()),
        }
    }
    if errors.is_empty() {
        Ok(Credentials::new(list))
    } else {
        Err(LoadError::Invalid(DocErrors(errors)))
    }
}

/// The admin API's bearer tokens of a loaded policy file, reading `secret_sha256_file`s
/// relative to the policy file.
pub fn admin_principals(
    file: &PolicyFile,
    policy_path: &Path,
) -> Result<sandgate_policy::Principals, LoadError> {
    let mut tokens = Vec::new();
    let mut errors = Vec::new();
    for t in &file.admin.tokens {
        let (file_name, line) = t.origin.rsplit_once(':').unwrap_or((&t.origin, "0"));
        let hex = match &t.secret {
            SecretSource::Inline(hex) => hex.clone(),
            SecretSource::File(name) => {
                let full = policy_path.parent().unwrap_or(Path::new(".")).join(name);
                match std::fs::read_to_string(&full) {
                    Ok(text) => text.trim().to_owned(),
                    Err(e) => {
                        errors.push(DocError {
                            file: file_name.to_owned(),
                            line: line.parse().unwrap_or(0),
                            field: "spec.admin.tokens".to_owned(),
                            message: format!("cannot read {}: {e}", full.display()),
                        });
                        continue;
                    }
                }
            }
        };
        tokens.push((t.name.clone(), t.role, hex, t.tasks.clone()));
    }
    if !errors.is_empty() {
        return Err(LoadError::Invalid(DocErrors(errors)));
    }
    sandgate_policy::Principals::new(tokens).map_err(|e| {
        LoadError::Invalid(DocErrors(vec![DocError {
            file: policy_path.display().to_string(),
            line: 0,
            field: "spec.admin.tokens".to_owned(),
            message: e.to_string(),
        }]))
    })
}

impl PolicySource {
    /// The source for `path` and the command line's patterns, not read yet.
    pub fn new(path: PathBuf, flag_allow: Vec<Pattern>, flag_deny: Vec<Pattern>) -> PolicySource {
        PolicySource {
            path,
            flag_allow,
            flag_deny,
            read_at_mtime: None,
        }
    }

    /// Loads the file and builds the rules (file entries plus command-line patterns), and
    /// notes the file's modification time as it was before reading.
    pub fn load_first(&mut self) -> Result<(PolicyFile, Ruleset), LoadError> {
        self.read_at_mtime = modified(&self.path);
        self.load(&FirstLoaded::new())
    }

    /// Loads the file and builds the rules (file entries plus command-line patterns); each
    /// TTL counts from when its entry was first loaded as `earlier` records it (the record
    /// of the version in force), else from now.
    pub fn load(&self, earlier: &FirstLoaded) -> Result<(PolicyFile, Ruleset), LoadError> {
        let (file, credentials) = load_file_since(&self.path, earlier)?;
        let mut rules = Ruleset::from_parts(&self.flag_allow, &self.flag_deny, Some(&file));
        rules.set_credentials(credentials);
        // The bound secrets, from the proxy's environment as it is at this load.
        let secrets = sandgate_policy::document::credentials::resolve(&file.credentials, |name| {
            std::env::var(name).ok()
        })
        .map_err(LoadError::Invalid)?;
        rules.set_secrets(secrets);
        Ok((file, rules))
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Reloads on every message from `hup` (SIGHUP) and whenever the file's modification time
/// changes. Runs until `hup` closes. `current` is the file in force at start.
pub async fn watch(
    source: PolicySource,
    current: PolicyFile,
    handle: PolicyHandle,
    mut hup: mpsc::Receiver<()>,
) {
    // From the version in force: a change made while the proxy was starting counts.
    let mut last_seen = source.read_at_mtime;
    let mut in_force = current;
    // The generation in force; only an applied file gets a new one.
    let mut generation = 1u64;
    let mut rejections = 0u64;
    loop {
        tokio::select! {
            signal = hup.recv() => {
                if signal.is_none() {
                    return;
                }
            }
            _ = tokio::time::sleep(POLL) => {
                let now = modified(&source.path);
                if now == last_seen {
                    continue;
                }
                last_seen = now;
            }
        }
        match source.load(&in_force.first_loaded) {
            Ok((file, rules)) => {
                generation += 1;
                rejections = 0;
                if file.listeners != in_force.listeners
                    || file.resolver != in_force.resolver
                    || file.allow_ranges != in_force.allow_ranges
                {
                    tracing::warn!(path = %source.path.display(), "listeners, resolver and allow_ranges change only on restart");
                }
                let (allow, deny) = rules.len();
                tracing::info!(path = %source.path.display(), generation, allow, deny, "policy reloaded");
                // What the new version says that the version in force did not (a TTL entry
                // that has now ended, say), once.
                for w in file.warnings.iter().filter(|w| !in_force.warnings.contains(w)) {
                    tracing::warn!(warning = %w.as_warning(), "reloaded policy");
                }
                handle
                    .replace(
                        rules,
                        generation,
                        format!("{}: {allow} allow, {deny} deny rules", source.path.display()),
                    )
                    .await;
                if file.nodes != in_force.nodes {
                    handle.set_nodes(&file.nodes);
                    tracing::info!(path = %source.path.display(), nodes = file.nodes.0.len(), "nodes reloaded");
                }
                in_force = file;
            }
            Err(e) => {
                rejections += 1;
                tracing::error!(path = %source.path.display(), in_force = generation, error = %e, "policy reload rejected; the previous policy stays in force");
                handle.rejected(generation, rejections, e.to_string()).await;
            }
        }
    }
}
