//! CONNECT (RFC 9110 section 9.3.6): the authority-form target goes to the egress core;
//! when it opens a connection, this answers 200, forwards any bytes the client sent early
//! (a TLS ClientHello pipelined behind the head), and relays until the tunnel ends. TLS is
//! never terminated.

use sandgate_policy::{Access, parse_connect_target};
use tokio::io::AsyncWriteExt;

use super::ClientConn;
use super::head::RequestHead;
use crate::audit::event::{Outcome, UpstreamFailure};
use crate::egress::{Egress, End, Opened};
use crate::refusal::Refusal;
use crate::relay;

/// Handles a CONNECT request; the client connection ends with it.
pub(crate) async fn handle_connect(egress: &Egress, mut client: ClientConn, head: RequestHead) {
    // Boxed and finished before the relay starts, so a long-lived tunnel carries none of
    // the set-up state (the head, the decision, the vetted addresses).
    let opened = Box::pin(open(egress, &mut client, &head.target)).await;
    drop(head);
    let Some(opened) = opened else {
        return;
    };
    let Opened { stream, grant, .. } = opened;
    let end = tunnel(egress, client, stream, grant.stop()).await;
    egress.close(grant, end).await;
}

/// Parses and opens the target; answers and records every refusal. `None`: refused.
async fn open(egress: &Egress, client: &mut ClientConn, raw_target: &str) -> Option<Opened> {
    let pending = egress.begin(client.peer, client.identity.clone(), Some("CONNECT".into()));
    let result = match parse_connect_target(raw_target) {
        Err(e) => Err(egress.refuse(pending, None, Refusal::Target(e)).await),
        Ok(target) => match egress.decide(pending, &target, Access::Connect).await {
            Ok(decided) => decided.open(egress).await,
            Err(refused) => Err(refused),
        },
    };
    match result {
        Ok(opened) => Some(opened),
        Err(refused) => {
            client.reply(&refused).await;
            None
        }
    }
}

/// Answers 200, forwards bytes the client sent early, then relays until both sides are done.
async fn tunnel(
    egress: &Egress,
    client: ClientConn,
    upstream: tokio::net::TcpStream,
    stop: &tokio_util::sync::CancellationToken,
) -> End {
    let ClientConn { mut stream, buf, .. } = client;
    let end = |sent, received, outcome: Outcome| End {
        sent,
        received,
        status: Some(200),
        outcome,
    };
    if stream
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .is_err()
    {
        return end(0, 0, Outcome::ClientFailure);
    }
    let early = buf.len() as u64;
    if early > 0 && relay::write_all(&upstream, &buf).await.is_err() {
        return end(0, 0, Outcome::Upstream(UpstreamFailure::Closed));
    }
    drop(buf);
    let (sent, received, outcome) =
        relay::tunnel(&stream, &upstream, egress.limits.tunnel_idle_timeout, stop).await;
    // Cut by its own token while the proxy runs on: the exception was revoked.
    let outcome = match outcome {
        Outcome::Shutdown if !egress.hard_stop.is_cancelled() => Outcome::Revoked,
        other => other,
    };
    end(early + sent, received, outcome)
}
