//! Sans-I/O HTTP/1 parsing, shared by the proxy's HTTP/1 front end, a central's node streams
//! and the upstream-proxy connector: bounded request and response heads (`head.rs`) and
//! message body framing (`framing.rs`, RFC 9112 section 6). Bytes in, typed values or typed
//! errors out; nothing here reads a socket. A crate of its own, below the proxy, so that
//! the parsers the network's bytes reach first depend on nothing of the proxy's (only on the
//! policy's host grammar, for `Host`).

pub mod framing;
pub mod head;
