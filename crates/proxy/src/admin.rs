//! The opt-in admin listener (`--metrics-listen`): `GET /metrics` answers the OpenMetrics
//! text exposition; anything else is 404. Heads are read with the proxy's own bounded parser.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::http1::head::parse_request_head;
use crate::metrics::Metrics;

/// Largest admin request head.
const MAX_HEAD: usize = 8 * 1024;

/// Serves until `stop` is cancelled.
pub(crate) async fn serve(listener: TcpListener, metrics: Arc<Metrics>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), answer(stream, &metrics)).await;
        });
    }
}

async fn answer(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let head = loop {
        let mut chunk = [0u8; 1024];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        match parse_request_head(&buf) {
            Ok(Some((head, _))) => break head,
            Ok(None) if buf.len() < MAX_HEAD => {}
            _ => {
                return stream
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
            }
        }
    };
    let path = head.target.split('?').next().unwrap_or("");
    let response = if head.method == "GET" && path == "/metrics" {
        let body = metrics.encode();
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    } else {
        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
    };
    stream.write_all(response.as_bytes()).await
}
