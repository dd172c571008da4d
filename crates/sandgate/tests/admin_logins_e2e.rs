//! Attacker tests of the admin credentials (docs/exceptions.md, "Failed logins"): a refused
//! login on the approvals page is on record like a refused API call, a burst of wrong
//! tokens from one address is refused (429, `Retry-After`) without being checked while the
//! right token from another address still logs in, and cycling source addresses meets the
//! limit for all addresses, which an address a person logged in from does not. The proxy
//! listens on 127.0.0.1:0; each client binds its own 127.0.0.0/8 source address.
//! The failure table's bound is a unit test beside it (`crates/control/src/throttle.rs`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::control::start_with;
use common::{ProxyProcess, runtime};
use sandgate_testkit::dns::{DnsServer, Zone};
use serde_json::Value;
use socket2::{Domain, Socket, Type};

/// A proxy whose policy has a requester (`tok-agent`) and an approver (`tok-alice`), its
/// admin listener on 127.0.0.1:0; returns it with the admin address it logged.
fn proxy(dns: &DnsServer, dir: &std::path::Path) -> (ProxyProcess, SocketAddr) {
    let hash = sandgate_policy::auth::secret_hash;
    let text = format!(
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: logins }}\nspec:\n\
         \x20 admin:\n    tokens:\n\
         \x20     - {{ name: agent-7, role: requester, secret_sha256: {a}, tasks: [ t-1 ] }}\n\
         \x20     - {{ name: alice, role: approver, secret_sha256: {b} }}\n",
        a = hash("tok-agent"),
        b = hash("tok-alice"),
    );
    let policy = dir.join("policy.yaml");
    std::fs::write(&policy, text).unwrap();
    let state = dir.join("state");
    let args = [
        "--admin-listen",
        "127.0.0.1:0",
        "--state-dir",
        state.to_str().unwrap(),
    ];
    let p = start_with(dns, &policy, &args);
    let line = p
        .log_line("admin listening")
        .expect("the admin listener's address");
    let admin = line
        .split("addr=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line}"));
    (p, admin)
}

/// One HTTP/1.1 exchange with the admin listener from `source`: the status and the
/// `Retry-After` value.
fn exchange(admin: SocketAddr, source: Ipv4Addr, request: &str) -> (u16, Option<u64>) {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket.bind(&SocketAddr::from((source, 0)).into()).unwrap();
    socket.connect(&admin.into()).unwrap();
    let mut stream = TcpStream::from(socket);
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer);
    let status = common::status_of(&text);
    let retry_after = text
        .lines()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("retry-after"))
        .and_then(|(_, v)| v.trim().parse().ok());
    (status, retry_after)
}

/// A login on the approvals page with `token`, from `source`.
fn login(admin: SocketAddr, source: Ipv4Addr, token: &str) -> (u16, Option<u64>) {
    let body = format!("token={token}");
    exchange(
        admin,
        source,
        &format!(
            "POST /ui/login HTTP/1.1\r\nHost: admin\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// `GET /v1/exceptions` with `token` as the bearer token, from `source`.
fn api_list(admin: SocketAddr, source: Ipv4Addr, token: &str) -> (u16, Option<u64>) {
    exchange(
        admin,
        source,
        &format!(
            "GET /v1/exceptions HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        ),
    )
}

/// The `admin_refused` events so far, waiting until there are at least `want`.
fn refusals(p: &ProxyProcess, want: usize) -> Vec<Value> {
    refusals_until(p, |found| found.len() >= want)
}

/// The `admin_refused` events so far, waiting (at most 5 s) until `done` holds for them.
fn refusals_until(p: &ProxyProcess, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found: Vec<Value> = common::read_audit(&p.audit_path)
            .into_iter()
            .filter(|e| e["event"] == "admin_refused")
            .collect();
        if done(&found) || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn from_source(events: &[Value], source: Ipv4Addr) -> Vec<&Value> {
    let prefix = format!("{source}:");
    events
        .iter()
        .filter(|e| e["client_addr"].as_str().is_some_and(|a| a.starts_with(&prefix)))
        .collect()
}

/// A wrong token and a requester's token on the login page are each an `admin_refused`
/// event, like a refused API call: who tried, from where, and why.
#[test]
fn a_refused_login_on_the_page_is_on_record() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let (p, admin) = proxy(&dns, dir.path());
    let me = Ipv4Addr::new(127, 0, 0, 1);
    assert_eq!(login(admin, me, "tok-guess").0, 401);
    assert_eq!(login(admin, me, "tok-agent").0, 401);
    assert_eq!(login(admin, me, "tok-alice").0, 303);
    let events = refusals(&p, 2);
    let logins: Vec<(&str, u64, &Value)> = events
        .iter()
        .filter(|e| e["method"] == "POST /ui/login")
        .map(|e| {
            assert!(
                e["client_addr"].as_str().unwrap().starts_with("127.0.0.1:"),
                "{e}"
            );
            (
                e["detail"].as_str().unwrap(),
                e["status"].as_u64().unwrap(),
                &e["subject"],
            )
        })
        .collect();
    assert_eq!(
        logins,
        [
            ("unknown token", 401, &Value::Null),
            ("a requester's token cannot log in", 401, &Value::from("agent-7")),
        ],
        "{events:#?}"
    );
}

/// Five wrong tokens from one address, then that address is refused (429, `Retry-After`)
/// without its token being checked, on the page and the API alike, the right token
/// included; the approver logs in from another address meanwhile; the refusal ends after
/// `Retry-After`. Only the first 429 of the run is recorded.
#[test]
fn a_burst_of_wrong_logins_is_refused_for_a_while_and_others_still_log_in() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let (p, admin) = proxy(&dns, dir.path());
    let attacker = Ipv4Addr::new(127, 0, 0, 2);
    for i in 0..5 {
        assert_eq!(
            login(admin, attacker, &format!("guess-{i}")),
            (401, None),
            "guess {i}"
        );
    }
    let (status, retry) = login(admin, attacker, "guess-5");
    assert_eq!(status, 429, "the sixth wrong login in a row");
    let retry = retry.expect("Retry-After on a 429");
    assert!((1..=10).contains(&retry), "Retry-After: {retry}");
    assert_eq!(
        login(admin, attacker, "tok-alice").0,
        429,
        "unchecked while refused"
    );
    assert_eq!(
        api_list(admin, attacker, "tok-alice").0,
        429,
        "the API shares the limit"
    );
    assert_eq!(login(admin, Ipv4Addr::new(127, 0, 0, 3), "tok-alice").0, 303);

    // Wrong bearer tokens on the API are slowed the same way.
    let caller = Ipv4Addr::new(127, 0, 0, 4);
    for i in 0..5 {
        assert_eq!(api_list(admin, caller, &format!("guess-{i}")).0, 401, "guess {i}");
    }
    let (status, api_retry) = api_list(admin, caller, "guess-5");
    assert_eq!(status, 429);
    assert!(api_retry.is_some_and(|r| (1..=10).contains(&r)), "{api_retry:?}");
    assert_eq!(api_list(admin, caller, "tok-alice").0, 429);

    // Bounded in time: after Retry-After the address is heard again.
    let (_, retry) = login(admin, attacker, "tok-alice");
    std::thread::sleep(Duration::from_secs(retry.expect("still refused")));
    assert_eq!(login(admin, attacker, "tok-alice").0, 303);

    let events = refusals(&p, 12);
    let statuses = |source| -> Vec<u64> {
        from_source(&events, source)
            .iter()
            .map(|e| e["status"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(statuses(attacker), [401, 401, 401, 401, 401, 429], "{events:#?}");
    assert_eq!(statuses(caller), [401, 401, 401, 401, 401, 429], "{events:#?}");
}

/// Wrong logins from 250 addresses (127.0.1.x): after the burst the limit for all
/// addresses lets about one a second through and refuses the rest unchecked (so only those
/// let through enter the failure table, whose cap `throttle.rs` tests); the approver's
/// address (logged in before) is exempt and logs in at once, and a new address gets in
/// after `Retry-After` once the flood stops. The refusals on record stay bounded by the
/// attempts let through.
#[test]
fn cycling_source_addresses_meets_the_limit_for_all_but_not_the_approver() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let (p, admin) = proxy(&dns, dir.path());
    let approver = Ipv4Addr::new(127, 0, 0, 2);
    assert_eq!(login(admin, approver, "tok-alice").0, 303);

    let started = Instant::now();
    let (mut checked, mut refused) = (0u64, 0u64);
    for i in 1..=250u8 {
        match login(admin, Ipv4Addr::new(127, 0, 1, i), "guess").0 {
            401 => checked += 1,
            429 => refused += 1,
            other => panic!("{other} from 127.0.1.{i}"),
        }
    }
    let secs = started.elapsed().as_secs() + 1;
    assert!(refused > 0, "no wrong login was refused: {checked} checked");
    assert!(checked <= 30 + secs, "{checked} checked in {secs} s");
    assert_eq!(
        login(admin, approver, "tok-alice").0,
        303,
        "the approver's address"
    );

    let newcomer = Ipv4Addr::new(127, 0, 2, 1);
    let mut tries = 0;
    loop {
        match login(admin, newcomer, "tok-alice") {
            (303, _) => break,
            (429, Some(retry)) if tries < 3 => {
                assert!(retry <= 1, "Retry-After: {retry}");
                std::thread::sleep(Duration::from_secs(retry));
                tries += 1;
            }
            other => panic!("a new address with the right token: {other:?}"),
        }
    }

    let flood = |events: &[Value], status: u64| -> u64 {
        let of_flood = |e: &&Value| {
            e["client_addr"]
                .as_str()
                .is_some_and(|a| a.starts_with("127.0.1."))
        };
        let n = events
            .iter()
            .filter(of_flood)
            .filter(|e| e["status"] == status)
            .count();
        u64::try_from(n).unwrap()
    };
    let events = refusals_until(&p, |e| flood(e, 401) >= checked && flood(e, 429) >= 1);
    let (recorded_401, recorded_429) = (flood(&events, 401), flood(&events, 429));
    assert_eq!(recorded_401, checked, "every checked wrong login is on record");
    assert!(
        recorded_429 >= 1 && recorded_429 <= checked + 1,
        "{recorded_429} refusals recorded of {refused}"
    );
}

/// This whole binary again as `nobody` when the tests run as root.
#[test]
fn the_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody("admin_logins_e2e", "the_suite_passes_as_an_ordinary_user", 3);
}
