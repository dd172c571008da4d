//! TLS configurations that change while the proxy runs: read again on SIGHUP and when their
//! files change on disk (a Kubernetes Secret's update, cert-manager's renewal), swapped
//! whole, and each swap counted, so that connections made under an older configuration
//! take no new streams (a central sends them GOAWAY; a node opens a fresh connection)
//! while the tunnels already on them carry on.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use super::tls::{ClientFiles, Expiries, ServerFiles, TlsError};

/// Loads a configuration from its files.
pub trait Load<C> {
    /// The configuration, and when each of its certificate files (its own, the CA it
    /// trusts) expires.
    fn load_config(&self) -> Result<(Arc<C>, Expiries), TlsError>;
    /// The files it reads.
    fn paths(&self) -> Vec<PathBuf>;
}

impl Load<rustls::ServerConfig> for ServerFiles {
    fn load_config(&self) -> Result<(Arc<rustls::ServerConfig>, Expiries), TlsError> {
        self.load_expiring()
    }
    fn paths(&self) -> Vec<PathBuf> {
        vec![self.cert.clone(), self.key.clone(), self.client_ca.clone()]
    }
}

impl Load<rustls::ClientConfig> for ClientFiles {
    fn load_config(&self) -> Result<(Arc<rustls::ClientConfig>, Expiries), TlsError> {
        self.load_expiring()
    }
    fn paths(&self) -> Vec<PathBuf> {
        vec![self.ca.clone(), self.cert.clone(), self.key.clone()]
    }
}

/// What tells a file's versions apart: its contents (length and hash; `None`: it cannot be
/// read now, or is not a regular file of at most 1 MiB). A Secret volume's symlink swap, a
/// renewal, a rewrite in place that keeps the size and the modification time: each
/// changes them; a `chmod` or a `touch` does not.
pub(super) type Stamp = Option<(usize, u64)>;

pub(super) fn stamps(paths: &[PathBuf]) -> Vec<Stamp> {
    use std::hash::{Hash, Hasher};
    paths
        .iter()
        .map(|p| {
            let bytes = super::tls::read_tls_file(p).ok()?;
            let mut h = std::collections::hash_map::DefaultHasher::new();
            bytes.hash(&mut h);
            Some((bytes.len(), h.finish()))
        })
        .collect()
}

/// A configuration swapped whole when its files are read again: new connections use the
/// new one; established connections keep theirs, and can tell by [`Reloadable::generation`]
/// that they are older.
#[derive(Debug)]
pub struct Reloadable<C, F> {
    files: F,
    current: RwLock<Arc<C>>,
    /// The files' stamps taken just before the version in force was read: a change after
    /// that, even one made while the proxy was starting, makes the files stale.
    loaded: Mutex<Vec<Stamp>>,
    /// Counts the swaps; connections made earlier take no new streams.
    generation: watch::Sender<u64>,
    /// Held through a whole reload (stamp, load, swap, record), so a SIGHUP's and the
    /// watcher's cannot interleave into a configuration older than its recorded stamps.
    reloading: Mutex<()>,
    /// Whether the files on disk differ from the ones in force and did not load when last
    /// tried (the ones in force stay; the watcher tries again every second).
    failing: AtomicBool,
    /// When each certificate file in force expires (from the certificates it was built of).
    expiries: Mutex<Expiries>,
}

impl<C, F: Load<C>> Reloadable<C, F> {
    pub fn new(files: F) -> Result<Reloadable<C, F>, TlsError> {
        let loaded = stamps(&files.paths());
        let (config, expiries) = files.load_config()?;
        let (current, expiries) = (RwLock::new(config), Mutex::new(expiries));
        Ok(Reloadable {
            files,
            current,
            loaded: Mutex::new(loaded),
            generation: watch::Sender::new(0),
            reloading: Mutex::new(()),
            failing: AtomicBool::new(false),
            expiries,
        })
    }

    /// The configuration in force.
    pub fn get(&self) -> Arc<C> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// How many times the configuration has been swapped.
    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Told of every swap.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The files it is read from.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.files.paths()
    }

    /// Whether changed files failed to load when last tried (the older ones are in force).
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// When each certificate file in force expires (Unix seconds; `None`: unreadable).
    pub fn expiries(&self) -> Expiries {
        lock(&self.expiries).clone()
    }

    /// Reads the files again; on an error the configuration in force stays. Connections
    /// count as older (and take no new streams) only when the files changed: a SIGHUP
    /// that reloads the policy alone leaves them be.
    pub fn reload(&self) -> Result<(), TlsError> {
        let _one_at_a_time = lock(&self.reloading);
        self.noted(self.load_stamped(stamps(&self.paths())))
    }

    /// Records whether the files on disk are in force.
    fn noted(&self, outcome: Result<(), TlsError>) -> Result<(), TlsError> {
        self.failing.store(outcome.is_err(), Ordering::Relaxed);
        outcome
    }

    /// Reloads when the files on disk differ from the ones in force: `None` when they do
    /// not. The files are read once for both.
    pub(crate) fn reload_if_stale(&self) -> Option<Result<(), TlsError>> {
        let _one_at_a_time = lock(&self.reloading);
        let seen = stamps(&self.paths());
        if *lock(&self.loaded) == seen {
            // Files put back as they were after a failed change are in force again.
            self.failing.store(false, Ordering::Relaxed);
            return None;
        }
        Some(self.noted(self.load_stamped(seen)))
    }

    /// Loads the files whose stamps, taken just before, are `seen`, and puts them in force
    /// (the caller holds `reloading`, so a SIGHUP's reload and the watcher's cannot
    /// interleave into a configuration older than its recorded stamps).
    fn load_stamped(&self, seen: Vec<Stamp>) -> Result<(), TlsError> {
        let (fresh, expiries) = self.files.load_config()?;
        match self.current.write() {
            Ok(mut c) => *c = fresh,
            Err(poisoned) => *poisoned.into_inner() = fresh,
        }
        *lock(&self.expiries) = expiries;
        let previous = std::mem::replace(&mut *lock(&self.loaded), seen.clone());
        if previous != seen {
            self.generation.send_modify(|g| *g += 1);
        }
        Ok(())
    }
}

/// A mutex's guard, whether or not a thread panicked holding it (what it guards is
/// replaced whole, never left half-written).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One TLS configuration [`TlsHandle`] reloads, whichever side it serves (a central's node
/// listener, a node's connections to its centrals): the handle needs no more of it.
pub trait TlsConfig: Send + Sync + std::fmt::Debug {
    /// Reads the files again ([`Reloadable::reload`]).
    fn reload(&self) -> Result<(), TlsError>;
    /// Reloads if the files changed on disk ([`Reloadable::reload_if_stale`]).
    fn reload_if_stale(&self) -> Option<Result<(), TlsError>>;
    /// Whether changed files failed to load when last tried.
    fn failing(&self) -> bool;
    /// When each certificate file in force expires.
    fn expiries(&self) -> Expiries;
    /// The files it is read from.
    fn paths(&self) -> Vec<PathBuf>;
}

impl<C, F> TlsConfig for Reloadable<C, F>
where
    C: Send + Sync + std::fmt::Debug,
    F: Load<C> + Send + Sync + std::fmt::Debug,
{
    fn reload(&self) -> Result<(), TlsError> {
        Reloadable::reload(self)
    }
    fn reload_if_stale(&self) -> Option<Result<(), TlsError>> {
        Reloadable::reload_if_stale(self)
    }
    fn failing(&self) -> bool {
        Reloadable::failing(self)
    }
    fn expiries(&self) -> Expiries {
        Reloadable::expiries(self)
    }
    fn paths(&self) -> Vec<PathBuf> {
        Reloadable::paths(self)
    }
}

/// Reloads TLS files, on SIGHUP and when they change on disk: new connections use the new
/// certificates; connections already up take no new streams, and the tunnels on them
/// carry on.
#[derive(Debug, Clone)]
pub struct TlsHandle {
    /// Every TLS configuration in the process: node listeners' and the centrals connector's.
    pub(crate) configs: Vec<Arc<dyn TlsConfig>>,
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
}

/// How often [`TlsHandle::watch`] looks at the files.
const WATCH_EVERY: Duration = Duration::from_secs(1);

impl TlsHandle {
    /// Reads every TLS file again; on an error that configuration stays as it was. Returns
    /// the errors.
    pub fn reload(&self) -> Vec<TlsError> {
        let errors = self.configs.iter().filter_map(|c| c.reload().err()).collect();
        self.publish();
        errors
    }

    /// Sets the TLS metrics from the configurations in force: when each certificate file
    /// expires (a path two configurations share, such as one CA, by the earlier of the two
    /// versions they hold), and how many configurations have changed files that do not load.
    pub fn publish(&self) {
        let mut failing = 0;
        let mut by_path: std::collections::BTreeMap<PathBuf, Option<i64>> = Default::default();
        for config in &self.configs {
            failing += i64::from(config.failing());
            for (path, not_after) in config.expiries() {
                let earliest = by_path.entry(path).or_insert(not_after);
                *earliest = match (*earliest, not_after) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        for (path, not_after) in by_path {
            let labels = crate::metrics::PathLabels {
                path: path.display().to_string(),
            };
            let gauge = self.metrics.tls_certificate_expiry.get_or_create(&labels);
            gauge.set(not_after.unwrap_or(0));
        }
        self.metrics.tls_reload_failing.set(failing);
    }

    /// Whether there is anything to reload.
    pub fn is_empty(&self) -> bool {
        self.configs.is_empty()
    }

    /// Every TLS file of the node listeners and of the connections to central proxies.
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = self.configs.iter().flat_map(|c| c.paths()).collect();
        paths.sort();
        paths.dedup();
        paths
    }

    /// Reloads each configuration whose files differ from the ones in force: `None` when
    /// none does, else the errors.
    fn reload_stale(&self) -> Option<Vec<TlsError>> {
        let mut tried = false;
        let mut errors = Vec::new();
        for outcome in self.configs.iter().filter_map(|c| c.reload_if_stale()) {
            tried = true;
            errors.extend(outcome.err());
        }
        tried.then_some(errors)
    }

    /// Reloads whenever files differ from the ones in force (checked every second, off the
    /// request workers), so a rotated certificate needs no SIGHUP. A set that does not load
    /// (a certificate written before its key, a CA not valid yet) leaves the configuration
    /// in force and is tried again every second until it loads; its error is logged once
    /// per version of the files. Runs until the task is dropped.
    pub async fn watch(self) {
        let paths = Arc::new(self.paths());
        let mut reported: Option<Vec<Stamp>> = None;
        self.publish();
        loop {
            tokio::time::sleep(WATCH_EVERY).await;
            let (handle, paths) = (self.clone(), paths.clone());
            let tick = tokio::task::spawn_blocking(move || {
                let outcome = handle.reload_stale();
                let failed_on = matches!(&outcome, Some(e) if !e.is_empty()).then(|| stamps(&paths));
                (outcome, failed_on)
            });
            let Ok((outcome, failed_on)) = tick.await else {
                continue;
            };
            self.publish();
            match outcome {
                None => {}
                Some(errors) if errors.is_empty() => {
                    reported = None;
                    tracing::info!("TLS files changed and reloaded; new connections use them");
                }
                // Logged once per version of the files.
                Some(errors) if reported != failed_on => {
                    for e in &errors {
                        tracing::error!(error = %e, "TLS files changed but not reloaded; the previous ones stay in force (tried again every second)");
                    }
                    reported = failed_on;
                }
                Some(_) => {}
            }
        }
    }
}
