//! Property tests over the byte-level parsers (the same properties the cargo-fuzz targets in
//! `fuzz/` check, run here on every test so they cannot rot).

#![allow(clippy::indexing_slicing, reason = "property tests")]

use proptest::prelude::*;
use sandgate_proxy::framing::{BodyKind, ChunkedScanner};
use sandgate_proxy::head::{parse_request_head, parse_response_head};

fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("Content-Length: 5".to_owned()),
        Just("Content-Length: 5, 5".to_owned()),
        Just("Content-Length: 6".to_owned()),
        Just("Transfer-Encoding: chunked".to_owned()),
        Just("Transfer-Encoding: gzip".to_owned()),
        Just("Host: a.test".to_owned()),
        Just("Connection: close".to_owned()),
        Just(" folded".to_owned()),
        "[A-Za-z-]{1,10}: [ -~]{0,20}",
    ]
}

proptest! {
    #[test]
    fn request_head_parser_never_panics(data in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(Some((_, len))) = parse_request_head(&data) {
            prop_assert!(len <= data.len());
        }
        let _ = parse_response_head(&data, "GET");
    }

    #[test]
    fn framing_is_never_ambiguous(
        method in prop::sample::select(vec!["GET", "POST", "CONNECT"]),
        version in prop::sample::select(vec!["HTTP/1.0", "HTTP/1.1"]),
        fields in prop::collection::vec(field(), 0..6),
    ) {
        let text = format!("{method} http://a.test/ {version}\r\n{}\r\n", fields.iter().map(|f| format!("{f}\r\n")).collect::<String>());
        let has = |name: &str| fields.iter().any(|f| f.to_ascii_lowercase().starts_with(name));
        if let Ok(Some((head, _))) = parse_request_head(text.as_bytes()) {
            // Accepted heads never carry both framings, and chunked only as the final coding.
            prop_assert!(!(has("content-length") && has("transfer-encoding")));
            if has("transfer-encoding") {
                prop_assert_eq!(head.body, BodyKind::Chunked);
            }
            prop_assert!(!fields.iter().any(|f| f.starts_with(' ')), "obs-fold accepted");
        }
    }

    #[test]
    fn chunked_scanner_is_split_invariant(data in prop::collection::vec(any::<u8>(), 0..200), split in any::<usize>()) {
        let valid = b"4\r\nwiki\r\n5;x=y\r\npedia\r\n0\r\nT: 1\r\n\r\n";
        for input in [&data[..], &valid[..]] {
            let split = split % (input.len() + 1);
            let mut whole = ChunkedScanner::new();
            let a = whole.feed(input);
            let mut parts = ChunkedScanner::new();
            let (x, y) = input.split_at(split);
            let b = parts.feed(x).and_then(|n| if n < x.len() { Ok(n) } else { parts.feed(y).map(|m| n + m) });
            prop_assert_eq!(a.is_ok(), b.is_ok());
            if let (Ok(a), Ok(b)) = (a, b) {
                prop_assert_eq!(a, b);
                prop_assert_eq!(whole.is_done(), parts.is_done());
            }
        }
    }
}
