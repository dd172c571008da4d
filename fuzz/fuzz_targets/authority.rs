//! Fuzzes the host, authority and pattern parsers: no input may panic, and whatever parses
//! prints back to something that parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandgate_policy::{Host, Pattern, parse_connect_target, parse_http_target};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(target) = parse_connect_target(text) {
        assert_eq!(parse_connect_target(&target.to_string()), Ok(target));
    }
    let _ = parse_http_target(text);
    if let Ok(host) = Host::parse(text) {
        assert_eq!(Host::parse(&host.to_string()), Ok(host));
    }
    if let Ok(pattern) = Pattern::parse(text) {
        assert_eq!(Pattern::parse(&pattern.to_string()), Ok(pattern));
    }
});
