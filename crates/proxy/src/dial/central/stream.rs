//! One request's stream to a central: the CONNECT request with the request's attribution,
//! sent on an HTTP/2 connection (the stream is then the upstream end) or on an HTTP/1.1
//! connection (`--upstream-transport http1`: the upgraded connection is bridged to the core
//! through a socket pair).

use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use sandgate_policy::{Access, Identity, Target};
use tokio::net::TcpStream;

use super::HopError;
use crate::relay::{NodeStream, StreamSlot, Upstream};
use crate::transport::{ACCESS_FIELD, attribution, bridge};

/// The CONNECT request for `target` with the request's attribution (its authority is the
/// target; HTTP/2 carries it as `:authority`, HTTP/1.1 as the request target and `Host`).
pub(super) fn connect_request(
    target: &Target,
    access: Access,
    identity: &Identity,
) -> Result<hyper::Request<()>, HopError> {
    let authority = target.to_string();
    let mut request = hyper::Request::connect(authority.as_str());
    for (k, v) in attribution::fields(identity) {
        request = request.header(k, v);
    }
    if access == Access::Http {
        request = request.header(ACCESS_FIELD, "http");
    }
    request.body(()).map_err(|e| HopError::Unavailable(e.to_string()))
}

/// Opens a CONNECT stream on an HTTP/2 connection; on a 2xx the stream is the upstream
/// (the core relays a tunnel's frame by frame; the HTTP/1 forwarder reads and writes it).
pub(super) async fn open_stream(
    sender: SendRequest<Bytes>,
    request: impl FnOnce() -> Result<hyper::Request<()>, HopError>,
    timeout: Duration,
    slot: StreamSlot,
) -> Result<Upstream, HopError> {
    let request = request()?;
    let not_sent = |e: h2::Error| HopError::NotSent(e.to_string());
    let exchange = async {
        let mut sender = sender.ready().await.map_err(not_sent)?;
        let (response, send) = sender.send_request(request, false).map_err(not_sent)?;
        // Refused before the central looked at it (beyond a GOAWAY's last stream, or
        // REFUSED_STREAM), or lost after it may have: only the first may be sent again.
        let response = response.await.map_err(|e| {
            if e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM) {
                not_sent(e)
            } else {
                HopError::Unavailable(e.to_string())
            }
        })?;
        Ok::<_, HopError>((response, send))
    };
    let (response, send) = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| HopError::Unavailable("no answer in time".into()))??;
    if !response.status().is_success() {
        return Err(HopError::Refused(response.status().as_u16()));
    }
    let stream = NodeStream::new(send, response.into_body(), Some(slot));
    Ok(Upstream::Stream(Box::new(stream)))
}

/// `--upstream-transport http1`: sends the CONNECT, and on a 2xx bridges the connection:
/// the core's end.
pub(super) async fn exchange_http1(
    mut sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    request: impl FnOnce() -> Result<hyper::Request<()>, HopError>,
    times: crate::dial::HopTimes,
) -> Result<TcpStream, HopError> {
    let timeout = times.answer;
    let (parts, ()) = request()?.into_parts();
    let mut request = hyper::Request::from_parts(parts, Empty::<Bytes>::new());
    if let Ok(host) = hyper::header::HeaderValue::from_str(&request.uri().to_string()) {
        request.headers_mut().insert(hyper::header::HOST, host);
    }
    let send = async {
        sender.ready().await?;
        sender.send_request(request).await
    };
    let response = match tokio::time::timeout(timeout, send).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(HopError::Unavailable(e.to_string())),
        Err(_) => return Err(HopError::Unavailable("no answer in time".into())),
    };
    if !response.status().is_success() {
        return Err(HopError::Refused(response.status().as_u16()));
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|e| HopError::Unavailable(e.to_string()))?;
    let (core, pump) = bridge::pair().map_err(|e| HopError::Unavailable(e.to_string()))?;
    tokio::spawn(bridge::pump(TokioIo::new(upgraded), pump, None, times.stall));
    Ok(core)
}
