//! A below-host exception's revocation cuts the exchange it allowed while its response is
//! still streaming: `GET` on `/bytes/**` of tls.test is granted, a 200 MB response is
//! under way inside the tunnel the proxy intercepts for it (the client has read its first
//! bytes), and the exception is revoked. The response stops within about a second, short
//! of its length, and the request's close says `revoked`.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::control::api;
use crate::l7::decisions::decision;
use crate::l7_tls::{close_of, tls_through};

/// The response's length: far more than the socket buffers on the way hold.
const LENGTH: usize = 200_000_000;

#[test]
fn a_below_host_exceptions_revocation_cuts_a_response_in_flight() {
    let f = crate::fixture();
    let id = f.approved_get("fetch the archive", &["/bytes/**"], "{}");

    let host = format!("tls.test:{}", f.tls);
    let mut tls = tls_through(f.task, &host, "tls.test", &f.i.ca_pem).unwrap();
    let path = format!("/bytes/{LENGTH}");
    tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .unwrap();
    // The head and the first bytes of the body: the response is under way.
    let mut first = vec![0u8; 64 * 1024];
    let mut got = 0;
    while got < first.len() {
        match tls.read(&mut first[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    let head = String::from_utf8_lossy(&first[..got.min(200)]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    let revoke = format!("/v1/exceptions/{id}/revoke");
    let (status, revoked) = api(f.admin, "POST", &revoke, Some("tok-alice"), Some("{}"));
    assert_eq!(status, 200, "{revoked}");
    let revoked_at = Instant::now();
    // Read on until the connection ends (each read waits at most the socket's 5 s).
    let mut rest = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    while revoked_at.elapsed() < Duration::from_secs(20) {
        match tls.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => rest += n,
        }
    }
    let took = revoked_at.elapsed();
    assert!(
        got + rest < LENGTH,
        "the whole response came through: {rest} bytes after"
    );
    assert!(
        took < Duration::from_millis(1500),
        "cut after {took:?} ({rest} bytes)"
    );

    let audit = &f.i.proxy.audit_path;
    let decided = decision(audit, "tls.test", "GET", &path);
    assert_eq!(decided["decision"], "allow", "{decided:#}");
    let closed: Value = close_of(audit, &decided);
    assert_eq!(closed["outcome"], "revoked", "{closed:#}");
}
