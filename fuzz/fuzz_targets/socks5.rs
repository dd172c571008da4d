//! Fuzzes the SOCKS5 message parsers (greeting, RFC 1929 login, request): no input may
//! panic, and a message that parses took at most the bytes given and at most the longest
//! message, and parses the same from exactly those bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandgate_proxy::socks5::wire::{self, MAX_MESSAGE, Parse};

fuzz_target!(|data: &[u8]| {
    if let Ok(Parse::Done(msg, used)) = wire::greeting(data) {
        assert!(used <= data.len() && used <= MAX_MESSAGE);
        assert_eq!(wire::greeting(&data[..used]), Ok(Parse::Done(msg, used)));
    }
    if let Ok(Parse::Done(msg, used)) = wire::login(data) {
        assert!(used <= data.len() && used <= MAX_MESSAGE);
        assert_eq!(wire::login(&data[..used]), Ok(Parse::Done(msg, used)));
    }
    if let Ok(Parse::Done(msg, used)) = wire::request(data) {
        assert!(used <= data.len() && used <= MAX_MESSAGE);
        // What the front end makes of it must not panic either.
        let _ = sandgate_policy::parse_connect_target(&format!("{}:{}", msg.host, msg.port));
        assert_eq!(wire::request(&data[..used]), Ok(Parse::Done(msg, used)));
    }
});
