//! Slows guessing at the admin credentials: a token presented on the approvals page's login
//! form or as an API bearer token and refused counts as a failure, and failures are limited
//! per client address and for all addresses together. It does not check credentials (the
//! caller's closure does), record anything or answer anyone; `api.rs` and `ui.rs` do.
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
mod tests {
    use super::*;

    fn from(ip: &str) -> Option<SocketAddr> {
        Some(SocketAddr::new(ip.parse().unwrap(), 40000))
    }

    fn wrong() -> Result<(), ()> {
        Err(())
    }

    fn right() -> Result<(), ()> {
        Ok(())
    }

    fn small() -> Limits {
        Limits {
            per_address: Rate {
                burst: 3,
                every: Duration::from_secs(10),
            },
            all: Rate {
                burst: 5,
                every: Duration::from_secs(1),
            },
            addresses: 8,
            people: 2,
            person_life: Duration::from_secs(3600),
        }
    }

    /// Let through (checked) or refused, and the refusal.
    fn go(t: &Throttle, ip: &str, now: Instant, check: fn() -> Result<(), ()>) -> Result<bool, Wait> {
        t.attempt(from(ip), now, check).map(|r| r.is_ok())
    }

    #[test]
    fn an_address_gets_its_burst_then_one_per_interval_and_no_check_meanwhile() {
        let t = Throttle::new(small());
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(go(&t, "10.0.0.1", t0, wrong), Ok(false));
        }
        let refused = go(&t, "10.0.0.1", t0, right).unwrap_err();
        assert_eq!(
            refused,
            Wait {
                scope: Scope::Address,
                retry_after: 10,
                record: true
            }
        );
        // Another address is not held up by this one.
        assert_eq!(go(&t, "10.0.0.2", t0, right), Ok(true));
        // Refused unchecked: the right credential too, and only the first refusal recorded.
        let again = go(&t, "10.0.0.1", t0 + Duration::from_secs(4), right).unwrap_err();
        assert_eq!((again.retry_after, again.record), (6, false));
        // Bounded in time: one more attempt after the interval.
        assert_eq!(go(&t, "10.0.0.1", t0 + Duration::from_secs(10), right), Ok(true));
        assert_eq!(go(&t, "10.0.0.1", t0 + Duration::from_secs(10), wrong), Ok(false));
        let third = go(&t, "10.0.0.1", t0 + Duration::from_secs(10), wrong).unwrap_err();
        assert!(third.record, "a new run of refusals is recorded again");
    }

    #[test]
    fn a_success_does_not_launder_failures() {
        let t = Throttle::new(small());
        let t0 = Instant::now();
        for _ in 0..2 {
            assert_eq!(go(&t, "10.0.0.1", t0, wrong), Ok(false));
        }
        assert_eq!(go(&t, "10.0.0.1", t0, right), Ok(true));
        assert_eq!(go(&t, "10.0.0.1", t0, wrong), Ok(false));
        assert!(go(&t, "10.0.0.1", t0, wrong).is_err());
    }

    #[test]
    fn ipv6_counts_by_64_and_mapped_ipv4_as_ipv4() {
        let all = Rate {
            burst: 100,
            every: Duration::from_secs(1),
        };
        let t = Throttle::new(Limits { all, ..small() });
        let t0 = Instant::now();
        for ip in ["2001:db8::1", "2001:db8::2", "2001:db8::ffff:3"] {
            assert_eq!(go(&t, ip, t0, wrong), Ok(false));
        }
        assert_eq!(
            go(&t, "2001:db8::9", t0, right).unwrap_err().scope,
            Scope::Address
        );
        assert_eq!(go(&t, "2001:db8:0:1::1", t0, right), Ok(true));
        for _ in 0..3 {
            assert_eq!(go(&t, "192.0.2.1", t0, wrong), Ok(false));
        }
        assert!(go(&t, "::ffff:192.0.2.1", t0, right).is_err());
    }

    /// An attacker cycling addresses spends the limit for all; a person's address is exempt
    /// from it, a new one waits at most the limit's interval once the attack stops.
    #[test]
    fn cycling_addresses_meets_the_limit_for_all_but_not_a_person_address() {
        let t = Throttle::new(small());
        let t0 = Instant::now();
        assert_eq!(go(&t, "10.9.9.9", t0, right), Ok(true));
        t.vouch(from("10.9.9.9"), t0);
        let mut checked = 0;
        let mut first_refusals = 0;
        for i in 0..100u8 {
            match go(&t, &format!("10.0.1.{i}"), t0, wrong) {
                Ok(_) => checked += 1,
                Err(w) => {
                    assert_eq!((w.scope, w.retry_after), (Scope::All, 1));
                    first_refusals += usize::from(w.record);
                }
            }
        }
        assert_eq!((checked, first_refusals), (5, 1));
        assert_eq!(go(&t, "10.9.9.9", t0, right), Ok(true), "the person's address");
        assert!(
            go(&t, "10.0.2.1", t0, right).is_err(),
            "a new address, during the attack"
        );
        assert_eq!(go(&t, "10.0.2.1", t0 + Duration::from_secs(1), right), Ok(true));
        assert!(t.lock().failures.len() <= 5);
    }

    /// The table never holds more than its cap, whatever the addresses and the time.
    #[test]
    fn the_failure_table_is_bounded() {
        let t = Throttle::new(small());
        let t0 = Instant::now();
        let mut most = 0;
        for i in 0..5000u32 {
            let [_, _, c, d] = i.to_be_bytes();
            // Ten attempts a second, of which the limit for all lets one through.
            let now = t0 + Duration::from_millis(u64::from(i) * 100);
            let _ = go(&t, &format!("10.1.{c}.{d}"), now, wrong);
            most = most.max(t.lock().failures.len());
        }
        // An entry is due 10 s after its one failure, and one enters a second: the cap of 8
        // is reached and held.
        assert_eq!(most, 8);
        // People's addresses exempt from the limit for all are bounded too.
        for i in 0..10u8 {
            t.vouch(from(&format!("10.2.0.{i}")), t0);
        }
        assert_eq!(t.lock().people.len(), 2);
    }

    #[test]
    fn a_full_table_refuses_new_addresses_but_not_a_person() {
        let all = Rate {
            burst: 100,
            every: Duration::from_secs(1),
        };
        let t = Throttle::new(Limits { all, ..small() });
        let t0 = Instant::now();
        t.vouch(from("10.9.9.9"), t0);
        for i in 0..8u8 {
            assert_eq!(go(&t, &format!("10.0.1.{i}"), t0, wrong), Ok(false));
        }
        let full = go(&t, "10.0.2.1", t0, right).unwrap_err();
        assert_eq!((full.scope, full.retry_after), (Scope::All, 10));
        assert_eq!(
            go(&t, "10.9.9.9", t0, wrong),
            Ok(false),
            "a person's address is checked"
        );
        assert_eq!(t.lock().failures.len(), 8);
        assert!(t.lock().failures.contains_key(&source(from("10.9.9.9"))));
        // Entries due are dropped to make room.
        assert_eq!(go(&t, "10.0.2.1", t0 + Duration::from_secs(10), right), Ok(true));
    }

    #[test]
    fn a_person_is_remembered_for_its_life_only() {
        let t = Throttle::new(small());
        let t0 = Instant::now();
        t.vouch(from("10.9.9.9"), t0);
        for i in 0..5u8 {
            assert_eq!(go(&t, &format!("10.0.1.{i}"), t0, wrong), Ok(false));
        }
        let later = t0 + Duration::from_secs(3600);
        for i in 0..5u8 {
            assert_eq!(go(&t, &format!("10.0.3.{i}"), later, wrong), Ok(false));
        }
        assert!(go(&t, "10.9.9.9", later, right).is_err());
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(10)), 10);
        assert_eq!(whole_seconds(Duration::from_millis(10_001)), 11);
        assert_eq!(whole_seconds(Duration::ZERO), 1);
    }
}
