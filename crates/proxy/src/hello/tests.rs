#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "tests; they connect to their own loopback listeners"
)]

use std::time::Duration;

use proptest::prelude::*;
use sandgate_testkit::tls::{client_hello, split_record};

use super::*;

#[test]
fn a_client_hello_is_read_with_its_server_name() {
    let hello = client_hello("API.example.com");
    assert_eq!(
        examine(&hello),
        Some(Seen::ClientHello {
            server_name: Some("api.example.com".into())
        })
    );
    // An IP address is not a server name (RFC 6066); rustls sends none.
    assert_eq!(
        examine(&client_hello("192.0.2.1")),
        Some(Seen::ClientHello { server_name: None })
    );
}

#[test]
fn every_prefix_asks_for_more_and_a_split_hello_is_reassembled() {
    let hello = client_hello("a.example");
    for n in 0..hello.len() {
        assert_eq!(examine(&hello[..n]), None, "prefix of {n} bytes");
    }
    // Bytes behind a complete hello (0-RTT data, a pipelined record) change nothing.
    let mut more = hello.clone();
    more.extend_from_slice(b"\x17\x03\x03\x00\x01x");
    assert_eq!(examine(&more), examine(&hello));
    let split = split_record(&hello, 40);
    assert_eq!(examine(&split[..split.len() - 1]), None);
    assert_eq!(
        examine(&split),
        Some(Seen::ClientHello {
            server_name: Some("a.example".into())
        })
    );
}

#[test]
fn plain_bytes_are_not_tls_and_a_broken_hello_is_unreadable() {
    assert_eq!(examine(b"GET / HTTP/1.1\r\n"), Some(Seen::NotTls));
    assert_eq!(examine(b"SSH-2.0-OpenSSH_9.2\r\n"), Some(Seen::NotTls));
    assert_eq!(
        examine(&[0x16, 0x01]),
        None,
        "could still be a ClientHello in an odd record"
    );
    assert_eq!(examine(&[0x16, 0x01, 0, 0, 0, 0x02]), Some(Seen::NotTls));
    assert_eq!(examine(&[0x16]), None);
    // Another TLS record ahead of the hello (here a ChangeCipherSpec) is not "not TLS": a
    // ClientHello behind it would never be looked at.
    let mut ccs_first = vec![0x14, 0x03, 0x03, 0x00, 0x01, 0x01];
    ccs_first.extend_from_slice(&client_hello("evil.example"));
    assert_eq!(examine(&ccs_first), Some(Seen::Unreadable));
    assert_eq!(
        examine(&[0x17, 0x03, 0x03, 0x00, 0x01, 0x00]),
        Some(Seen::Unreadable)
    );
    // A handshake record holding something other than a ClientHello.
    let mut other = client_hello("a.example");
    other[5] = 2;
    assert_eq!(examine(&other), Some(Seen::Unreadable));
    // A ClientHello whose inner length lies.
    let mut lying = client_hello("a.example");
    lying[8] = lying[8].wrapping_sub(3);
    assert_eq!(examine(&lying), Some(Seen::Unreadable));
    // A handshake that never completes within the bound.
    let mut endless = vec![0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0xff, 0xff, 0xff];
    endless.resize(MAX_FIRST_BYTES, 0);
    assert_eq!(examine(&endless), Some(Seen::Unreadable));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Nothing the client sends makes the reader panic, and a judgement never depends on
    /// bytes after the ones judged: once judged, more bytes change nothing but `Unreadable`
    /// for an incomplete record.
    #[test]
    fn examine_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = examine(&bytes);
    }

    #[test]
    fn a_mutated_hello_never_passes_as_a_different_clean_name(
        at in 0usize..200, value in any::<u8>()
    ) {
        let mut hello = client_hello("a.example");
        let i = at % hello.len();
        hello[i] = value;
        if let Some(Seen::ClientHello { server_name: Some(name) }) = examine(&hello) {
            // A parsed name is the one on the wire, never something assembled elsewhere.
            let wire = String::from_utf8_lossy(&hello).to_lowercase();
            prop_assert!(wire.contains(&name), "{name}");
        }
    }
}

/// Bytes sent over a real socket in chunks come back from [`read_first`] unchanged, and
/// with what is left in the socket they are exactly what was sent.
fn forwarded_equals_sent(sent: Vec<u8>, chunk: usize) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let writer = tokio::spawn({
            let sent = sent.clone();
            async move {
                use tokio::io::AsyncWriteExt;
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                for part in sent.chunks(chunk.max(1)) {
                    s.write_all(part).await.unwrap();
                    tokio::task::yield_now().await;
                }
                s
            }
        });
        let (client, _) = listener.accept().await.unwrap();
        // An upstream that never speaks.
        let up_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = tokio::net::TcpStream::connect(up_listener.local_addr().unwrap())
            .await
            .unwrap();
        let writer_end = writer.await.unwrap();
        drop(writer_end);
        let (first, _seen) = read_first(
            &mut Leg::Tcp(&client),
            &mut Leg::Tcp(&upstream),
            Vec::new(),
            tokio::time::Instant::now() + Duration::from_secs(5),
        )
        .await;
        let mut rest = Vec::new();
        {
            use tokio::io::AsyncReadExt;
            let mut client = client;
            client.read_to_end(&mut rest).await.unwrap();
        }
        let mut all = first;
        all.extend_from_slice(&rest);
        prop_assert_eq!(all, sent);
        Ok(())
    })
}

/// A hello trickled in byte by byte is parsed once per complete record, not once per byte:
/// every prefix short of a record boundary is judged without rustls.
#[test]
fn only_complete_records_are_parsed() {
    let hello = split_record(&client_hello("a.example"), 100);
    let first_record = 5 + 100;
    assert!(complete_records(&hello[..first_record]));
    assert!(!complete_records(&hello[..first_record - 1]));
    assert!(!complete_records(&hello[..first_record + 3]));
    assert!(complete_records(&hello));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_bytes_read_are_forwarded_unchanged(
        junk in proptest::collection::vec(any::<u8>(), 0..4096),
        chunk in 1usize..700,
        with_hello in any::<bool>(),
    ) {
        let mut sent = if with_hello { client_hello("a.example") } else { Vec::new() };
        sent.extend_from_slice(&junk);
        forwarded_equals_sent(sent, chunk)?;
    }
}

#[tokio::test]
async fn a_server_that_speaks_first_and_a_silent_client_are_told_apart() {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let _client_side = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (client, _) = listener.accept().await.unwrap();
    let up_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = tokio::net::TcpStream::connect(up_listener.local_addr().unwrap())
        .await
        .unwrap();
    let (mut server, _) = up_listener.accept().await.unwrap();
    let (bytes, seen) = read_first(
        &mut Leg::Tcp(&client),
        &mut Leg::Tcp(&upstream),
        Vec::new(),
        tokio::time::Instant::now() + Duration::from_millis(50),
    )
    .await;
    assert_eq!((bytes.len(), seen), (0, Seen::Silent));
    server.write_all(b"220 smtp ready\r\n").await.unwrap();
    let (bytes, seen) = read_first(
        &mut Leg::Tcp(&client),
        &mut Leg::Tcp(&upstream),
        Vec::new(),
        tokio::time::Instant::now() + Duration::from_secs(5),
    )
    .await;
    assert_eq!((bytes.len(), seen), (0, Seen::ServerFirst));
}

#[test]
fn a_retry_request_is_told_apart_from_a_server_hello() {
    use super::retry::{examine_second, is_retry};
    let mut hrr = vec![0x16, 0x03, 0x03, 0x00, 0x58, 0x02, 0x00, 0x00, 0x54, 0x03, 0x03];
    hrr.extend_from_slice(&[
        0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91, 0xc2,
        0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
    ]);
    for n in 0..hrr.len() {
        assert_eq!(is_retry(&hrr[..n]), None, "{n}");
    }
    assert_eq!(is_retry(&hrr), Some(true));
    let mut server_hello = hrr.clone();
    server_hello[20] ^= 1;
    assert_eq!(is_retry(&server_hello), Some(false));
    assert_eq!(is_retry(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28]), Some(false));
    assert_eq!(is_retry(b"HTTP/1.1 200"), Some(false));
    // The second flight: ChangeCipherSpec records skipped, then the hello judged.
    let mut second = vec![0x14, 0x03, 0x03, 0x00, 0x01, 0x01];
    second.extend_from_slice(&client_hello("evil.example"));
    assert_eq!(
        examine_second(&second),
        Some(Seen::ClientHello {
            server_name: Some("evil.example".into())
        })
    );
    assert_eq!(examine_second(&second[..3]), None);
    assert_eq!(examine_second(&second[..20]), None);
    // Nothing but a ClientHello may follow a retry request.
    assert_eq!(examine_second(b"GET / HTTP/1.1\r\n"), Some(Seen::Unreadable));
}

/// As an attacker, after a HelloRetryRequest: ChangeCipherSpec records that each claim
/// 65,534 bytes, streamed so the buffer always ends inside one. The second flight is
/// refused once it reaches the first-bytes bound, wherever the cut falls; before, it was
/// "more bytes needed" for ever (a client sent 134 MB into one tunnel in 1.7 s).
#[test]
fn a_second_flight_of_endless_change_cipher_specs_is_refused_at_the_bound() {
    use super::MAX_FIRST_BYTES;
    use super::retry::examine_second;
    let mut flood = Vec::new();
    while flood.len() < 3 * MAX_FIRST_BYTES {
        flood.extend_from_slice(&[0x14, 0x03, 0x03, 0xff, 0xfe]);
        flood.extend(std::iter::repeat_n(0x01, 0xfffe));
    }
    for cut in [
        MAX_FIRST_BYTES,
        MAX_FIRST_BYTES + 1,
        MAX_FIRST_BYTES + 4095,
        2 * MAX_FIRST_BYTES,
    ] {
        assert_eq!(examine_second(&flood[..cut]), Some(Seen::Unreadable), "{cut}");
    }
    // Below the bound, a record still arriving is waited for.
    assert_eq!(examine_second(&flood[..MAX_FIRST_BYTES - 1]), None);
}
