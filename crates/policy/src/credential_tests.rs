use super::*;

fn secrets() -> BoundSecrets {
    BoundSecrets::new(vec![Credential {
        host: Host::parse("api.example").unwrap(),
        header: "authorization".into(),
        value: ValueTemplate::parse("Bearer ${env:KEY}").unwrap().fill("sk-real"),
        placeholder: "SANDGATE_EXAMPLE".into(),
        inspect_body: false,
        origin: Arc::from("p.yaml:9"),
    }])
}

fn check(host: &str, seen: bool, target: &str, fields: &[(&str, &str)]) -> Result<Carried, Leak> {
    secrets().check(
        &Host::parse(host).unwrap(),
        seen,
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
