//! Plain HTTP through a central proxy: a node carries a client's plain HTTP requests on a
//! stream for their destination, and the central decides, forwards and records each one
//! (its method, its status, the node, the task), as it does for its own clients. A node
//! that writes anything else on such a stream (a request for another destination, a
//! CONNECT, an origin-form request) is refused, and that is on record too.

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

use std::time::Duration;

use central::{OkCentral, events_where, node};
use common::curl;
use sandgate_testkit::node::{Answer, NodeTls, stream};

/// Every request a node's sandgate forwards is decided and recorded at the central with
/// its method and status: several on one kept stream, and a refusal the client sees as
/// the central's, which the node records as a refusal upstream.
#[test]
fn the_central_records_each_plain_http_request_a_node_forwards() {
    let OkCentral { c, cert, origin, .. } = &OkCentral::new();
    let p = origin.port();
    let (ok_p, no_p) = (format!("ok.test:{p}"), format!("no.test:{p}"));
    let n = node(cert, &[c.node_addr], &[&ok_p, &no_p], Some(("t1", "p1")));
    let proxy = format!("http://{}", n.addr);

    // Two requests on one client connection: the node keeps one stream for both.
    let (code, out, err) = curl(
        &proxy,
        &[
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} ",
            &format!("http://ok.test:{p}/one"),
            // The next transfer reuses the connection (options start afresh after --next).
            "--next",
            "-sS",
            "--noproxy",
            "",
            "-x",
            &proxy,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} ",
            "-d",
            "x=1",
            &format!("http://ok.test:{p}/two"),
        ],
    );
    assert_eq!((code, out.as_str()), (0, "200 200 "), "{err}");
    // ... and the central one connection to the origin for both.
    assert_eq!(origin.connections(), 1);
    let (_, out, _) = curl(
        &proxy,
        &[
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("http://no.test:{p}/"),
        ],
    );
    assert_eq!(out, "403");

    let decisions = events_where(&c.proxy.audit_path, 3, |e| e["event"] == "decision");
    let seen: Vec<_> = decisions
        .iter()
        .map(|e| {
            (
                e["method"].as_str().unwrap_or("-").to_owned(),
                e["destination_host"].as_str().unwrap_or("-").to_owned(),
                e["decision"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect();
    let want = |m: &str, h: &str, d: &str| (m.to_owned(), h.to_owned(), d.to_owned());
    assert_eq!(
        seen,
        [
            want("GET", "ok.test", "allow"),
            want("POST", "ok.test", "allow"),
            want("GET", "no.test", "deny"),
        ],
        "{decisions:#?}"
    );
    for e in &decisions {
        assert_eq!(
            (e["node"].as_str(), e["task_id"].as_str(), e["scheme"].as_str()),
            (Some("node-a"), Some("t1"), Some("http")),
            "{e}"
        );
    }
    let closes = events_where(&c.proxy.audit_path, 2, |e| e["event"] == "close");
    assert!(
        closes.iter().all(|e| e["status"] == 200 && e["outcome"] == "ok"),
        "{closes:#?}"
    );
    // The node records the central's refusal as one upstream, not as an origin's 403.
    let refused = events_where(&n.proxy.audit_path, 1, |e| {
        e["event"] == "close" && e["destination_host"] == "no.test"
    });
    assert_eq!(
        refused[0]["outcome"], "upstream_failure:upstream_denied",
        "{refused:#?}"
    );
}

/// The attacker holds a node's certificate and writes its own bytes on a stream opened for
/// an allowed destination: a request for another destination, a CONNECT, an origin-form
/// request. Each is refused with 400 and on record; none reaches an origin.
#[test]
fn a_node_cannot_smuggle_other_requests_on_a_stream_of_plain_http() {
    let OkCentral { c, cert, origin, .. } = &OkCentral::new();
    let p = origin.port();
    let tls = NodeTls {
        cert: &cert.cert,
        key: &cert.key,
        ca: &cert.ca,
        central_name: "127.0.0.1",
    };
    let fields = [
        ("sandgate-task", "t1"),
        ("sandgate-project", "p1"),
        ("sandgate-access", "http"),
    ];
    let rt = tokio::runtime::Runtime::new().unwrap();
    let on_stream = |bytes: String| -> Answer {
        rt.block_on(stream(
            c.node_addr,
            tls,
            &format!("ok.test:{p}"),
            &fields,
            bytes.as_bytes(),
            Duration::from_secs(5),
        ))
    };
    let status_line = |a: &Answer| {
        String::from_utf8_lossy(&a.body)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    };

    // The honest use, for contrast: a request for the stream's own destination.
    let a = on_stream(format!(
        "GET http://ok.test:{p}/fine HTTP/1.1\r\nHost: ok.test:{p}\r\nConnection: close\r\n\r\n"
    ));
    assert_eq!(a.status, 200);
    assert!(status_line(&a).starts_with("HTTP/1.1 200"), "{a:?}");
    for smuggled in [
        format!("GET http://no.test:{p}/smuggled HTTP/1.1\r\nHost: no.test:{p}\r\n\r\n"),
        format!("CONNECT no.test:{p} HTTP/1.1\r\nHost: no.test:{p}\r\n\r\n"),
        format!("GET /smuggled HTTP/1.1\r\nHost: ok.test:{p}\r\n\r\n"),
    ] {
        let a = on_stream(smuggled.clone());
        assert_eq!(a.status, 200, "the stream itself is the node's to open");
        assert!(status_line(&a).starts_with("HTTP/1.1 400"), "{smuggled}: {a:?}");
    }
    let refused = events_where(&c.proxy.audit_path, 3, |e| e["decision"] == "deny");
    let codes: Vec<&str> = refused.iter().filter_map(|e| e["reason_code"].as_str()).collect();
    assert_eq!(
        codes,
        [
            "node_stream_request_invalid",
            "node_stream_request_invalid",
            "origin_form"
        ],
        "{refused:#?}"
    );
    assert!(refused.iter().all(|e| e["node"] == "node-a"), "{refused:#?}");
    // Nothing but the honest request reached the origin.
    assert_eq!(origin.connections(), 1);
}
