//! The relays against real loopback sockets (both TCP implementations run the same
//! scenario) and in-memory streams with paused time.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::Leg;

/// A connected pair: (the far end a test drives, the end the relay holds).
async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    #[expect(clippy::disallowed_methods, reason = "a test's own loopback pair")]
    let far = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (near, _) = listener.accept().await.unwrap();
    (far, near)
}

/// Both directions carry bytes, a half-close passes on while the other direction goes on,
/// and the counts are exact.
async fn scenario<F, Fut>(relay: F)
where
    F: FnOnce(TcpStream, TcpStream) -> Fut,
    Fut: std::future::Future<Output = (u64, u64, super::Outcome)> + Send + 'static,
{
    let (mut client, client_near) = pair().await;
    let (mut origin, origin_near) = pair().await;
    let task = tokio::spawn(relay(client_near, origin_near));
    client.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 5];
    origin.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hello");
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    // The client's half-close reaches the origin as EOF...
    assert_eq!(origin.read_to_end(&mut rest).await.unwrap(), 0);
    // ...and the origin can still answer.
    origin.write_all(b"world!").await.unwrap();
    drop(origin);
    client.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"world!");
    let (sent, received, outcome) = task.await.unwrap();
    assert_eq!((sent, received, outcome), (5, 6, super::Outcome::Ok));
}

#[tokio::test]
async fn the_tunnel_relay_copies_both_ways_and_passes_half_closes_on() {
    scenario(|c, o| async move {
        super::tunnel(
            &mut Leg::Tcp(&c),
            Leg::Tcp(&o),
            Duration::from_secs(30),
            &CancellationToken::new(),
            (0, 0),
        )
        .await
    })
    .await;
}

#[tokio::test]
async fn the_portable_relay_does_the_same() {
    scenario(|c, o| async move {
        super::copy::copy_relay(&c, &o, Duration::from_secs(30), &CancellationToken::new()).await
    })
    .await;
}

#[tokio::test]
async fn a_tunnel_that_moves_nothing_is_closed_at_the_idle_timeout() {
    let (_client, client_near) = pair().await;
    let (_origin, origin_near) = pair().await;
    let started = std::time::Instant::now();
    let (_, _, outcome) = super::tunnel(
        &mut Leg::Tcp(&client_near),
        Leg::Tcp(&origin_near),
        Duration::from_millis(150),
        &CancellationToken::new(),
        (0, 0),
    )
    .await;
    assert_eq!(outcome, super::Outcome::IdleTimeout);
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[tokio::test(start_paused = true)]
async fn any_streams_relay_with_idle_and_shutdown() {
    let (mut client, client_near) = tokio::io::duplex(64);
    let (mut origin, origin_near) = tokio::io::duplex(64);
    let stop = CancellationToken::new();
    let relay = tokio::spawn({
        let stop = stop.clone();
        async move { super::relay_streams(client_near, origin_near, Duration::from_secs(60), &stop).await }
    });
    client.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    origin.read_exact(&mut buf).await.unwrap();
    origin.write_all(b"pong!").await.unwrap();
    let mut back = [0u8; 5];
    client.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"pong!");
    stop.cancel();
    assert_eq!(relay.await.unwrap(), (4, 5, super::Outcome::Shutdown));

    let (_client, client_near) = tokio::io::duplex(64);
    let (_origin, origin_near) = tokio::io::duplex(64);
    let never = CancellationToken::new();
    let idle = super::relay_streams(client_near, origin_near, Duration::from_secs(900), &never);
    // Paused time: the 900 s idle timeout passes at once, with no real waiting.
    assert_eq!(idle.await, (0, 0, super::Outcome::IdleTimeout));
}
