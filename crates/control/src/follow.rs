//! A proxy that follows a control plane it does not host (`sandgate proxy --exceptions-from`,
//! a run's `net.exceptions`): the approved exceptions another proxy's admin API publishes,
//! applied here within this proxy's own bounds and never beyond them.
//!
//! The feed is the admin API itself, read with a token of the `follower` role (it reads
//! exceptions and their changes, nothing else): `/v1/events` wakes a full read of
//! `/v1/exceptions`, and the stream is opened again every resync period, so a missed event
//! leaves this proxy stale for one period at most. The stream is subscribed before the
//! exceptions are read, so a change between the two is never lost. Each read installs the
//! active, in-bounds exceptions as the rules' exceptions layer and cuts the connections of
//! those that left it (revoked, expired, or out of bounds), as the proxy that hosts the
//! store does. Expiry needs no feed: each entry carries its second, the rules drop it then,
//! and the proxy cuts what it let through (`cuts.rs`).
//!
//! While the control plane cannot be read, the exceptions last read stay, each until its
//! own expiry, and no new one arrives; the proxy's `state_store_unavailable` gauge is 1 and
//! `/readyz` says so. It tries again with a back-off (a second, doubling up to the resync
//! period) and catches up by itself. The client is blocking, so the follower has a thread
//! of its own; dropping the [`Follower`] stops it at its next wake.
//!
//! The feed is authenticated ([`check_feed`]): `https://`, verified against the CA it is
//! given (an admin listener serving TLS), or plain HTTP on loopback only; over plain HTTP
//! to another host the token and the exceptions would cross a network unauthenticated.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sandgate_policy::{Exception, ExceptionPolicy};
use sandgate_proxy::PolicyHandle;

use crate::client::{AdminClient, AdminError, AdminUrl};
use crate::service::Clock;

/// What a follower reads, and how often it reads it whole.
#[derive(Debug, Clone)]
pub struct FeedSpec {
    pub url: AdminUrl,
    pub token: String,
    /// For an `https://` URL: the CA (PEM) the admin listener's certificate must chain to.
    pub ca: Option<std::path::PathBuf>,
    /// The full re-read period (the event stream is opened again this often).
    pub resync: Duration,
}

/// Why a feed cannot be followed (a usage error at start).
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error(
        "{url}: a control plane on another host is not followed over plain HTTP (the token and the exceptions would cross the network unauthenticated); serve its admin listener over TLS (--admin-tls-cert, --admin-tls-key) and follow https://HOST:PORT with the CA that signed it"
    )]
    NotLoopback { url: String },
    #[error(
        "{url}: an https:// control plane needs the CA that signed its certificate (--exceptions-ca, net.exceptions.ca)"
    )]
    NoCa { url: String },
    #[error("{0}")]
    Tls(String),
    #[error("the follower's token is empty")]
    NoToken,
    /// The control plane refused the token (401, 403): a configuration to fix.
    #[error(
        "{0} (the follower's token needs the follower or viewer role in the control plane's spec.admin.tokens)"
    )]
    Refused(AdminError),
    #[error("cannot start the follower's thread: {0}")]
    Thread(String),
}

/// Checks that `url` may be followed: TLS verified against a CA anywhere, plain HTTP to
/// loopback only.
pub fn check_feed(url: &AdminUrl, ca: Option<&std::path::Path>) -> Result<(), FeedError> {
    if url.is_tls() && ca.is_none() {
        return Err(FeedError::NoCa { url: url.to_string() });
    }
    if !url.is_tls() && !url.addrs().iter().all(|a| a.ip().is_loopback()) {
        return Err(FeedError::NotLoopback { url: url.to_string() });
    }
    Ok(())
}

/// Checks that a follower has a token to read with.
pub fn check_token(token: &str) -> Result<(), FeedError> {
    if token.trim().is_empty() {
        return Err(FeedError::NoToken);
    }
    Ok(())
}

/// A running follower; dropping it stops the thread at its next wake.
#[derive(Debug)]
pub struct Follower {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    client: AdminClient,
    policy: ExceptionPolicy,
    proxy: PolicyHandle,
    clock: ClockFn,
    resync: Duration,
    /// The exceptions last installed.
    known: crate::applied::Applied,
    /// Whether the last read failed (logged once per outage).
    down: AtomicBool,
    stop: AtomicBool,
}

/// The clock, with a `Debug` that says nothing.
struct ClockFn(Clock);

impl std::fmt::Debug for ClockFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

impl Follower {
    /// Reads the control plane once, so what is approved already applies before the first
    /// request (a run's command starts only after this returns), then follows it on a
    /// thread of its own. A control plane that cannot be read now is logged and marked
    /// unavailable; the thread keeps trying.
    pub fn start(
        spec: FeedSpec,
        policy: ExceptionPolicy,
        proxy: PolicyHandle,
        clock: Clock,
    ) -> Result<Follower, FeedError> {
        check_feed(&spec.url, spec.ca.as_deref())?;
        check_token(&spec.token)?;
        let limits = crate::client::Limits {
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            ..Default::default()
        };
        let client = match &spec.ca {
            Some(ca) => AdminClient::with_ca(spec.url, &spec.token, limits, ca)
                .map_err(|e| FeedError::Tls(e.to_string()))?,
            None => AdminClient::with_limits(spec.url, &spec.token, limits),
        };
        let shared = Arc::new(Shared {
            client,
            policy,
            proxy,
            clock: ClockFn(clock),
            resync: spec.resync,
            known: Default::default(),
            down: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let first = shared.read();
        if let Err(
            e @ AdminError::Refused {
                status: 401 | 403, ..
            },
        ) = first
        {
            return Err(FeedError::Refused(e));
        }
        shared.note(first.as_ref().err());
        let thread = shared.clone();
        std::thread::Builder::new()
            .name("sandgate-follow".into())
            .spawn(move || thread.follow())
            .map_err(|e| FeedError::Thread(e.to_string()))?;
        Ok(Follower { shared })
    }

    /// Whether the last read of the control plane succeeded.
    pub fn is_up(&self) -> bool {
        !self.shared.down.load(Ordering::Relaxed)
    }

    /// The exceptions in force here now (ids).
    pub fn known(&self) -> Vec<String> {
        self.shared.known.known().iter().map(|e| e.id.clone()).collect()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

/// The longest wait between two attempts while the control plane cannot be read.
const FIRST_RETRY: Duration = Duration::from_secs(1);

impl Shared {
    /// Follows until stopped: subscribe, read whole, read again on every exception event,
    /// and start over every resync period or when the stream fails.
    fn follow(&self) {
        let mut retry = FIRST_RETRY;
        while !self.stop.load(Ordering::Relaxed) {
            let opened = || {
                // Subscribed: read whole now, so nothing between the two is missed.
                let read = self.read();
                self.note(read.as_ref().err());
            };
            let mut lagged = false;
            let streamed = self
                .client
                .stream_lines("/v1/events", self.resync, opened, |line| {
                    if line.starts_with("event:") {
                        lagged = line.contains("lagged");
                    } else if let Some(data) = line.strip_prefix("data:")
                        && (std::mem::take(&mut lagged) || changes_active(data))
                    {
                        let read = self.read();
                        self.note(read.as_ref().err());
                    }
                    !self.stop.load(Ordering::Relaxed)
                });
            match streamed {
                // The period is over (or the server ended the stream): read whole, go on.
                Ok(()) | Err(AdminError::Timeout { .. }) => {
                    let read = self.read();
                    self.note(read.as_ref().err());
                    if read.is_ok() {
                        retry = FIRST_RETRY;
                        continue;
                    }
                }
                Err(e) => self.note(Some(&e)),
            }
            self.sleep(retry);
            retry = (retry * 2).min(self.resync.max(FIRST_RETRY));
        }
    }

    /// Sleeps `d` in short steps, so a stop is seen soon.
    fn sleep(&self, d: Duration) {
        let step = Duration::from_millis(100);
        let mut left = d;
        while !left.is_zero() && !self.stop.load(Ordering::Relaxed) {
            let now = left.min(step);
            std::thread::sleep(now);
            left -= now;
        }
    }

    /// Reads every exception the control plane holds and installs the active ones within
    /// this proxy's bounds.
    fn read(&self) -> Result<(), AdminError> {
        let listed = self.client.get("/v1/exceptions?state=approved&below=1")?;
        let rows = listed.as_array().cloned().unwrap_or_default();
        let rows = rows
            .into_iter()
            .filter_map(|row| match serde_json::from_value::<Exception>(row) {
                Ok(e) => Some(e),
                Err(error) => {
                    tracing::warn!(%error, "the control plane sent an exception this proxy cannot read; it is ignored");
                    None
                }
            })
            .collect();
        let active = crate::applied::in_force(
            rows,
            &self.policy,
            (self.clock.0)(),
            crate::applied::Stray::Expected,
        );
        self.known.install(&self.proxy, active);
        Ok(())
    }

    /// Logs the feed's failure once per outage, and its return; sets the gauge.
    fn note(&self, error: Option<&AdminError>) {
        self.proxy.note_store(error.is_none());
        match error {
            Some(e) => {
                if !self.down.swap(true, Ordering::Relaxed) {
                    tracing::error!(error = %e, known = self.known.known().len(),
                        "cannot read the control plane: the exceptions last read stay until they expire, and no new one arrives");
                }
            }
            None => {
                if self.down.swap(false, Ordering::Relaxed) {
                    tracing::info!("control plane readable again");
                }
            }
        }
    }
}

/// Whether an event (an audit line) may change what is active: an approval, a revocation
/// or an expiry. A viewer's token also streams every request's events; those wake nothing.
fn changes_active(data: &str) -> bool {
    let kind = serde_json::from_str::<serde_json::Value>(data.trim())
        .ok()
        .and_then(|v| v.get("event").and_then(|e| e.as_str()).map(str::to_owned));
    matches!(
        kind.as_deref(),
        Some("exception_approved" | "exception_revoked" | "exception_expired")
    )
}

#[cfg(test)]
#[path = "follow_tests.rs"]
mod tests;
