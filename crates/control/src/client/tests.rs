//! Tests of the admin client: URL parsing (table tests), the resolver that never asks the
//! system, and whole calls against a one-shot HTTP server on 127.0.0.1:0.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::json;
use ureq::config::Config;
use ureq::unversioned::resolver::Resolver;
use ureq::unversioned::transport::NextTimeout;

use super::*;

fn problem(input: &str) -> UrlProblem {
    AdminUrl::parse(input)
        .map(|u| panic!("{input:?} parsed as {u}"))
        .unwrap_or_else(|e| e.problem().clone())
}

#[test]
fn ip_literals_and_localhost_parse_to_their_addresses() {
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, 9090));
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 9090));
    let cases: &[(&str, &str, &[SocketAddr])] = &[
        ("http://127.0.0.1:9090", "http://127.0.0.1:9090", &[v4]),
        ("http://127.0.0.1:9090/", "http://127.0.0.1:9090", &[v4]),
        ("HTTP://127.0.0.1:9090//", "http://127.0.0.1:9090", &[v4]),
        (
            "http://10.1.2.3:80",
            "http://10.1.2.3:80",
            &[SocketAddr::from(([10, 1, 2, 3], 80))],
        ),
        ("http://[::1]:9090", "http://[::1]:9090", &[v6]),
        ("http://[0:0:0:0:0:0:0:1]:9090/", "http://[::1]:9090", &[v6]),
        ("http://localhost:9090", "http://localhost:9090", &[v4, v6]),
        ("http://LocalHost:9090/", "http://localhost:9090", &[v4, v6]),
    ];
    for (input, canonical, addrs) in cases {
        let url = AdminUrl::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(url.to_string(), *canonical, "{input}");
        assert_eq!(url.addrs(), *addrs, "{input}");
        assert_eq!(url.port(), addrs[0].port());
    }
}

#[test]
fn a_host_name_is_refused_with_what_to_write_instead() {
    for input in [
        "http://admin.internal:9090",
        "http://evil.example:1/",
        "http://localhost.:9090",
        "http://localhost.evil.example:9090",
        // glibc's inet_aton reads these as 127.0.0.1; they are names here.
        "http://127.1:9090",
        "http://0x7f.0.0.1:9090",
        "http://0177.0.0.1:9090",
        "http://127.0.0.01:9090",
    ] {
        assert!(
            matches!(problem(input), UrlProblem::HostName(_)),
            "{input}: {:?}",
            problem(input)
        );
    }
    let message = AdminUrl::parse("http://admin.internal:9090")
        .unwrap_err()
        .to_string();
    assert!(message.contains("\"admin.internal\" is a host name"), "{message}");
    assert!(
        message.contains("IP address") && message.contains("localhost"),
        "{message}"
    );
}

#[test]
fn other_bad_input_names_its_problem() {
    let cases: &[(&str, UrlProblem)] = &[
        ("ftp://127.0.0.1:21", UrlProblem::Scheme("ftp".into())),
        ("127.0.0.1:9090", UrlProblem::Syntax),
        ("", UrlProblem::Syntax),
        ("http://:9090", UrlProblem::Syntax),
        ("http://[::1:9090", UrlProblem::Syntax),
        ("http://[fe80::1%25eth0]:9090", UrlProblem::Syntax),
        ("http://[::1]x:9090", UrlProblem::Syntax),
        ("http://127.0.0.1", UrlProblem::MissingPort),
        ("http://127.0.0.1:", UrlProblem::MissingPort),
        ("http://127.0.0.1:/", UrlProblem::MissingPort),
        ("http://[::1]", UrlProblem::MissingPort),
        ("http://localhost/", UrlProblem::MissingPort),
        ("http://127.0.0.1:0", UrlProblem::Port("0".into())),
        ("http://127.0.0.1:65536", UrlProblem::Port("65536".into())),
        ("http://127.0.0.1:+80", UrlProblem::Port("+80".into())),
        ("http://127.0.0.1:http", UrlProblem::Port("http".into())),
        ("http://::1:9090", UrlProblem::BareIpv6),
        ("http://127.0.0.1:9090/v1", UrlProblem::Path),
        ("http://127.0.0.1:9090?x=1", UrlProblem::Path),
        ("http://127.0.0.1:9090#ui", UrlProblem::Path),
        ("http://u:secret@127.0.0.1:9090", UrlProblem::UserInfo),
    ];
    for (input, expected) in cases {
        assert_eq!(&problem(input), expected, "{input}");
    }
    let message = AdminUrl::parse("http://127.0.0.1").unwrap_err().to_string();
    assert_eq!(
        message,
        "\"http://127.0.0.1\": no port: expected http://HOST:PORT"
    );
    let message = AdminUrl::parse("http://u:secret@127.0.0.1:9090")
        .unwrap_err()
        .to_string();
    assert!(!message.contains("secret"), "{message}");
}

#[test]
fn a_long_input_is_clipped_in_the_message() {
    let input = format!("http://{}.example:1", "a".repeat(5000));
    let message = AdminUrl::parse(&input).unwrap_err().to_string();
    assert!(message.len() < 600, "{}", message.len());
}

#[test]
fn path_segments_cannot_add_a_segment_or_a_query() {
    assert_eq!(path_segment("ex-1a2b_C"), "ex-1a2b_C");
    assert_eq!(path_segment("../x?y#z"), "%2E%2E%2Fx%3Fy%23z");
    assert_eq!(path_segment(".."), "%2E%2E");
}

fn resolve(uri: &str) -> Result<Vec<SocketAddr>, ureq::Error> {
    let uri: Uri = uri.parse().unwrap();
    let config = Config::builder().proxy(None).build();
    LiteralResolver
        .resolve(&uri, &config, NextTimeout::default())
        .map(|addrs| addrs.iter().copied().collect())
}

#[test]
fn the_resolver_maps_literals_and_localhost_without_asking() {
    assert_eq!(
        resolve("http://127.0.0.1:80/").unwrap(),
        [SocketAddr::from(([127, 0, 0, 1], 80))]
    );
    assert_eq!(
        resolve("http://[::1]:80/").unwrap(),
        [SocketAddr::from((Ipv6Addr::LOCALHOST, 80))]
    );
    assert_eq!(
        resolve("http://localhost:80/").unwrap(),
        [
            SocketAddr::from((Ipv4Addr::LOCALHOST, 80)),
            SocketAddr::from((Ipv6Addr::LOCALHOST, 80))
        ]
    );
}

/// Attacker test: a name in an admin URL never reaches the system resolver. The URL is
/// refused as a host name before a client exists; and were a name handed to the agent
/// itself (a redirect, a future caller), its resolver refuses it with our reason, where
/// ureq's default resolver would ask getaddrinfo and fail with `HostNotFound` or `Io`.
#[test]
fn a_host_name_never_triggers_a_system_lookup() {
    let refused = AdminUrl::parse("http://evil.example:1/").unwrap_err();
    assert_eq!(refused.problem(), &UrlProblem::HostName("evil.example".into()));
    assert!(matches!(AdminError::from(refused), AdminError::Url(_)));

    for uri in [
        "http://evil.example:1/",
        "http://localhost.evil.example:1/",
        "https://evil.example:1/",
        "http://127.1:1/",
    ] {
        let by_resolver = resolve(uri).unwrap_err();
        assert!(
            matches!(&by_resolver, ureq::Error::BadUri(m) if m.contains("is a host name")),
            "{uri}: {by_resolver:?}"
        );
        let by_agent = agent(&Limits::default(), None).get(uri).call().unwrap_err();
        assert!(
            matches!(&by_agent, ureq::Error::BadUri(m) if m.contains("is a host name")),
            "{uri}: {by_agent:?}"
        );
    }
    // The agent takes no other scheme either.
    let ftp = agent(&Limits::default(), None)
        .get("ftp://127.0.0.1:1/")
        .call()
        .unwrap_err();
    assert!(matches!(&ftp, ureq::Error::BadUri(_)), "{ftp:?}");
}

#[test]
fn https_needs_the_ca_and_trusts_nothing_else() {
    // An https:// URL parses; a client without a CA refuses every call before connecting.
    let url = AdminUrl::parse("https://127.0.0.1:9443").unwrap();
    assert!(url.is_tls());
    assert_eq!(url.to_string(), "https://127.0.0.1:9443");
    let client = AdminClient::new(url, "t");
    let e = client.get("/v1/exceptions").unwrap_err();
    assert!(matches!(&e, AdminError::Tls(m) if m.contains("CA")), "{e:?}");
    // A CA for a plain URL is a mistake, refused.
    let ca = std::env::temp_dir().join("sandgate-client-test-none.pem");
    let plain = AdminUrl::parse("http://127.0.0.1:9090").unwrap();
    let e = AdminClient::with_ca(plain, "t", Limits::default(), &ca).unwrap_err();
    assert!(
        matches!(&e, AdminError::Tls(m) if m.contains("https://")),
        "{e:?}"
    );
    // A CA file that cannot be read is said.
    let e = AdminClient::with_ca(url, "t", Limits::default(), &ca).unwrap_err();
    assert!(matches!(&e, AdminError::Tls(m) if m.contains("CA file")), "{e:?}");
}

/// A one-shot HTTP server on 127.0.0.1:0: answers `response` to the first request and
/// hands back the request's head and body as text.
fn serve_once(response: Vec<u8>) -> (SocketAddr, JoinHandle<String>) {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&seen).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(str::to_owned)
                    })
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if body.len() >= length {
                    break;
                }
            }
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let _ = stream.write_all(&response);
        String::from_utf8_lossy(&seen).into_owned()
    });
    (addr, handle)
}

fn http(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn a_get_sends_the_bearer_token_and_returns_the_json() {
    let (addr, seen) = serve_once(http("200 OK", r#"[{"id":"ex-1"}]"#));
    let client = AdminClient::new(AdminUrl::from(addr), " tok-1\n");
    assert_eq!(client.get("/v1/exceptions").unwrap(), json!([{"id": "ex-1"}]));
    let request = seen.join().unwrap();
    assert!(
        request.starts_with("GET /v1/exceptions HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(
        request.contains("\r\nauthorization: Bearer tok-1\r\n")
            || request.contains("\r\nAuthorization: Bearer tok-1\r\n"),
        "{request}"
    );
    assert!(!format!("{client:?}").contains("tok-1"));
}

#[test]
fn a_post_sends_json_through_localhost() {
    let (addr, seen) = serve_once(http("201 Created", r#"{"id":"ex-2","state":"pending"}"#));
    let url = AdminUrl::parse(&format!("http://localhost:{}/", addr.port())).unwrap();
    let answer = AdminClient::new(url, "tok").post("/v1/exceptions", &json!({"task_id": "t-1"}));
    assert_eq!(answer.unwrap()["state"], "pending");
    let request = seen.join().unwrap().to_ascii_lowercase();
    assert!(
        request.starts_with("post /v1/exceptions http/1.1\r\n"),
        "{request}"
    );
    assert!(request.contains("content-type: application/json"), "{request}");
    assert!(request.ends_with(r#"{"task_id":"t-1"}"#), "{request}");
}

#[test]
fn a_refusal_carries_the_status_and_the_apis_reason() {
    for (body, message) in [
        (r#"{"error":"not approved"}"#, "not approved"),
        (r#"{"message":"No such kernel"}"#, "No such kernel"),
        ("plain\u{1b}[31m text", "plain [31m text"),
        ("", "no message"),
    ] {
        let (addr, _) = serve_once(http("409 Conflict", body));
        let error = AdminClient::new(AdminUrl::from(addr), "tok")
            .get("/x")
            .unwrap_err();
        assert_eq!(
            error,
            AdminError::Refused {
                api: format!("http://{addr}"),
                status: 409,
                message: message.into()
            }
        );
        assert_eq!(
            error.to_string(),
            format!("http://{addr} answered 409: {message}")
        );
    }
}

/// A redirect is not followed: it would carry the token to wherever it points.
#[test]
fn a_redirect_is_an_answer_not_a_second_request() {
    let (addr, _) = serve_once(
        b"HTTP/1.1 302 Found\r\nLocation: http://evil.example:1/\r\nContent-Length: 0\r\n\r\n".to_vec(),
    );
    let error = AdminClient::new(AdminUrl::from(addr), "tok")
        .get("/v1/exceptions")
        .unwrap_err();
    assert!(
        matches!(error, AdminError::Refused { status: 302, .. }),
        "{error:?}"
    );
}

#[test]
fn answers_are_bounded_in_size_and_must_be_json() {
    let big = format!("[\"{}\"]", "x".repeat(2000));
    let (addr, _) = serve_once(http("200 OK", &big));
    let limits = Limits {
        max_body: 1000,
        ..Limits::default()
    };
    let error = AdminClient::with_limits(AdminUrl::from(addr), "tok", limits)
        .get("/x")
        .unwrap_err();
    assert!(
        matches!(error, AdminError::TooLarge { limit: 1000, .. }),
        "{error:?}"
    );

    let (addr, _) = serve_once(http("200 OK", "<html>"));
    let error = AdminClient::new(AdminUrl::from(addr), "tok")
        .get("/x")
        .unwrap_err();
    assert!(
        matches!(error, AdminError::NotJson { status: 200, .. }),
        "{error:?}"
    );

    let (addr, _) = serve_once(http("204 No Content", ""));
    assert_eq!(
        AdminClient::new(AdminUrl::from(addr), "tok").get("/x").unwrap(),
        Value::Null
    );
}

#[test]
fn a_silent_server_is_a_timeout() {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
    let limits = Limits {
        timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let client = AdminClient::with_limits(AdminUrl::from(listener.local_addr().unwrap()), "tok", limits);
    let error = client.get("/x").unwrap_err();
    assert!(matches!(error, AdminError::Timeout { .. }), "{error:?}");
    drop(listener);
}

#[test]
fn a_closed_port_is_unreachable() {
    let closed = sandgate_testkit::closed::ClosedPort::new();
    let error = AdminClient::new(AdminUrl::from(closed.addr()), "tok")
        .get("/x")
        .unwrap_err();
    assert!(
        matches!(&error, AdminError::Unreachable { cause, .. } if cause.contains("refused")),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .starts_with(&format!("cannot reach http://{}: ", closed.addr()))
    );
}

#[test]
fn a_token_no_header_can_carry_is_refused_before_connecting() {
    // Nothing listens on port 1 of this address; the call must not get that far.
    let url = AdminUrl::from(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 1));
    let error = AdminClient::new(url, "tok\r\nX-Evil: 1").get("/x").unwrap_err();
    assert_eq!(error, AdminError::Token);
}
