//! Fuzzes the request-head parser and its framing checks: no input may panic, and a parsed
//! head never claims more bytes than it was given.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandgate_proxy::head::{parse_request_head, parse_response_head};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((_, len))) = parse_request_head(data) {
        assert!(len <= data.len());
    }
    if let Ok(Some((_, len))) = parse_response_head(data, "GET") {
        assert!(len <= data.len());
    }
});
