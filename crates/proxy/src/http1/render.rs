//! HTTP/1 rendering of a refusal: the status line, an RFC 9209 `Proxy-Status` field, a
//! challenge for 407, and a one-line body naming the destination and the request id. Bodies
//! stay short; details go to the audit log under that request id.

use std::fmt::Write as _;

use crate::refusal::Classified;

fn status_text(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// The whole response, ending with `Connection: close`.
pub(crate) fn render(c: &Classified, request_id: &str) -> Vec<u8> {
    let body = format!("sandgate: {} (request {request_id})\n", c.text);
    let details = sf_string(&c.text);
    // RFC 9110 section 11.7.1: a 407 says how to authenticate.
    let challenge = if c.status == 407 {
        "Proxy-Authenticate: Basic realm=\"sandgate\"\r\n"
    } else {
        ""
    };
    let mut head = String::with_capacity(160 + body.len());
    let _ = write!(
        head,
        "HTTP/1.1 {} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Proxy-Status: sandgate; error={}; details={details}\r\n{challenge}Connection: close\r\n\r\n{body}",
        c.status,
        status_text(c.status),
        body.len(),
        c.error_type,
    );
    head.into_bytes()
}

/// An RFC 8941 sf-string: printable ASCII in quotes, with `"` and `\` escaped.
fn sf_string(text: &str) -> String {
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
    use crate::refusal::Refusal;
    use sandgate_policy::{PolicyReason, parse_connect_target};

    #[test]
    fn deny_names_destination_and_sets_proxy_status() {
        let target = parse_connect_target("evil.test:443").unwrap();
        let c = Refusal::Policy {
            target,
            reason: PolicyReason::NotAllowlisted,
        }
        .classify("CONNECT");
        assert!(c.is_denial);
        let text = String::from_utf8(render(&c, "abc")).unwrap();
        assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        assert!(text.contains("Proxy-Status: sandgate; error=http_request_denied; details=\"denied CONNECT evil.test:443: not in allowlist\"\r\n"));
        assert!(text.ends_with("sandgate: denied CONNECT evil.test:443: not in allowlist (request abc)\n"));
    }

    #[test]
    fn sf_string_escapes() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("ü"), "\"?\"");
    }
}
