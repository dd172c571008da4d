//! A read-only entry (GET, HEAD and OPTIONS) with real clients, curl and Python requests:
//! reads pass, every write is refused with 403 and recorded with the entry named, whichever
//! client sends it and whether or not it follows an allowed request on the same kept-alive
//! connection, and whether or not that connection was let in before a reload made the entry
//! read-only. The origin keeps a log of what it received: no write may be in it.

use sandgate_testkit::dns::Zone;

use std::process::Command;
use std::time::{Duration, Instant};

use super::decisions::{assert_names_entry, assert_refused_by, decision, entry_lines};
use super::wire;
use super::{egress_policy, entry};
use crate::common::world::{World, proxy};
use crate::common::{curl, python, read_audit};

const WRITES: [&str; 4] = ["POST", "PUT", "PATCH", "DELETE"];

/// Python requests on one Session (one kept-alive connection to the proxy where it can):
/// a read first, then the writes, then the other reads; prints `METHOD=STATUS` for each.
const REQUESTS: &str = r#"
import sys, requests
proxy, base = sys.argv[1:3]
s = requests.Session()
s.trust_env = False
s.proxies = {"http": proxy}
out = []
for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]:
    body = b"x=1" if method in ("POST", "PUT", "PATCH") else None
    r = s.request(method, f"{base}/py/{method}?token=q", data=body, timeout=10)
    out.append(f"{method}={r.status_code}")
print(" ".join(out))
"#;

#[test]
fn a_read_only_entry_passes_reads_and_refuses_every_write() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(Zone::new().with("ro.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let (policy, text) = egress_policy(dir.path(), &entry("ro.test", port, &["read_only: true"]));
    let lines = entry_lines(&text);
    let p = proxy(&dns, &["--policy", policy.to_str().unwrap()]);
    let base = format!("http://ro.test:{port}");
    let status = |args: &[&str]| {
        let (code, status, err) = curl(
            &p.url(),
            &[&["-o", "/dev/null", "-w", "%{http_code}"], args].concat(),
        );
        assert_eq!(code, 0, "{args:?}: {err}");
        status
    };

    for method in WRITES {
        let url = format!("{base}/curl/{method}?token=q");
        assert_eq!(
            status(&["-X", method, "--data", "x=1", &url]),
            "403",
            "curl {method}"
        );
    }
    assert_eq!(status(&[&format!("{base}/curl/GET?token=q")]), "200");
    assert_eq!(status(&["-I", &format!("{base}/curl/HEAD")]), "200");

    let out = std::process::Command::new(python())
        .args(["-c", REQUESTS, &p.url(), &base])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        printed.trim(),
        "GET=200 POST=403 PUT=403 PATCH=403 DELETE=403 HEAD=200 OPTIONS=200",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Method tokens are exact: a lowercase `get` is not GET, and an extension method is no
    // read. Neither reaches the origin.
    for method in ["get", "PROPFIND"] {
        let reply = wire::once(
            p.addr,
            method,
            &format!("{base}/raw/{method}"),
            &format!("ro.test:{port}"),
        );
        assert_eq!(reply.status, 403, "{method}: {reply:?}");
    }

    let seen = origin.requests();
    let methods: Vec<&str> = seen.iter().filter_map(|r| r.split(' ').next()).collect();
    assert_eq!(
        methods,
        ["GET", "HEAD", "GET", "HEAD", "OPTIONS"],
        "the origin received {seen:?}"
    );

    for client in ["curl", "py"] {
        for method in WRITES {
            let d = decision(&p.audit_path, "ro.test", method, &format!("/{client}/{method}"));
            assert_refused_by(&d, "request_not_allowed", "policy.yaml", &lines);
        }
        let d = decision(&p.audit_path, "ro.test", "GET", &format!("/{client}/GET"));
        assert_eq!(d["decision"], "allow", "{d:#}");
        assert_names_entry(&d, "policy.yaml", &lines);
    }
    for method in ["get", "PROPFIND"] {
        let d = decision(&p.audit_path, "ro.test", method, &format!("/raw/{method}"));
        assert_refused_by(&d, "request_not_allowed", "policy.yaml", &lines);
    }
}

/// A connection kept alive from before a reload that makes its entry read-only: its next
/// write is decided under the rules in force then, not the ones that let it in.
#[test]
fn a_reload_to_read_only_holds_on_a_connection_kept_alive_from_before() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(Zone::new().with("ro.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let (policy, _) = egress_policy(dir.path(), &entry("ro.test", port, &[]));
    let p = proxy(&dns, &["--policy", policy.to_str().unwrap()]);
    let host = format!("ro.test:{port}");
    let mut conn = wire::Conn::open(p.addr);
    let before = conn.exchange("POST", &format!("http://{host}/before"), &host, false);
    assert_eq!(before.status, 200, "{before:?}");

    // Written whole elsewhere and renamed over the file, so no reload reads half of it.
    let applied = || {
        read_audit(&p.audit_path)
            .iter()
            .filter(|e| e["event"] == "policy_reload" && e["outcome"] == "applied")
            .count()
    };
    let applied_before = applied();
    let staging = tempfile::tempdir_in(dir.path()).unwrap();
    let (staged, _) = egress_policy(staging.path(), &entry("ro.test", port, &["read_only: true"]));
    std::fs::rename(staged, &policy).unwrap();
    Command::new("kill")
        .args(["-HUP", &p.child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while applied() == applied_before {
        assert!(Instant::now() < deadline, "no reload:\n{}", p.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }

    let after = conn.exchange("POST", &format!("http://{host}/after"), &host, true);
    assert_eq!(after.status, 403, "{after:?}");
    assert_eq!(origin.requests(), ["POST /before"]);
}

/// A refused upload still in flight reads as its 403 over plain HTTP too: the proxy answers,
/// then reads and drops what the client still sends before it closes, so the answer is not
/// lost to the reset an unread body would cause. Nothing of it reaches the origin.
#[test]
fn a_refused_upload_still_in_flight_reads_as_its_403() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(Zone::new().with("ro.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let (policy, _) = egress_policy(dir.path(), &entry("ro.test", port, &["read_only: true"]));
    let p = proxy(&dns, &["--policy", policy.to_str().unwrap()]);
    let upload = dir.path().join("upload.bin");
    std::fs::write(&upload, vec![b'x'; 384 * 1024]).unwrap();
    let data = format!("@{}", upload.display());
    let url = format!("http://ro.test:{port}/bucket/object");
    for framing in [None, Some("transfer-encoding: chunked")] {
        let mut args = vec!["--limit-rate", "256K", "--data-binary", &data];
        args.extend(["-o", "/dev/null", "-w", "%{http_code}", &url]);
        if let Some(field) = framing {
            args.extend(["-H", field]);
        }
        let (code, status, err) = curl(&p.url(), &args);
        assert_eq!((code, status.as_str()), (0, "403"), "{framing:?}: {err}");
    }
    assert_eq!(origin.requests(), Vec::<String>::new());
}
