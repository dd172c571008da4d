//! HTTP and HTTPS origins on 127.0.0.1:0 (hyper). Every response is JSON describing the
//! request the origin received (method, path, headers, body length), so tests can check
//! what the proxy forwarded. `/bytes/N` answers with N bytes instead, `/sleep/MS` answers
//! `slept` after MS milliseconds.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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
    task: tokio::task::JoinHandle<()>,
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
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = service_fn(handle);
                    let builder = hyper::server::conn::http1::Builder::new();
                    match tls {
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                        }
                        Some(acceptor) => {
                            if let Ok(tls_stream) = acceptor.accept(stream).await {
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
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let path = req.uri().to_string();
    if let Some(ms) = path.strip_prefix("/sleep/").and_then(|n| n.parse::<u64>().ok()) {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        return Ok(Response::new(Full::new(Bytes::from_static(b"slept"))));
    }
    if let Some(n) = path.strip_prefix("/bytes/").and_then(|n| n.parse::<usize>().ok()) {
        return Ok(Response::new(Full::new(Bytes::from(vec![b'x'; n]))));
    }
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
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
    Ok(resp)
}
