//! CONNECT (RFC 9110 section 9.3.6): the authority-form target goes to the egress core;
//! when it dials a connection, this answers 200 and hands the tunnel, with any bytes the
//! client sent early (a TLS ClientHello pipelined behind the head), back to the core, which
//! checks its first bytes and relays it. TLS is never terminated, except for a tunnel the
//! core opened to be intercepted (`intercept/`).

use sandgate_policy::{Access, parse_connect_target};
use tokio::io::AsyncWriteExt;

use super::ClientConn;
use crate::egress::{Dialed, Egress, Request};
use crate::h1::head::RequestHead;
use crate::refusal::Refusal;

/// Handles a CONNECT request; the client connection ends with it.
pub(crate) async fn handle_connect(
    egress: &std::sync::Arc<Egress>,
    mut client: ClientConn,
    head: RequestHead,
) {
    // Boxed and finished before the relay starts, so a long-lived tunnel carries none of
    // the set-up state (the head, the decision, the vetted addresses).
    let dialed = Box::pin(open(egress, &mut client, &head.target)).await;
    drop(head);
    let Some(dialed) = dialed else {
        return;
    };
    let ClientConn {
        mut stream,
        buf,
        peer,
        identity,
        ..
    } = client;
    if stream
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .is_err()
    {
        return egress.abandon(dialed, Some(200)).await;
    }
    if dialed.inspects() {
        let client = super::intercept::Client {
            stream,
            early: buf.to_vec(),
            peer,
            identity,
        };
        // Boxed: the interception's state (TLS, hyper) would otherwise enlarge every
        // CONNECT's task, blind tunnels included.
        return Box::pin(super::intercept::serve(egress, client, dialed)).await;
    }
    // Bytes the client sent early (a ClientHello pipelined behind the head) are the
    // tunnel's first bytes. The head's buffer (4 KiB) is freed first: held across the
    // carry, every tunnel kept it for its whole life.
    let early = buf.to_vec();
    drop(buf);
    egress
        .carry(crate::relay::Leg::Tcp(&stream), dialed, early, Some(200))
        .await;
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
