//! Slows guessing at the admin credentials: a token presented on the approvals page's login
//! form or as an API bearer token and refused counts as a failure, and failures are limited
//! per client address and for all addresses together. It does not check credentials (the
//! caller's closure does), record anything or answer anyone: `call.rs` records, `api.rs` and
//! `ui.rs` answer.
//!
//! Each limit is the generic cell rate algorithm (ITU-T I.371, "virtual scheduling"): a
//! budget is the instant at which it is full again; a failure moves that instant one
//! interval later (from now at the earliest), and an attempt is let through only while at
//! least one failure is left. Time is an argument, so the tests run without a clock.
//!
//! - Per address (IPv4; IPv6 by its /64, which one host usually holds whole; an IPv4-mapped
//!   address as the IPv4 it carries): [`Limits::per_address`] failures at once, then one
//!   per interval.
//! - All addresses together: [`Limits::all`]. An address from which a person (an approver
//!   or a viewer) authenticated within [`Limits::person_life`] is exempt from this limit (not
//!   from its own), so an attacker spending it from other addresses cannot keep the approver
//!   out; up to [`Limits::people`] such addresses are kept, the least recent forgotten first.
//!
//! While an address is over a limit its attempts are refused without checking the
//! credential, the right one included: otherwise the answer would still tell a right guess
//! from a wrong one. A success does not clear an address's failures, so a legitimate caller
//! sharing the address cannot launder an attacker's guesses.
//!
//! Memory: the failure table holds at most [`Limits::addresses`] addresses; an entry can be
//! dropped once its budget is full again (at most `burst` intervals after its last failure).
//! A new address enters only after the limit for all addresses let its attempt through, so
//! the table grows no faster than that limit; if it is full even so, a new address is
//! refused like one over the limit for all, except a person's, which takes the place of the
//! entry nearest to being dropped.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A budget's size and refill: `burst` failures at once, then one per `every`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    pub(crate) burst: u32,
    pub(crate) every: Duration,
}

/// The limits in force; [`Limits::default`] is what the admin listener uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) per_address: Rate,
    pub(crate) all: Rate,
    /// Addresses the failure table holds at most.
    pub(crate) addresses: usize,
    /// Addresses a person authenticated from, kept at most.
    pub(crate) people: usize,
    pub(crate) person_life: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            // Room for a person's typing mistakes; a guesser gets 360 an hour per address.
            per_address: Rate {
                burst: 5,
                every: Duration::from_secs(10),
            },
            // An attacker cycling addresses gets 3,600 an hour in all.
            all: Rate {
                burst: 30,
                every: Duration::from_secs(1),
            },
            // An entry is due at most 50 s after its last failure, and new ones enter at
            // most 30 at once and one a second after (80 within 50 s), people's addresses
            // aside (64 at most): the cap is a backstop, not what limits them.
            addresses: 1024,
            people: 64,
            // A session's life (ui.rs).
            person_life: Duration::from_secs(8 * 3600),
        }
    }
}

/// Which limit refused an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The client's own address.
    Address,
    /// All addresses together (or the failure table is full).
    All,
}

/// An attempt refused without a check: when to try again, and whether this refusal is the
/// first since the last attempt let through (only that one is recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wait {
    pub(crate) scope: Scope,
    /// Whole seconds, at least 1 (the `Retry-After` value, RFC 9110 section 10.2.3).
    pub(crate) retry_after: u64,
    pub(crate) record: bool,
}

impl Wait {
    /// Why, in a few words, for the client and the audit trail.
    pub(crate) fn reason(&self) -> String {
        let whose = match self.scope {
            Scope::Address => "from this address",
            Scope::All => "from new addresses",
        };
        format!(
            "too many failed logins {whose}; try again in {} s",
            self.retry_after
        )
    }
}

/// The failure budgets, behind one lock: checking a credential happens inside it, so
/// concurrent guesses from one address cannot all pass the check before any is counted.
#[derive(Debug)]
pub struct Throttle {
    limits: Limits,
    table: Mutex<Table>,
}

impl Default for Throttle {
    fn default() -> Throttle {
        Throttle::new(Limits::default())
    }
}

#[derive(Debug, Default)]
struct Table {
    failures: HashMap<Source, Budget>,
    all: Budget,
    /// When a person last authenticated from each address.
    people: HashMap<Source, Instant>,
}

/// Where attempts come from, as the limits count them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    V4([u8; 4]),
    /// The /64.
    V6([u8; 8]),
    /// No peer address known (only a router driven without a listener).
    Unknown,
}

fn source(peer: Option<SocketAddr>) -> Source {
    match peer.map(|p| p.ip()) {
        Some(IpAddr::V4(v4)) => Source::V4(v4.octets()),
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => Source::V4(v4.octets()),
            None => {
                let [a, b, c, d, ..] = v6.segments();
                let mut net = [0u8; 8];
                for (chunk, seg) in net.chunks_exact_mut(2).zip([a, b, c, d]) {
                    chunk.copy_from_slice(&seg.to_be_bytes());
                }
                Source::V6(net)
            }
        },
        None => Source::Unknown,
    }
}

/// One budget: the instant at which it is full again, and whether a refusal since the last
/// attempt let through has been recorded.
#[derive(Debug, Clone, Copy, Default)]
struct Budget {
    full_at: Option<Instant>,
    noted: bool,
}

impl Budget {
    fn debt(&self, now: Instant) -> Duration {
        self.full_at
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now))
    }

    /// How long until one more failure fits, when none fits now.
    fn over(&self, rate: Rate, now: Instant) -> Option<Duration> {
        let room = rate.every.saturating_mul(rate.burst.saturating_sub(1));
        let debt = self.debt(now);
        (debt > room).then(|| debt.saturating_sub(room))
    }

    fn charge(&mut self, rate: Rate, now: Instant) {
        let from = self.full_at.map_or(now, |at| at.max(now));
        self.full_at = Some(from.checked_add(rate.every).unwrap_or(from));
    }

    /// A refusal: recorded only if it is the first since an attempt was let through.
    fn refuse(&mut self, scope: Scope, wait: Duration) -> Wait {
        let record = !self.noted;
        self.noted = true;
        Wait {
            scope,
            retry_after: whole_seconds(wait),
            record,
        }
    }
}

fn whole_seconds(d: Duration) -> u64 {
    let s = d.as_secs();
    if d.subsec_nanos() > 0 || s == 0 {
        s.saturating_add(1)
    } else {
        s
    }
}

impl Throttle {
    pub(crate) fn new(limits: Limits) -> Throttle {
        Throttle {
            limits,
            table: Mutex::new(Table::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // The table stays consistent at every step, so a panic elsewhere leaves it usable.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `check` (the credential check) for an attempt from `peer` unless a limit refuses
    /// it first; an `Err` from `check` is a failure and is counted.
    pub(crate) fn attempt<T, E>(
        &self,
        peer: Option<SocketAddr>,
        now: Instant,
        check: impl FnOnce() -> Result<T, E>,
    ) -> Result<Result<T, E>, Wait> {
        let l = self.limits;
        let src = source(peer);
        let mut t = self.lock();
        let person = t
            .people
            .get(&src)
            .is_some_and(|at| now.saturating_duration_since(*at) < l.person_life);
        let known = match t.failures.get_mut(&src) {
            Some(b) => {
                if let Some(wait) = b.over(l.per_address, now) {
                    return Err(b.refuse(Scope::Address, wait));
                }
                true
            }
            None => false,
        };
        if !person {
            if !known && let Some(wait) = t.room(l.addresses, now) {
                return Err(t.all.refuse(Scope::All, wait));
            }
            if let Some(wait) = t.all.over(l.all, now) {
                return Err(t.all.refuse(Scope::All, wait));
            }
            t.all.noted = false;
        }
        if let Some(b) = t.failures.get_mut(&src) {
            b.noted = false;
        }
        let result = check();
        if result.is_err() {
            if !known && t.failures.len() >= l.addresses {
                // Only a person's address gets here with the table full: it takes the place
                // of the address nearest to being dropped.
                t.evict_one(now);
            }
            t.failures.entry(src).or_default().charge(l.per_address, now);
            t.all.charge(l.all, now);
        }
        Ok(result)
    }

    /// A person (an approver or a viewer) authenticated from `peer`: exempt it from the
    /// limit for all addresses for [`Limits::person_life`].
    pub(crate) fn vouch(&self, peer: Option<SocketAddr>, now: Instant) {
        let l = self.limits;
        let mut t = self.lock();
        let src = source(peer);
        if !t.people.contains_key(&src) && t.people.len() >= l.people {
            t.people
                .retain(|_, at| now.saturating_duration_since(*at) < l.person_life);
            let oldest = t.people.iter().min_by_key(|(_, at)| **at).map(|(s, _)| *s);
            if t.people.len() >= l.people
                && let Some(oldest) = oldest
            {
                t.people.remove(&oldest);
            }
        }
        t.people.insert(src, now);
    }
}

impl Table {
    /// Makes room for a new address: drops the entries whose budget is full again. `Some`
    /// (how long until the first entry frees) when the table is still full.
    fn room(&mut self, cap: usize, now: Instant) -> Option<Duration> {
        if self.failures.len() < cap {
            return None;
        }
        self.failures.retain(|_, b| !b.debt(now).is_zero());
        if self.failures.len() < cap {
            return None;
        }
        self.failures.values().map(|b| b.debt(now)).min()
    }

    fn evict_one(&mut self, now: Instant) {
        let nearest = self
            .failures
            .iter()
            .min_by_key(|(_, b)| b.debt(now))
            .map(|(s, _)| *s);
        if let Some(s) = nearest {
            self.failures.remove(&s);
        }
    }
}

#[cfg(test)]
#[path = "throttle_tests.rs"]
mod tests;
