//! CONNECT (RFC 9110 section 9.3.6): the authority-form target goes to the egress core;
//! when it dials a connection, this answers 200 and hands the tunnel, with any bytes the
//! client sent early (a TLS ClientHello pipelined behind the head), back to the core, which
//! checks its first bytes and relays it. TLS is never terminated, except for a tunnel the
//! core opened to be intercepted (`intercept/`).

use sandgate_policy::{Access, parse_connect_target};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::ClientConn;
use crate::egress::{Dialed, Egress, Request};
use crate::h1::head::RequestHead;
use crate::refusal::Refusal;

/// A tunnel answered 200 and not yet carried: what its long-lived part holds, for the
/// caller to hand to [`Egress::carry`] once the request loop's state is gone.
#[derive(Debug)]
pub(crate) struct Tunnel {
    pub stream: TcpStream,
    pub dialed: Dialed,
    /// Bytes the client sent behind its CONNECT head (a pipelined ClientHello).
    pub early: Vec<u8>,
}

/// Handles a CONNECT request: refused (answered and recorded), intercepted (served here
/// until it ends), or answered 200 and returned, to be carried by the caller once the
/// request loop's state is gone.
pub(crate) async fn handle_connect(
    egress: &std::sync::Arc<Egress>,
    mut client: ClientConn,
    head: RequestHead,
) -> Option<Tunnel> {
    let dialed = open(egress, &mut client, &head.target).await;
    drop(head);
    let dialed = dialed?;
    let ClientConn {
        mut stream,
        buf,
        peer,
        identity,
        standing,
        ..
    } = client;
    if stream
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .is_err()
    {
        egress.abandon(dialed, Some(200)).await;
        return None;
    }
    if dialed.inspects() {
        let client = super::intercept::Client {
            stream,
            early: buf.to_vec(),
            peer,
            identity,
            standing,
        };
        // Boxed: the interception's state (TLS, hyper) would otherwise enlarge every
        // CONNECT's set-up.
        Box::pin(super::intercept::serve(egress, client, dialed)).await;
        return None;
    }
    // Bytes the client sent early (a ClientHello pipelined behind the head) are the
    // tunnel's first bytes; the head's buffer (1 KiB for a connection's first request,
    // 4 KiB after) is freed with the request loop.
    Some(Tunnel {
        stream,
        dialed,
        early: buf.to_vec(),
    })
}

/// Parses, decides and dials the target; answers and records every refusal. `None`: refused.
async fn open(egress: &Egress, client: &mut ClientConn, raw_target: &str) -> Option<Dialed> {
    let request = Request {
        peer: client.peer,
        identity: client.identity.clone(),
        node: None,
        method: "CONNECT".into(),
        path: None,
        dest: parse_connect_target(raw_target)
            .map(|t| (t, Access::Connect))
            .map_err(Refusal::Target),
    };
    let result = match egress.clear(request).await {
        Ok(decided) => decided.dial(egress).await,
        Err(refused) => Err(refused),
    };
    match result {
        Ok(dialed) => Some(dialed),
        Err(refused) => {
            client.reply(&refused).await;
            None
        }
    }
}
