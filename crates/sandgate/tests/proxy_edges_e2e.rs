//! End-to-end tests of `sandgate proxy` at its edges: the loop guard, private and reserved
//! answers and connect timeouts in private network namespaces, SIGTERM, bad flags, an
//! ordinary user, the allocator, resets, idle tunnels and the connection cap, chaining. Real curl and
//! Python clients, our own DNS server.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    clippy::zombie_processes,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::world::{World, events_of, policy_doc, proxy};
use common::{ProxyProcess, curl, raw, rerun_in_private_netns, rerun_in_private_netns_with, status_of};
use sandgate_testkit::dns::Zone;

#[test]
fn the_proxy_refuses_to_connect_to_itself() {
    let w = World::new();
    let dns = w.dns(Zone::new());
    // The policy must name the proxy's own port, known once it listens (on port 0): the
    // file allows it then, and the proxy reloads the file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, policy_doc("  network:\n    allowlist: [ other.test ]\n")).unwrap();
    let p = proxy(&dns, &["--policy", file.to_str().unwrap()]);
    let own = p.addr.to_string();
    let next = dir.path().join("next.yaml");
    std::fs::write(
        &next,
        policy_doc(&format!("  network:\n    allowlist: [ \"{own}\" ]\n")),
    )
    .unwrap();
    std::fs::rename(&next, &file).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p
        .audit_events(0)
        .iter()
        .any(|e| e["event"] == "policy_reload" && e["outcome"] == "applied")
    {
        assert!(
            Instant::now() < deadline,
            "the policy naming {own} was not applied"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let reply = raw(
        p.addr,
        format!("CONNECT {own} HTTP/1.1\r\nHost: {own}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&reply), 403, "{reply}");
    assert!(reply.contains("is this proxy"), "{reply}");
}

#[test]
fn private_and_reserved_answers_are_refused_in_a_private_netns() {
    if rerun_in_private_netns("private_and_reserved_answers_are_refused_in_a_private_netns") {
        return;
    }
    let w = World::new();
    let dns = w.dns(
        Zone::new()
            .with("rebind.test", &["93.184.216.34", "10.0.0.1"])
            .with("meta.test", &["169.254.169.254"])
            .with("mapped.test", &["::ffff:127.0.0.1"])
            .with("nat64.test", &["64:ff9b::a00:1"])
            .with("ula.test", &["fd00::1"])
            .with("cgnat.test", &["100.64.0.1"]),
    );
    let dns_addr = dns.addr().to_string();
    // No --allow-range here: the guard is in full force.
    let p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow",
        "*",
        "--allow",
        "10.0.0.5",
        "--allow",
        "[::1]",
    ]);
    for (target, class) in [
        ("rebind.test:443", "private"),
        ("meta.test:443", "cloud_metadata"),
        ("mapped.test:443", "loopback"),
        ("nat64.test:443", "private"),
        ("ula.test:443", "unique_local"),
        ("cgnat.test:443", "shared_cgnat"),
        ("10.0.0.5:443", "private"),
        ("[::1]:443", "loopback"),
    ] {
        let reply = raw(
            p.addr,
            format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&reply), 403, "{target}: {reply}");
        assert!(
            reply.contains("error=destination_ip_prohibited"),
            "{target}: {reply}"
        );
        assert!(
            reply.contains(&format!("resolves to a {class} address")),
            "{target}: {reply}"
        );
    }
    let events = p.audit_events(8);
    assert_eq!(events.len(), 8, "{events:#?}");
    assert!(
        events
            .iter()
            .all(|e| e["decision"] == "deny" && e["reason_code"] == "destination_ip_prohibited")
    );
    assert_eq!(events[0]["resolved_ip"], "10.0.0.1");
}

#[test]
fn sigterm_lets_a_tunnel_finish_and_flushes_the_audit_log() {
    let w = World::new();
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let allow = format!("echo.test:{}", echo.addr().port());
    let mut p = proxy(&dns, &["--allow", &allow, "--shutdown-grace", "5"]);
    let mut s = TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT {allow} HTTP/1.1\r\nHost: {allow}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).unwrap();
    let pid = p.child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // New connections are refused or closed, but the open tunnel still works.
    s.write_all(b"still here").unwrap();
    let mut back = [0u8; 10];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"still here");
    drop(s);
    let status = p.terminate();
    assert!(status.success(), "{status:?}");
    let events = common::read_audit(&p.audit_path);
    assert_eq!(events.len(), 2, "{events:#?}");
    assert_eq!(events[1]["event"], "close");
    assert_eq!(events[1]["bytes_sent"], 10);
}

#[test]
fn bad_flags_exit_64_naming_the_value() {
    for (args, needle) in [
        (&["--allow", "*.com"][..], "*.com"),
        (&["--allow", "127.1"][..], "127.1"),
        (&["--deny", "**"][..], "**"),
        (&["--listen", "nowhere"][..], "nowhere"),
        (&["--allow-range", "10.0.0.0/99"][..], "10.0.0.0/99"),
        (&["--no-such-flag"][..], "--no-such-flag"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_sandgate"))
            .arg("proxy")
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// The proxy runs on mimalloc (crates/alloc), chosen before its first allocation, whether or
/// not the global option comes before the command word, with its two options set over the
/// environment's; `--allocator system` or `SANDGATE_ALLOCATOR=system` keeps glibc's (the flag
/// winning over the variable), and so does any other command. mimalloc's verbose output says
/// when it reserves its arena, which it does only once used, and what its options are.
#[test]
fn the_proxy_alone_runs_on_mimalloc() {
    // Options before the command word, flags after it, SANDGATE_ALLOCATOR, the allocator.
    let cases: [Case; 6] = [
        (&[], &[], None, "mimalloc"),
        (&["--log-format", "json"], &[], None, "mimalloc"),
        (&[], &[], Some("system"), "system"),
        (&[], &["--allocator", "system"], None, "system"),
        (&[], &["--allocator=mimalloc"], Some("system"), "mimalloc"),
        (&[], &[], Some(""), "mimalloc"),
    ];
    for (global, flags, variable, allocator) in cases {
        let (seen, verbose) = proxy_start(global, flags, variable);
        let case = format!("{global:?} {flags:?} {variable:?}");
        assert!(
            seen.iter()
                .any(|l| l.contains("allocator") && l.contains(allocator)),
            "{case}: {seen:#?}"
        );
        let used = verbose.contains("mimalloc: reserved");
        assert_eq!(used, allocator == "mimalloc", "{case}: {verbose}");
        // Set over the environment's 500 and 1 where mimalloc serves; left alone elsewhere.
        let delay = if used {
            "option 'purge_delay': 0"
        } else {
            "option 'purge_delay': 500"
        };
        assert!(verbose.contains(delay), "{case}: {verbose}");
        if used {
            assert!(
                verbose.contains("option 'arena_eager_commit': 0"),
                "{case}: {verbose}"
            );
        }
    }
    let other = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .arg("presets")
        .env_remove("SANDGATE_ALLOCATOR")
        .env("MIMALLOC_VERBOSE", "1")
        .output()
        .unwrap();
    assert!(other.status.success());
    let verbose = String::from_utf8_lossy(&other.stderr);
    assert!(!verbose.contains("mimalloc: reserved"), "{verbose}");
    // A name clap does not know is refused, naming the variable.
    let bad = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["proxy", "--listen", "127.0.0.1:0"])
        .env("SANDGATE_ALLOCATOR", "glibc")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("glibc") && stderr.contains("--allocator"),
        "{stderr}"
    );
}

/// One start of the proxy: options before the command word, flags after it,
/// `SANDGATE_ALLOCATOR` (unset if `None`), and the allocator it must run on.
type Case = (
    &'static [&'static str],
    &'static [&'static str],
    Option<&'static str>,
    &'static str,
);

/// A proxy started with `global` options first, `flags` after the command word and
/// `SANDGATE_ALLOCATOR` as `variable` (unset if `None`), mimalloc verbose and its two options
/// set otherwise in the environment: its log up to the first "listening" line, and
/// mimalloc's verbose lines.
fn proxy_start(global: &[&str], flags: &[&str], variable: Option<&str>) -> (Vec<String>, String) {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandgate"));
    command
        .args(global)
        .args(["proxy", "--listen", "127.0.0.1:0", "--audit-log"])
        .arg(dir.path().join("audit.jsonl"))
        .args(flags)
        .current_dir(dir.path())
        .env("SANDGATE_LOG", "debug")
        .env("MIMALLOC_VERBOSE", "1")
        .env("MIMALLOC_PURGE_DELAY", "500")
        .env("MIMALLOC_ARENA_EAGER_COMMIT", "1")
        .env_remove("SANDGATE_ALLOCATOR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if let Some(variable) = variable {
        command.env("SANDGATE_ALLOCATOR", variable);
    }
    let mut child = command.spawn().unwrap();
    let mut seen = Vec::new();
    // Up to the first "listening" line (the allocator is logged before it), or the end.
    for line in std::io::BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        let done = line.contains("listening");
        seen.push(line);
        if done {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let verbose = seen
        .iter()
        .filter(|l| l.starts_with("mimalloc") || l.starts_with("option"))
        .cloned()
        .collect::<Vec<_>>()
        .join("\n");
    (seen, verbose)
}

#[test]
fn an_ordinary_user_runs_the_proxy() {
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(Zone::new().with("plain.test", &["127.0.0.1"]));
    let dns_addr = dns.addr().to_string();
    let allow = format!("plain.test:{}", origin.port());
    let (p, _bin) = ProxyProcess::start_unprivileged(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &allow,
    ]);
    let pid = p.child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap().to_owned();
    assert!(
        !uid_line.split_whitespace().skip(1).any(|u| u == "0"),
        "proxy runs as root: {uid_line}"
    );
    let (code, body, err) = curl(&p.url(), &[&format!("http://{allow}/as-nobody")]);
    assert_eq!(code, 0, "{err}");
    assert!(body.contains("/as-nobody"), "{body}");
    let reply = raw(
        p.addr,
        b"CONNECT elsewhere.test:443 HTTP/1.1\r\nHost: elsewhere.test:443\r\n\r\n",
    );
    assert_eq!(status_of(&reply), 403, "{reply}");
    assert_eq!(p.audit_events(3).len(), 3);
}

#[test]
fn an_upstream_reset_mid_tunnel_ends_only_that_tunnel() {
    let w = World::new();
    let origin = w.origin();
    // An upstream that reads a little, then resets the connection (SO_LINGER 0).
    let resetter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let reset_port = resetter.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = resetter.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    });
    let dns = w.dns(
        Zone::new()
            .with("reset.test", &["127.0.0.1"])
            .with("fine.test", &["127.0.0.1"]),
    );
    let a1 = format!("reset.test:{reset_port}");
    let a2 = format!("fine.test:{}", origin.port());
    let p = proxy(&dns, &["--allow", &a1, "--allow", &a2]);
    let mut s = TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT {a1} HTTP/1.1\r\nHost: {a1}\r\n\r\nhello").as_bytes())
        .unwrap();
    server.join().unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    // The proxy carries on serving.
    let (code, body, err) = curl(&p.url(), &[&format!("http://{a2}/after-reset")]);
    assert_eq!(code, 0, "{err}");
    assert!(body.contains("/after-reset"));
    let events = p.audit_events(4);
    let close = events_of(&events, "close")
        .into_iter()
        .find(|e| e["destination_host"] == "reset.test")
        .unwrap();
    assert_eq!(close["outcome"], "upstream_reset", "{close}");
    assert_eq!(close["bytes_sent"], 5);
}

#[test]
fn connect_timeout_is_504_in_a_private_netns() {
    // A veth pair whose far end has no address: ARP for 198.18.0.2 is never answered, so the
    // SYN never leaves, inside a namespace that has no route off this machine anyway.
    let setup = "ip link add sink0 type veth peer name sink1; ip addr add 198.18.0.1/24 dev sink0; \
                 ip link set sink0 up; ip link set sink1 up; \
                 for i in 1 2 3 4 5 6 7 8 9 10; do ip link show sink0 | grep -q LOWER_UP && break; sleep 0.1; done";
    if rerun_in_private_netns_with("connect_timeout_is_504_in_a_private_netns", setup) {
        return;
    }
    let p = ProxyProcess::start(&[
        "--dns-server",
        "127.0.0.1:9",
        "--allow-range",
        "198.18.0.0/15",
        "--allow",
        "198.18.0.2:443",
        "--connect-timeout",
        "0.5",
    ]);
    let reply = raw(
        p.addr,
        b"CONNECT 198.18.0.2:443 HTTP/1.1\r\nHost: 198.18.0.2:443\r\n\r\n",
    );
    assert_eq!(status_of(&reply), 504, "{reply}");
    assert!(reply.contains("error=connection_timeout"), "{reply}");
    let events = p.audit_events(2);
    assert_eq!(
        events[1]["outcome"], "upstream_failure:connection_timeout",
        "{events:#?}"
    );
}

#[test]
fn idle_tunnels_are_closed_and_the_connection_cap_holds() {
    let w = World::new();
    let echo = w.echo();
    let dns = w.dns(Zone::new().with("echo.test", &["127.0.0.1"]));
    let allow = format!("echo.test:{}", echo.addr().port());
    let p = proxy(
        &dns,
        &[
            "--allow",
            &allow,
            "--tunnel-idle-timeout",
            "0.5",
            "--max-connections",
            "1",
        ],
    );
    let connect = format!("CONNECT {allow} HTTP/1.1\r\nHost: {allow}\r\n\r\n");
    let mut first = TcpStream::connect(p.addr).unwrap();
    first.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    first.write_all(connect.as_bytes()).unwrap();
    let mut head = [0u8; 39];
    first.read_exact(&mut head).unwrap();
    // While the first tunnel holds the only slot, a second connection is answered 503 at
    // once (never left waiting unanswered).
    let second = common::raw(p.addr, connect.as_bytes());
    assert!(second.starts_with("HTTP/1.1 503"), "{second}");
    assert!(second.contains("connection_limit_reached"), "{second}");
    // The idle first tunnel is closed after 0.5 s; then a new connection is served.
    let mut rest = Vec::new();
    first.read_to_end(&mut rest).unwrap();
    let mut third = TcpStream::connect(p.addr).unwrap();
    third.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    third.write_all(connect.as_bytes()).unwrap();
    third.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"));
    let events = p.audit_events(4);
    let close = events_of(&events, "close")[0];
    assert_eq!(close["outcome"], "idle_timeout", "{events:#?}");
    assert!(
        events.iter().any(|e| e["reason_code"]
            .as_str()
            .is_some_and(|r| r.starts_with("connection_limit:"))),
        "{events:#?}"
    );
}

#[test]
fn a_node_local_proxy_chains_through_a_central_one() {
    let w = World::new();
    let echo = w.echo();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("echo.test", &["127.0.0.1"])
            .with("web.test", &["127.0.0.1"])
            .with("other.test", &["127.0.0.1"]),
    );
    let tunnel = format!("echo.test:{}", echo.addr().port());
    let web = format!("web.test:{}", origin.port());
    let other = format!("other.test:{}", echo.addr().port());
    let central = proxy(&dns, &["--allow", &tunnel, "--allow", &web]);
    let central_addr = central.addr.to_string();
    // The node-local proxy has no working DNS at all: names are resolved centrally.
    let local = ProxyProcess::start(&[
        "--dns-server",
        "127.0.0.1:9",
        "--upstream-proxy",
        &central_addr,
        "--allow",
        &tunnel,
        "--allow",
        &web,
        "--allow",
        &other,
    ]);
    let mut s = TcpStream::connect(local.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT {tunnel} HTTP/1.1\r\nHost: {tunnel}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"));
    s.write_all(b"through two proxies").unwrap();
    let mut back = [0u8; 19];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"through two proxies");
    drop(s);
    let (code, body, err) = curl(&local.url(), &[&format!("http://{web}/chained")]);
    assert_eq!(code, 0, "{err}");
    assert!(body.contains("\"path\":\"/chained\""), "{body}");
    // Allowed locally, refused centrally: 403, recorded as an allow that failed upstream.
    let reply = raw(
        local.addr,
        format!("CONNECT {other} HTTP/1.1\r\nHost: {other}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&reply), 403, "{reply}");
    assert!(reply.contains("refused by the upstream proxy"), "{reply}");
    // The same for plain HTTP: the central proxy's 403 is relayed, and recorded as the
    // upstream's refusal (its Proxy-Status says so), not as an origin's answer.
    let (code, status, err) = curl(
        &local.url(),
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("http://{other}/"),
        ],
    );
    assert_eq!((code, status.as_str()), (0, "403"), "{err}");
    // Refused locally: the central proxy never hears of it.
    let reply = raw(
        local.addr,
        b"CONNECT nope.test:443 HTTP/1.1\r\nHost: nope.test:443\r\n\r\n",
    );
    assert_eq!(status_of(&reply), 403);
    let central_events = central.audit_events(5);
    assert!(
        !central_events
            .iter()
            .any(|e| e["destination_host"] == "nope.test")
    );
    assert_eq!(
        central_events
            .iter()
            .filter(|e| e["event"] == "decision" && e["decision"] == "allow")
            .count(),
        2
    );
    let local_events = local.audit_events(9);
    let closes: Vec<&str> = events_of(&local_events, "close")
        .iter()
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert!(closes.contains(&"upstream_failure:upstream_denied"), "{closes:?}");
    let http_denied = local_events.iter().any(|e| {
        e["event"] == "close" && e["scheme"] == "http" && e["outcome"] == "upstream_failure:upstream_denied"
    });
    assert!(http_denied, "{local_events:#?}");
    assert_eq!(
        local_events.iter().filter(|e| e["event"] == "decision").count(),
        5,
        "{local_events:#?}"
    );
}

/// SIGHUP is what service managers send to mean "reload" (the systemd unit's ExecReload):
/// without a policy file there is nothing to reload, and the proxy must go on, not die of
/// the signal's default action.
#[test]
fn sighup_without_a_policy_file_leaves_the_proxy_running() {
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(Zone::new().with("web.test", &["127.0.0.1"]));
    let web = format!("web.test:{}", origin.port());
    let p = proxy(&dns, &["--allow", &web]);
    for _ in 0..3 {
        let sent = std::process::Command::new("kill")
            .args(["-HUP", &p.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }
    let logged = p.log_line("no policy file to reload").is_some();
    assert!(logged, "the SIGHUP was not handled");
    let (code, status, err) = curl(
        &p.url(),
        &["-o", "/dev/null", "-w", "%{http_code}", &format!("http://{web}/")],
    );
    assert_eq!((code, status.as_str()), (0, "200"), "{err}");
}
