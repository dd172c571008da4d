//! The watch over a running run's tweaks: a run that holds something only a tweak gave it
//! (a longer time limit, more output, the network, a workspace: [`Holding`]) ends within
//! about a second of that tweak's revocation, or of any other way the control plane ends it
//! (expiry, a narrowing, its row gone), and at the second it expires.
//!
//! A periodic check, not a subscription: every [`POLL`] the approved exceptions of the
//! run's task are read again ([`control::approved_of`], at most [`control::WATCH_TIMEOUT`]
//! each, the wait for a thread included), the tweaks they grant are computed as at the run's start (within the sandbox's
//! bounds), and the run goes on only while they still give all it holds. It fails closed:
//! while the control plane cannot be read, the tweaks last read are kept, each only until
//! its own expiry second, which is awaited exactly (not at the next poll). A tweak granted
//! since may keep a run going; nothing read ever lets a run hold more than it started with.
//!
//! The future [`until_ended`] returns completes only when the run must stop, with the
//! future that says why ([`Stopped`]: each tweak it relied on that ended, and its state as
//! the control plane tells it, asked for at most [`NAMING`]); the runner stops the run at
//! once and asks meanwhile ([`crate::runner::run`]). Runs that hold no tweak are not
//! watched.
//!
//! The watch's reads never wait behind the agent's: its calls are the control plane's
//! watch lane ([`control::Lane::Watch`]), bounded as a whole (thread included), where the
//! agent's tool calls share a few slots of their own.

use std::time::Duration;

use sandgate_policy::Exception;

use crate::config::{Egress, Sandbox};
use crate::control;
use crate::runner::{EndedTweak, Stopped, Stopping};
use crate::tweaks::{self, Grant, Granted, Holding};

/// How often the control plane is read while a run holds a tweak: with the call's own
/// bound, a revocation is seen within about a second.
pub const POLL: Duration = Duration::from_millis(400);

/// The most time spent asking the control plane how the tweaks that ended ended, before
/// the run is stopped: what is not known by then is said as `ended`.
const NAMING: Duration = Duration::from_millis(500);

/// One run's watch: what it holds, what was granted when it started, and the approved
/// exceptions last read.
#[derive(Debug, Clone)]
pub struct Watch {
    pub egress: Egress,
    pub sandbox: Sandbox,
    pub holding: Holding,
    /// What the tweaks granted when the run was admitted.
    pub at_start: Granted,
    /// The approved exceptions read then.
    pub known: Vec<Exception>,
}

/// Completes when the run must stop (something it holds is no longer granted), with the
/// future that says why.
pub async fn until_ended(w: Watch) -> Stopping {
    let mut known = w.known.clone();
    let mut unreadable = false;
    loop {
        let now = now_ms();
        let granted = tweaks::granted(&w.sandbox, &known, now / 1000);
        if !w.holding.kept_by(&granted) {
            return Box::pin(async move { stopped(&w, &granted, now / 1000).await });
        }
        // The next second a grant the run relies on expires, awaited exactly.
        let expiry = granted
            .grants
            .iter()
            .filter(|g| w.holding.relies_on(g))
            .filter_map(|g| g.expires_at)
            .min()
            .map(|at| {
                Duration::from_millis(u64::try_from(at.saturating_mul(1000).saturating_sub(now)).unwrap_or(0))
            });
        let wait = expiry.map_or(POLL, |e| e.min(POLL));
        tokio::time::sleep(wait).await;
        if expiry.is_some_and(|e| e <= POLL) {
            continue;
        }
        let left = expiry.map(|e| e.saturating_sub(POLL));
        let read = control::approved_of(&w.egress, &w.sandbox.run_task, control::Lane::Watch);
        tokio::select! {
            r = read => match r {
                Ok(seen) => {
                    known = seen;
                    unreadable = false;
                }
                Err(e) => {
                    if !unreadable {
                        tracing::warn!(sandbox = %w.sandbox.name, error = %e, "the control plane cannot be read: a run keeps its tweaks only until they expire");
                    }
                    unreadable = true;
                }
            },
            () = sleep_or_never(left) => {}
        }
    }
}

/// Sleeps `d`, or forever.
async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Why the run stops: each grant it relied on that `now` no longer gives, in the state the
/// control plane says it is in.
async fn stopped(w: &Watch, now: &Granted, at: i64) -> Stopped {
    let mut ended = Vec::new();
    let gone = w.holding.ended(&w.at_start, now);
    // A grant changed in a way `ended` cannot name (none should): every one it relied on.
    let gone: Vec<&Grant> = if gone.is_empty() {
        w.at_start
            .grants
            .iter()
            .filter(|g| w.holding.relies_on(g))
            .collect()
    } else {
        gone
    };
    let deadline = tokio::time::Instant::now() + NAMING;
    for g in gone {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        ended.push(EndedTweak {
            id: g.id.clone(),
            state: state_of(&w.egress, g, at, left).await,
            tweak: g.gives.to_string(),
        });
    }
    let said: Vec<String> = ended
        .iter()
        .map(|e| format!("{} (exception {}: {})", e.state, e.id, e.tweak))
        .collect();
    Stopped {
        message: format!("stopped: the tweak it ran under was {}", said.join("; ")),
        tweaks: ended,
    }
}

/// How a grant ended: `expired` at its second; else as the control plane shows it within
/// `left` (`revoked`, `denied`; `narrowed` while still approved), `ended` when it cannot say.
async fn state_of(egress: &Egress, g: &Grant, at: i64, left: Duration) -> String {
    if g.expires_at.is_some_and(|e| e <= at) {
        return "expired".to_owned();
    }
    if left.is_zero() {
        return "ended".to_owned();
    }
    let shown = control::show(egress, &g.id, control::Lane::Naming(left))
        .await
        .and_then(control::exception);
    match shown {
        Ok(x) if x.is_active(at) => "narrowed".to_owned(),
        Ok(x) => x.state_at(at).to_string(),
        Err(_) => "ended".to_owned(),
    }
}

/// Milliseconds since the Unix epoch: expiry seconds are awaited to the millisecond.
fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}
