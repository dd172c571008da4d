use super::canonical::LOOKALIKES;
use super::*;

fn path(p: &str) -> CanonicalPath {
    CanonicalPath::parse(p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn pat(p: &str) -> PathPattern {
    PathPattern::parse(p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn rules(
    methods: Option<&[&str]>,
    paths: Option<&[&str]>,
    read_only: bool,
) -> Result<Option<RequestRules>, RulesError> {
    let own = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let methods = methods.map(own);
    let paths = paths.map(own);
    RequestRules::new(methods.as_deref(), paths.as_deref(), read_only)
}

#[test]
fn patterns_match_segment_by_segment() {
    let table: &[(&str, &str, bool)] = &[
        ("/myorg/**", "/myorg", true),
        ("/myorg/**", "/myorg/", true),
        ("/myorg/**", "/myorg/repo/info/refs", true),
        ("/myorg/**", "/myorgx/repo", false),
        ("/myorg/**", "/other/myorg/x", false),
        (
            "/myorg/*/git-upload-pack",
            "/myorg/repo.git/git-upload-pack",
            true,
        ),
        ("/myorg/*/git-upload-pack", "/myorg/a/b/git-upload-pack", false),
        (
            "/myorg/*/git-upload-pack",
            "/myorg/repo.git/git-receive-pack",
            false,
        ),
        ("/**/info/refs", "/a/b/c/info/refs", true),
        ("/**/info/refs", "/info/refs", true),
        ("/**/info/refs", "/a/info/refs/x", false),
        ("/a/b", "/a/b/", false),
        ("/a/b/", "/a/b/", true),
        ("/a/b/", "/a/b", false),
        ("/", "/", true),
        ("/", "/a", false),
        ("/**", "/", true),
        ("/**", "/anything/at/all", true),
        ("/v1/*.json", "/v1/a.json", true),
        ("/v1/*.json", "/v1/.json", true),
        ("/v1/*.json", "/v1/a.json/x", false),
        ("/v1/a*b*c", "/v1/abc", true),
        ("/v1/a*b*c", "/v1/aXbYc", true),
        ("/v1/a*b*c", "/v1/acb", false),
        ("/v1/a*a", "/v1/a", false),
        ("/v1/a*a", "/v1/aa", true),
        ("/a/*", "/a/", false),
        ("/Org/**", "/org/x", false),
        ("/a%20b/**", "/a b/x", true),
        ("/a%20b/**", "/a%20b/x", true),
    ];
    for (p, request, expected) in table {
        assert_eq!(pat(p).matches(&path(request)), *expected, "{p} against {request}");
    }
}

#[test]
fn the_query_is_not_the_path() {
    assert!(pat("/myorg/**").matches(&path("/myorg/a?next=../../other")));
    assert!(pat("/myorg/**").matches(&path("/myorg/a?x=%2f..%2f")));
    assert_eq!(path("/a/b?q").decoded(), "/a/b");
}

#[test]
fn spellings_a_server_may_read_as_another_path_are_refused() {
    let table: &[(&str, PathError)] = &[
        ("/myorg/%2e%2e/other/x", PathError::DotSegment),
        ("/myorg/%2E%2E/other", PathError::DotSegment),
        ("/myorg/../other", PathError::DotSegment),
        ("/myorg/./x", PathError::DotSegment),
        ("/myorg/.%2e/x", PathError::DotSegment),
        ("/myorg/..;/other", PathError::DotSegment),
        ("/myorg/.;x=1/other", PathError::DotSegment),
        ("/myorg/x;y/other", PathError::Parameter),
        ("/myorg/..%3b/other", PathError::DotSegment),
        ("/myorg/..%2fother/x", PathError::Separator),
        ("/myorg%2Fx", PathError::Separator),
        ("/myorg%2fx", PathError::Separator),
        ("/myorg/x%5c..%5c..%5cother", PathError::Separator),
        ("/myorg/x\\..\\other", PathError::Separator),
        ("/myorg//x", PathError::EmptySegment),
        ("//myorg/x", PathError::EmptySegment),
        ("/myorg/%zz", PathError::Encoding),
        ("/myorg/%2", PathError::Encoding),
        ("/myorg/%+1", PathError::Encoding),
        ("/myorg/x%00", PathError::Control),
        ("/myorg/x%0a", PathError::Control),
        ("/myorg/%ff", PathError::Utf8),
        ("/myorg/%c0%ae%c0%ae/x", PathError::Utf8),
        ("/myorg/%ef%bc%8e%ef%bc%8e/x", PathError::Lookalike),
        ("/myorg/\u{FF0F}x", PathError::Lookalike),
        ("/myorg/\u{2025}/x", PathError::Lookalike),
        ("/myorg/%EF%B8%B0/other", PathError::Lookalike),
        ("/myorg/%EF%B8%99/other", PathError::Lookalike),
        ("/myorg/a%E2%84%80/x", PathError::Lookalike),
        ("/myorg/x%E2%84%85y", PathError::Lookalike),
        ("/myorg/%E2%92%88", PathError::Lookalike),
        ("/myorg/..%C2%85/other", PathError::Control),
        ("/myorg/%C2%80", PathError::Control),
        ("/myorg/%C2%9F", PathError::Control),
        ("/myorg/..%20/other", PathError::DotSegment),
        ("/myorg/%20.%20/other", PathError::DotSegment),
        ("/myorg/..%E2%80%A8/other", PathError::DotSegment),
        ("myorg/x", PathError::NotAbsolute),
        ("*", PathError::NotAbsolute),
    ];
    for (p, expected) in table {
        assert_eq!(CanonicalPath::parse(p), Err(*expected), "{p}");
    }
    // Decoded, an unreserved character is itself; a dot within a name is no dot segment.
    assert_eq!(path("/myorg/%41bc").decoded(), "/myorg/Abc");
    assert_eq!(CanonicalPath::parse("/myorg/..."), Err(PathError::DotSegment));
    assert_eq!(
        CanonicalPath::parse("/myorg/..%20./x"),
        Err(PathError::DotSegment)
    );
    assert_eq!(
        CanonicalPath::parse("/files/app.jsp;.txt"),
        Err(PathError::Parameter)
    );
    assert_eq!(
        CanonicalPath::parse("/public/%252e%252e/admin"),
        Err(PathError::Encoding)
    );
    assert_eq!(CanonicalPath::parse("/public/%2523"), Err(PathError::Encoding));
    assert!(pat("/myorg/*").matches(&path("/myorg/.git")));
    assert!(pat("/myorg/*").matches(&path("/myorg/a.b.c")));
}

#[test]
fn the_lookalike_table_is_sorted() {
    assert!(LOOKALIKES.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn patterns_are_checked_as_strictly_as_paths() {
    for bad in [
        "myorg/**",
        "",
        "/a//b",
        "/a/**x",
        "/a/***",
        "/a/../b",
        "/a/%2e%2e/b",
        "/a/%2F",
        "/a?x",
        "/a#x",
        "/a\\b",
    ] {
        assert!(PathPattern::parse(bad).is_err(), "{bad:?}");
    }
    assert!(PathPattern::parse(&format!("/{}", "a".repeat(1024))).is_err());
}

#[test]
fn what_a_method_and_path_cannot_judge() {
    for (method, body, expected) in [
        ("GET", false, true),
        ("GET", true, false),
        ("HEAD", true, false),
        ("OPTIONS", true, false),
        ("POST", true, true),
        ("TRACE", false, false),
        ("TRACK", false, false),
        ("CONNECT", false, false),
    ] {
        assert_eq!(judgeable(method, body), expected, "{method} body={body}");
    }
}

#[test]
fn methods_are_exact_and_read_only_is_get_head_options() {
    let ro = rules(None, None, true).unwrap().unwrap();
    let root = path("/");
    for m in ["GET", "HEAD", "OPTIONS"] {
        assert!(ro.allows(m, &root), "{m}");
    }
    for m in ["POST", "PUT", "PATCH", "DELETE", "get", "CONNECT", "TRACE"] {
        assert!(!ro.allows(m, &root), "{m}");
    }
    assert_eq!(ro.to_string(), "read-only");
    let fetch = rules(Some(&["POST"]), Some(&["/o/*/git-upload-pack"]), false)
        .unwrap()
        .unwrap();
    assert!(fetch.allows("POST", &path("/o/r.git/git-upload-pack")));
    assert!(!fetch.allows("POST", &path("/o/r.git/git-receive-pack")));
    assert!(!fetch.allows("GET", &path("/o/r.git/git-upload-pack")));
    assert!(!fetch.allows_any_path("POST"));
    assert_eq!(fetch.to_string(), "POST /o/*/git-upload-pack");
    let only_paths = rules(None, Some(&["/a/**"]), false).unwrap().unwrap();
    assert!(only_paths.allows("DELETE", &path("/a/x")));
}

#[test]
fn rules_refuse_what_cannot_be_meant() {
    assert_eq!(rules(None, None, false), Ok(None));
    assert_eq!(rules(Some(&[]), None, false), Err(RulesError::Empty));
    assert_eq!(rules(None, Some(&[]), false), Err(RulesError::Empty));
    assert_eq!(
        rules(Some(&["GET"]), None, true),
        Err(RulesError::ReadOnlyAndMethods)
    );
    for bad in ["get", "", "GE T", "G\u{e9}T", "X".repeat(33).as_str()] {
        assert!(
            matches!(rules(Some(&[bad]), None, false), Err(RulesError::Method(_))),
            "{bad:?}"
        );
    }
    assert!(matches!(
        rules(None, Some(&["/a//b"]), false),
        Err(RulesError::Path { .. })
    ));
}

/// A policy with the rules as a user writes them, decided as the proxy decides.
mod decided {
    use crate::{
        Access, Context, PolicyReason, RequestLine, Ruleset, Verdict, parse_connect_target, parse_policy,
    };

    const POLICY: &str = "apiVersion: sandgate.dev/v1
kind: EgressPolicy
metadata: { name: t }
spec:
  network:
    allowlist:
      - host: git.example
        methods: [GET, HEAD]
        paths: [\"/myorg/**\"]
      - host: git.example
        methods: [POST]
        paths: [\"/myorg/*/git-upload-pack\"]
      - host: api.example
        read_only: true
      - host: open.example
      - host: both.example
        read_only: true
      - host: both.example
";

    fn rules() -> Ruleset {
        let file = parse_policy(POLICY, "p.yaml", 0).unwrap();
        Ruleset::from_parts(&[], &[], Some(&file))
    }

    fn http(r: &Ruleset, host: &str, method: &str, target: &str) -> (Verdict, PolicyReason, Option<String>) {
        let d = r.decide_request(
            &parse_connect_target(&format!("{host}:80")).unwrap(),
            Access::Http,
            &Context::system(0),
            Some(RequestLine { method, target }),
        );
        (d.verdict, d.reason, d.rule_label().map(|l| l.to_string()))
    }

    #[test]
    fn clone_passes_and_push_is_refused_naming_the_rule() {
        let r = rules();
        let allow = |m, t| http(&r, "git.example", m, t).0 == Verdict::Allow;
        assert!(allow("GET", "/myorg/repo.git/info/refs?service=git-upload-pack"));
        assert!(allow("POST", "/myorg/repo.git/git-upload-pack"));
        // Push discovery is a GET under /myorg/; the push itself is the POST refused.
        let (v, reason, rule) = http(&r, "git.example", "POST", "/myorg/repo.git/git-receive-pack");
        assert_eq!((v, reason), (Verdict::Deny, PolicyReason::RequestNotAllowed));
        assert_eq!(
            rule.as_deref(),
            Some("allow:git.example[GET,HEAD /myorg/**] (p.yaml:7)")
        );
        assert_eq!(
            http(&r, "git.example", "GET", "/other/repo.git/info/refs").1,
            PolicyReason::RequestNotAllowed
        );
        assert_eq!(
            http(&r, "git.example", "GET", "/myorg/%2e%2e/other/repo.git/info/refs").1,
            PolicyReason::PathNotCanonical
        );
        assert_eq!(
            http(&r, "elsewhere.example", "GET", "/").1,
            PolicyReason::NotAllowlisted
        );
    }

    #[test]
    fn a_tunnel_to_a_host_with_request_rules_only_is_refused_and_an_open_entry_still_tunnels() {
        let r = rules();
        let tunnel = |host: &str, access| {
            let d = r.decide(
                &parse_connect_target(&format!("{host}:443")).unwrap(),
                access,
                &Context::system(0),
            );
            (d.verdict, d.reason)
        };
        for access in [Access::Connect, Access::Socks5] {
            assert_eq!(
                tunnel("git.example", access),
                (Verdict::Deny, PolicyReason::InspectionRequired)
            );
            assert_eq!(tunnel("open.example", access).0, Verdict::Allow);
            // An entry without rules for the same host allows it whole.
            assert_eq!(tunnel("both.example", access).0, Verdict::Allow);
        }
        assert_eq!(http(&r, "both.example", "DELETE", "/x").0, Verdict::Allow);
    }

    #[test]
    fn read_only_allows_reading_only() {
        let r = rules();
        for m in ["GET", "HEAD", "OPTIONS"] {
            assert_eq!(http(&r, "api.example", m, "/v1/x").0, Verdict::Allow, "{m}");
        }
        for m in ["POST", "PUT", "PATCH", "DELETE"] {
            assert_eq!(
                http(&r, "api.example", m, "/v1/x"),
                (
                    Verdict::Deny,
                    PolicyReason::RequestNotAllowed,
                    Some("allow:api.example[read-only] (p.yaml:13)".into())
                ),
                "{m}"
            );
        }
        // No path rule: a path no rule reads is no reason to refuse a read.
        assert_eq!(http(&r, "api.example", "GET", "/a/../b").0, Verdict::Allow);
    }

    #[test]
    fn what_a_rule_cannot_mean_is_an_error_naming_the_field() {
        let bad = |entries: &str| {
            let doc = format!(
                "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: t }}\nspec:\n  network:\n{entries}"
            );
            parse_policy(&doc, "p.yaml", 0).unwrap_err().to_string()
        };
        let e = bad("    denylist:\n      - host: x.example\n        methods: [POST]\n");
        assert!(
            e.contains("spec.network.denylist.methods") && e.contains("a deny entry"),
            "{e}"
        );
        let e = bad("    allowlist:\n      - host: x.example\n        methods: [get]\n");
        assert!(
            e.contains("spec.network.allowlist.methods") && e.contains("uppercase"),
            "{e}"
        );
        let e = bad("    allowlist:\n      - host: x.example\n        paths: [\"/a/../b\"]\n");
        assert!(e.contains("spec.network.allowlist.paths"), "{e}");
        let e =
            bad("    allowlist:\n      - host: x.example\n        read_only: true\n        methods: [GET]\n");
        assert!(e.contains("spec.network.allowlist.read_only"), "{e}");
        let e = bad("    allowlist:\n      - host: x.example\n        paths: []\n");
        assert!(
            e.contains("spec.network.allowlist.paths") && e.contains("empty"),
            "{e}"
        );
    }
}

#[test]
fn within_proves_what_it_can_and_refuses_the_rest() {
    let within = |i: &str, o: &str| pat(i).within(&pat(o));
    assert!(within("/org/repo", "/org/**"));
    assert!(within("/org/repo/info/refs", "/org/*/info/refs"));
    assert!(within("/org/**", "/org/**"));
    assert!(within("/org/*/x", "/**"));
    assert!(within("/org/a*b", "/org/*"));
    assert!(within("/org/v1.json", "/org/*.json"));
    assert!(within("/a/**/b", "/**/b"));
    // Wider, or not provable: refused.
    assert!(!within("/org/**", "/org/*"));
    assert!(!within("/org", "/org/**/x"));
    assert!(!within("/**", "/org/**"));
    assert!(!within("/org/*", "/org/repo"));
    assert!(!within("/org/a*", "/org/a*b"));
    assert!(!within("/org/", "/org/*"));
    assert!(within("/org/", "/org/**"));
}

/// An origin that decodes the path before it splits off the query (CVE-2024-38474) reads
/// `secret.key%3F.tar.gz` as `secret.key` with a query: the rule `/files/*.tar.gz` must not
/// admit it, in any case of the hex digits, nor a `#` that ends the path the same way, nor
/// a compatibility form of either that a server normalising Unicode turns into one.
#[test]
fn an_encoded_query_or_fragment_delimiter_is_refused() {
    let rule = pat("/files/*.tar.gz");
    for p in [
        "/files/secret.key%3F.tar.gz",
        "/files/secret.key%3f.tar.gz",
        "/files/secret.key%23.tar.gz",
        "/files/secret.key#.tar.gz",
        "/files/%3F/x.tar.gz",
        "/files/secret.key%EF%BC%9F.tar.gz",
        "/files/secret.key%EF%BC%83.tar.gz",
        "/files/secret.key\u{FE16}.tar.gz",
        "/files/secret.key\u{2047}.tar.gz",
        "/files/secret.key\u{FE5F}.tar.gz",
    ] {
        let parsed = CanonicalPath::parse(p);
        assert!(
            parsed
                .as_ref()
                .is_err_and(|e| *e == PathError::Delimiter || *e == PathError::Lookalike),
            "{p}: {parsed:?} (matched by the rule: {})",
            parsed.as_ref().is_ok_and(|c| rule.matches(c))
        );
    }
    assert_eq!(CanonicalPath::parse("/files/a%3Fb"), Err(PathError::Delimiter));
    assert_eq!(CanonicalPath::parse("/files/a%23b"), Err(PathError::Delimiter));
    assert_eq!(
        CanonicalPath::parse("/files/a\u{FF1F}b"),
        Err(PathError::Lookalike)
    );
    // A real query is still only the query, and a pattern cannot name either character.
    assert!(rule.matches(&path("/files/x.tar.gz?a=%3F%23")));
    assert!(PathPattern::parse("/files/%3F").is_err());
    assert!(PathPattern::parse("/files/%23").is_err());
}

/// Every code point whose NFKC form holds `%` or `;` is a look-alike too: `％3F` is `%3F`,
/// then `?`, to a server that normalises before it decodes (the fullwidth `％`, U+FF05, in
/// `/files/secret.key％3F.tar.gz`), and `；` starts path parameters.
#[test]
fn percent_and_semicolon_lookalikes_are_refused() {
    for c in [
        '\u{FF05}', '\u{FE6A}', '\u{037E}', '\u{FE14}', '\u{FE54}', '\u{FF1B}',
    ] {
        let mut utf8 = [0; 4];
        let encoded: String = c
            .encode_utf8(&mut utf8)
            .bytes()
            .map(|b| format!("%{b:02X}"))
            .collect();
        let p = format!("/files/secret.key{encoded}3F.tar.gz");
        assert_eq!(
            CanonicalPath::parse(&p),
            Err(PathError::Lookalike),
            "U+{:04X}",
            c as u32
        );
        assert_eq!(
            LOOKALIKES.binary_search(&c).map(|_| ()),
            Ok(()),
            "U+{:04X}",
            c as u32
        );
    }
    assert_eq!(LOOKALIKES.len(), 52, "Python's unicodedata lists 52 (Unicode 14)");
}
