//! The line's JSON, written by hand: byte for byte what `serde_json` writes for a [`Line`]
//! (its field order, `null` for an absent field, its string escapes: `\"`, `\\`, the
//! short forms `\b \t \n \f \r`, `\u00XX` for other control characters, everything else
//! verbatim), tested against it below.
//!
//! Why not `serde_json`: a line has 41 fields, most of them `null`, and the writer encodes
//! two lines per request on the proxy's one core. Through serde each field is a map entry
//! with its key escaped at run time and each address formatted through `fmt`; the profile of
//! keep-alive GETs had the encoding at a tenth of the proxy's CPU (issue 32). Here the keys
//! are constants and the common values (IPv4 addresses, integers, plain ASCII strings) are
//! written without `fmt`.
//!
//! The destructuring in [`Line::write_json`] names every field, so a field added to
//! [`Line`] does not compile until it is written here too.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use sandgate_policy::Verdict;

use super::Line;

impl Line<'_> {
    /// Appends the line's JSON object (no newline) to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        // A GET's lines are about 750 bytes: one reservation, not one per field.
        out.reserve(1024);
        let Line {
            schema_version,
            event,
            created_at,
            request_id,
            client_addr,
            task_id,
            project_id,
            job_id,
            decision,
            reason_code,
            scheme,
            method,
            destination_host,
            destination_port,
            resolved_ip,
            rule,
            status,
            bytes_sent,
            bytes_received,
            duration_ms,
            outcome,
            detail,
            count,
            window_start,
            exception_id,
            hosts,
            ports,
            ttl_seconds,
            reason,
            requested_by,
            decided_by,
            expires_at,
            subject,
            tls_server_name,
            node,
            would_deny,
            agent,
            path,
            methods,
            paths,
            tweak,
        } = self;
        out.extend_from_slice(b"{\"schema_version\":");
        uint(out, u64::from(*schema_version));
        out.extend_from_slice(b",\"event\":");
        string(out, event.as_str());
        out.extend_from_slice(b",\"created_at\":");
        string(out, created_at);
        out.extend_from_slice(b",\"request_id\":");
        string(out, request_id);
        out.extend_from_slice(b",\"client_addr\":");
        option(out, *client_addr, socket_addr);
        str_field(out, b",\"task_id\":", *task_id);
        str_field(out, b",\"project_id\":", *project_id);
        str_field(out, b",\"job_id\":", *job_id);
        out.extend_from_slice(b",\"decision\":");
        option(out, *decision, |out, v| {
            string(
                out,
                match v {
                    Verdict::Allow => "allow",
                    Verdict::Deny => "deny",
                },
            )
        });
        str_field(out, b",\"reason_code\":", *reason_code);
        str_field(out, b",\"scheme\":", *scheme);
        str_field(out, b",\"method\":", *method);
        str_field(out, b",\"destination_host\":", *destination_host);
        uint_field(out, b",\"destination_port\":", destination_port.map(u64::from));
        out.extend_from_slice(b",\"resolved_ip\":");
        option(out, *resolved_ip, |out, ip| {
            out.push(b'"');
            ip_addr(out, ip);
            out.push(b'"');
        });
        str_field(out, b",\"rule\":", *rule);
        uint_field(out, b",\"status\":", status.map(u64::from));
        uint_field(out, b",\"bytes_sent\":", *bytes_sent);
        uint_field(out, b",\"bytes_received\":", *bytes_received);
        uint_field(out, b",\"duration_ms\":", *duration_ms);
        str_field(out, b",\"outcome\":", *outcome);
        str_field(out, b",\"detail\":", *detail);
        uint_field(out, b",\"count\":", *count);
        str_field(out, b",\"window_start\":", *window_start);
        str_field(out, b",\"exception_id\":", *exception_id);
        out.extend_from_slice(b",\"hosts\":");
        option(out, *hosts, |out, hosts| {
            array(out, hosts, |out, h| string(out, h))
        });
        out.extend_from_slice(b",\"ports\":");
        option(out, *ports, |out, ports| {
            array(out, ports, |out, p| uint(out, u64::from(*p)))
        });
        uint_field(out, b",\"ttl_seconds\":", ttl_seconds.map(u64::from));
        str_field(out, b",\"reason\":", *reason);
        str_field(out, b",\"requested_by\":", *requested_by);
        str_field(out, b",\"decided_by\":", *decided_by);
        str_field(out, b",\"expires_at\":", expires_at.as_deref());
        str_field(out, b",\"subject\":", *subject);
        str_field(out, b",\"tls_server_name\":", *tls_server_name);
        str_field(out, b",\"node\":", *node);
        str_field(out, b",\"would_deny\":", *would_deny);
        str_field(out, b",\"agent\":", *agent);
        str_field(out, b",\"path\":", *path);
        out.extend_from_slice(b",\"methods\":");
        option(out, methods.as_deref(), |out, methods| {
            array(out, methods, |out, m| string(out, m))
        });
        out.extend_from_slice(b",\"paths\":");
        option(out, *paths, |out, paths| {
            array(out, paths, |out, p| string(out, p))
        });
        str_field(out, b",\"tweak\":", tweak.as_deref());
        out.push(b'}');
    }
}

fn option<T>(out: &mut Vec<u8>, value: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    match value {
        Some(v) => write(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

fn str_field(out: &mut Vec<u8>, key: &[u8], value: Option<&str>) {
    out.extend_from_slice(key);
    option(out, value, string);
}

fn uint_field(out: &mut Vec<u8>, key: &[u8], value: Option<u64>) {
    out.extend_from_slice(key);
    option(out, value, uint);
}

fn array<T>(out: &mut Vec<u8>, items: &[T], mut write: impl FnMut(&mut Vec<u8>, &T)) {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write(out, item);
    }
    out.push(b']');
}

/// A JSON string, escaped as `serde_json` escapes it (RFC 8259 section 7: `"`, `\` and the
/// control characters must be; nothing else is).
fn string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    // Most strings (times, ids, names, addresses) need no escape: checked with no branch per
    // byte (the compiler vectorises the fold), then copied whole.
    let plain = bytes
        .iter()
        .fold(true, |plain, &b| plain & (b >= 0x20) & (b != b'"') & (b != b'\\'));
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    if plain {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0a => b"\\n",
            0x0c => b"\\f",
            0x0d => b"\\r",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(bytes.get(start..i).unwrap_or_default());
        start = i + 1;
        if short.is_empty() {
            let hex = |n: u8| HEX.get(usize::from(n)).copied().unwrap_or(b'0');
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', hex(b >> 4), hex(b & 0xf)]);
        } else {
            out.extend_from_slice(short);
        }
    }
    out.extend_from_slice(bytes.get(start..).unwrap_or_default());
    out.push(b'"');
}

/// A decimal integer, without `fmt` (itoa: what serde_json itself writes integers with).
fn uint(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn ipv4(out: &mut Vec<u8>, ip: Ipv4Addr) {
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push(b'.');
        }
        uint(out, u64::from(octet));
    }
}

/// An address as its `Display` writes it (IPv6 through `Display` itself: rare here, and its
/// compressed form is the standard library's to define).
fn ip_addr(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => ipv4(out, v4),
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// A socket address as a JSON string, as serde writes it (its `Display`).
fn socket_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    out.push(b'"');
    match addr {
        SocketAddr::V4(v4) => {
            ipv4(out, *v4.ip());
            out.push(b':');
            uint(out, u64::from(v4.port()));
        }
        SocketAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests;
