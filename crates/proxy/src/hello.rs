//! A tunnel's first bytes: read (bounded in bytes and time), kept unchanged to be forwarded,
//! and recognised as a TLS ClientHello (with its server name) or not. rustls's `Acceptor`
//! parses the ClientHello, reassembling one split over several records; nothing is
//! decrypted, and no TLS session is started here. What the bytes may be is the policy's
//! call ([`sandgate_policy::TunnelRules::check`]).
//!
//! A first record that looks like a TLS handshake but that rustls cannot read as a
//! ClientHello is [`Seen::Unreadable`], not "not TLS": a crafted hello the parser rejects
//! but a server accepts must not slip past the name check.

use std::io;

use crate::relay::Leg;
use sandgate_policy::FirstBytes;

/// At most this many bytes are read before the first bytes are judged (a ClientHello with
/// post-quantum key shares is about 2 KiB; one TLS record holds 16 KiB).
pub const MAX_FIRST_BYTES: usize = 24 * 1024;

/// TLS record content type of a handshake.
const HANDSHAKE: u8 = 0x16;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 0x01;
/// Every TLS record content type: change_cipher_spec, alert, handshake, application_data.
const TLS_CONTENT_TYPES: [u8; 4] = [0x14, 0x15, 0x16, 0x17];

/// What the first bytes were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    ClientHello {
        server_name: Option<String>,
    },
    /// Not a TLS record at all.
    NotTls,
    /// A TLS handshake record, but not a ClientHello rustls can read (malformed, cut
    /// short, or larger than [`MAX_FIRST_BYTES`]).
    Unreadable,
    ServerFirst,
    Silent,
    /// The client closed (a clean end) before sending anything.
    Closed,
    /// The client's connection failed (a reset) before it sent anything: there is nothing
    /// to carry.
    Reset,
}

impl Seen {
    /// The policy's view.
    pub fn as_first_bytes(&self) -> FirstBytes<'_> {
        match self {
            Seen::ClientHello { server_name } => FirstBytes::ClientHello {
                server_name: server_name.as_deref(),
            },
            Seen::NotTls => FirstBytes::NotTls,
            Seen::Unreadable => FirstBytes::UnreadableHello,
            Seen::ServerFirst => FirstBytes::ServerFirst,
            Seen::Silent => FirstBytes::Silent,
            Seen::Closed | Seen::Reset => FirstBytes::Closed,
        }
    }

    /// The server name, if a ClientHello carried one.
    pub fn server_name(&self) -> Option<&str> {
        match self {
            Seen::ClientHello { server_name } => server_name.as_deref(),
            _ => None,
        }
    }
}

/// Judges `buf`, the client's first bytes so far: `None` while more are needed.
pub fn examine(buf: &[u8]) -> Option<Seen> {
    match buf {
        [] => return None,
        [first, ..] if !TLS_CONTENT_TYPES.contains(first) => return Some(Seen::NotTls),
        [_] => return None,
        // A handshake record with another version than 0x03 0x0N, holding what looks like a
        // ClientHello: some servers (Go's) accept any first-record version, so it is read
        // as TLS with its version set aside, and its name checked like any other.
        [HANDSHAKE, major, ..] if *major != 0x03 => {
            return match buf.get(5) {
                None => None,
                Some(&CLIENT_HELLO) => parse(&with_record_version(buf)),
                Some(_) => Some(Seen::NotTls),
            };
        }
        // Record versions are 0x03 0x0N (SSL 3.0 to TLS 1.2 on the wire).
        [_, major, ..] if *major != 0x03 => return Some(Seen::NotTls),
        // Another TLS record first (a ChangeCipherSpec, an alert, data) could put a
        // ClientHello that is never looked at behind it.
        [first, ..] if *first != HANDSHAKE => return Some(Seen::Unreadable),
        _ => {}
    }
    parse(buf)
}

/// rustls's reading of whole records of handshake bytes; `None` while a record is still
/// arriving (the parser runs only on complete records, so a hello trickled in byte by byte
/// costs one parse per record, not one per byte).
fn parse(buf: &[u8]) -> Option<Seen> {
    if !complete_records(buf) {
        return (buf.len() >= MAX_FIRST_BYTES).then_some(Seen::Unreadable);
    }
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rest = buf;
    while !rest.is_empty() {
        match acceptor.read_tls(&mut rest) {
            Ok(0) | Err(_) => return Some(Seen::Unreadable),
            Ok(_) => {}
        }
    }
    match acceptor.accept() {
        Ok(Some(accepted)) => Some(Seen::ClientHello {
            server_name: accepted.client_hello().server_name().map(str::to_owned),
        }),
        Ok(None) if buf.len() < MAX_FIRST_BYTES => None,
        Ok(None) | Err(_) => Some(Seen::Unreadable),
    }
}

/// Whether `buf` is whole TLS records, the last one complete.
fn complete_records(buf: &[u8]) -> bool {
    let mut at = 0usize;
    while at < buf.len() {
        let Some(&[hi, lo]) = buf.get(at + 3..at + 5) else {
            return false;
        };
        at += 5 + usize::from(u16::from_be_bytes([hi, lo]));
    }
    at == buf.len()
}

/// How many bytes to ask for next: what completes the record `buf` ends in (its header
/// says), and at least 4 KiB. A read's room is zeroed first, so asking for 16 KiB for a
/// ClientHello of a few hundred bytes cost every tunnel a 16 KiB allocation and memset.
fn next_read(buf: &[u8]) -> usize {
    let mut at = 0usize;
    while let Some(&[hi, lo]) = buf.get(at + 3..at + 5) {
        at += 5 + usize::from(u16::from_be_bytes([hi, lo]));
    }
    at.saturating_sub(buf.len()).max(4096)
}

/// `buf` with every record's version set to TLS 1.0's (0x03 0x01).
fn with_record_version(buf: &[u8]) -> Vec<u8> {
    let mut out = buf.to_vec();
    let mut at = 0usize;
    while let Some([_, major, minor, hi, lo]) = out.get_mut(at..at + 5) {
        (*major, *minor) = (0x03, 0x01);
        at += 5 + usize::from(u16::from_be_bytes([*hi, *lo]));
    }
    out
}

/// Reads the client's first bytes after `early` (bytes already read behind the request)
/// until they can be judged, the server speaks first, the client closes, `deadline` passes,
/// or [`MAX_FIRST_BYTES`] are in. Returns every byte read, to be forwarded unchanged.
pub(crate) async fn read_first(
    client: &mut Leg<'_>,
    upstream: &mut Leg<'_>,
    early: Vec<u8>,
    deadline: tokio::time::Instant,
) -> (Vec<u8>, Seen) {
    let mut buf = early;
    loop {
        if let Some(seen) = examine(&buf) {
            return (buf, seen);
        }
        let waiting_for_first = buf.is_empty();
        tokio::select! {
            biased;
            ready = client.readable() => {
                // A stream's reset shows here (a socket's, on the read).
                if ready.is_err() {
                    let seen = if buf.is_empty() { Seen::Reset } else { Seen::Unreadable };
                    return (buf, seen);
                }
                let room = MAX_FIRST_BYTES
                    .saturating_sub(buf.len())
                    .min(16 * 1024 + 5)
                    .min(next_read(&buf));
                let before = buf.len();
                match read_some(client, &mut buf, room) {
                    Ok(0) if before == 0 => return (buf, Seen::Closed),
                    // Closed in the middle of a record: it cannot be judged.
                    Ok(0) => return (buf, Seen::Unreadable),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) if before == 0 => return (buf, Seen::Reset),
                    Err(_) => return (buf, Seen::Unreadable),
                }
            }
            // A TLS server never speaks first; watched only until the client has.
            _ = upstream.readable(), if waiting_for_first => return (buf, Seen::ServerFirst),
            () = tokio::time::sleep_until(deadline) => {
                let seen = if buf.is_empty() { Seen::Silent } else { Seen::Unreadable };
                return (buf, seen);
            }
        }
    }
}

/// One non-blocking read of at most `room` bytes, appended to `buf`. Up to 4 KiB go
/// through the stack, so `buf` grows by what arrived (a ClientHello of a few hundred bytes
/// takes that much), not by the room asked for.
fn read_some(stream: &mut Leg<'_>, buf: &mut Vec<u8>, room: usize) -> io::Result<usize> {
    let mut small = [0u8; 4096];
    if let Some(room) = small.get_mut(..room) {
        let n = stream.try_read(room)?;
        buf.extend_from_slice(room.get(..n).unwrap_or_default());
        return Ok(n);
    }
    let start = buf.len();
    buf.resize(start + room, 0);
    let result = stream.try_read(buf.get_mut(start..).unwrap_or_default());
    buf.truncate(start + *result.as_ref().unwrap_or(&0));
    result
}

pub(crate) mod retry;

#[cfg(test)]
mod tests;
