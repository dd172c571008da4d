//! Fuzzes the tunnel's first-bytes reader (rustls's ClientHello parser behind it): no input
//! may panic; a judgement is final (more bytes never turn a ClientHello into something
//! else); and what the policy makes of it never panics either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandgate_policy::{TunnelRules, parse_connect_target};
use sandgate_proxy::hello::{Seen, examine};

fuzz_target!(|data: &[u8]| {
    let Some(seen) = examine(data) else {
        return;
    };
    if let Seen::ClientHello { .. } = &seen {
        let mut more = data.to_vec();
        more.extend_from_slice(b"\x17\x03\x03\x00\x01x");
        assert_eq!(examine(&more).as_ref(), Some(&seen));
    }
    if let Ok(target) = parse_connect_target("a.example:443") {
        let _ = TunnelRules::default().check(&target, &seen.as_first_bytes());
    }
});
