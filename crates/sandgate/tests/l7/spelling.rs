//! Spelling attacks on a path rule, over plain HTTP with a raw client that writes the
//! request line itself: against `paths: ["/myorg/**"]`, every way of writing a path that
//! leaves `/myorg/` once an origin or a framework normalises it (encoded slashes, backslashes
//! and dots, `..` and `.` segments, `//`, `;` path parameters, invalid or control-character
//! escapes), other letter case, a longer first segment, a host spelled with a trailing dot
//! and in capitals, a Host field naming another host, and a refused request after an allowed
//! one on the same connection, one after another or pipelined. Each is refused with 403 and
//! recorded; the origin never hears of any of them (it has accepted no connection when the
//! last is refused). A query that looks like an attack and an escape of an ordinary letter
//! pass. Then git's fetch rule asked directly: `*` is one whole segment.

use sandgate_testkit::dns::Zone;
use serde_json::Value;

use super::decisions::{assert_names_entry, decision, entry_lines, events_once};
use super::wire::{self, Conn};
use super::{egress_policy, entry};
use crate::common::world::{World, proxy};

const NOT_CANONICAL: &str = "path_not_canonical";
const NOT_ALLOWED: &str = "request_not_allowed";

/// Paths refused on `sp.test`, with the reason each must be recorded with.
const REFUSED: [(&str, &str); 30] = [
    // From a hostile review: path parameters, a second encoding, dots and spaces.
    ("/myorg/app.jsp;.txt", NOT_CANONICAL),
    ("/myorg/%252e%252e/other", NOT_CANONICAL),
    ("/myorg/..%20./other", NOT_CANONICAL),
    ("/myorg/...", NOT_CANONICAL),
    ("/myorg/%2e%2e/other/x", NOT_CANONICAL),
    ("/myorg/..%2fother/x", NOT_CANONICAL),
    ("/myorg%2Fx", NOT_CANONICAL),
    ("/myorg/%2E%2E/other", NOT_CANONICAL),
    ("/myorg/../other/x", NOT_CANONICAL),
    ("/myorg/./x", NOT_CANONICAL),
    ("/myorg//x", NOT_CANONICAL),
    ("/MYORG/x", NOT_ALLOWED),
    ("/myorg/..;/other", NOT_CANONICAL),
    ("/myorg/x%5c..%5c..%5cother", NOT_CANONICAL),
    ("/myorg/%zz", NOT_CANONICAL),
    ("/myorg/x%00", NOT_CANONICAL),
    ("/myorg/%2e/x", NOT_CANONICAL),
    ("/myorg/.;/x", NOT_CANONICAL),
    ("/myorg/x\\..\\..\\other", NOT_CANONICAL),
    ("/myorg/x%2F..%2F..%2Fother", NOT_CANONICAL),
    ("/myorg/x/..", NOT_CANONICAL),
    ("/myorg/x%0d%0aX:%20y", NOT_CANONICAL),
    ("/myorg/%", NOT_CANONICAL),
    ("/myorg/.%2e/other", NOT_CANONICAL),
    ("/myorg/%c0%ae%c0%ae/other", NOT_CANONICAL),
    ("/myorg/%EF%BC%8E%EF%BC%8E/other", NOT_CANONICAL),
    ("/myorg/%E2%80%A5/other", NOT_CANONICAL),
    ("/myorgevil/x", NOT_ALLOWED),
    ("/myorg.git/x", NOT_ALLOWED),
    ("/other/x", NOT_ALLOWED),
];

#[test]
fn spellings_that_leave_the_path_rule_are_refused_before_the_origin() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("sp.test", &["127.0.0.1"])
            .with("open.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let entries = entry("sp.test", port, &["paths: [\"/myorg/**\"]"]) + &entry("open.test", port, &[]);
    let (policy, text) = egress_policy(dir.path(), &entries);
    let line = entry_lines(&text)[..1].to_vec();
    let p = proxy(&dns, &["--policy", policy.to_str().unwrap()]);
    let host = format!("sp.test:{port}");

    for (path, _) in REFUSED {
        let reply = wire::once(p.addr, "GET", &format!("http://{host}{path}"), &host);
        assert_eq!(reply.status, 403, "GET {path}: {reply:?}");
    }
    // The host spelled with a trailing dot and in capitals is the same host, under the same
    // rule; a Host field naming a host without rules changes nothing either.
    let dotted = format!("SP.TEST.:{port}");
    let reply = wire::once(p.addr, "GET", &format!("http://{dotted}/other/x"), &dotted);
    assert_eq!(reply.status, 403, "trailing dot: {reply:?}");
    let reply = wire::once(
        p.addr,
        "GET",
        &format!("http://{host}/other/y"),
        &format!("open.test:{port}"),
    );
    assert_eq!(reply.status, 403, "Host naming another host: {reply:?}");
    assert_eq!(
        (origin.connections(), origin.requests()),
        (0, Vec::new()),
        "a refused request reached the origin"
    );

    let events = events_once(&p.audit_path, |e| e["path"] == "/other/y");
    let decisions: Vec<&Value> = events.iter().filter(|e| e["event"] == "decision").collect();
    assert_eq!(decisions.len(), REFUSED.len() + 2, "{events:#?}");
    for ((path, reason), d) in REFUSED.iter().zip(&decisions) {
        assert_eq!(
            (&d["decision"], &d["reason_code"], &d["path"], &d["method"]),
            (&"deny".into(), &(*reason).into(), &(*path).into(), &"GET".into()),
            "GET {path}: {d:#}"
        );
        assert_names_entry(d, "policy.yaml", &line);
    }
    for d in &decisions[REFUSED.len()..] {
        assert_eq!(
            (&d["decision"], &d["reason_code"]),
            (&"deny".into(), &NOT_ALLOWED.into()),
            "{d:#}"
        );
        assert_names_entry(d, "policy.yaml", &line);
    }

    // Kept alive: an allowed request, then a refused one on the same connection; and the
    // same pipelined, three requests in one write.
    let mut conn = Conn::open(p.addr);
    let first = conn.exchange("GET", &format!("http://{host}/myorg/first"), &host, false);
    assert!(
        first.status == 200 && first.body.contains("/myorg/first"),
        "{first:?}"
    );
    let second = conn.exchange("GET", &format!("http://{host}/myorg/%2e%2e/other"), &host, true);
    assert_eq!(second.status, 403, "{second:?}");
    let mut conn = Conn::open(p.addr);
    conn.send(
        &[
            wire::request("GET", &format!("http://{host}/myorg/pipe-1"), &host, false),
            wire::request("GET", &format!("http://{host}/other/pipe-2"), &host, false),
            wire::request("GET", &format!("http://{host}/myorg/pipe-3"), &host, true),
        ]
        .concat(),
    );
    let replies = [conn.read_reply(), conn.read_reply(), conn.read_reply()];
    assert_eq!((replies[0].status, replies[1].status), (200, 403), "{replies:?}");
    // The third may be answered, or the connection closed after the refusal.
    assert!([0, 200].contains(&replies[2].status), "{replies:?}");

    // What passes: the query is not the path, an escaped letter is that letter, a trailing
    // slash is no empty segment, and `**` stands for no segment too.
    for target in ["/myorg/a/b?q=..%2f", "/myorg/%41bc", "/myorg/x/", "/myorg"] {
        let reply = wire::once(p.addr, "GET", &format!("http://{host}{target}"), &host);
        assert_eq!(reply.status, 200, "GET {target}: {reply:?}");
    }
    let seen = origin.requests();
    let forwarded = |target: &str| seen.contains(&format!("GET {target}"));
    for target in [
        "/myorg/first",
        "/myorg/pipe-1",
        "/myorg/a/b?q=..%2f",
        "/myorg/x/",
        "/myorg",
    ] {
        assert!(forwarded(target), "{target} did not arrive: {seen:?}");
    }
    assert!(forwarded("/myorg/%41bc") || forwarded("/myorg/Abc"), "{seen:?}");
    let allowed = |r: &String| {
        let target = r.strip_prefix("GET ").unwrap_or("");
        let path = target.split('?').next().unwrap_or("");
        path == "/myorg" || (path.starts_with("/myorg/") && !path.contains("%2e") && !path.contains(".."))
    };
    assert!(seen.iter().all(allowed), "a refused request arrived: {seen:?}");

    let d = decision(&p.audit_path, "sp.test", "GET", "/myorg/a/b");
    assert_eq!(d["decision"], "allow", "{d:#}");
    let is_escaped =
        |e: &Value| e["event"] == "decision" && (e["path"] == "/myorg/%41bc" || e["path"] == "/myorg/Abc");
    let events = events_once(&p.audit_path, is_escaped);
    let escaped = events.iter().find(|e| is_escaped(e));
    assert!(escaped.is_some_and(|e| e["decision"] == "allow"), "{events:#?}");
}

/// The fetch-only entries of the git tests, asked directly: `*` is exactly one segment, the
/// last segment is matched whole and in its case, the method exactly.
#[test]
fn a_segment_wildcard_stands_for_exactly_one_segment() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(Zone::new().with("git.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let (policy, _) = egress_policy(dir.path(), &super::fetch_only("git.test", port, 6));
    let p = proxy(&dns, &["--policy", policy.to_str().unwrap()]);
    let host = format!("git.test:{port}");
    let cases: [(&str, &str, u16); 10] = [
        ("POST", "/myorg/repo.git/git-upload-pack", 200),
        ("POST", "/myorg/repo.git/git-upload-pack?x=1", 200),
        ("POST", "/myorg/git-upload-pack", 403),
        ("POST", "/myorg/a/b/git-upload-pack", 403),
        ("POST", "/myorg/repo.git/git-upload-pack/x", 403),
        ("POST", "/myorg/repo.git/Git-Upload-Pack", 403),
        ("POST", "/myorg/repo.git/git-upload-packs", 403),
        ("POST", "/myorg/repo.git/git-receive-pack", 403),
        ("post", "/myorg/repo.git/git-upload-pack", 403),
        ("PUT", "/myorg/repo.git/git-upload-pack", 403),
    ];
    for (method, path, status) in cases {
        let reply = wire::once(p.addr, method, &format!("http://{host}{path}"), &host);
        assert_eq!(reply.status, status, "{method} {path}: {reply:?}");
    }
    assert_eq!(
        origin.requests(),
        [
            "POST /myorg/repo.git/git-upload-pack",
            "POST /myorg/repo.git/git-upload-pack?x=1"
        ],
        "only the allowed requests arrive"
    );
}

/// Segments that a server normalising Unicode (NFKC) or trimming whitespace reads as a dot
/// segment or a separator, beyond the ones above: the rest of the code points whose NFKC
/// form holds `..` or `/`, and C1 control characters (Python's `str.strip()` removes U+0085,
/// so a segment `..\u{85}` is `..` to a server that trims). Each is refused as not canonical,
/// and none reaches the origin.
#[test]
fn every_compatibility_form_of_a_dot_segment_or_separator_and_c1_controls_are_refused() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(Zone::new().with("sp.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let (policy, _) = egress_policy(dir.path(), &entry("sp.test", port, &["paths: [\"/myorg/**\"]"]));
    let p = proxy(&dns, &["--policy", policy.to_str().unwrap()]);
    let host = format!("sp.test:{port}");
    let cases = [
        "/myorg/%EF%B8%B0/other", // U+FE30, vertical two dot leader: NFKC `..`
        "/myorg/%EF%B8%99/other", // U+FE19, vertical ellipsis: NFKC `...`, as U+2026
        "/myorg/a%E2%84%80/x",    // U+2100, account of: NFKC `a/c`
        "/myorg/a%E2%84%81/x",    // U+2101: NFKC `a/s`
        "/myorg/x%E2%84%85y",     // U+2105, care of: NFKC `c/o`
        "/myorg/x%E2%84%86y",     // U+2106: NFKC `c/u`
        "/myorg/..%C2%85/other",  // U+0085 (NEL), a C1 control: `..` once trimmed
        "/myorg/%C2%80",          // U+0080, a C1 control
        "/myorg/%C2%9F",          // U+009F, a C1 control
    ];
    let mut passed = Vec::new();
    for path in cases {
        let reply = wire::once(p.addr, "GET", &format!("http://{host}{path}"), &host);
        if reply.status != 403 {
            passed.push(format!("GET {path}: {}", reply.status));
        }
    }
    assert!(
        passed.is_empty(),
        "not refused: {passed:#?}\norigin received {:?}",
        origin.requests()
    );
    let events = events_once(&p.audit_path, |e| e["path"] == "/myorg/%C2%9F");
    let reasons: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "decision")
        .map(|e| &e["reason_code"])
        .collect();
    assert!(
        reasons.len() == cases.len() && reasons.iter().all(|r| *r == NOT_CANONICAL),
        "{events:#?}"
    );
    assert_eq!(origin.connections(), 0);
}

/// What a method and a path cannot judge rides along with a request they allowed: a body
/// on a GET (an origin that ignores its length reads it as a second request, here a push
/// that no rule decided), a TRACE (an echo of the request). Both are refused where an entry
/// with methods or paths allowed them, and the origin hears of neither.
#[test]
fn a_read_with_a_body_or_a_trace_is_refused_where_rules_judge() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(Zone::new().with("sp.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let entries = entry(
        "sp.test",
        port,
        &["methods: [GET, TRACE]", "paths: [\"/myorg/**\"]"],
    );
    let (policy, _) = egress_policy(dir.path(), &entries);
    let p = proxy(&dns, &["--policy", policy.to_str().unwrap()]);
    let host = format!("sp.test:{port}");
    let smuggled =
        format!("POST /myorg/r.git/git-receive-pack HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n");
    let mut conn = Conn::open(p.addr);
    conn.send(&wire::request_with(
        "GET",
        &format!("http://{host}/myorg/r"),
        &host,
        &[],
        &smuggled,
    ));
    let reply = conn.read_reply();
    assert_eq!(reply.status, 400, "a GET with a body: {reply:?}");
    let reply = wire::once(p.addr, "TRACE", &format!("http://{host}/myorg/r"), &host);
    assert_eq!(reply.status, 400, "TRACE: {reply:?}");
    let reply = wire::once(p.addr, "GET", &format!("http://{host}/myorg/last"), &host);
    assert_eq!(reply.status, 200, "a plain GET still passes: {reply:?}");
    assert_eq!(
        origin.requests(),
        ["GET /myorg/last"],
        "only the plain GET reached the origin"
    );
    let events = events_once(&p.audit_path, |e| e["path"] == "/myorg/last");
    let refused: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "decision" && e["reason_code"] == "request_not_judgeable")
        .collect();
    assert_eq!(refused.len(), 2, "{events:#?}");
}

/// A method override (`X-HTTP-Method-Override` and its two spellings, as Rails, Express and
/// Google APIs read them) on a request a rule judged never reaches the origin: a POST
/// allowed to `git-upload-pack` is not read there as a DELETE. On a host allowed whole the
/// fields go on untouched: sandgate does not rewrite what no rule judged.
#[test]
fn a_method_override_never_reaches_the_origin_of_a_judged_request() {
    let w = World::new();
    let origin = w.origin();
    let port = origin.port();
    let dns = w.dns(
        Zone::new()
            .with("sp.test", &["127.0.0.1"])
            .with("whole.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let entries = entry(
        "sp.test",
        port,
        &["methods: [POST]", "paths: [\"/*/*/git-upload-pack\"]"],
    ) + &entry("whole.test", port, &[]);
    let (policy, _) = egress_policy(dir.path(), &entries);
    let p = proxy(&dns, &["--policy", policy.to_str().unwrap()]);
    let overrides = [
        ("X-HTTP-Method-Override", "DELETE"),
        ("x-http-method", "PUT"),
        ("X-Method-Override", "PATCH"),
    ];
    for host in ["sp.test", "whole.test"] {
        let authority = format!("{host}:{port}");
        let mut conn = Conn::open(p.addr);
        conn.send(&wire::request_with(
            "POST",
            &format!("http://{authority}/o/r.git/git-upload-pack"),
            &authority,
            &overrides,
            "0000",
        ));
        assert_eq!(conn.read_reply().status, 200, "{host}");
    }
    let seen = origin.received();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for (name, _) in overrides {
        let name = name.to_ascii_lowercase();
        assert!(
            seen[0].header(&name).is_empty(),
            "{name} reached the origin of a judged request"
        );
        assert_eq!(
            seen[1].header(&name).len(),
            1,
            "{name} was dropped where no rule judged"
        );
    }
}
