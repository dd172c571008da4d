//! The audit trail end to end: nothing lost on SIGTERM under load, rotation under load keeps
//! every event exactly once, /metrics parsed by a real Prometheus parser matches the traffic,
//! the readers skip and report a torn last line, and `audit summary` counts an upstream
//! proxy's refusal as denied, as a run's exit summary does.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{ProxyProcess, read_audit};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use sandgate_testkit::origin::Origin;
use serde_json::Value;

use common::runtime;

/// A tunnel client: CONNECT, send `n` bytes, read them back, close. Returns whether it got
/// a response (any status line).
fn tunnel_client(proxy: SocketAddr, target: &str, n: usize) -> (bool, bool) {
    let Ok(mut s) = TcpStream::connect(proxy) else {
        return (false, false);
    };
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    if s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .is_err()
    {
        return (false, false);
    }
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return (!head.is_empty(), false),
        }
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        return (true, false);
    }
    let data = vec![7u8; n];
    s.write_all(&data).unwrap();
    let mut back = vec![0u8; n];
    s.read_exact(&mut back).unwrap();
    (true, true)
}

/// An HTTP client: one GET, returns whether a status line came back.
fn http_client(proxy: SocketAddr, url: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(proxy) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    if s.write_all(format!("GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out.starts_with(b"HTTP/1.1 ")
}

#[test]
fn sigterm_under_load_loses_no_event() {
    let rt = runtime();
    let echo = rt.block_on(EchoServer::start());
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("echo.test", &["127.0.0.1"])
            .with("web.test", &["127.0.0.1"]),
    ));
    let tunnel_target = format!("echo.test:{}", echo.addr().port());
    let web = format!("web.test:{}", origin.port());
    let dns_addr = dns.addr().to_string();
    let mut p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &tunnel_target,
        "--allow",
        &web,
        "--shutdown-grace",
        "10",
    ]);
    let proxy = p.addr;
    const CLIENTS: usize = 300;
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let mut handles = Vec::new();
    for i in 0..CLIENTS {
        let barrier = barrier.clone();
        let tunnel_target = tunnel_target.clone();
        let url = match i % 3 {
            0 => format!("http://{web}/sleep/400"),
            1 => "http://denied.test/".to_owned(),
            _ => String::new(),
        };
        handles.push(std::thread::spawn(move || {
            barrier.wait();
            if url.is_empty() {
                let (responded, _) = tunnel_client(proxy, &tunnel_target, 10_000 + i);
                responded
            } else {
                http_client(proxy, &url)
            }
        }));
    }
    barrier.wait();
    std::thread::sleep(Duration::from_millis(150));
    Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    let responses = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|r| *r)
        .count();
    let status = p.terminate();
    assert!(status.success(), "{status:?}");
    let events = read_audit(&p.audit_path);
    let decisions = events.iter().filter(|e| e["event"] == "decision").count();
    assert!(
        responses > CLIENTS / 2,
        "most clients were mid-request when SIGTERM came: {responses}"
    );
    assert_eq!(
        decisions, responses,
        "one decision event per response a client saw"
    );
    // Every allowed request has its close event, and tunnels have exact byte counts.
    let allowed: Vec<&Value> = events.iter().filter(|e| e["decision"] == "allow").collect();
    let closes: HashMap<&str, &Value> = events
        .iter()
        .filter(|e| e["event"] == "close")
        .map(|e| (e["request_id"].as_str().unwrap(), e))
        .collect();
    for a in &allowed {
        let close = closes
            .get(a["request_id"].as_str().unwrap())
            .unwrap_or_else(|| panic!("no close for {a}"));
        if close["scheme"] == "connect" && close["outcome"] == "ok" {
            assert_eq!(close["bytes_sent"], close["bytes_received"], "{close}");
            assert!(close["bytes_sent"].as_u64().unwrap() >= 10_000, "{close}");
        }
    }
    assert_eq!(closes.len(), allowed.len());
}

#[test]
fn rotation_under_load_keeps_every_event_exactly_once() {
    let rt = runtime();
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("echo.test", &["127.0.0.1"])));
    let target = format!("echo.test:{}", echo.addr().port());
    let dns_addr = dns.addr().to_string();
    let mut p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &target,
        "--audit-max-bytes",
        "8192",
        "--audit-keep",
        "1000",
    ]);
    let proxy = p.addr;
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let target = target.clone();
            std::thread::spawn(move || (0..40).filter(|_| tunnel_client(proxy, &target, 100).1).count())
        })
        .collect();
    let done: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(done, 320);
    assert!(p.terminate().success());
    let files = sandgate_proxy::audit_query::log_files(&p.audit_path);
    assert!(
        files.len() > 5,
        "the log rotated under load: {} files",
        files.len()
    );
    let (events, skipped) = sandgate_proxy::audit_query::read_events(&files).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    for f in &files {
        assert!(
            std::fs::metadata(f).unwrap().len() <= 8192,
            "{} too large",
            f.display()
        );
    }
    let mut seen: HashMap<(String, &str), usize> = HashMap::new();
    for e in &events {
        *seen
            .entry((e.record.request_id.clone(), e.record.kind().as_str()))
            .or_default() += 1;
    }
    assert_eq!(events.len(), 640, "320 decisions and 320 closes");
    assert!(seen.values().all(|n| *n == 1), "an event was duplicated");
    assert_eq!(seen.len(), 640);
}

#[test]
fn metrics_parse_with_a_real_prometheus_parser_and_match_the_traffic() {
    let rt = runtime();
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("echo.test", &["127.0.0.1"])));
    let target = format!("echo.test:{}", echo.addr().port());
    let dns_addr = dns.addr().to_string();
    let p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &target,
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let metrics_addr = p.admin().to_string();
    for n in [100, 200, 300, 400, 500] {
        assert!(tunnel_client(p.addr, &target, n).1);
    }
    for _ in 0..3 {
        assert!(http_client(p.addr, "http://nope.test/"));
    }
    p.audit_events(13);
    let script = r#"
import sys, json, urllib.request
from prometheus_client.openmetrics.parser import text_string_to_metric_families
text = urllib.request.urlopen("http://" + sys.argv[1] + "/metrics", timeout=10).read().decode()
out = {}
for family in text_string_to_metric_families(text):
    for s in family.samples:
        key = s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
        out[key] = s.value
print(json.dumps(out))
"#;
    let out = Command::new(common::python())
        .args(["-c", script, &metrics_addr])
        .env_remove("http_proxy")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m: HashMap<String, f64> = serde_json::from_slice(&out.stdout).unwrap();
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("no {k} in {m:?}"));
    assert_eq!(
        get("sandgate_decisions_total{decision=allow,reason=allowlisted}"),
        5.0
    );
    assert_eq!(
        get("sandgate_decisions_total{decision=deny,reason=not_allowlisted}"),
        3.0
    );
    assert_eq!(get("sandgate_connections_total{}"), 8.0);
    assert_eq!(get("sandgate_bytes_sent_total{}"), 1500.0);
    assert_eq!(get("sandgate_bytes_received_total{}"), 1500.0);
    assert_eq!(get("sandgate_dns_seconds_count{}"), 5.0);
    assert_eq!(get("sandgate_connect_seconds_count{}"), 5.0);
    assert_eq!(get("sandgate_policy_generation{}"), 1.0);
    assert!(get("sandgate_audit_events_written_total{}") >= 13.0);
    assert_eq!(get("sandgate_connections_active{}"), 0.0);
}

#[test]
fn readers_skip_and_report_a_torn_last_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let good = |id: &str, decision: &str| {
        format!(
            "{{\"schema_version\":1,\"event\":\"decision\",\"created_at\":\"2026-11-22T10:00:00Z\",\"request_id\":\"{id}\",\"decision\":\"{decision}\",\"destination_host\":\"a.test\",\"destination_port\":443,\"method\":\"CONNECT\",\"reason_code\":\"x\"}}\n"
        )
    };
    std::fs::write(dir.path().join("audit.jsonl.1"), good("r1", "allow")).unwrap();
    std::fs::write(
        &log,
        format!(
            "{}{}{{\"schema_version\":1,\"event\":\"clo",
            good("r2", "deny"),
            good("r3", "deny")
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_sandgate");
    let out = Command::new(bin)
        .args(["audit", "tail", "--json", "--file"])
        .arg(&log)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    assert!(
        stdout.lines().next().unwrap().contains("\"r1\""),
        "rotated files first: {stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("audit.jsonl:3: skipped torn last line"),
        "{stderr}"
    );

    let out = Command::new(bin)
        .args(["audit", "tail", "--decision", "deny", "--file"])
        .arg(&log)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);

    // No --format, no --output-file: JSON lines on stdout, each as written.
    let out = Command::new(bin)
        .args(["audit", "export", "--input"])
        .arg(&log)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert!(
        stdout
            .lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| v["event"] == "decision")),
        "{stdout}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exported 2 events to stdout"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let csv = dir.path().join("out.csv");
    let out = Command::new(bin)
        .args(["audit", "export", "--format", "csv", "--input"])
        .arg(&log)
        .arg("--output-file")
        .arg(&csv)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipped torn last line"));
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 3, "header and two rows: {text}");
    assert!(text.starts_with("schema_version,event,created_at,request_id"));

    let out = Command::new(bin)
        .args(["audit", "summary", "--file"])
        .arg(&log)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("       2  a.test:443"), "{stdout}");
}

#[test]
fn aggregation_folds_allowed_traffic_and_keeps_denies_individual() {
    let rt = runtime();
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("echo.test", &["127.0.0.1"])));
    let target = format!("echo.test:{}", echo.addr().port());
    let dns_addr = dns.addr().to_string();
    let mut p = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &target,
        "--audit-aggregate-window",
        "0.3",
    ]);
    for _ in 0..10 {
        assert!(tunnel_client(p.addr, &target, 100).1);
    }
    assert!(http_client(p.addr, "http://nope.test/"));
    assert!(http_client(p.addr, "http://nope.test/"));
    // One window passes with no traffic: its aggregate is written without waiting for more.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !read_audit(&p.audit_path)
        .iter()
        .any(|e| e["event"] == "aggregate")
    {
        assert!(std::time::Instant::now() < deadline, "no aggregate written");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(p.terminate().success());
    let events = read_audit(&p.audit_path);
    assert_eq!(
        events.iter().filter(|e| e["decision"] == "deny").count(),
        2,
        "denies stay individual"
    );
    assert!(
        !events
            .iter()
            .any(|e| e["event"] == "close" || (e["event"] == "decision" && e["decision"] == "allow"))
    );
    let aggs: Vec<&Value> = events.iter().filter(|e| e["event"] == "aggregate").collect();
    let sum = |k: &str| aggs.iter().map(|e| e[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(
        (sum("count"), sum("bytes_sent"), sum("bytes_received")),
        (10, 1000, 1000),
        "{aggs:#?}"
    );
    assert!(
        aggs.iter()
            .all(|e| e["destination_host"] == "echo.test" && e["window_start"].is_string())
    );
}

/// The sections of `audit summary`'s output: title line, then `count  destination` rows.
fn summary_sections(stdout: &str) -> HashMap<String, Vec<(u64, String)>> {
    let mut sections: HashMap<String, Vec<(u64, String)>> = HashMap::new();
    let mut current = String::new();
    for line in stdout.lines() {
        if !line.starts_with(' ') {
            current = line.trim_end_matches(':').to_owned();
            sections.entry(current.clone()).or_default();
        } else if let Some((n, dest)) = line.trim().split_once("  ")
            && let Ok(n) = n.parse()
        {
            sections
                .entry(current.clone())
                .or_default()
                .push((n, dest.trim().to_owned()));
        }
    }
    sections
}

/// A node-local proxy allows a destination the central proxy it chains through refuses: the
/// client gets 403, and the local log holds an allow whose close says
/// `upstream_failure:upstream_denied`. `audit summary` counts that request as denied, not
/// allowed, with or without aggregation (an aggregate folds the allow; the close stays).
#[test]
fn audit_summary_counts_an_upstream_refusal_as_denied() {
    let rt = runtime();
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("echo.test", &["127.0.0.1"])
            .with("other.test", &["127.0.0.1"]),
    ));
    let tunnel = format!("echo.test:{}", echo.addr().port());
    let other = format!("other.test:{}", echo.addr().port());
    let dns_addr = dns.addr().to_string();
    let mut central = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &tunnel,
    ]);
    let central_addr = central.addr.to_string();
    let bin = env!("CARGO_BIN_EXE_sandgate");
    for aggregate in [None, Some("0.2")] {
        let mut args = vec![
            "--dns-server",
            "127.0.0.1:9",
            "--upstream-proxy",
            &central_addr,
            "--allow",
            &tunnel,
            "--allow",
            &other,
        ];
        if let Some(window) = aggregate {
            args.extend(["--audit-aggregate-window", window]);
        }
        let mut local = ProxyProcess::start(&args);
        assert_eq!(tunnel_client(local.addr, &tunnel, 10), (true, true));
        let (answered, passed) = tunnel_client(local.addr, &other, 10);
        assert!(answered && !passed, "the central proxy refuses {other}");
        assert!(local.terminate().success());
        let events = read_audit(&local.audit_path);
        assert!(
            events
                .iter()
                .any(|e| e["outcome"] == "upstream_failure:upstream_denied"),
            "{events:#?}"
        );
        let out = Command::new(bin)
            .args(["audit", "summary", "--file"])
            .arg(&local.audit_path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let s = summary_sections(&stdout);
        assert_eq!(
            s["top denied destinations"],
            [(1, other.clone())],
            "aggregate {aggregate:?}: {stdout}"
        );
        assert_eq!(
            s["top allowed destinations (requests)"],
            [(1, tunnel.clone())],
            "aggregate {aggregate:?}: {stdout}"
        );
    }
    assert!(central.terminate().success());
}
