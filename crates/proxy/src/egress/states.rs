//! A request's states in the core, and the record each still owes the audit trail: a
//! [`Pending`] request (begun, not yet decided), a [`Decided`] allow and a [`Dialed`] tunnel
//! each owe one decision event; a [`Grant`] (an allow on record) owes one close event.
//!
//! Exactly once holds by construction. Each call that records consumes its state and
//! disarms it ([`Pending::settle`], [`Grant::settle`]); a state dropped without that (a task
//! dropped at the hard stop, a front end's early return, a panic unwinding) records what it
//! owes from its `Drop`: a deny `abandoned` for an undecided request, a close for a grant
//! (`shutdown` once its stop token was cancelled, else `client_failure`). A drop cannot wait,
//! so that record is queued if there is room and else written to stderr, as the refusals
//! made while the audit log fails are. None of these types can be cloned, and each is
//! `#[must_use]`.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use sandgate_policy::{Access, Target, Verdict};
use tokio_util::sync::CancellationToken;

use crate::audit::Audit;
use crate::audit::event::{Close, Decision, Dest, Event, Outcome, Party};
use crate::config::Identity;
use crate::cuts::CutGuard;
use crate::refusal::Classified;
use crate::relay::Upstream;

/// The reason code of a request that ended before it was decided (its task was dropped).
pub(crate) const ABANDONED: &str = "abandoned";

/// A request that has not been decided yet.
#[must_use = "a request must end in exactly one decision event: refuse it or decide it"]
#[derive(Debug)]
pub(crate) struct Pending {
    pub(super) party: Party,
    pub(super) started: Instant,
    /// Where it asked to go, once known (for the record a drop writes).
    pub(super) dest: Option<Dest>,
    /// `Some` while the decision is owed.
    owed: Option<Arc<Audit>>,
}

impl Pending {
    pub(super) fn new(party: Party, audit: Arc<Audit>) -> Pending {
        Pending {
            party,
            started: Instant::now(),
            dest: None,
            owed: Some(audit),
        }
    }

    /// The party and start, for the decision event the caller records now.
    pub(super) fn settle(mut self) -> (Party, Instant) {
        self.owed = None;
        (std::mem::replace(&mut self.party, nobody()), self.started)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(audit) = self.owed.take() else {
            return;
        };
        audit.record_now_or_log(Event::Decision(Decision {
            party: std::mem::replace(&mut self.party, nobody()),
            dest: self.dest.take(),
            verdict: Verdict::Deny,
            reason_code: ABANDONED.into(),
            resolved_ip: None,
            rule: None,
            status: None,
            tls_server_name: None,
            would_deny: None,
            detail: Some(
                "ended before it was decided (the proxy stopped or the connection went away)".into(),
            ),
        }));
    }
}

/// A stand-in party left behind in a settled state (never recorded).
fn nobody() -> Party {
    static NOBODY: LazyLock<Arc<Identity>> = LazyLock::new(Default::default);
    Party {
        path: None,
        request_id: String::new(),
        client_addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        identity: NOBODY.clone(),
        method: None,
        node: None,
    }
}

/// An allowed request, before the guard has seen its addresses.
#[must_use = "an allowed request must be opened or reused, which records its decision"]
#[derive(Debug)]
pub(crate) struct Decided {
    pub(super) pending: Pending,
    pub(super) target: Target,
    pub(super) access: Access,
    pub(super) rule: Option<Arc<str>>,
    /// The second the deciding entry expires: what it let through ends then.
    pub(super) expires: Option<i64>,
    /// Let through in report-only mode: what the policy said instead.
    pub(super) would_deny: Option<sandgate_policy::PolicyReason>,
    /// A CONNECT opened to be intercepted: each request inside is decided on its own.
    pub(super) inspect: bool,
    /// Allowed by an entry with methods or paths: the request was judged by them, so what
    /// they cannot judge must not ride along (a body on a read).
    pub(super) judged: bool,
}

/// A request whose allow is on record; its close must be recorded too.
#[must_use = "an allowed request must end in a close event: close or fail it"]
#[derive(Debug)]
pub(crate) struct Grant {
    pub(super) party: Party,
    /// Cancelled at the end of the shutdown grace, or when the granting rule is revoked or
    /// expires.
    pub(super) stop: CancellationToken,
    /// Registered where a revocation or the expiry can cut it; removed when the grant ends.
    /// Boxed: few grants have one, and every idle tunnel holds its grant.
    pub(super) cut: Option<Box<CutGuard>>,
    /// A revocation or the expiry can end it early (whoever holds the registration now).
    pub(super) cuttable: bool,
    /// The second the deciding entry expires.
    pub(super) expires: Option<i64>,
    pub target: Target,
    pub(super) access: Access,
    pub(super) resolved: Option<IpAddr>,
    pub(super) started: Instant,
    /// `Some` while the close is owed.
    pub(super) owed: Option<Arc<Audit>>,
}

impl Grant {
    /// Cancelled when in-flight work under this grant must end (shutdown, revocation,
    /// expiry).
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// Whether a revocation or an expiry can end this grant early (also once its
    /// registration was handed on by [`Grant::keep_cut`]).
    pub fn cuttable(&self) -> bool {
        self.cuttable
    }

    /// Hands the registration to whatever outlives this grant (a kept-alive client
    /// connection): the token it cancels and the guard that keeps it registered.
    pub fn keep_cut(&mut self) -> Option<(CancellationToken, CutGuard)> {
        let guard = self.cut.take()?;
        Some((self.stop.clone(), *guard))
    }

    /// The close event for `end`; the grant owes nothing after.
    pub(super) fn settle(mut self, sent: u64, received: u64, status: Option<u16>, outcome: Outcome) -> Event {
        self.owed = None;
        self.close_event(sent, received, status, outcome)
    }

    fn close_event(&mut self, sent: u64, received: u64, status: Option<u16>, outcome: Outcome) -> Event {
        Event::Close(Close {
            dest: dest_of(&self.target, self.access),
            resolved_ip: self.resolved,
            status,
            bytes_sent: sent,
            bytes_received: received,
            duration_ms: self.started.elapsed().as_millis() as u64,
            outcome,
            party: std::mem::replace(&mut self.party, nobody()),
        })
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        let Some(audit) = self.owed.take() else {
            return;
        };
        // Dropped unclosed: its task was dropped at the hard stop (its token is cancelled
        // then), or the work under it ended some way no call recorded.
        let outcome = match self.stop.is_cancelled() {
            true => Outcome::Shutdown,
            false => Outcome::ClientFailure,
        };
        audit.record_now_or_log(self.close_event(0, 0, None, outcome));
    }
}

/// An upstream connection the core opened for a granted request.
#[derive(Debug)]
pub(crate) struct Opened {
    pub stream: Upstream,
    pub addr: SocketAddr,
    /// The connection goes to an upstream proxy (which needs absolute-form HTTP requests).
    pub chained: bool,
    pub grant: Grant,
}

/// A connection the core opened for an allowed tunnel whose allow is not on record yet: the
/// tunnel's first bytes decide it ([`super::Egress::carry`]).
#[must_use = "a dialled tunnel must be carried or abandoned, which records its decision"]
#[derive(Debug)]
pub(crate) struct Dialed {
    pub(super) decided: Decided,
    pub stream: Upstream,
    pub addr: SocketAddr,
    pub(super) vetted_ip: Option<IpAddr>,
    /// Cancelled at the end of the shutdown grace, or when the granting rule is revoked or
    /// expires.
    pub(super) stop: (CancellationToken, Option<CutGuard>),
}

/// A refusal already on record; the front end renders it.
#[derive(Debug)]
pub(crate) struct Refused {
    pub id: String,
    pub classified: Classified,
}

/// How an allowed exchange or tunnel ended.
#[derive(Debug)]
pub(crate) struct End {
    pub sent: u64,
    pub received: u64,
    pub status: Option<u16>,
    pub outcome: Outcome,
}

pub(super) fn dest_of(target: &Target, access: Access) -> Dest {
    Dest {
        scheme: access.scheme(),
        host: host_text(&target.host),
        port: target.port,
    }
}

/// The host as its `Display` writes it, without `fmt` (each request records its
/// destination twice: decision, close).
fn host_text(host: &sandgate_policy::Host) -> String {
    host.text()
}

/// Request ids: a per-process prefix and a counter, unique within a run and unlikely to
/// repeat across restarts.
#[derive(Debug)]
pub(super) struct RequestIds {
    prefix: u32,
    next: AtomicU64,
}

impl RequestIds {
    pub(super) fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        RequestIds {
            prefix: nanos ^ std::process::id().rotate_left(16),
            next: AtomicU64::new(1),
        }
    }

    /// The next id: the prefix and the counter's low 32 bits, 16 lowercase hex digits
    /// (written without `fmt`: one per request).
    pub(super) fn next(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        if n > u64::from(u32::MAX) {
            return format!("{:08x}{n:08x}", self.prefix);
        }
        let both = (u64::from(self.prefix) << 32) | (n & 0xffff_ffff);
        (0..16)
            .rev()
            .map(|i| {
                char::from(
                    HEX.get(((both >> (i * 4)) & 0xf) as usize)
                        .copied()
                        .unwrap_or(b'0'),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_and_hosts_read_as_their_formatted_forms() {
        let ids = RequestIds {
            prefix: 0x0a0b_c0de,
            next: AtomicU64::new(0xffff_fffe),
        };
        for n in 0xffff_fffe_u64..=0x1_0000_0000 {
            assert_eq!(ids.next(), format!("{:08x}{n:08x}", ids.prefix));
        }
        for host in ["a.example.com", "0.0.0.0", "255.10.9.100", "[2001:db8::1]"] {
            let host = sandgate_policy::Host::parse(host).unwrap();
            assert_eq!(host_text(&host), host.to_string());
        }
    }
}
