//! HTTP/1 rendering of a refusal: a status line whose reason phrase names the destination
//! and why (`403 sandgate: example.org:443 not in allowlist`, which is what pip and
//! Python's http.client print for a refused CONNECT, and curl shows with -v), an RFC 9209
//! `Proxy-Status` field, a challenge for 407, the request id (`Sandgate-Request-Id`, which
//! `curl -v` shows for a refused CONNECT, whose body it does not print), and a short body:
//! the same line, the request id with the command that explains it from the audit log
//! (`sandgate explain --request-id`, with `--audit-log PATH` when the configuration names
//! the log, as a run's does), and what to do next, in the words of whoever configured the
//! proxy ([`crate::config::Remedies`]). Details stay in the audit log.

use std::fmt::Write as _;

use crate::refusal::Classified;

/// Longest reason phrase written, in bytes: clients read status lines into small buffers
/// and some log them whole.
const MAX_PHRASE: usize = 160;

/// The status line's reason phrase: `sandgate: ` and the refusal's phrase, printable ASCII
/// only (RFC 9112 section 4 allows SP, HTAB, VCHAR and obs-text; CR and LF would end the
/// line, so anything but SP and VCHAR becomes `?`), at most [`MAX_PHRASE`] bytes.
fn reason_phrase(c: &Classified) -> String {
    let mut out = String::with_capacity(MAX_PHRASE);
    out.push_str("sandgate: ");
    for ch in c.phrase.chars() {
        if out.len() >= MAX_PHRASE {
            out.truncate(MAX_PHRASE - 3);
            out.push_str("...");
            break;
        }
        out.push(if matches!(ch, ' '..='~') { ch } else { '?' });
    }
    out
}

/// A refusal's body: the line, the request id with the command that explains it, what to
/// do next. Also the body of a refusal inside an intercepted tunnel.
pub(crate) fn body(c: &Classified, request_id: &str) -> String {
    // The log named when the configuration knows it (a run's), so the command finds the
    // request wherever the log is kept.
    let log = c
        .audit_log
        .as_ref()
        .map(|p| format!(" --audit-log {}", p.display()))
        .unwrap_or_default();
    let mut body = format!(
        "sandgate: {}\nrequest id: {request_id} (sandgate explain --request-id {request_id}{log})\n",
        c.text
    );
    for hint in &c.hints {
        body.push_str(hint);
        body.push('\n');
    }
    body
}

/// The whole response, ending with `Connection: close`.
pub(crate) fn render(c: &Classified, request_id: &str) -> Vec<u8> {
    let body = body(c, request_id);
    let details = sf_string(&c.text);
    // RFC 9110 section 11.7.1: a 407 says how to authenticate.
    let challenge = if c.status == 407 {
        "Proxy-Authenticate: Basic realm=\"sandgate\"\r\n"
    } else {
        ""
    };
    let mut head = String::with_capacity(320 + body.len());
    let _ = write!(
        head,
        "HTTP/1.1 {} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Proxy-Status: sandgate; error={}; details={details}\r\nSandgate-Request-Id: {request_id}\r\n\
         {challenge}Connection: close\r\n\r\n{body}",
        c.status,
        reason_phrase(c),
        body.len(),
        c.error_type,
    );
    head.into_bytes()
}

/// An RFC 8941 sf-string: printable ASCII in quotes, with `"` and `\` escaped.
pub(crate) fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Remedies, Setting};
    use crate::refusal::Refusal;
    use sandgate_policy::{PolicyReason, parse_connect_target};

    #[test]
    fn deny_names_destination_and_sets_proxy_status() {
        let target = parse_connect_target("evil.test:443").unwrap();
        let c = Refusal::Policy {
            target,
            reason: PolicyReason::NotAllowlisted,
            rule: None,
        }
        .classify("CONNECT", &Remedies::default());
        assert!(c.is_denial);
        let text = String::from_utf8(render(&c, "abc")).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 403 sandgate: evil.test:443 not in allowlist\r\n"),
            "{text}"
        );
        assert!(text.contains("Proxy-Status: sandgate; error=http_request_denied; details=\"denied CONNECT evil.test:443: not in allowlist\"\r\nSandgate-Request-Id: abc\r\n"));
        assert!(
            text.ends_with(
                "\r\n\r\nsandgate: denied CONNECT evil.test:443: not in allowlist\n\
             request id: abc (sandgate explain --request-id abc)\n\
             to allow it, add evil.test to the allowlist (spec.network.allowlist, or --allow evil.test)\n"
            ),
            "{text}"
        );
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
    }

    #[test]
    fn a_run_words_the_fix_in_its_own_terms_and_names_its_audit_log() {
        let run = Remedies {
            allow_hint: Setting {
                field: "net.allow_domains".into(),
                flag: Some("--allow-domain".into()),
            },
            range_hint: Setting {
                field: "net.allow_ranges".into(),
                flag: None,
            },
            audit_log: Some("/home/u/.local/state/sandgate/runs/run-1-0.jsonl".into()),
        };
        let c = Refusal::Policy {
            target: parse_connect_target("evil.test:443").unwrap(),
            reason: PolicyReason::NotAllowlisted,
            rule: None,
        }
        .classify("CONNECT", &run);
        let text = String::from_utf8(render(&c, "abc")).unwrap();
        assert!(
            text.ends_with(
                "request id: abc (sandgate explain --request-id abc --audit-log /home/u/.local/state/sandgate/runs/run-1-0.jsonl)\n\
             to allow it, add evil.test to the allowlist (net.allow_domains, or --allow-domain evil.test)\n"
            ),
            "{text}"
        );
        assert!(
            !text.contains("spec.network") && !text.contains("--allow "),
            "{text}"
        );
    }

    #[test]
    fn an_unusual_port_is_named_in_the_entry_and_ip_literals_keep_theirs() {
        let hint = |target: &str, method: &str| {
            Refusal::Policy {
                target: parse_connect_target(target).unwrap(),
                reason: PolicyReason::NotAllowlisted,
                rule: None,
            }
            .classify(method, &Remedies::default())
            .hints
            .join("\n")
        };
        assert!(hint("a.test:8443", "CONNECT").contains("--allow a.test:8443)"));
        assert!(hint("a.test:80", "GET").contains("--allow a.test)"));
        assert!(hint("a.test:443", "GET").contains("--allow a.test:443)"));
        assert!(hint("[2001:db8::1]:443", "CONNECT").contains("--allow [2001:db8::1]:443)"));
    }

    #[test]
    fn the_reason_phrase_stays_one_bounded_printable_line() {
        let mut c = Refusal::HeadTimeout.classify("-", &Remedies::default());
        c.phrase = format!("a\r\nInjected: yes\u{e9}{}", "x".repeat(500));
        let phrase = reason_phrase(&c);
        assert!(phrase.len() <= MAX_PHRASE, "{}", phrase.len());
        assert!(phrase.starts_with("sandgate: a??Injected: yes?x"), "{phrase}");
        assert!(phrase.ends_with("..."));
        assert!(phrase.bytes().all(|b| (b' '..=b'~').contains(&b)));
        let text = String::from_utf8(render(&c, "r")).unwrap();
        assert_eq!(text.lines().next().unwrap(), format!("HTTP/1.1 408 {phrase}"));
        assert!(!text.contains("Injected: yes\r\n"));
    }

    #[test]
    fn sf_string_escapes() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("ü"), "\"?\"");
    }
}
