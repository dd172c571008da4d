//! The benchmark suite. Each scenario runs against one [`Via`] and returns its figures.
//! What a scenario costs the processes (CPU, memory) is read around it (`process.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{BoxError, HttpClient, HttpsClient, Via, open};
use crate::servers::Servers;

/// MB/s (10^6 bytes per second) moving `bytes` through one tunnel, client to server.
pub async fn upload(via: Via, s: &Servers, bytes: u64) -> Result<f64, BoxError> {
    let mut stream = open(via, s.sink).await?;
    let started = Instant::now();
    stream.write_u64(bytes).await?;
    let buf = vec![0xa5u8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        stream.write_all(buf.get(..n).unwrap_or_default()).await?;
        left -= n as u64;
    }
    let mut ack = [0u8; 1];
    stream.read_exact(&mut ack).await?;
    Ok(bytes as f64 / started.elapsed().as_secs_f64() / 1e6)
}

/// MB/s moving `bytes` through one tunnel, server to client.
pub async fn download(via: Via, s: &Servers, bytes: u64) -> Result<f64, BoxError> {
    let mut stream = open(via, s.source).await?;
    let started = Instant::now();
    stream.write_u64(bytes).await?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err("download ended early".into());
        }
        left = left.saturating_sub(n as u64);
    }
    Ok(bytes as f64 / started.elapsed().as_secs_f64() / 1e6)
}

/// Keep-alive GET results.
#[derive(Debug, Clone, Copy)]
pub struct HttpFigures {
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// Requests answered, from the first connection's start to the last one's end.
    pub requests: u64,
}

/// `conns` keep-alive connections sending plain-HTTP GETs back to back for `duration`.
pub async fn http_gets(
    via: Via,
    s: &Servers,
    conns: usize,
    duration: Duration,
) -> Result<HttpFigures, BoxError> {
    let origin = s.origin;
    keep_alive_gets(conns, duration, move || {
        GetClient::Http(HttpClient::new(via, origin))
    })
    .await
}

/// `conns` keep-alive HTTPS connections to the TLS origin at `origin` (a tunnel each, then
/// a TLS handshake with `tls`) sending GETs back to back for `duration`.
pub async fn https_gets(
    via: Via,
    origin: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    conns: usize,
    duration: Duration,
) -> Result<HttpFigures, BoxError> {
    keep_alive_gets(conns, duration, move || {
        GetClient::Https(Box::new(HttpsClient::new(via, origin, tls.clone())))
    })
    .await
}

/// One connection's client in the GET scenarios.
enum GetClient {
    Http(HttpClient),
    Https(Box<HttpsClient>),
}

impl GetClient {
    async fn get(&mut self) -> Result<(), BoxError> {
        match self {
            GetClient::Http(c) => c.get().await,
            GetClient::Https(c) => c.get().await,
        }
    }
}

/// `conns` clients from `client` each sending GETs back to back for `duration`; the latency
/// of every GET, connecting included where one had to connect.
async fn keep_alive_gets(
    conns: usize,
    duration: Duration,
    client: impl Fn() -> GetClient,
) -> Result<HttpFigures, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(conns);
    for _ in 0..conns {
        let stop = stop.clone();
        let mut client = client();
        tasks.push(tokio::spawn(async move {
            let mut latencies: Vec<u32> = Vec::with_capacity(1 << 16);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                client.get().await?;
                latencies.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
            }
            Ok::<_, BoxError>(latencies)
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| -> f64 {
        let i = ((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1));
        all.get(i).copied().map_or(0.0, f64::from)
    };
    Ok(HttpFigures {
        rps: all.len() as f64 / elapsed,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        p999_us: pct(0.999),
        requests: all.len() as u64,
    })
}

/// A TLS ClientHello as rustls's client writes it (for an IP address, so without a server
/// name: every proxy reaches the servers by IP literal).
pub fn client_hello() -> Result<Vec<u8>, BoxError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let server = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server)?;
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out)?;
    }
    Ok(out)
}

/// New-tunnel results.
#[derive(Debug, Clone, Copy)]
pub struct TunnelFigures {
    /// Tunnels a second.
    pub tps: f64,
    /// Tunnels opened, used and closed.
    pub tunnels: u64,
}

/// New tunnels: each opens a tunnel to the echo server, sends `first` (a TLS ClientHello)
/// and reads it echoed back, closes.
pub async fn new_tunnels(
    via: Via,
    s: &Servers,
    first: Arc<[u8]>,
    conns: usize,
    duration: Duration,
) -> Result<TunnelFigures, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let echo = s.echo;
    let mut tasks = Vec::with_capacity(conns);
    for _ in 0..conns {
        let stop = stop.clone();
        let first = first.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            let mut back = vec![0u8; first.len()];
            while !stop.load(Ordering::Relaxed) {
                let mut stream = open(via, echo).await?;
                stream.write_all(&first).await?;
                stream.read_exact(&mut back).await?;
                done += 1;
            }
            Ok::<_, BoxError>(done)
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(TunnelFigures {
        tps: total as f64 / started.elapsed().as_secs_f64(),
        tunnels: total,
    })
}

/// Opens `n` tunnels to the echo server and returns them, to be held idle while the proxy's
/// memory is measured: with `echoed`, each past its first bytes (one byte echoed, so every
/// tunnel has carried data); without, each silent, as the proxy waits for its first bytes.
pub async fn hold_tunnels(
    via: Via,
    echo: SocketAddr,
    n: usize,
    echoed: bool,
) -> Result<Vec<tokio::net::TcpStream>, BoxError> {
    let mut held = Vec::with_capacity(n);
    for batch in 0..n.div_ceil(200) {
        let count = 200.min(n - batch * 200);
        let mut tasks = Vec::with_capacity(count);
        for _ in 0..count {
            tasks.push(tokio::spawn(async move {
                let mut stream = open(via, echo).await?;
                if echoed {
                    stream.write_all(b"x").await?;
                    let mut back = [0u8; 1];
                    stream.read_exact(&mut back).await?;
                }
                Ok::<_, BoxError>(stream)
            }));
        }
        for t in tasks {
            held.push(t.await??);
        }
    }
    Ok(held)
}
