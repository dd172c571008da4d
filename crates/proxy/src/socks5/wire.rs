//! SOCKS5 messages as bytes (RFC 1928 greeting and request, RFC 1929 login), parsed without
//! I/O so every shape of input can be tested and fuzzed. Each parser takes the bytes read so
//! far and says: more are needed, here is the message and how many bytes it took, or the
//! bytes are not that message. Every field is bounded by the protocol (a length byte), so
//! no message is longer than [`MAX_MESSAGE`].

use std::net::{Ipv4Addr, Ipv6Addr};

/// The longest client message: a login (1 + 1 + 255 + 1 + 255 bytes).
pub const MAX_MESSAGE: usize = 513;

/// The SOCKS version byte.
pub const VERSION: u8 = 5;

/// What a parser made of the bytes so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse<T> {
    /// Not all of the message is here yet.
    Incomplete,
    /// The message, and the number of bytes it took.
    Done(T, usize),
}

/// Bytes that are not the expected message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("not SOCKS version 5")]
    NotVersion5,
    #[error("not an RFC 1929 login")]
    NotLogin,
    #[error("unknown SOCKS5 address type {0}")]
    AddressType(u8),
    #[error("the name is not UTF-8")]
    NameNotUtf8,
}

/// The method negotiation: the methods the client offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    pub methods: Vec<u8>,
}

/// An RFC 1929 username/password login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    pub user: Vec<u8>,
    pub pass: Vec<u8>,
}

/// A request: the command and the destination, its host as authority text (a name, a
/// dotted quad, or a bracketed IPv6 address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub command: u8,
    pub host: String,
    pub port: u16,
}

/// `VER NMETHODS METHODS...`
pub fn greeting(buf: &[u8]) -> Result<Parse<Greeting>, WireError> {
    let Some((&version, rest)) = buf.split_first() else {
        return Ok(Parse::Incomplete);
    };
    if version != VERSION {
        return Err(WireError::NotVersion5);
    }
    let Some((methods, used)) = counted(rest) else {
        return Ok(Parse::Incomplete);
    };
    Ok(Parse::Done(
        Greeting {
            methods: methods.to_vec(),
        },
        1 + used,
    ))
}

/// `VER(1) ULEN UNAME PLEN PASSWD`
pub fn login(buf: &[u8]) -> Result<Parse<Login>, WireError> {
    let Some((&version, rest)) = buf.split_first() else {
        return Ok(Parse::Incomplete);
    };
    if version != 1 {
        return Err(WireError::NotLogin);
    }
    let Some((user, u)) = counted(rest) else {
        return Ok(Parse::Incomplete);
    };
    let Some((pass, p)) = rest.get(u..).and_then(counted) else {
        return Ok(Parse::Incomplete);
    };
    Ok(Parse::Done(
        Login {
            user: user.to_vec(),
            pass: pass.to_vec(),
        },
        1 + u + p,
    ))
}

/// `VER CMD RSV ATYP DST.ADDR DST.PORT`. An unknown address type is an error as soon as
/// its byte is read (its length is unknowable).
pub fn request(buf: &[u8]) -> Result<Parse<Request>, WireError> {
    let (version, command, kind) = match buf {
        [v, ..] if *v != VERSION => return Err(WireError::NotVersion5),
        [_, c, _, k, ..] => (VERSION, *c, *k),
        _ => return Ok(Parse::Incomplete),
    };
    let _ = version;
    let rest = buf.get(4..).unwrap_or_default();
    let (host, used) = match kind {
        1 => match rest.first_chunk::<4>() {
            Some(a) => (Ipv4Addr::from(*a).to_string(), 4),
            None => return Ok(Parse::Incomplete),
        },
        4 => match rest.first_chunk::<16>() {
            Some(a) => (format!("[{}]", Ipv6Addr::from(*a)), 16),
            None => return Ok(Parse::Incomplete),
        },
        3 => match counted(rest) {
            Some((name, used)) => (
                String::from_utf8(name.to_vec()).map_err(|_| WireError::NameNotUtf8)?,
                used,
            ),
            None => return Ok(Parse::Incomplete),
        },
        other => return Err(WireError::AddressType(other)),
    };
    let Some(port) = rest.get(used..).and_then(|r| r.first_chunk::<2>()) else {
        return Ok(Parse::Incomplete);
    };
    Ok(Parse::Done(
        Request {
            command,
            host,
            port: u16::from_be_bytes(*port),
        },
        4 + used + 2,
    ))
}

/// A length byte and that many bytes: the field and the bytes taken, or `None` if short.
fn counted(buf: &[u8]) -> Option<(&[u8], usize)> {
    let (&len, rest) = buf.split_first()?;
    let field = rest.get(..usize::from(len))?;
    Some((field, 1 + usize::from(len)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn each_message_parses_and_says_how_long_it_was() {
        assert_eq!(
            greeting(&[5, 2, 0, 2, 9]),
            Ok(Parse::Done(Greeting { methods: vec![0, 2] }, 4))
        );
        assert_eq!(
            login(&[1, 1, b'u', 2, b'p', b'w']),
            Ok(Parse::Done(
                Login {
                    user: b"u".to_vec(),
                    pass: b"pw".to_vec()
                },
                6
            ))
        );
        let name = [5, 1, 0, 3, 3, b'a', b'.', b'b', 0, 80, 0x16];
        assert_eq!(
            request(&name),
            Ok(Parse::Done(
                Request {
                    command: 1,
                    host: "a.b".into(),
                    port: 80
                },
                10
            ))
        );
        let v6 = [&[5u8, 1, 0, 4][..], &[0; 15], &[1, 1, 187]].concat();
        assert_eq!(
            request(&v6).unwrap(),
            Parse::Done(
                Request {
                    command: 1,
                    host: "[::1]".into(),
                    port: 443
                },
                22
            )
        );
        assert_eq!(
            request(&[5, 2, 0, 1, 10, 0, 0, 1, 0, 22]).unwrap(),
            Parse::Done(
                Request {
                    command: 2,
                    host: "10.0.0.1".into(),
                    port: 22
                },
                10
            )
        );
    }

    #[test]
    fn broken_messages_are_errors_and_short_ones_incomplete() {
        assert_eq!(greeting(&[4, 1, 0]), Err(WireError::NotVersion5));
        assert_eq!(login(&[5, 0, 0]), Err(WireError::NotLogin));
        assert_eq!(request(&[5, 1, 0, 9]), Err(WireError::AddressType(9)));
        assert_eq!(
            request(&[5, 1, 0, 3, 1, 0xff, 0, 80]),
            Err(WireError::NameNotUtf8)
        );
        assert_eq!(greeting(&[5, 3, 0]), Ok(Parse::Incomplete));
        assert_eq!(login(&[1, 3, b'a']), Ok(Parse::Incomplete));
        assert_eq!(request(&[5, 1, 0, 3, 4, b'a']), Ok(Parse::Incomplete));
    }

    proptest! {
        /// No input panics; a message that parses took no more bytes than it was given,
        /// never more than the longest message, and parses the same from exactly those
        /// bytes. Every prefix of it is incomplete (or the same error), never another
        /// message.
        #[test]
        fn parsers_are_total_and_consistent(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            fn check<T: PartialEq + std::fmt::Debug>(
                bytes: &[u8],
                parse: fn(&[u8]) -> Result<Parse<T>, WireError>,
            ) -> Result<(), TestCaseError> {
                if let Ok(Parse::Done(msg, used)) = parse(bytes) {
                    prop_assert!(used <= bytes.len() && used <= MAX_MESSAGE);
                    prop_assert_eq!(parse(&bytes[..used]), Ok(Parse::Done(msg, used)));
                    for n in 0..used {
                        prop_assert!(!matches!(parse(&bytes[..n]), Ok(Parse::Done(..))));
                    }
                }
                Ok(())
            }
            check(&bytes, greeting)?;
            check(&bytes, login)?;
            check(&bytes, request)?;
        }
    }
}
