//! The harness's own loopback servers: a keep-alive HTTP origin with a fixed small response,
//! an echo server, a sink (reads N bytes, answers with one byte) and a source (writes N
//! bytes). They run in the driver process, on the load generator's core.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\r\nhello bench\n";

/// Addresses of the running servers.
#[derive(Debug, Clone, Copy)]
pub struct Servers {
    pub origin: SocketAddr,
    pub echo: SocketAddr,
    pub sink: SocketAddr,
    pub source: SocketAddr,
}

async fn listen<F, Fut>(handler: F) -> std::io::Result<SocketAddr>
where
    F: Fn(TcpStream) -> Fut + Send + Copy + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(handler(stream));
        }
    });
    Ok(addr)
}

pub async fn start() -> std::io::Result<Servers> {
    Ok(Servers {
        origin: listen(origin).await?,
        echo: listen(echo).await?,
        sink: listen(sink).await?,
        source: listen(source).await?,
    })
}

/// Answers every request head (no bodies expected) with the fixed response.
async fn origin(mut stream: TcpStream) {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(n) = stream.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.drain(..end + 4);
            if stream.write_all(RESPONSE).await.is_err() {
                return;
            }
        }
    }
}

async fn echo(mut stream: TcpStream) {
    let (mut r, mut w) = stream.split();
    let _ = tokio::io::copy(&mut r, &mut w).await;
}

/// Reads an 8-byte length, then that many bytes, then answers `K`.
async fn sink(mut stream: TcpStream) {
    let Ok(len) = stream.read_u64().await else { return };
    let mut left = len;
    let mut buf = vec![0u8; 256 * 1024];
    while left > 0 {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n as u64),
        }
    }
    let _ = stream.write_all(b"K").await;
}

/// Reads an 8-byte length, then writes that many bytes.
async fn source(mut stream: TcpStream) {
    let Ok(len) = stream.read_u64().await else { return };
    let buf = vec![0x5au8; 256 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        if stream.write_all(buf.get(..n).unwrap_or_default()).await.is_err() {
            return;
        }
        left -= n as u64;
    }
}
