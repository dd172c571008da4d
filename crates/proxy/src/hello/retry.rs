//! The second ClientHello of a TLS 1.3 handshake. A server that cannot use the client's key
//! share answers the first ClientHello with a HelloRetryRequest (a ServerHello whose random
//! is a fixed value, RFC 8446 section 4.1.3), and the client sends a second ClientHello. RFC
//! 8446 says it must name the same server, but a server that picks its site in an SNI
//! callback acts on the second name: so the second hello is read and checked too.
//!
//! Only tunnels whose first bytes were a ClientHello get here. The server's first record is
//! read (bounded in bytes and time) and forwarded unchanged; if it is no HelloRetryRequest,
//! that is all. If it is, the client's next flight (a ChangeCipherSpec may come first) is
//! read the same way as the first bytes and returned for the caller to judge and forward.

use std::io;
use std::time::Duration;

use crate::relay::Leg;

use super::{MAX_FIRST_BYTES, Seen, examine, read_some};

/// The random of a HelloRetryRequest: SHA-256 of "HelloRetryRequest".
const HRR_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91, 0xc2,
    0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];

/// Bytes of a server's first record up to the end of a ServerHello's random: the record
/// header (5), the handshake header (4), the legacy version (2), the random (32).
const SERVER_HELLO_PREFIX: usize = 5 + 4 + 2 + 32;

/// What the server's first bytes were.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ServerFirst {
    /// Not a HelloRetryRequest (a ServerHello, an alert, nothing in time): nothing more to
    /// check. The bytes read go to the client.
    Done(Vec<u8>),
    /// A HelloRetryRequest: the bytes read go to the client, then the client's second
    /// ClientHello is to be read.
    Retry(Vec<u8>),
}

/// Whether `buf` begins with a HelloRetryRequest; `None` while too short to tell.
pub(crate) fn is_retry(buf: &[u8]) -> Option<bool> {
    match buf {
        [0x16, 0x03, _, _, _, 0x02, ..] => {}
        [] | [0x16] | [0x16, 0x03] | [0x16, 0x03, _] | [0x16, 0x03, _, _] | [0x16, 0x03, _, _, _] => {
            return None;
        }
        _ => return Some(false),
    }
    let random = buf.get(SERVER_HELLO_PREFIX - 32..SERVER_HELLO_PREFIX)?;
    Some(random == HRR_RANDOM)
}

/// Reads the server's first bytes, at most until a HelloRetryRequest can be told apart.
pub(crate) async fn read_server_first(upstream: &mut Leg<'_>, limit: Duration) -> ServerFirst {
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match is_retry(&buf) {
            Some(true) => return ServerFirst::Retry(buf),
            Some(false) => return ServerFirst::Done(buf),
            None => {}
        }
        let ready = tokio::time::timeout_at(deadline, upstream.readable()).await;
        if !matches!(ready, Ok(Ok(()))) {
            return ServerFirst::Done(buf);
        }
        match read_some(upstream, &mut buf, 4096) {
            Ok(0) => return ServerFirst::Done(buf),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return ServerFirst::Done(buf),
        }
    }
}

/// Judges the client's second flight: leading ChangeCipherSpec records are skipped, and
/// what follows must be a readable ClientHello. `None` while more bytes are needed, never
/// past [`MAX_FIRST_BYTES`] (records that claim more, however they are cut, are refused).
pub(crate) fn examine_second(buf: &[u8]) -> Option<Seen> {
    if buf.len() >= MAX_FIRST_BYTES {
        return match examine_second_within(buf) {
            Some(seen) => Some(seen),
            None => Some(Seen::Unreadable),
        };
    }
    examine_second_within(buf)
}

fn examine_second_within(buf: &[u8]) -> Option<Seen> {
    let mut rest = buf;
    while let [0x14, ..] = rest {
        let [_, 0x03, _, hi, lo, ..] = rest else {
            // A ChangeCipherSpec header still arriving (or not one at all).
            return if rest.len() < 5 {
                None
            } else {
                Some(Seen::Unreadable)
            };
        };
        let len = 5 + usize::from(u16::from_be_bytes([*hi, *lo]));
        rest = rest.get(len..)?;
    }
    match examine(rest) {
        // After a HelloRetryRequest nothing but a ClientHello may come.
        Some(Seen::NotTls) => Some(Seen::Unreadable),
        None if buf.len() >= MAX_FIRST_BYTES => Some(Seen::Unreadable),
        other => other,
    }
}

/// Reads the client's second flight until it can be judged (or `limit` passes).
pub(crate) async fn read_second(client: &mut Leg<'_>, limit: Duration) -> (Vec<u8>, Seen) {
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(seen) = examine_second(&buf) {
            return (buf, seen);
        }
        let ready = tokio::time::timeout_at(deadline, client.readable()).await;
        if !matches!(ready, Ok(Ok(()))) {
            return (buf, Seen::Unreadable);
        }
        match read_some(client, &mut buf, 4096) {
            Ok(0) => return (buf, Seen::Closed),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return (buf, Seen::Closed),
        }
    }
}
