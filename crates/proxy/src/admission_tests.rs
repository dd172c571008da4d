//! Tests of the admission rule on counts alone (no sockets): the fixed limits, a client
//! past its share, the reserves, and a model check of every state small pools can reach.

use std::collections::HashSet;

use super::*;

fn limits(total: usize, listener: Option<usize>, client: Option<usize>) -> Limits {
    Limits {
        max_connections: total,
        max_connections_per_listener: listener,
        max_connections_per_client: client,
        ..Limits::default()
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Admits connections from `from` until one is refused (at most `most`).
fn fill(adm: &Admission, on: &ListenerSlots, from: IpAddr, most: usize) -> (Vec<Permit>, Option<LimitKind>) {
    let mut held = Vec::new();
    for _ in 0..most {
        match adm.admit(on, from) {
            Ok(p) => held.push(p),
            Err(kind) => return (held, Some(kind)),
        }
    }
    (held, None)
}

#[test]
fn each_limit_refuses_with_its_own_kind_and_gives_room_back() {
    let l = limits(5, Some(4), Some(3));
    let adm = Admission::new(&l);
    let a = Admission::listener(&l, 2);
    let b = Admission::listener(&l, 2);
    let ip1 = ip("127.0.0.1");
    let ip2 = ip("::ffff:127.0.0.2");
    let held: Vec<Permit> = (0..3).map(|_| adm.admit(&a, ip1).unwrap()).collect();
    assert_eq!(adm.admit(&a, ip1).unwrap_err(), LimitKind::Client);
    let fourth = adm.admit(&a, ip2).unwrap();
    assert_eq!(adm.admit(&a, ip2).unwrap_err(), LimitKind::Listener);
    // A refusal takes no slot.
    assert_eq!(a.held_by(ip("127.0.0.2")), 1);
    let fifth = adm.admit(&b, ip2).unwrap();
    assert_eq!(adm.admit(&b, ip("10.0.0.9")).unwrap_err(), LimitKind::Proxy);
    assert_eq!(b.held_by(ip("10.0.0.9")), 0);
    drop(held);
    assert_eq!(a.held_by(ip1), 0);
    assert!(adm.admit(&b, ip1).is_ok());
    drop((fourth, fifth));
    assert_eq!(lock(&adm.proxy).held, 0);
}

/// Issue 28: tenant A holding its whole share on its listener from 127.0.0.1 must not
/// lock tenant B, from the same address, out of B's own listener.
#[test]
fn a_tenant_on_its_own_listener_gets_in_while_another_holds_its_share_from_the_same_address() {
    let l = limits(40, None, Some(4));
    let adm = Admission::new(&l);
    let (a, b) = (Admission::listener(&l, 2), Admission::listener(&l, 2));
    let ip = ip("127.0.0.1");
    let tenant_a: Vec<Permit> = (0..4).map(|_| adm.admit(&a, ip).unwrap()).collect();
    assert_eq!(
        adm.admit(&a, ip).unwrap_err(),
        LimitKind::Client,
        "A's share holds"
    );
    let tenant_b = adm.admit(&b, ip).expect("B on its own listener");
    // The same address written as IPv4-mapped IPv6 is the same client.
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
    let more_b: Vec<Permit> = (0..3).map(|_| adm.admit(&b, mapped).unwrap()).collect();
    assert_eq!(
        adm.admit(&b, ip).unwrap_err(),
        LimitKind::Client,
        "B's share holds"
    );
    drop((tenant_a, tenant_b, more_b));
    let again: Vec<Permit> = (0..4).map(|_| adm.admit(&a, ip).unwrap()).collect();
    assert!(adm.admit(&b, ip).is_ok(), "both shares were given back");
    drop(again);
}

#[test]
fn defaults_leave_room_for_other_tenants() {
    let one = limits(1000, None, None);
    assert_eq!(one.per_listener(1), 1000);
    assert_eq!(one.per_listener(2), 500);
    assert_eq!(one.per_listener(10), 250);
    assert_eq!(one.per_client(), 250);
    let small = limits(40, None, None);
    assert_eq!(small.per_client(), 10);
    assert_eq!(limits(40, Some(7), Some(3)).per_listener(2), 7);
    assert_eq!(connections_for_fd_limit(1024), 384);
    assert_eq!(connections_for_fd_limit(100), 0);
}

/// Issue 32: with 20,000 descriptors a lone client held a quarter of the cap (2,468) and the
/// rest stayed unused. Now it holds three quarters, and a second address still gets a
/// whole share but the slots kept for the addresses after it.
#[test]
fn a_lone_client_holds_three_quarters_of_the_default_cap_and_a_second_still_gets_in() {
    let l = limits(connections_for_fd_limit(20_000), None, None);
    assert_eq!((l.max_connections, l.per_client()), (9_872, 2_468));
    let adm = Admission::new(&l);
    let on = Admission::listener(&l, 1);
    let (lone, refused) = fill(&adm, &on, ip("10.0.0.1"), 10_000);
    assert_eq!(lone.len(), 9_872 - 2_468, "everything but a quarter");
    assert!(lone.len() >= 5_000);
    assert_eq!(refused, Some(LimitKind::Client));
    let (second, refused) = fill(&adm, &on, ip("10.0.0.2"), 10_000);
    assert_eq!(
        second.len(),
        2_468 - 4,
        "its share, less a slot for each of four newcomers"
    );
    assert_eq!(refused, Some(LimitKind::Client));
    assert!(adm.admit(&on, ip("10.0.0.3")).is_ok());
}

/// The attacker alone takes everything it can, then tries for the reserve again and again:
/// each try is refused as over its client limit, and takes nothing. A slot it gives back
/// is its to take again; a newcomer finds the reserve.
#[test]
fn a_client_past_its_share_is_refused_the_reserve() {
    let l = limits(100, None, None);
    let adm = Admission::new(&l);
    let on = Admission::listener(&l, 1);
    let attacker = ip("192.0.2.1");
    let (mut held, refused) = fill(&adm, &on, attacker, 200);
    assert_eq!((held.len(), refused), (75, Some(LimitKind::Client)));
    for _ in 0..10 {
        assert_eq!(adm.admit(&on, attacker).unwrap_err(), LimitKind::Client);
    }
    assert_eq!(on.held_by(attacker), 75);
    assert_eq!(lock(&adm.proxy).borrowed, 50);
    held.pop();
    assert_eq!(lock(&on.0).pool.borrowed, 49);
    held.push(adm.admit(&on, attacker).unwrap());
    assert!(adm.admit(&on, attacker).is_err());
    assert!(adm.admit(&on, ip("192.0.2.2")).is_ok(), "a newcomer gets in");
    drop(held);
    let counts = lock(&on.0);
    assert_eq!((counts.pool.held, counts.pool.borrowed), (0, 0));
    assert_eq!(lock(&adm.proxy).borrowed, 0);
}

/// Two attackers: the first takes everything it can alone, the second all that is left to
/// it. Four newcomers still get in, one after another: it takes six addresses to lock out
/// the seventh, where fixed shares of a quarter took four.
#[test]
fn two_addresses_cannot_lock_out_a_third() {
    let l = limits(100, None, None);
    let adm = Admission::new(&l);
    let on = Admission::listener(&l, 1);
    let (first, _) = fill(&adm, &on, ip("192.0.2.1"), 200);
    let (second, refused) = fill(&adm, &on, ip("192.0.2.2"), 200);
    assert_eq!((first.len(), second.len()), (75, 21));
    assert_eq!(refused, Some(LimitKind::Client));
    let newcomers: Vec<Permit> = (3..7)
        .map(|n| adm.admit(&on, ip(&format!("192.0.2.{n}"))).unwrap())
        .collect();
    assert_eq!(adm.admit(&on, ip("192.0.2.7")).unwrap_err(), LimitKind::Listener);
    drop((first, second, newcomers));
}

/// `--max-connections-per-client` set is a hard cap, even for a lone client.
#[test]
fn an_explicit_per_client_limit_stays_a_hard_cap() {
    let l = limits(100, None, Some(25));
    let adm = Admission::new(&l);
    let on = Admission::listener(&l, 1);
    let (held, refused) = fill(&adm, &on, ip("10.0.0.1"), 200);
    assert_eq!((held.len(), refused), (25, Some(LimitKind::Client)));
    assert_eq!(lock(&adm.proxy).borrowed, 0);
}

/// The check and the take are one step: eight threads racing from one address take
/// exactly what one would, never a slot of the reserve.
#[test]
fn racing_takes_never_share_out_the_reserve() {
    let l = limits(100, None, None);
    let adm = Admission::new(&l);
    let on = Admission::listener(&l, 1);
    let from = ip("10.0.0.1");
    let held: Vec<Permit> = std::thread::scope(|s| {
        let takers: Vec<_> = (0..8).map(|_| s.spawn(|| fill(&adm, &on, from, 100).0)).collect();
        takers.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(held.len(), 75);
    assert_eq!(lock(&on.0).pool.held, 75);
}

/// Walks every state that clients `hostile` can reach by taking and giving back slots one
/// at a time in any order (client `i` is an address of its own on listener `hostile[i]`),
/// and checks a newcomer on each listener in each: it is admitted whenever fixed shares
/// would admit it against that many addresses, and refused only in a state fixed shares
/// could reach (nothing borrowed). Returns the number of states walked, and of those in
/// which some slot was borrowed.
fn walk(l: &Limits, listeners: usize, hostile: &[usize]) -> (usize, usize) {
    let share = Share::of(l);
    let proxy_empty = *lock(&Admission::new(l).proxy);
    let listener_empty = lock(&Admission::listener(l, listeners).0).pool;
    let pools = |state: &[usize]| {
        let mut on = vec![listener_empty; listeners];
        let mut proxy = proxy_empty;
        for (&h, &x) in state.iter().zip(hostile) {
            let past = h.saturating_sub(share.size());
            for pool in [&mut on[x], &mut proxy] {
                pool.held += h;
                pool.borrowed += past;
            }
        }
        (on, proxy)
    };
    let mut seen = HashSet::from([vec![0; hostile.len()]]);
    let mut todo = vec![vec![0; hostile.len()]];
    let mut borrowing = 0;
    while let Some(state) = todo.pop() {
        let (on, proxy) = pools(&state);
        borrowing += usize::from(proxy.borrowed > 0);
        for (x, pool) in on.iter().enumerate() {
            let here = hostile.iter().filter(|&&h| h == x).count();
            let newcomer = decide(share, 0, pool, &proxy);
            if here < pool.newcomers && hostile.len() < proxy.newcomers {
                assert!(
                    newcomer.is_ok(),
                    "{} address(es) locked a newcomer out of listener {x} in {state:?}",
                    hostile.len()
                );
            }
            if newcomer.is_err() && here <= pool.newcomers && hostile.len() <= proxy.newcomers {
                assert_eq!(
                    (pool.borrowed, proxy.borrowed),
                    (0, 0),
                    "a lock-out fixed shares could not reach: {state:?}"
                );
            }
        }
        for (i, &x) in hostile.iter().enumerate() {
            let mut moves = Vec::new();
            if decide(share, state[i], &on[x], &proxy).is_ok() {
                moves.push(state[i] + 1);
            }
            if state[i] > 0 {
                moves.push(state[i] - 1);
            }
            for held in moves {
                let mut next = state.clone();
                next[i] = held;
                if seen.insert(next.clone()) {
                    todo.push(next);
                }
            }
        }
    }
    (seen.len(), borrowing)
}

#[test]
fn no_reachable_state_lets_fewer_addresses_lock_out_a_newcomer_than_fixed_shares() {
    // Each walk reaches states with borrowed slots, where the rule differs from fixed shares.
    // One listener; the cap's quarter is the share, so four addresses fill it.
    assert!(walk(&limits(12, None, None), 1, &[0, 0, 0]).1 > 0);
    assert!(walk(&limits(12, None, None), 1, &[0, 0, 0, 0]).1 > 0);
    assert!(walk(&limits(8, None, None), 1, &[0, 0, 0, 0]).1 > 0);
    assert!(walk(&limits(20, None, None), 1, &[0, 0, 0]).1 > 0);
    // Two listeners by default: half the cap each, two addresses fill one.
    assert!(walk(&limits(16, None, None), 2, &[0, 0, 1, 1]).1 > 0);
    // Listeners that may each take the whole cap: the proxy's pool is the one that fills.
    assert!(walk(&limits(12, Some(12), None), 2, &[0, 0, 1]).1 > 0);
    assert!(walk(&limits(12, Some(12), None), 2, &[0, 0, 1, 1]).1 > 0);
    // With a hard cap nothing is ever borrowed: fixed shares exactly.
    assert_eq!(walk(&limits(12, None, Some(3)), 1, &[0, 0, 0, 0]).1, 0);
}

/// A connection's further connections (an intercepted tunnel's upstreams) count as its
/// client's: they stop at its share, wait for a slot given back, and give up at the
/// deadline with the limit that stayed full.
#[tokio::test(start_paused = true)]
async fn a_standing_admits_by_the_same_rule_and_waits_for_a_slot() {
    let l = limits(8, None, Some(2));
    let adm = Arc::new(Admission::new(&l));
    let slots = Admission::listener(&l, 1);
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    let first = adm.admit(&slots, ip).unwrap();
    let standing = adm.standing(&slots, ip);
    let second = standing.admit_within(Duration::ZERO).await.unwrap();
    assert_eq!(slots.held_by(ip), 2);
    let waited = standing.admit_within(Duration::from_secs(2)).await;
    assert_eq!(waited.err(), Some(LimitKind::Client), "past the client's cap");
    // A slot given back while one waits is the waiter's.
    let waiter = tokio::spawn({
        let standing = standing.clone();
        async move { standing.admit_within(Duration::from_secs(2)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(second);
    let third = waiter.await.unwrap();
    assert!(third.is_ok(), "{third:?}");
    assert_eq!(slots.held_by(ip), 2);
    drop((first, third));
    assert_eq!(slots.held_by(ip), 0);
}
