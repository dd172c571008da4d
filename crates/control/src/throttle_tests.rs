//! The limiter's tests: time passed in as an argument, no clock read.

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
