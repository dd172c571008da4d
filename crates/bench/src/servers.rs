//! The harness's own loopback servers: a keep-alive HTTP origin with a fixed small response,
//! the same origin behind TLS (a certificate for 127.0.0.1 from a CA made at start), an echo
//! server, a sink (reads N bytes, answers with one byte) and a source (writes N bytes). They
//! run in the driver process, on the load generator's core.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::client::BoxError;

const RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\r\nhello bench\n";

/// Addresses of the running servers.
#[derive(Debug)]
pub struct Servers {
    pub origin: SocketAddr,
    pub echo: SocketAddr,
    pub sink: SocketAddr,
    pub source: SocketAddr,
    pub tls: TlsOrigin,
}

/// The fixed-response origin behind TLS 1.3 (rustls, ring), HTTP/1.1 only.
#[derive(Debug)]
pub struct TlsOrigin {
    pub addr: SocketAddr,
    /// The CA that signed the origin's certificate, PEM: what its clients trust, and what an
    /// intercepting proxy is given as the system's roots.
    pub ca_pem: String,
    /// The same CA in a file, for `SSL_CERT_FILE`.
    pub ca_file: PathBuf,
    _dir: tempfile::TempDir,
}

async fn listen<F, Fut>(handler: F) -> std::io::Result<SocketAddr>
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
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

pub async fn start() -> Result<Servers, BoxError> {
    Ok(Servers {
        origin: listen(origin).await?,
        echo: listen(echo).await?,
        sink: listen(sink).await?,
        source: listen(source).await?,
        tls: tls_origin().await?,
    })
}

async fn tls_origin() -> Result<TlsOrigin, BoxError> {
    let (ca_pem, config) = certificate_for_loopback()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let addr = listen(move |stream| {
        let accepting = acceptor.accept(stream);
        async move {
            if let Ok(tls) = accepting.await {
                origin(tls).await;
            }
        }
    })
    .await?;
    let dir = tempfile::tempdir()?;
    let ca_file = dir.path().join("origin-ca.pem");
    std::fs::write(&ca_file, &ca_pem)?;
    Ok(TlsOrigin {
        addr,
        ca_pem,
        ca_file,
        _dir: dir,
    })
}

/// A CA (PEM) and a server configuration presenting a leaf it signed for 127.0.0.1.
fn certificate_for_loopback() -> Result<(String, Arc<rustls::ServerConfig>), BoxError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // A name of its own, or the leaf would look self-signed (issuer == subject).
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sandgate-bench origin CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let mut leaf_params = CertificateParams::new(Vec::<String>::new())?;
    leaf_params.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    let leaf_key = KeyPair::generate()?;
    let leaf = leaf_params.signed_by(&leaf_key, &ca)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)?;
    Ok((ca.pem(), Arc::new(config)))
}

/// Answers every request head (no bodies expected) with the fixed response.
async fn origin<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) {
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
            // The flush sends a TLS stream's record now; a no-op on TCP.
            if stream.write_all(RESPONSE).await.is_err() || stream.flush().await.is_err() {
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
