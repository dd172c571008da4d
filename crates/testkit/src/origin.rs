//! HTTP and HTTPS origins on 127.0.0.1:0 (hyper). Every response is JSON describing the
//! request the origin received (method, path, headers, body length), so tests can check
//! what the proxy forwarded, and the origin keeps `METHOD TARGET` of every request it
//! handled ([`Origin::requests`]), so a test can tell that a refused one never came, with
//! its header fields and body ([`Origin::received`]), so a test can read what arrived
//! without the client being shown it, and an HTTPS origin counts its completed TLS
//! handshakes ([`Origin::handshakes`]).
//! `/bytes/N` answers with N bytes instead, `/sleep/MS` answers `slept` after MS
//! milliseconds, and a path under `/close/` is answered as usual with `Connection: close`,
//! the origin then ending the connection (as one does at its idle or request limit).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A running origin; stops accepting when dropped.
#[derive(Debug)]
pub struct Origin {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    handshakes: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

/// One request as the origin received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub method: String,
    /// The target as hyper read it from the request line.
    pub target: String,
    /// Every header field, names lowercase, in order.
    pub headers: Vec<(String, String)>,
    /// The body, once read whole (empty for `/bytes/N` and `/sleep/MS`, which do not read
    /// it).
    pub body: Vec<u8>,
}

impl Received {
    /// The values of the header fields named `name` (lowercase).
    pub fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    /// A plain HTTP origin.
    pub async fn http() -> Origin {
        Origin::start(None).await
    }

    /// An HTTPS origin presenting the certificate of `config`.
    pub async fn https(config: Arc<rustls::ServerConfig>) -> Origin {
        Origin::start(Some(tokio_rustls::TlsAcceptor::from(config))).await
    }

    async fn start(tls: Option<tokio_rustls::TlsAcceptor>) -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
        let addr = listener.local_addr().expect("origin address");
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let shaken = handshakes.clone();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let tls = tls.clone();
                let log = log.clone();
                let shaken = shaken.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, log.clone()));
                    let builder = hyper::server::conn::http1::Builder::new();
                    match tls {
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                        }
                        Some(acceptor) => {
                            if let Ok(tls_stream) = acceptor.accept(stream).await {
                                shaken.fetch_add(1, Ordering::SeqCst);
                                let _ = builder.serve_connection(TokioIo::new(tls_stream), service).await;
                            }
                        }
                    }
                });
            }
        });
        Origin {
            addr,
            connections,
            handshakes,
            requests,
            task,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// TCP connections accepted so far (shows upstream keep-alive reuse).
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// TLS handshakes completed so far (an HTTPS origin; 0 for plain HTTP).
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    /// `METHOD TARGET` of every request handled so far, in order (the target as hyper read
    /// it from the request line).
    pub fn requests(&self) -> Vec<String> {
        self.received()
            .iter()
            .map(|r| format!("{} {}", r.method, r.target))
            .collect()
    }

    /// Every request handled so far, in order, with its header fields and body.
    pub fn received(&self) -> Vec<Received> {
        self.requests.lock().expect("origin request log").clone()
    }
}

async fn handle(
    req: Request<Incoming>,
    log: Arc<Mutex<Vec<Received>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let path = req.uri().to_string();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    // Logged as it arrives (a request whose body never ends still came), its body added
    // once read.
    let at = {
        let mut log = log.lock().expect("origin request log");
        log.push(Received {
            method: method.clone(),
            target: path.clone(),
            headers: headers.clone(),
            body: Vec::new(),
        });
        log.len() - 1
    };
    if let Some(ms) = path.strip_prefix("/sleep/").and_then(|n| n.parse::<u64>().ok()) {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        return Ok(Response::new(Full::new(Bytes::from_static(b"slept"))));
    }
    if let Some(n) = path.strip_prefix("/bytes/").and_then(|n| n.parse::<usize>().ok()) {
        return Ok(Response::new(Full::new(Bytes::from(vec![b'x'; n]))));
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if let Some(r) = log.lock().expect("origin request log").get_mut(at) {
        r.body = body.to_vec();
    }
    let json = serde_json::json!({
        "method": method,
        "path": path,
        "headers": headers,
        "body_len": body.len(),
        "body_sha": format!("{:x}", body.iter().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(*b)))),
    });
    let mut resp = Response::new(Full::new(Bytes::from(json.to_string())));
    resp.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    if path.starts_with("/close/") {
        resp.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
    Ok(resp)
}
