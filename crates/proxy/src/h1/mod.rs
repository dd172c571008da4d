//! Sans-I/O HTTP/1 parsing, shared by the HTTP/1 front end, a central's node streams and the
//! upstream-proxy connector: bounded request and response heads (`head.rs`) and message body
//! framing (`framing.rs`, RFC 9112 section 6). Bytes in, typed values or typed errors out;
//! nothing here reads a socket or imports another module of the crate.

pub mod framing;
pub mod head;
