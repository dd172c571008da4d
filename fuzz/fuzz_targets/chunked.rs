//! Fuzzes the chunked-body scanner: feeding input in two pieces at any split point must
//! give the same answer as feeding it whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandgate_proxy::framing::ChunkedScanner;

fuzz_target!(|input: (u16, &[u8])| {
    let (split, data) = input;
    let split = usize::from(split) % (data.len() + 1);
    let mut whole = ChunkedScanner::new();
    let whole_result = whole.feed(data);
    let mut parts = ChunkedScanner::new();
    let (a, b) = data.split_at(split);
    let parted = parts.feed(a).and_then(|n| {
        if n < a.len() {
            Ok(n)
        } else {
            parts.feed(b).map(|m| n + m)
        }
    });
    match (whole_result, parted) {
        (Ok(x), Ok(y)) => {
            assert_eq!(x, y);
            assert_eq!(whole.is_done(), parts.is_done());
        }
        (Err(_), Err(_)) => {}
        (x, y) => panic!("split changed the outcome: {x:?} vs {y:?}"),
    }
});
