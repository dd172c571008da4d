use std::cell::Cell;

use super::*;

thread_local! {
    /// Bytes handed to the placeholder search on this thread (see [`mark`]).
    pub(super) static SEARCHED: Cell<usize> = const { Cell::new(0) };
}

fn secrets() -> BoundSecrets {
    BoundSecrets::new(vec![Credential {
        host: Host::parse("api.example").unwrap(),
        header: "authorization".into(),
        value: ValueTemplate::parse("Bearer ${env:KEY}").unwrap().fill("sk-real"),
        placeholder: "SANDGATE_EXAMPLE".into(),
        inspect_body: false,
        origin: Arc::from("p.yaml:9"),
    }])
    .unwrap()
}

fn check(host: &str, seen: bool, target: &str, fields: &[(&str, &str)]) -> Result<Carried, Leak> {
    secrets().check(
        &Host::parse(host).unwrap(),
        seen,
        "GET",
        target,
        fields.iter().map(|(n, v)| (*n, v.as_bytes())),
    )
}

#[test]
fn the_placeholder_is_swapped_in_its_header_to_its_host_only() {
    let carried = check(
        "api.example",
        true,
        "/v1/x",
        &[("Authorization", "Bearer SANDGATE_EXAMPLE")],
    )
    .unwrap();
    let Carried::Swap(swap) = carried else {
        panic!("no swap: {carried:?}");
    };
    assert_eq!(swap.len(), 1);
    assert_eq!(swap[0].0, "authorization");
    assert_eq!(swap[0].1.expose(), "Bearer sk-real");
    assert_eq!(
        check("api.example", true, "/v1/x", &[("Accept", "*/*")]),
        Ok(Carried::Nothing)
    );
}

#[test]
fn a_placeholder_anywhere_else_is_a_leak() {
    let to_other = check(
        "other.example",
        true,
        "/",
        &[("Authorization", "Bearer SANDGATE_EXAMPLE")],
    );
    assert!(to_other.unwrap_err().where_.contains("other.example"));
    let other_header = check("api.example", true, "/", &[("X-Echo", "SANDGATE_EXAMPLE")]);
    assert!(other_header.unwrap_err().where_.contains("X-Echo"));
    let in_query = check("api.example", true, "/v1?key=SANDGATE_EXAMPLE", &[]);
    assert!(in_query.unwrap_err().where_.contains("query"));
    let plain = check(
        "api.example",
        false,
        "/",
        &[("Authorization", "Bearer SANDGATE_EXAMPLE")],
    );
    assert!(plain.unwrap_err().where_.contains("plain HTTP"));
}

#[test]
fn a_secret_is_never_printed() {
    let s = secrets();
    let text = format!("{s:?}");
    assert!(!text.contains("sk-real"), "{text}");
    let leak = check("other.example", true, "/", &[("A", "SANDGATE_EXAMPLE")]).unwrap_err();
    assert!(!leak.to_string().contains("sk-real"));
}

#[test]
fn values_name_their_secret_from_the_environment_once() {
    let t = ValueTemplate::parse("Bearer ${env:OPENAI_API_KEY}").unwrap();
    assert_eq!(
        (t.before.as_str(), t.env.as_str(), t.after.as_str()),
        ("Bearer ", "OPENAI_API_KEY", "")
    );
    assert_eq!(ValueTemplate::parse("sk-literal"), Err(CredentialError::NoEnv));
    assert_eq!(
        ValueTemplate::parse("${env:A}${env:B}"),
        Err(CredentialError::NoEnv)
    );
    assert!(matches!(
        ValueTemplate::parse("${env:A-B}"),
        Err(CredentialError::EnvName(_))
    ));
    assert!(matches!(
        ValueTemplate::parse("${env:}"),
        Err(CredentialError::EnvName(_))
    ));
    assert!(check_names("SANDGATE_OPENAI", "Authorization").is_ok());
    assert!(check_names("short", "Authorization").is_err());
    assert!(check_names("has space in it", "Authorization").is_err());
    assert!(check_names("SANDGATE_OPENAI", "Bad Header").is_err());
}

fn watched() -> BoundSecrets {
    let c = |host: &str, placeholder: &str, inspect_body: bool| Credential {
        host: Host::parse(host).unwrap(),
        header: "authorization".into(),
        value: ValueTemplate::parse("Bearer ${env:KEY}").unwrap().fill("sk-real"),
        placeholder: placeholder.into(),
        inspect_body,
        origin: Arc::from("p.yaml:9"),
    };
    BoundSecrets::new(vec![
        c("api.example", "SANDGATE_EXAMPLE", true),
        c("other.example", "SANDGATE_NOT_WATCHED", false),
    ])
    .unwrap()
}

/// A body to another host is searched for the placeholders that ask for it, however the
/// body is cut into chunks; a body to the credential's own host, and placeholders that do
/// not ask, are not.
#[test]
fn a_placeholder_in_a_body_to_another_host_is_found_across_any_chunking() {
    let secrets = watched();
    let elsewhere = Host::parse("paste.example").unwrap();
    assert!(secrets.body_scan(&Host::parse("api.example").unwrap()).is_none());
    let body = b"{\"note\": \"key is SANDGATE_EXAMPLE, thanks\"}";
    for size in 1..=body.len() {
        let mut scan = secrets.body_scan(&elsewhere).unwrap();
        let found = body.chunks(size).position(|chunk| scan.feed(chunk).is_err());
        let end = body.windows(16).position(|w| w == b"SANDGATE_EXAMPLE").unwrap() + 15;
        assert_eq!(
            found,
            Some(end / size),
            "chunks of {size}: refused at the chunk that completes it"
        );
    }
    let mut scan = secrets.body_scan(&elsewhere).unwrap();
    let leak = scan.feed(b"SANDGATE_EXAMPLE").unwrap_err();
    assert!(
        leak.to_string()
            .contains("in the body of a request to paste.example"),
        "{leak}"
    );
    let mut clean = secrets.body_scan(&elsewhere).unwrap();
    for chunk in [
        &b"SANDGATE_EXAMPL"[..],
        b"x SANDGATE_NOT_WATCHED ",
        b"SANDGATE_",
        b"EXAMPLx",
    ] {
        assert!(clean.feed(chunk).is_ok());
    }
}

/// A placeholder percent-encoded in the path or the query (any case of the hex digits, or
/// encoded twice) is the placeholder to an origin that decodes it: a leak, as the literal
/// one is. So is one encoded in a header other than its own (a cookie an origin decodes).
#[test]
fn a_placeholder_percent_encoded_anywhere_else_is_a_leak() {
    for target in [
        "/v1?k=SANDGATE%5FEXAMPLE",
        "/v1?k=SANDGATE%5fEXAMPLE",
        "/v1?k=%53%41%4e%44%47%41%54%45%5f%45%58%41%4d%50%4c%45",
        "/v1?k=SANDGATE%255FEXAMPLE",
        "/v1/SANDGATE%5FEXAMPLE/x",
        "/v1/SANDGATE_EXAMPLE/x",
    ] {
        for host in ["api.example", "other.example"] {
            let leak = check(host, true, target, &[]);
            assert!(
                leak.as_ref().is_err_and(|l| l.where_.contains("path or query")),
                "{target} to {host}: {leak:?}"
            );
        }
    }
    let cookie = check("other.example", true, "/", &[("Cookie", "k=SANDGATE%5FEXAMPLE")]);
    assert!(cookie.unwrap_err().where_.contains("Cookie"));
    // Near misses are not the placeholder.
    assert_eq!(
        check("other.example", true, "/v1?k=SANDGATE%5EXAMPLE%", &[]),
        Ok(Carried::Nothing)
    );
}

/// A header named with the placeholder, in any case, to its own host or another, over TLS
/// or plain HTTP: an origin sees the name as readily as a value.
#[test]
fn a_placeholder_as_a_header_name_is_a_leak() {
    for (host, seen, name) in [
        ("other.example", true, "SANDGATE_EXAMPLE"),
        ("other.example", false, "sandgate_example"),
        ("api.example", true, "X-Sandgate_Example-Key"),
    ] {
        let leak = check(host, seen, "/", &[(name, "1")]);
        assert!(
            leak.as_ref().is_err_and(|l| l.where_.contains("name")),
            "{host} {name}: {leak:?}"
        );
    }
}

/// A method token that is the placeholder, in any case: an entry without `methods` lets
/// any token through, and an origin may log or echo it.
#[test]
fn a_placeholder_as_the_method_is_a_leak() {
    let host = Host::parse("other.example").unwrap();
    for method in ["SANDGATE_EXAMPLE", "sandgate_example", "XSANDGATE_EXAMPLEX"] {
        let leak = secrets().check(&host, false, method, "/", std::iter::empty());
        assert!(
            leak.as_ref().is_err_and(|l| l.where_.contains("method")),
            "{method}: {leak:?}"
        );
    }
    let get = secrets().check(&host, false, "GET", "/", std::iter::empty());
    assert_eq!(get, Ok(Carried::Nothing));
}

/// A placeholder that is part of another's is found inside it (each is searched for in the
/// same pass, overlaps included): the longer one, sent in its own header, carries the
/// shorter one there, which is a leak as it was before the search was shared.
#[test]
fn overlapping_placeholders_are_each_found() {
    let c = |placeholder: &str, header: &str, secret: &str| Credential {
        host: Host::parse("api.example").unwrap(),
        header: header.into(),
        value: ValueTemplate::parse("${env:KEY}").unwrap().fill(secret),
        placeholder: placeholder.into(),
        inspect_body: false,
        origin: Arc::from("p.yaml:9"),
    };
    let secrets = BoundSecrets::new(vec![
        c("SANDGATE_EXAMPLE_LONG", "x-long", "sk-long"),
        c("SANDGATE_EXAMPLE", "x-short", "sk-short"),
    ])
    .unwrap();
    let host = Host::parse("api.example").unwrap();
    let fields = [("X-Long", "SANDGATE_EXAMPLE_LONG")];
    let fields = fields.iter().map(|(n, v)| (*n, v.as_bytes()));
    let leak = secrets.check(&host, true, "GET", "/", fields).unwrap_err();
    assert!(leak.where_.contains("X-Long"), "the short one is in it: {leak}");
}

/// The work of a check grows with the request, not with the number of credentials times
/// the request: each name and value is searched once for every placeholder (the target and
/// values up to [`DECODE_ROUNDS`] more times once decoded, only when they hold a `%`). A
/// 400 KB head of near-placeholders against 32 credentials is searched about once.
#[test]
fn a_check_searches_each_text_once_for_every_placeholder() {
    let credentials: Vec<Credential> = (0..32)
        .map(|n| Credential {
            host: Host::parse(&format!("h{n}.example")).unwrap(),
            header: "authorization".into(),
            value: ValueTemplate::parse("${env:KEY}").unwrap().fill("sk-real"),
            placeholder: format!("SANDGATE_{}_{n:03}", "A".repeat(100)),
            inspect_body: true,
            origin: Arc::from("p.yaml:9"),
        })
        .collect();
    let secrets = BoundSecrets::new(credentials).unwrap();
    let near = format!("SANDGATE_{}_99", "A".repeat(100)).repeat(40);
    let encoded = format!("%53{}", &near[1..]);
    let values: Vec<String> = (0..100)
        .map(|n| if n % 2 == 0 { near.clone() } else { encoded.clone() })
        .collect();
    let fields: Vec<(String, &[u8])> = values
        .iter()
        .enumerate()
        .map(|(n, v)| (format!("X-Near-{n}"), v.as_bytes()))
        .collect();
    let head: usize = fields.iter().map(|(n, v)| n.len() + v.len()).sum();
    assert!(head > 400_000, "{head}");
    SEARCHED.with(|n| n.set(0));
    let host = Host::parse("elsewhere.example").unwrap();
    let iter = fields.iter().map(|(n, v)| (n.as_str(), *v));
    assert_eq!(secrets.check(&host, true, "GET", "/", iter), Ok(Carried::Nothing));
    let searched = SEARCHED.with(Cell::get);
    // The encoded half once more, decoded (a single round: it decodes to no further `%`).
    let bound = head + head / 2 + 1_000;
    assert!(
        searched <= bound,
        "searched {searched} bytes of a {head}-byte head (bound {bound})"
    );
    // A body chunk is searched once too, with the seam.
    SEARCHED.with(|n| n.set(0));
    let mut scan = secrets.body_scan(&host).unwrap();
    scan.feed(near.as_bytes()).unwrap();
    let searched = SEARCHED.with(Cell::get);
    assert!(searched <= 2 * near.len(), "{searched}");
}
