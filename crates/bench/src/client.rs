//! The load generator's client side: direct connections or CONNECT tunnels through a proxy,
//! keep-alive HTTP GETs in absolute form (proxy) or origin form (direct), and keep-alive
//! HTTPS GETs (origin form) over TLS inside a tunnel or straight to the origin.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// How the load reaches the servers.
#[derive(Debug, Clone, Copy)]
pub enum Via {
    Direct,
    Proxy(SocketAddr),
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[expect(
    clippy::disallowed_methods,
    reason = "the load generator connects to its own loopback servers"
)]
async fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// A byte stream to `dest`: direct, or a CONNECT tunnel through the proxy.
pub async fn open(via: Via, dest: SocketAddr) -> Result<TcpStream, BoxError> {
    match via {
        Via::Direct => Ok(connect(dest).await?),
        Via::Proxy(proxy) => {
            let mut s = connect(proxy).await?;
            s.write_all(format!("CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n").as_bytes())
                .await?;
            let mut head = Vec::with_capacity(256);
            let mut byte = [0u8; 1];
            // Byte at a time so no tunnel payload is swallowed with the head.
            while !head.ends_with(b"\r\n\r\n") {
                if s.read(&mut byte).await? == 0 || head.len() > 8192 {
                    return Err("proxy closed during CONNECT".into());
                }
                head.extend_from_slice(&byte);
            }
            if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
                return Err(format!("CONNECT refused: {}", String::from_utf8_lossy(&head)).into());
            }
            Ok(s)
        }
    }
}

/// A keep-alive HTTP client for the fixed-response origin.
#[derive(Debug)]
pub struct HttpClient {
    via: Via,
    origin: SocketAddr,
    stream: Option<TcpStream>,
    request: Vec<u8>,
    buf: Vec<u8>,
}

impl HttpClient {
    pub fn new(via: Via, origin: SocketAddr) -> HttpClient {
        let request = match via {
            Via::Direct => format!("GET / HTTP/1.1\r\nHost: {origin}\r\n\r\n"),
            Via::Proxy(_) => format!("GET http://{origin}/ HTTP/1.1\r\nHost: {origin}\r\n\r\n"),
        };
        HttpClient {
            via,
            origin,
            stream: None,
            request: request.into_bytes(),
            buf: Vec::with_capacity(4096),
        }
    }

    /// One GET; reconnects when the previous response closed the connection, and retries
    /// once on a fresh connection when a kept one turns out closed (tinyproxy closes after
    /// every response without saying so).
    pub async fn get(&mut self) -> Result<(), BoxError> {
        match self.stream.take() {
            Some(kept) => match self.exchange(kept).await {
                Ok(()) => Ok(()),
                Err(_) => self.fresh().await,
            },
            None => self.fresh().await,
        }
    }

    async fn fresh(&mut self) -> Result<(), BoxError> {
        let target = match self.via {
            Via::Direct => self.origin,
            Via::Proxy(p) => p,
        };
        let stream = connect(target).await?;
        self.exchange(stream).await
    }

    async fn exchange(&mut self, mut stream: TcpStream) -> Result<(), BoxError> {
        let close = exchange(&mut stream, &self.request, &mut self.buf).await?;
        if !close {
            self.stream = Some(stream);
        }
        Ok(())
    }
}

/// Writes `request` and reads one 200 response with a Content-Length body; whether the
/// server closes the connection after it.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> Result<bool, BoxError> {
    stream.write_all(request).await?;
    // A TLS stream may hold the request's record until flushed; a no-op on TCP.
    stream.flush().await?;
    buf.clear();
    let (head_len, body_len, close) = loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err("connection closed mid-response".into());
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(len) = resp.parse(buf)? {
            if resp.code != Some(200) {
                return Err(format!("status {:?}", resp.code).into());
            }
            let header = |name: &str| {
                resp.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| h.value)
            };
            let body: usize = header("content-length")
                .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
                .ok_or("no content-length")?;
            let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case(b"close"))
                || resp.version == Some(0)
                    && !header("connection").is_some_and(|v| v.eq_ignore_ascii_case(b"keep-alive"));
            break (len, body, close);
        }
    };
    while buf.len() < head_len + body_len {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err("connection closed mid-body".into());
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
    Ok(close)
}

/// A TLS client configuration (ring, HTTP/1.1 by ALPN) trusting exactly the certificates in
/// `pems`.
pub fn tls_config(pems: &[&str]) -> Result<Arc<rustls::ClientConfig>, BoxError> {
    let mut roots = rustls::RootCertStore::empty();
    for pem in pems {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(cert?)?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A keep-alive HTTPS client for the TLS origin: per connection a tunnel (or a direct TCP
/// connection), a TLS handshake with the origin's name (127.0.0.1), then GETs in origin form.
/// Behind an intercepting proxy the handshake is with the proxy, so `tls` must trust its CA.
#[derive(Debug)]
pub struct HttpsClient {
    via: Via,
    origin: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    stream: Option<TlsStream<TcpStream>>,
    request: Vec<u8>,
    buf: Vec<u8>,
}

impl HttpsClient {
    pub fn new(via: Via, origin: SocketAddr, tls: Arc<rustls::ClientConfig>) -> HttpsClient {
        HttpsClient {
            via,
            origin,
            tls,
            stream: None,
            request: format!("GET / HTTP/1.1\r\nHost: {origin}\r\n\r\n").into_bytes(),
            buf: Vec::with_capacity(4096),
        }
    }

    /// One GET, on the kept connection or (first, or after the origin closed it) on a new
    /// tunnel and handshake. No retry: the harness's origin never closes a kept connection.
    pub async fn get(&mut self) -> Result<(), BoxError> {
        let mut stream = match self.stream.take() {
            Some(kept) => kept,
            None => {
                let tcp = open(self.via, self.origin).await?;
                let name = ServerName::from(self.origin.ip());
                let connector = tokio_rustls::TlsConnector::from(self.tls.clone());
                connector.connect(name, tcp).await?
            }
        };
        let close = exchange(&mut stream, &self.request, &mut self.buf).await?;
        if !close {
            self.stream = Some(stream);
        }
        Ok(())
    }
}
