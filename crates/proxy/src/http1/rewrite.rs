//! The heads the forwarder writes (RFC 9110 section 7.6): a request head sent upstream in
//! origin form (absolute form to an upstream proxy), with Host from the request-target, only
//! end-to-end fields, and this hop added to Via; a response head sent to the client the
//! same way, with `Connection: close` when the connection ends after it.

use sandgate_policy::HttpTarget;

use crate::h1::head::{Field, RequestHead, ResponseHead, end_to_end_fields};

/// Added to every forwarded message (RFC 9110 section 7.6.3).
const VIA: &str = "1.1 sandgate";

fn push_field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The request head sent upstream: origin-form target (absolute-form to an upstream proxy),
/// Host from the request-target,
/// end-to-end fields only, and Via.
pub(super) fn request_head_bytes(head: &RequestHead, http: &HttpTarget, absolute: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + head.fields.len() * 32);
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    if absolute {
        // Chained through an upstream proxy: it needs the absolute form to know the target.
        out.extend_from_slice(b"http://");
        out.extend_from_slice(http.authority.as_bytes());
    }
    out.extend_from_slice(http.origin_form.as_bytes());
    out.extend_from_slice(if head.minor_version == 0 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    push_field(&mut out, "Host", http.authority.as_bytes());
    for field in end_to_end_fields(&head.fields).filter(|f| !f.is("via")) {
        push_field(&mut out, &field.name, &field.value);
    }
    push_via(&mut out, &head.fields);
    out.extend_from_slice(b"\r\n");
    out
}

/// The response head sent to the client: end-to-end fields, Via, and `Connection: close`
/// when this connection ends after the response.
pub(super) fn response_head_bytes(head: &ResponseHead, close: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + head.fields.len() * 32);
    out.extend_from_slice(b"HTTP/1.");
    decimal(&mut out, head.minor_version.into());
    out.push(b' ');
    decimal(&mut out, head.status);
    out.push(b' ');
    out.extend_from_slice(head.reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    for field in end_to_end_fields(&head.fields).filter(|f| !f.is("via")) {
        push_field(&mut out, &field.name, &field.value);
    }
    push_via(&mut out, &head.fields);
    if close {
        push_field(&mut out, "Connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The Via field: any Via the message already carries, then this hop. Written in place
/// (no `fmt`, no copies of valid values): every forwarded message has one.
fn push_via(out: &mut Vec<u8>, fields: &[Field]) {
    out.extend_from_slice(b"Via: ");
    for prior in fields.iter().filter(|f| f.is("via")) {
        out.extend_from_slice(String::from_utf8_lossy(&prior.value).as_bytes());
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(VIA.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal, without `fmt` (itoa).
fn decimal(out: &mut Vec<u8>, n: u16) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}
