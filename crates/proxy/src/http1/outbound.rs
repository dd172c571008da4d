//! The outbound side of plain-HTTP forwarding: the connection kept alive for a client
//! connection's next request, and when it may serve one. A kept connection serves only a
//! request for the same host and port (which it was vetted for) on behalf of the same
//! identity, and only within [`KEEP_IDLE`] of its last exchange; anything else gives it up
//! and has the egress core open a new one.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use sandgate_policy::{Host, HttpTarget, Identity};

use crate::egress::{Decided, Egress, Grant, Refused};
use crate::relay::Upstream;

/// A kept outbound connection idle for longer is not reused. A server closes an idle
/// connection on its own timer (Apache httpd and Node.js after 5 s, a central proxy after
/// its head timeout, 10 s by default); a request written as it does so is lost, and the
/// client would get a 502 for a request a fresh connection serves. Below the shortest
/// common timeout, that race cannot happen with those servers.
const KEEP_IDLE: std::time::Duration = std::time::Duration::from_secs(4);

/// A kept-alive outbound connection (to the origin, or to the upstream proxy when chained)
/// and the destination it was vetted for.
#[derive(Debug)]
pub(crate) struct Outbound {
    host: Host,
    port: u16,
    addr: SocketAddr,
    pub(super) stream: Upstream,
    pub(super) buf: BytesMut,
    /// The connection goes to an upstream proxy: requests go in absolute form.
    pub(super) chained: bool,
    /// Who it was opened for: a central's stream carries the identity it was opened with,
    /// so a request of another (a second credential on the same client connection) gets a
    /// stream of its own.
    identity: Arc<Identity>,
    /// When its last exchange ended (or it was opened).
    pub(super) idle_since: std::time::Instant,
}

impl Outbound {
    /// A kept connection is reusable only if it has not idled past [`KEEP_IDLE`], the
    /// origin has not closed it and has sent nothing unasked (a non-blocking read that
    /// would block means both).
    fn is_alive(&mut self) -> bool {
        self.idle_since.elapsed() < KEEP_IDLE && self.buf.is_empty() && self.stream.is_idle()
    }
}

/// Reuses the kept outbound connection when it serves this same destination (the allow is
/// recorded with its address), or has the core open a new one.
pub(super) async fn connect(
    egress: &Egress,
    decided: Decided,
    http: &HttpTarget,
    identity: &Arc<Identity>,
    outbound: &mut Option<Outbound>,
) -> Result<Grant, Refused> {
    let reusable = outbound
        .as_mut()
        .filter(|u| u.host == http.target.host && u.port == http.target.port && u.identity == *identity)
        .and_then(|u| u.is_alive().then_some(u.addr));
    if let Some(addr) = reusable {
        return decided.reuse(egress, addr).await;
    }
    give_up(outbound);
    let opened = decided.open(egress).await?;
    *outbound = Some(Outbound {
        host: http.target.host.clone(),
        port: http.target.port,
        addr: opened.addr,
        stream: opened.stream,
        buf: BytesMut::new(),
        chained: opened.chained,
        identity: identity.clone(),
        idle_since: std::time::Instant::now(),
    });
    Ok(opened.grant)
}

/// Gives a kept connection up cleanly (one to another destination, or the client's
/// connection ended): a stream to a central proxy ends, rather than being reset.
pub(crate) fn give_up(outbound: &mut Option<Outbound>) {
    if let Some(o) = outbound.take() {
        o.stream.close();
    }
}

/// The kept connection of a client connection, given up cleanly when the connection ends,
/// however it does.
#[derive(Debug, Default)]
pub(crate) struct Kept(pub Option<Outbound>);

impl Drop for Kept {
    fn drop(&mut self) {
        give_up(&mut self.0);
    }
}
