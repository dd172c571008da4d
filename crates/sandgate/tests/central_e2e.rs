//! The node-to-central transport, end to end with real processes: `sandgate pki` makes the
//! certificates, a central proxy serves a `role: node` listener, node-local proxies forward
//! to it with `--upstream https://`, and curl is the client. What a node claims is checked
//! against `spec.nodes`; what a node cannot prove is refused and on record.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod central;
mod common;
mod sandbox_support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use central::{EchoCentral, OkCentral, Pki, central, events_where, node};
use common::control::{get_status, within};
use common::world::{World, events_of};
use common::{curl, read_audit};
use sandgate_testkit::dns::Zone;
use serde_json::Value;

#[test]
fn a_node_forwards_each_request_as_a_stream_and_the_central_decides_and_attributes() {
    let OkCentral { c, cert, origin, .. } = &OkCentral::new();
    // The node allows both names locally: the central's policy is what refuses no.test.
    let (ok_p, no_p) = (
        format!("ok.test:{}", origin.port()),
        format!("no.test:{}", origin.port()),
    );
    let n = node(cert, &[c.node_addr], &[&ok_p, &no_p], Some(("t1", "p1")));
    let proxy = format!("http://{}", n.addr);
    let ok = format!("http://ok.test:{}/hello", origin.port());
    let no = format!("http://no.test:{}/", origin.port());

    // Plain HTTP and a CONNECT tunnel, both allowed; forged attribution fields from the
    // client are not forwarded, and do not become the central's record.
    let forged = [
        "-H",
        "sandgate-task: forged",
        "-H",
        "Sandgate-Subject: forged",
        "-H",
        "sandgate_subject: forged",
    ];
    let (code, body, _) = curl(&proxy, &[&["-sS"], &forged[..], &[&ok]].concat());
    assert_eq!(code, 0);
    assert!(
        body.contains("/hello")
            && !body.to_ascii_lowercase().contains("sandgate-")
            && !body.to_ascii_lowercase().contains("sandgate_"),
        "{body}"
    );
    let (code, out, _) = curl(
        &proxy,
        &["-sS", "-p", "-o", "/dev/null", "-w", "%{http_code}", &ok],
    );
    assert_eq!((code, out.as_str()), (0, "200"));
    // Denied by the central: the client sees 403 from the node.
    let (_, out, _) = curl(&proxy, &["-sS", "-o", "/dev/null", "-w", "%{http_code}", &no]);
    assert_eq!(out, "403");
    let (_, out, _) = curl(
        &proxy,
        &["-sS", "-p", "-o", "/dev/null", "-w", "%{http_code}", &no],
    );
    assert_eq!(out, "000", "a refused CONNECT is not a tunnel");

    let central_events = events_where(&c.proxy.audit_path, 4, |e| e["event"] == "decision");
    assert_eq!(central_events.len(), 4, "{central_events:#?}");
    for e in &central_events {
        assert_eq!(e["node"], "node-a", "{e}");
        assert_eq!(
            (
                e["task_id"].as_str(),
                e["project_id"].as_str(),
                e["subject"].as_str()
            ),
            (Some("t1"), Some("p1"), Some("ci-bot")),
            "{e}"
        );
    }
    let allowed: Vec<_> = central_events
        .iter()
        .filter(|e| e["decision"] == "allow")
        .collect();
    let denied: Vec<_> = central_events
        .iter()
        .filter(|e| e["decision"] == "deny")
        .collect();
    assert_eq!((allowed.len(), denied.len()), (2, 2));
    assert!(
        denied
            .iter()
            .all(|e| e["destination_host"] == "no.test" && e["reason_code"] == "not_allowlisted")
    );
    assert_eq!(allowed[0]["scheme"], "http", "plain HTTP is decided as HTTP");
    assert_eq!(allowed[1]["scheme"], "connect");
    // Many requests, one connection: every stream came from the same node socket.
    let peers: std::collections::BTreeSet<&str> = central_events
        .iter()
        .filter_map(|e| e["client_addr"].as_str())
        .collect();
    assert_eq!(
        peers.len(),
        1,
        "one mutual-TLS connection per node and central: {peers:?}"
    );
    // The node resolved nothing itself: its nameserver does not exist, and the close
    // events name the central as the address connected to.
    let node_events = read_audit(&n.proxy.audit_path);
    let closes = events_of(&node_events, "close");
    assert!(
        closes
            .iter()
            .any(|e| e["resolved_ip"] == "127.0.0.1" && e["outcome"] == "ok"),
        "{node_events:#?}"
    );
    let refused = closes
        .iter()
        .find(|e| e["destination_host"] == "no.test")
        .expect("a close for the refusal");
    assert_eq!(
        refused["outcome"], "upstream_failure:upstream_denied",
        "{refused}"
    );
    // Each allowed stream ends cleanly at the central too: the node gives a kept request
    // stream up (its client gone) with END_STREAM, not a reset the central would record as
    // the client's.
    let ended = events_where(&c.proxy.audit_path, 2, |e| {
        e["event"] == "close" && e["destination_host"] == "ok.test"
    });
    assert_eq!(ended.len(), 2, "{ended:#?}");
    assert!(ended.iter().all(|e| e["outcome"] == "ok"), "{ended:#?}");
}

/// The attacker is a node (or something on the network pretending to be one): no
/// certificate, a certificate from another CA, an expired one, a name not listed, a task it
/// may not vouch for. Each is refused, and each is on record at the central.
#[test]
fn a_node_that_cannot_prove_itself_or_overclaims_is_refused_and_audited() {
    let OkCentral { c, origin, pki, .. } = &OkCentral::new();
    let url = format!("http://ok.test:{}/", origin.port());
    let ok_p = format!("ok.test:{}", origin.port());
    let status = |n: &central::Node, flags: &[&str]| -> String {
        let mut args = vec!["-sS", "-o", "/dev/null", "-w", "%{http_code}"];
        args.extend_from_slice(flags);
        args.push(&url);
        curl(&format!("http://{}", n.addr), &args).1
    };

    // No client certificate at all: curl speaking TLS to the node listener.
    let (_, _, err) = curl(
        "",
        &[
            "-sS",
            "--cacert",
            pki.path("ca.pem").to_str().unwrap(),
            &format!("https://{}/", c.node_addr),
        ],
    );
    assert!(
        !err.is_empty(),
        "a client without a certificate must not get through"
    );

    // Another CA's certificate with the same name.
    let other = Pki::new();
    let foreign = other.node("node-a", &[]);
    let foreign = central::NodeCert {
        ca: pki.path("ca.pem"),
        ..foreign
    };
    let n = node(&foreign, &[c.node_addr], &[&ok_p], Some(("t1", "p1")));
    let s = status(&n, &[]);
    assert_eq!(s, "502", "a node the central does not trust gets no stream");
    assert!(n.proxy.log_line("central proxy unavailable").is_some());
    drop(n);

    // Expired.
    let expired = pki.node("node-a", &["--not-after", "2020-01-01"]);
    let n = node(&expired, &[c.node_addr], &[&ok_p], Some(("t1", "p1")));
    assert_eq!(status(&n, &[]), "502");
    drop(n);

    // Valid, but not listed in spec.nodes.
    let stranger = pki.node("node-b", &[]);
    let n = node(&stranger, &[c.node_addr], &[&ok_p], Some(("t1", "p1")));
    assert_eq!(status(&n, &[]), "502");
    drop(n);

    // Listed, claiming a project it may not vouch for.
    let good = pki.node("node-a", &[]);
    let n = node(&good, &[c.node_addr], &[&ok_p], Some(("t9", "p9")));
    assert_eq!(status(&n, &[]), "403");
    assert_eq!(status(&n, &["-p"]), "000");

    let refused = events_where(&c.proxy.audit_path, 6, |e| e["decision"] == "deny");
    let codes: Vec<&str> = refused.iter().filter_map(|e| e["reason_code"].as_str()).collect();
    let count = |code: &str| codes.iter().filter(|c| **c == code).count();
    // No certificate, another CA, expired: each a failed handshake.
    assert!(count("node_tls_refused") >= 3, "{refused:#?}");
    let details: Vec<&str> = refused.iter().filter_map(|e| e["detail"].as_str()).collect();
    assert!(
        details
            .iter()
            .any(|d| d.contains("Expired") || d.contains("expired")),
        "{details:?}"
    );
    assert!(count("node_unknown") >= 1, "{refused:#?}");
    let overclaims: Vec<_> = refused
        .iter()
        .filter(|e| e["reason_code"] == "node_not_vouched")
        .collect();
    assert_eq!(overclaims.len(), 2, "{refused:#?}");
    for e in overclaims {
        assert_eq!(
            (
                e["node"].as_str(),
                e["task_id"].as_str(),
                e["project_id"].as_str()
            ),
            (Some("node-a"), Some("t9"), Some("p9"))
        );
    }
    // Nothing reached the origin for any of them.
    assert!(
        read_audit(&c.proxy.audit_path)
            .iter()
            .all(|e| e["decision"] != "allow")
    );
}

/// A client of the central's ordinary listener sends the attribution fields itself: they
/// mean nothing there (the request is the listener's), and they are not passed on.
#[test]
fn attribution_fields_count_only_from_a_node_on_a_node_listener() {
    let OkCentral { c, origin, .. } = &OkCentral::new();
    let url = format!("http://ok.test:{}/", origin.port());
    let (code, body, _) = curl(
        &c.proxy.url(),
        &[
            "-sS",
            "-H",
            "sandgate-task: t1",
            "-H",
            "sandgate-project: p1",
            &url,
        ],
    );
    assert_eq!(code, 0);
    assert!(!body.to_ascii_lowercase().contains("sandgate-"), "{body}");
    let decisions = events_where(&c.proxy.audit_path, 1, |e| e["event"] == "decision");
    assert_eq!(decisions[0]["task_id"], Value::Null);
    assert_eq!(decisions[0]["node"], Value::Null);
}

/// Two central proxies: the node uses the first; killed mid-tunnel, it ends only that
/// tunnel, and the next request goes to the second. With both gone: 502 naming the hop,
/// and never a direct connection.
#[test]
fn a_node_fails_over_to_the_next_central_and_never_goes_direct() {
    let w = World::new();
    let echo = w.echo();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("ok.test", &["127.0.0.1"])
            .with("echo.test", &["127.0.0.1"]),
    );
    let pki = Pki::new();
    let body = central::spec_allowing(&[("ok.test", origin.port()), ("echo.test", echo.addr().port())]);
    let mut a = central(&pki, dns.addr(), &body, &[]);
    let b = central(&pki, dns.addr(), &body, &[]);
    let cert = pki.node("node-a", &[]);
    let (ok_p, echo_p) = (
        format!("ok.test:{}", origin.port()),
        format!("echo.test:{}", echo.addr().port()),
    );
    let n = node(
        &cert,
        &[a.node_addr, b.node_addr],
        &[&ok_p, &echo_p],
        Some(("t1", "p1")),
    );
    let url = format!("http://ok.test:{}/", origin.port());
    let get = || get_status(n.addr, &url);
    assert_eq!(get(), "200");

    // A tunnel through A, echoing.
    let mut t = central::tunnel(n.addr, &format!("echo.test:{}", echo.addr().port()));
    t.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    t.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    assert_eq!(
        events_where(&a.proxy.audit_path, 2, |e| e["event"] == "decision").len(),
        2
    );

    // A dies: its tunnel ends (EOF or reset, promptly), and the next request goes to B.
    let _ = a.proxy.child.kill();
    let _ = a.proxy.child.wait();
    let mut rest = Vec::new();
    let started = Instant::now();
    if let Err(e) = t.read_to_end(&mut rest) {
        let timed_out = matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        );
        assert!(!timed_out, "the tunnel A carried must end, not hang: {e}");
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    // The client sees the end; once it closes too, the node records the tunnel's close.
    drop(t);
    let tunnel_close = events_where(&n.proxy.audit_path, 1, |e| {
        e["event"] == "close" && e["destination_host"] == "echo.test"
    });
    assert_eq!(tunnel_close.len(), 1, "the node records the tunnel's end");
    assert_eq!(get(), "200", "failed over to B");
    assert_eq!(
        events_where(&b.proxy.audit_path, 1, |e| e["decision"] == "allow").len(),
        1
    );

    // B dies too: 502, naming the next hop, and the origin sees nothing new.
    let before = origin.connections();
    drop(b);
    let (_, head, _) = curl(&format!("http://{}", n.addr), &["-sS", "-i", &url]);
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    assert!(
        head.contains("Proxy-Status: sandgate; error=destination_unavailable"),
        "{head}"
    );
    assert!(head.contains("next hop"), "{head}");
    assert_eq!(origin.connections(), before, "never a direct connection");
}

/// One tunnel whose client never reads must not stall another on the same connection:
/// HTTP/2 flow control holds the slow stream at its own window.
#[test]
fn a_slow_tunnel_does_not_stall_the_others_on_the_same_connection() {
    let chain = EchoCentral::new(&[]);
    let n = &chain.node(&chain.pki.node("node-a", &[]));
    let target = chain.target.clone();
    let open = || {
        let t = central::tunnel(n.addr, &target);
        t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        t
    };
    // The slow one: sends up to 64 MiB (more than every socket buffer on the way holds) that the echo returns, and never reads any of it back.
    let mut slow = open();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b's'; 64 * 1024];
        let mut sent = 0usize;
        slow.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
        while sent < 64 * 1024 * 1024 {
            match slow.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break, // backed up all the way: what flow control should do
            }
        }
        (slow, sent)
    });
    std::thread::sleep(Duration::from_millis(500));
    // The fast one moves 4 MiB each way meanwhile.
    let fast = open();
    let total = 4 * 1024 * 1024;
    let mut reader = fast.try_clone().unwrap();
    let started = Instant::now();
    let reading = std::thread::spawn(move || {
        let mut got = 0usize;
        let mut buf = vec![0u8; 64 * 1024];
        while got < total {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        got
    });
    let mut fast_w = fast;
    let chunk = vec![b'f'; 64 * 1024];
    for _ in 0..total / chunk.len() {
        fast_w.write_all(&chunk).unwrap();
    }
    let got = reading.join().unwrap();
    assert_eq!(got, total, "the fast tunnel got everything back");
    assert!(started.elapsed() < Duration::from_secs(20));
    let (_slow, sent) = writer.join().unwrap();
    assert!(sent > 0);
}

/// `sandgate pki` refuses what it cannot do well: no CA yet, a name that is not one, a file
/// that exists.
#[test]
fn pki_refuses_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = central::pki(&["issue", "--node", "a"], dir.path());
    assert_eq!(code, 64);
    assert!(err.contains("pki init"), "{err}");
    assert_eq!(central::pki(&["init"], dir.path()).0, 0);
    let (code, _, err) = central::pki(&["init"], dir.path());
    assert_eq!(code, 64);
    assert!(err.contains("--force"), "{err}");
    let (code, _, err) = central::pki(&["issue", "--node", "../../etc/x"], dir.path());
    assert_eq!(code, 64, "{err}");
    let (code, _, err) = central::pki(&["issue", "--node", "a", "--not-after", "soon"], dir.path());
    assert_eq!(code, 64, "{err}");
    let (code, _, _) = central::pki(
        &["issue", "--central", "c.example", "--san", "10.0.0.1"],
        dir.path(),
    );
    assert_eq!(code, 0);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("ca.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the CA key is private");
}

/// `sandgate run` in `proxy` mode with `https://` upstreams: the run's own proxy is a
/// node-local proxy of two central ones. The command inside (curl) reaches what the
/// central allows, is refused what it does not, and every request is on record at the
/// central under the run's task and the node's name; with the first central gone, the
/// second carries the run.
#[test]
fn a_sandboxed_run_is_a_node_of_the_central_proxies() {
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("ok.test", &["127.0.0.1"])
            .with("no.test", &["127.0.0.1"]),
    );
    let pki = Pki::new();
    // A node's runs are named under it (node-a:run-...): it may vouch for those only.
    let body = format!(
        "  network:\n    allowlist:\n      - host: ok.test\n        ports: [{}]\n  nodes:\n    - name: node-a\n      tasks: [\"node-a:*\"]\n",
        origin.port()
    );
    let a = central(&pki, dns.addr(), &body, &[]);
    let b = central(&pki, dns.addr(), &body, &[]);
    let cert = pki.node("node-a", &[]);
    let dir = tempfile::tempdir().unwrap();
    let port = origin.port();
    let (ok, no) = (format!("ok.test:{port}"), format!("no.test:{port}"));
    let policy = sandbox_support::write_policy(
        dir.path(),
        &central::run_net(&[&ok, &no], &[a.node_addr, b.node_addr], &cert),
    );
    let script = format!(
        "curl -sS -o /dev/null -w '%{{http_code}} ' http://ok.test:{port}/; curl -sS -o /dev/null -w '%{{http_code}}' http://no.test:{port}/"
    );
    let out = sandbox_support::run(&policy, &["--subject", "agent-7"], &["sh", "-c", &script]);
    let (stdout, stderr) = sandbox_support::text(&out);
    assert_eq!(stdout, "200 403", "{stderr}");
    let events = events_where(&a.proxy.audit_path, 2, |e| e["event"] == "decision");
    assert_eq!(events.len(), 2, "{events:#?}");
    let task = events[0]["task_id"].as_str().expect("the run's task").to_owned();
    assert!(task.starts_with("node-a:run-"), "{task}");
    // The kept log is named after the run's own id, not its task: no `:` (scp and rsync
    // read `host:path`).
    let kept = stderr
        .rsplit_once("audit log: ")
        .and_then(|(_, rest)| rest.lines().next())
        .map(std::path::PathBuf::from)
        .expect("the summary names the kept log");
    let name = kept.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        name,
        format!("{}.jsonl", task.trim_start_matches("node-a:")),
        "{stderr}"
    );
    assert!(!kept.to_string_lossy().contains(':'), "{kept:?}");
    for e in &events {
        assert_eq!(
            (e["node"].as_str(), e["task_id"].as_str(), e["subject"].as_str()),
            (Some("node-a"), Some(task.as_str()), Some("agent-7")),
            "{e}"
        );
    }
    assert_eq!(events[0]["decision"], "allow");
    assert_eq!(
        (
            events[1]["decision"].as_str(),
            events[1]["destination_host"].as_str()
        ),
        (Some("deny"), Some("no.test"))
    );

    // Central A gone: the next run goes through B.
    drop(a);
    let out = sandbox_support::run(&policy, &[], &["sh", "-c", &script]);
    let (stdout, stderr) = sandbox_support::text(&out);
    assert_eq!(stdout, "200 403", "{stderr}");
    let on_b = events_where(&b.proxy.audit_path, 2, |e| e["event"] == "decision");
    assert_eq!(on_b.len(), 2, "{on_b:#?}");
    assert!(on_b.iter().all(|e| e["node"] == "node-a"));
    // Without --subject, the user who started the run.
    let user = on_b[0]["subject"].as_str().expect("a subject");
    assert!(
        ["root", "nobody"].contains(&user) || user.starts_with("uid-"),
        "{user}"
    );
}

/// The whole central suite again as `nobody` (tests run as root in CI): certificates,
/// central and node-local proxies and sandboxed runs all work for an ordinary user.
#[test]
fn the_central_suite_passes_as_an_ordinary_user() {
    common::rerun_as_nobody("central_e2e", "the_central_suite_passes_as_an_ordinary_user", 8);
}

/// `check-config` refuses what would stop a central from starting: a node listener with no
/// nodes, one with a task of its own, TLS files that cannot be read or do not match.
#[test]
fn check_config_refuses_node_listeners_that_cannot_work() {
    let pki = Pki::new();
    let check = |spec: &str| {
        let p = pki.path("check.yaml");
        std::fs::write(
            &p,
            format!(
                "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: c }}\nspec:\n{spec}"
            ),
        )
        .unwrap();
        let out = std::process::Command::new(common::sandgate_bin())
            .args(["check-config", p.to_str().unwrap()])
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let listener = |tls: &str, extra: &str| {
        format!("  listeners:\n    - listen: 127.0.0.1:0\n      role: node\n{extra}      tls: {{ {tls} }}\n")
    };
    let good_tls = "cert: central-127.0.0.1.pem, key: central-127.0.0.1.key, client_ca: ca.pem";
    let nodes = "  nodes:\n    - name: node-a\n      projects: [p1]\n      tasks: [t1]\n";
    assert_eq!(check(&format!("{}{nodes}", listener(good_tls, ""))).0, 0);
    let (code, err) = check(&listener(good_tls, ""));
    assert_eq!(code, 64);
    assert!(err.contains("spec.nodes"), "{err}");
    let (code, err) = check(&format!("{}{nodes}", listener(good_tls, "      task: t1\n")));
    assert_eq!(code, 64);
    assert!(err.contains("spec.listeners.task"), "{err}");
    let (code, err) = check(&format!(
        "{}{nodes}",
        listener(
            "cert: missing.pem, key: central-127.0.0.1.key, client_ca: ca.pem",
            ""
        )
    ));
    assert_eq!(code, 64);
    assert!(err.contains("missing.pem"), "{err}");
    // A key that is not the certificate's.
    let (code, err) = check(&format!(
        "{}{nodes}",
        listener(
            "cert: central-127.0.0.1.pem, key: node-node-a.key, client_ca: ca.pem",
            ""
        )
    ));
    assert_eq!(code, 64);
    assert!(err.contains("does not match"), "{err}");
    let (code, err) = check(&format!(
        "{}{nodes}",
        listener("cert: central-127.0.0.1.pem, key: central-127.0.0.1.key", "")
    ));
    assert_eq!(code, 64, "client_ca is required");
    assert!(err.contains("client_ca"), "{err}");
}

/// `--upstream-transport http1`: the same checks, one TLS connection per tunnel (the
/// comparison the benchmark makes); the central sees a new connection for each.
#[test]
fn the_http1_transport_opens_a_connection_per_tunnel() {
    let OkCentral { c, cert, origin, .. } = &OkCentral::new();
    let mut args = central::upstream_args(cert, &[c.node_addr]);
    args.extend(["--upstream-transport", "http1", "--dns-server", "127.0.0.1:9"].map(String::from));
    let allow = format!("ok.test:{}", origin.port());
    args.extend(["--allow".to_owned(), allow]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let n = common::ProxyProcess::start(&refs);
    let url = format!("http://ok.test:{}/", origin.port());
    for flags in [&[][..], &["-p"]] {
        let mut a = vec!["-sS", "-o", "/dev/null", "-w", "%{http_code}"];
        a.extend_from_slice(flags);
        a.push(&url);
        assert_eq!(curl(&n.url(), &a).1, "200");
    }
    let decisions = events_where(&c.proxy.audit_path, 2, |e| e["decision"] == "allow");
    assert_eq!(decisions.len(), 2);
    assert!(decisions.iter().all(|e| e["node"] == "node-a"));
    assert_ne!(
        decisions[0]["client_addr"], decisions[1]["client_addr"],
        "a connection per tunnel"
    );
}

/// A node is known by its certificate's first name, the name its runs are named under
/// (`NAME:run-...`), and by no other. Attack (review finding): a certificate whose first
/// name is `x-other` and whose second is `node-a` used to be served as node-a, while the
/// runs behind it were named `x-other:run-...`, a namespace no load-time check of the
/// listed names could see (another node's `x-*` pattern could claim them). Now it is
/// refused and on record as `node_unknown`; node-a's own certificate is still served.
#[test]
fn a_node_is_known_by_its_certificates_first_name_only() {
    let OkCentral {
        c, pki, origin, cert, ..
    } = &OkCentral::new();
    let ok_p = format!("ok.test:{}", origin.port());
    let url = format!("http://ok.test:{}/", origin.port());
    let second = pki.node("x-other", &["--san", "node-a"]);
    let n = node(&second, &[c.node_addr], &[&ok_p], Some(("t1", "p1")));
    assert_eq!(get_status(n.addr, &url), "502", "node-a only as a second name");
    let unknown = events_where(&c.proxy.audit_path, 1, |e| e["reason_code"] == "node_unknown");
    let detail = unknown[0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("first name") && detail.contains("x-other, node-a"),
        "{detail}"
    );
    drop(n);
    let n = node(cert, &[c.node_addr], &[&ok_p], Some(("t1", "p1")));
    assert_eq!(get_status(n.addr, &url), "200", "node-a's own certificate");
}

/// The operator drops a node from `spec.nodes` (a compromised machine): after the reload,
/// its next stream is refused even on the connection it already holds, and on record.
#[test]
fn a_node_dropped_from_the_policy_loses_its_open_connection_at_the_next_stream() {
    let OkCentral { c, cert, origin, .. } = &OkCentral::new();
    let ok_p = format!("ok.test:{}", origin.port());
    let n = node(cert, &[c.node_addr], &[&ok_p], Some(("t1", "p1")));
    let url = format!("http://ok.test:{}/", origin.port());
    let get = || get_status(n.addr, &url);
    assert_eq!(get(), "200");
    let text = std::fs::read_to_string(&c.policy)
        .unwrap()
        .replace("name: node-a", "name: node-z");
    std::fs::write(&c.policy, text).unwrap();
    central::hup(c.proxy.child.id());
    assert!(c.proxy.log_line("nodes reloaded").is_some());
    assert_eq!(get(), "403");
    let refused = events_where(&c.proxy.audit_path, 1, |e| e["reason_code"] == "node_unknown");
    assert_eq!(refused.len(), 1, "{refused:#?}");
    let allowed = events_where(&c.proxy.audit_path, 1, |e| e["decision"] == "allow");
    assert_eq!(
        refused[0]["client_addr"], allowed[0]["client_addr"],
        "refused on the connection it already held"
    );
}

/// A node trusted with any task still cannot claim a project it is not given: a project's
/// scoped entries stay that project's (review finding: `tasks: ["*"]` used to widen to any
/// project).
#[test]
fn a_node_trusted_with_any_task_cannot_claim_another_project() {
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("ok.test", &["127.0.0.1"])
            .with("secret.test", &["127.0.0.1"]),
    );
    let pki = Pki::new();
    let port = origin.port();
    let body = format!(
        "  network:\n    allowlist:\n      - host: ok.test\n        ports: [{port}]\n      - host: secret.test\n        ports: [{port}]\n        scope: {{ project: p-secret }}\n  nodes:\n    - name: node-a\n      tasks: [\"*\"]\n"
    );
    let c = central(&pki, dns.addr(), &body, &[]);
    let cert = pki.node("node-a", &[]);
    let allow = [format!("ok.test:{port}"), format!("secret.test:{port}")];
    let refs: Vec<&str> = allow.iter().map(String::as_str).collect();
    let get = |n: &central::Node, host: &str| get_status(n.addr, &format!("http://{host}:{port}/"));
    // Any task, no project: fine, and p-secret's entry does not apply.
    let n = node(&cert, &[c.node_addr], &refs, Some(("someone", "p-none")));
    assert_eq!(get(&n, "ok.test"), "403", "p-none is not node-a's project");
    drop(n);
    let n = node(&cert, &[c.node_addr], &refs, Some(("someone", "p-secret")));
    assert_eq!(get(&n, "secret.test"), "403", "nor is p-secret");
    let refused = events_where(&c.proxy.audit_path, 2, |e| e["reason_code"] == "node_not_vouched");
    assert_eq!(refused.len(), 2, "{refused:#?}");
    assert!(
        read_audit(&c.proxy.audit_path)
            .iter()
            .all(|e| e["decision"] != "allow")
    );
}

/// The node's private key stays out of the sandbox: a policy binding the directory that
/// holds it is refused before anything runs (review finding: the command could read it and
/// become the node).
#[test]
fn a_sandbox_policy_that_would_expose_the_node_key_is_refused() {
    let pki = Pki::new();
    let cert = pki.node("node-a", &[]);
    let dir = tempfile::tempdir().unwrap();
    let pki_dir = pki.dir.path().display().to_string();
    let policy = sandbox_support::write_policy(
        dir.path(),
        &format!(
            "net:\n  mode: proxy\n  allow_domains: [ \"ok.test:1\" ]\n  proxy:\n    upstream: [ \"https://127.0.0.1:9\" ]\n    tls: {{ ca: {}, cert: {}, key: {} }}\n",
            cert.ca.display(),
            cert.cert.display(),
            cert.key.display()
        ),
    );
    let text = std::fs::read_to_string(&policy)
        .unwrap()
        .replace("read_paths: [ /usr", &format!("read_paths: [ {pki_dir}, /usr"));
    assert!(
        text.contains(&pki_dir),
        "the policy binds the key's directory: {text}"
    );
    std::fs::write(&policy, text).unwrap();
    let out = sandbox_support::run(&policy, &[], &["cat", cert.key.to_str().unwrap()]);
    let (stdout, stderr) = sandbox_support::text(&out);
    assert_eq!(out.status.code(), Some(64), "{stdout}{stderr}");
    assert!(!stdout.contains("PRIVATE KEY"));
    assert!(stderr.contains("net.proxy.tls.key"), "{stderr}");
}

/// One client holding more tunnels open than a connection to the central carries streams
/// (512) cannot make another client of the same node wait: the node opens another
/// connection (review finding: the victim waited for the response timeout, then got 502).
#[test]
fn a_client_holding_every_stream_of_a_connection_does_not_block_the_others() {
    let w = World::new();
    let echo = w.echo();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("echo.test", &["127.0.0.1"])
            .with("ok.test", &["127.0.0.1"]),
    );
    let pki = Pki::new();
    let body = central::spec_allowing(&[("echo.test", echo.addr().port()), ("ok.test", origin.port())]);
    let c = central(&pki, dns.addr(), &body, &[]);
    let cert = pki.node("node-a", &[]);
    let allow = [
        format!("echo.test:{}", echo.addr().port()),
        format!("ok.test:{}", origin.port()),
    ];
    let refs: Vec<&str> = allow.iter().map(String::as_str).collect();
    let n = node(&cert, &[c.node_addr], &refs, Some(("t1", "p1")));
    let target = format!("echo.test:{}", echo.addr().port());
    let mut held = Vec::new();
    for i in 0..520 {
        let (head, t) = central::connect(n.addr, &target);
        assert!(head.starts_with("HTTP/1.1 200"), "tunnel {i}: {head:?}");
        held.push(t);
    }
    let started = Instant::now();
    let url = format!("http://ok.test:{}/", origin.port());
    assert_eq!(get_status(n.addr, &url), "200");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The held tunnels still work.
    held[0].write_all(b"ok").unwrap();
    let mut two = [0u8; 2];
    held[0].read_exact(&mut two).unwrap();
    assert_eq!(&two, b"ok");
}

/// Streams count against the central's connection limits like connections (a slot each,
/// beside the node's connection's own), so one node multiplexing many tunnels on one
/// connection cannot use up the central's descriptors (review finding); beyond its share a
/// stream is refused, and on record; the node's client gets the central's 503 as a 503.
#[test]
fn a_nodes_streams_count_against_the_centrals_connection_limits() {
    let chain = EchoCentral::new(&["--max-connections-per-client", "11"]);
    let n = &chain.node(&chain.pki.node("node-a", &[]));
    let (c, target) = (&chain.c, chain.target.clone());
    let mut statuses = Vec::new();
    let mut held = Vec::new();
    for _ in 0..12 {
        let (head, t) = central::connect(n.addr, &target);
        statuses.push(head.chars().take(12).collect::<String>());
        held.push(t);
    }
    let ok = statuses.iter().filter(|s| s.starts_with("HTTP/1.1 200")).count();
    assert_eq!(ok, 10, "{statuses:?}");
    assert!(
        statuses[10..].iter().all(|s| s.starts_with("HTTP/1.1 503")),
        "{statuses:?}"
    );
    let refused = events_where(&c.proxy.audit_path, 2, |e| {
        e["reason_code"] == "connection_limit:client"
    });
    assert_eq!(refused.len(), 2, "{refused:#?}");
    assert!(refused.iter().all(|e| e["node"] == "node-a"));
    // Closing tunnels gives the slots back.
    drop(held);
    assert!(within(5, || {
        central::connect(n.addr, &target).0.starts_with("HTTP/1.1 200")
    }));
}

/// Review findings on the edges: an expired CA is refused as a listener's client CA (webpki
/// does not check a trust anchor's dates), and `pki` will not write keys into a directory
/// others can write.
#[test]
fn an_expired_ca_and_a_shared_directory_are_refused() {
    let old = tempfile::tempdir().unwrap();
    let (code, _, err) = central::pki(&["init", "--not-after", "2021-01-01"], old.path());
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = central::pki(
        &["issue", "--central", "127.0.0.1", "--not-after", "2021-01-01"],
        old.path(),
    );
    assert_eq!(code, 0, "{err}");
    let policy = old.path().join("c.yaml");
    std::fs::write(
        &policy,
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: c }\nspec:\n  listeners:\n    - listen: 127.0.0.1:0\n      role: node\n      tls: { cert: central-127.0.0.1.pem, key: central-127.0.0.1.key, client_ca: ca.pem }\n  nodes:\n    - { name: node-a, projects: [ p1 ], tasks: [ t1 ] }\n",
    )
    .unwrap();
    let out = std::process::Command::new(common::sandgate_bin())
        .args(["check-config", policy.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("not valid now"), "{err}");

    use std::os::unix::fs::PermissionsExt;
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, _, err) = central::pki(&["init"], shared.path());
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("written by others"), "{err}");
    assert!(!shared.path().join("ca.key").exists());
}

/// The attacker (or a failure) is a central that hangs: it accepts connections and never
/// completes a handshake. It costs the first request its connect timeout, and then no
/// request waits on it again (it used to be tried inline after every back-off, each time
/// for the whole timeout): it is passed by while a health check retries it. Once a central
/// answers at that address again, the health check finds it and requests go to it again.
#[test]
fn a_hung_central_is_passed_by_and_a_returning_one_is_used_again() {
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(Zone::new().with("ok.test", &["127.0.0.1"]));
    let pki = Pki::new();
    let body = central::spec_allowing(&[("ok.test", origin.port())]);
    // Never accepted: the kernel completes the TCP handshake, nothing ever answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_addr = hung.local_addr().unwrap();
    let b = central(&pki, dns.addr(), &body, &[]);
    let cert = pki.node("node-a", &[]);
    let allow = format!("ok.test:{}", origin.port());
    let mut args = central::upstream_args(&cert, &[hung_addr, b.node_addr]);
    for a in [
        "--dns-server",
        "127.0.0.1:9",
        "--connect-timeout",
        "2",
        "--allow",
        &allow,
    ] {
        args.push(a.to_owned());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let n = common::ProxyProcess::start(&refs);
    let url = format!("http://ok.test:{}/", origin.port());
    let timed = || {
        let started = Instant::now();
        (get_status(n.addr, &url), started.elapsed())
    };
    let (status, took) = timed();
    assert_eq!(status, "200", "B answers once the hung central times out");
    assert!(took >= Duration::from_secs(2), "{took:?}");
    // Past the first back-off (1 s), and across the health check's attempts.
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..3 {
        let (status, took) = timed();
        assert_eq!(status, "200");
        assert!(
            took < Duration::from_secs(1),
            "a request waited on the hung central: {took:?}"
        );
        std::thread::sleep(Duration::from_millis(700));
    }
    assert!(events_where(&b.proxy.audit_path, 4, |e| e["decision"] == "allow").len() >= 4);

    // A real central at the hung one's address: the health check finds it, and requests,
    // which prefer it, go there again.
    drop(hung);
    let a = central::central_on(&pki, dns.addr(), &body, &[], &hung_addr.to_string());
    assert!(
        within(20, || {
            get_status(n.addr, &url) == "200" && !events_where_now(&a.proxy.audit_path).is_empty()
        }),
        "the returning central was not used again: {:#?}",
        read_audit(&n.audit_path)
    );
}

/// The allows on record at `path` now.
fn events_where_now(path: &std::path::Path) -> Vec<Value> {
    read_audit(path)
        .into_iter()
        .filter(|e| e["decision"] == "allow")
        .collect()
}

/// A client that resets its tunnel before sending a byte ends it at the node at once (it
/// used to be taken for a half-close, and the tunnel waited on the origin), and the node's
/// reset of the stream ends it at the central too. So does a client's reset mid-tunnel (the
/// central used to read the node's RST_STREAM as a clean end and wait on the origin), and a
/// node that dies mid-tunnel; each even when the origin stays silent and open.
#[test]
fn reset_tunnels_end_at_once_even_when_the_origin_stays_silent() {
    let w = World::new();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let held = std::thread::spawn(move || {
        // Accepts and holds three connections open, never reading, writing or closing them,
        // until the test ends (at most 20 s).
        let conns: Vec<_> = (0..3).filter_map(|_| silent.accept().ok()).collect();
        let _ = wait.recv_timeout(Duration::from_secs(20));
        drop(conns);
    });
    let dns = w.dns(Zone::new().with("hold.test", &["127.0.0.1"]));
    let pki = Pki::new();
    let c = central(
        &pki,
        dns.addr(),
        &central::spec_allowing(&[("hold.test", port)]),
        &[],
    );
    let cert = pki.node("node-a", &[]);
    let target = format!("hold.test:{port}");
    let mut n = node(&cert, &[c.node_addr], &[&target], Some(("t1", "p1")));

    let t = central::tunnel(n.addr, &target);
    socket2::SockRef::from(&t)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(t); // a reset
    let at_node = events_where(&n.proxy.audit_path, 1, |e| e["event"] == "close");
    assert_eq!(at_node.len(), 1, "the node's tunnel did not end");
    assert_eq!(at_node[0]["outcome"], "client_reset", "{}", at_node[0]);
    let reset_at_central = |n: usize, what: &str| {
        let ended = events_where(&c.proxy.audit_path, n, |e| {
            e["event"] == "close" && e["outcome"] == "client_reset"
        });
        assert!(
            ended.len() >= n,
            "{what}: the central's tunnel outlived it: {:#?}",
            read_audit(&c.proxy.audit_path)
        );
    };
    reset_at_central(1, "a reset before the first byte");

    let mut t = central::tunnel(n.addr, &target);
    t.write_all(b"x").unwrap(); // past the first-bytes check: relaying
    assert_eq!(
        events_where(&c.proxy.audit_path, 2, |e| e["decision"] == "allow").len(),
        2
    );
    socket2::SockRef::from(&t)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(t);
    reset_at_central(2, "a reset mid-tunnel");

    let mut t = central::tunnel(n.addr, &target);
    t.write_all(b"x").unwrap();
    assert_eq!(
        events_where(&c.proxy.audit_path, 3, |e| e["decision"] == "allow").len(),
        3
    );
    let _ = n.proxy.child.kill();
    let _ = n.proxy.child.wait();
    reset_at_central(3, "the node's death");
    drop(t);
    let _ = done.send(());
    held.join().unwrap();
}

/// Issue 29 (attack): a central whose audit log cannot be written used to carry every
/// CONNECT a node forwarded, unrecorded (its node front end never asked the audit trail;
/// HTTP/1 and SOCKS5 did). Now the core refuses every new stream: each tunnel after the
/// failure is answered 503 at the node's client, over HTTP/2 and the HTTP/1.1 transport,
/// and not a connection reaches the origin; a plain HTTP request gets the central's 503.
#[test]
fn a_central_that_cannot_write_its_audit_log_refuses_every_node_stream() {
    let w = World::new();
    let echo = w.echo();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("echo.test", &["127.0.0.1"])
            .with("ok.test", &["127.0.0.1"]),
    );
    let pki = Pki::new();
    let body = central::spec_allowing(&[("echo.test", echo.addr().port()), ("ok.test", origin.port())]);
    let mut c = central::central_with_audit(&pki, dns.addr(), &body, &[], std::path::Path::new("/dev/full"));
    let cert = pki.node("node-a", &[]);
    let target = format!("echo.test:{}", echo.addr().port());
    let ok = format!("ok.test:{}", origin.port());
    let h2 = node(&cert, &[c.node_addr], &[&target, &ok], Some(("t1", "p1")));
    let mut args = central::upstream_args(&cert, &[c.node_addr]);
    args.extend(["--upstream-transport", "http1", "--dns-server", "127.0.0.1:9"].map(String::from));
    args.extend([
        "--allow".to_owned(),
        target.clone(),
        "--allow".to_owned(),
        ok.clone(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let http1 = common::ProxyProcess::start(&refs);

    // The first tunnel may pass (decided before the writer first failed); its events are
    // the first the central cannot write.
    let (head, mut first) = central::connect(h2.addr, &target);
    if head.starts_with("HTTP/1.1 200") {
        first.write_all(b"x").unwrap();
        let _ = first.read(&mut [0u8; 1]);
    }
    drop(first);
    assert!(
        c.proxy.log_line("cannot write the audit log").is_some(),
        "the central never noticed: {}",
        c.proxy.log_text()
    );
    let reached = echo.connections();

    for (transport, n) in [("h2", h2.addr), ("http/1.1", http1.addr)] {
        for i in 0..3 {
            let (head, mut t) = central::connect(n, &target);
            assert!(
                head.starts_with("HTTP/1.1 503"),
                "{transport} tunnel {i} after the audit failure: {head:?}"
            );
            assert!(
                head.contains("Proxy-Status: sandgate; error=destination_unavailable"),
                "{head}"
            );
            // Nothing behind the refusal is carried: the refusal's body, then the end.
            let _ = t.write_all(b"ping");
            let mut back = Vec::new();
            let _ = t.read_to_end(&mut back);
            let back = String::from_utf8_lossy(&back);
            assert!(!back.contains("ping"), "{transport} tunnel {i} echoed: {back}");
            assert!(back.contains("answered 503"), "{transport} tunnel {i}: {back}");
        }
    }
    assert_eq!(echo.connections(), reached, "a refused tunnel reached the origin");

    // A node's stream of plain HTTP requests: the central's own 503 reaches the client.
    let url = format!("http://{ok}/");
    let (_, headers, _) = curl(
        &format!("http://{}", h2.addr),
        &["-s", "-D", "-", "-o", "/dev/null", &url],
    );
    assert!(headers.starts_with("HTTP/1.1 503"), "{headers}");
    assert!(
        headers.contains("error=proxy_internal_error") && headers.contains("audit log cannot be written"),
        "{headers}"
    );
    assert_eq!(origin.connections(), 0, "a refused request reached the origin");

    // Nothing the central decided is lost: at shutdown what its log could not take is on
    // its stderr, each of the seven refusals (six tunnels, one plain request) among it.
    c.proxy.terminate();
    let refused = "\"reason_code\":\"audit_unavailable\"";
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    // The drain thread may still be reading the last lines.
    while c.proxy.log_text().matches(refused).count() < 7 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = c.proxy.log_text();
    assert!(
        log.matches(refused).count() >= 7,
        "refusals missing from stderr: {log}"
    );
}
