//! The `relay` target: a bare relay, the floor a proxy's cost is measured against. One thread
//! (a current-thread runtime in a process of its own, pinned as the proxies are), no policy, no
//! audit, no rewriting: it reads a client's first head, dials the loopback address that head's
//! request line names (`CONNECT host:port`, or `GET http://host:port/...`), answers a CONNECT
//! with 200 or passes the head on as it came, then copies bytes both ways until either side
//! closes. Later requests on a kept-alive connection go where the first one went, which is
//! where the bench sends them. It dials nothing but loopback, and a head it cannot read ends
//! the connection.

use std::net::SocketAddr;
use std::process::ExitCode;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::client::BoxError;

/// The first argument that makes `sandgate-bench` the relay instead of the bench.
pub const FLAG: &str = "--bare-relay";

/// The longest first head read before giving up on a connection.
const MAX_HEAD: usize = 16 * 1024;

/// Each direction's copy buffer (tokio's default is 8 KiB; the proxies under test move 64 KiB
/// or more a call).
const COPY_BUF: usize = 64 * 1024;

/// Listens on 127.0.0.1, port 0, prints the address on stdout, and relays until killed.
pub fn serve() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_io().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandgate-bench relay: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(accept_loop()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandgate-bench relay: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn accept_loop() -> Result<(), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    loop {
        let (client, _) = listener.accept().await?;
        tokio::spawn(async move {
            let _ = relay(client).await;
        });
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "the bench's relay dials a socket address on loopback, checked in destination(); no name is resolved"
)]
async fn relay(mut client: TcpStream) -> Result<(), BoxError> {
    client.set_nodelay(true)?;
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let end = loop {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if let Some(p) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if head.len() > MAX_HEAD {
            return Err("head too long".into());
        }
    };
    let (connect, addr) = destination(&head)?;
    let mut upstream = TcpStream::connect(addr).await?;
    upstream.set_nodelay(true)?;
    if connect {
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        upstream.write_all(head.get(end..).unwrap_or_default()).await?;
    } else {
        upstream.write_all(&head).await?;
    }
    drop(head);
    tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, COPY_BUF, COPY_BUF).await?;
    Ok(())
}

/// Whether the head is a CONNECT, and the loopback address its request line names.
fn destination(head: &[u8]) -> Result<(bool, SocketAddr), BoxError> {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = std::str::from_utf8(line)?;
    let mut words = line.split(' ');
    let (Some(method), Some(target)) = (words.next(), words.next()) else {
        return Err("no request line".into());
    };
    let connect = method == "CONNECT";
    let authority = if connect {
        target
    } else {
        let rest = target
            .strip_prefix("http://")
            .ok_or("not an absolute-form target")?;
        rest.split('/').next().unwrap_or(rest)
    };
    let addr: SocketAddr = authority.parse()?;
    if !addr.ip().is_loopback() {
        return Err("the bare relay dials loopback only".into());
    }
    Ok((connect, addr))
}

#[cfg(test)]
mod tests {
    use super::destination;

    #[test]
    fn a_head_names_a_loopback_destination_or_is_refused() {
        let (c, a) = destination(b"CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n").unwrap();
        assert!(c);
        assert_eq!(a.to_string(), "127.0.0.1:443");
        let (c, a) = destination(b"GET http://127.0.0.1:8080/x HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert!(!c);
        assert_eq!(a.port(), 8080);
        assert!(destination(b"GET http://10.0.0.1:80/ HTTP/1.1\r\n\r\n").is_err());
        assert!(destination(b"GET /relative HTTP/1.1\r\n\r\n").is_err());
        assert!(destination(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n").is_err());
        assert!(destination(b"\r\n\r\n").is_err());
    }
}
