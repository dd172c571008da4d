//! The node-to-central wire both ends share (docs/central.md): node-local proxies forward to
//! central ones over mutual TLS, each tunnel, or each client connection's plain HTTP requests
//! to one destination, one HTTP/2 stream (RFC 9113 section 8.5 CONNECT) on one connection
//! per node and central. Here: the TLS files (`tls.rs`; `reload.rs` reads them again on
//! SIGHUP and when they change on disk; `admin_cert.rs` the admin listener's, read again
//! when they change), the attribution fields (`attribution.rs`), the
//! bridge that gives the HTTP/1.1 transport's tunnels a socket (`bridge.rs`), the HTTP/2
//! settings and keep-alive, and a central's node listener. The central's front end is
//! [`crate::node`]; the node's connector is `dial/central.rs`. Nothing here imports either.

mod admin_cert;
pub mod attribution;
pub(crate) mod bridge;
pub mod reload;
pub mod tls;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use sandgate_policy::Nodes;

pub use reload::TlsHandle;
pub use tls::{ClientFiles, ServerFiles, TlsError};

/// Flow control (RFC 9113 section 5.2). Each stream may have `STREAM_WINDOW` bytes in
/// flight that its reader has not taken, and the connection's window is that times the
/// most streams a connection may have open: so streams whose readers stop (a client that
/// never reads, whether slow or hostile) can hold at most their own windows, never the
/// connection's, and cannot stall the other tunnels on it. The product is also the most a
/// connection can buffer (128 MiB, reached only when every stream is stalled).
pub(crate) const STREAM_WINDOW: u32 = 256 * 1024;
/// Streams one node connection may have open at once (more wait for a free one).
pub(crate) const MAX_STREAMS: u32 = 512;
pub(crate) const CONNECTION_WINDOW: u32 = STREAM_WINDOW * MAX_STREAMS;
/// The largest DATA frame either side accepts: bulk tunnels move in fewer frames.
pub(crate) const MAX_FRAME: u32 = 64 * 1024;
/// The largest header block either side accepts.
pub(crate) const MAX_HEADER_LIST: u32 = 16 * 1024;
/// PING a connection this often; no answer within the timeout ends it.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(10);
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Field naming whether a stream carries plain HTTP requests (`http`, in absolute form, for
/// the stream's destination only) rather than a tunnel: the central then serves it with its
/// HTTP/1 front end and decides each request.
pub const ACCESS_FIELD: &str = "sandgate-access";

/// PINGs a connection every [`KEEPALIVE`]; returns when one goes unanswered for
/// [`KEEPALIVE_TIMEOUT`] (the caller then drops the connection). Never returns
/// without `ping` (taken already).
pub(crate) async fn keepalive(ping: Option<h2::PingPong>) {
    let Some(mut ping) = ping else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(KEEPALIVE).await;
        let answer = tokio::time::timeout(KEEPALIVE_TIMEOUT, ping.ping(h2::Ping::opaque()));
        if !matches!(answer.await, Ok(Ok(_))) {
            return;
        }
    }
}

/// A central proxy's node listener: its TLS (reloadable) and the nodes it serves.
#[derive(Debug)]
pub struct NodeListener {
    pub tls: Arc<reload::Reloadable<rustls::ServerConfig, ServerFiles>>,
    nodes: RwLock<Arc<Nodes>>,
}

impl NodeListener {
    /// Reads the TLS files.
    pub fn new(files: ServerFiles, nodes: Nodes) -> Result<NodeListener, TlsError> {
        Ok(NodeListener {
            tls: Arc::new(reload::Reloadable::new(files)?),
            nodes: RwLock::new(Arc::new(nodes)),
        })
    }

    /// The nodes served now.
    pub fn nodes(&self) -> Arc<Nodes> {
        match self.nodes.read() {
            Ok(n) => n.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the nodes (a policy reload); connections already up keep their node's
    /// entry until they end.
    pub fn set_nodes(&self, nodes: Nodes) {
        match self.nodes.write() {
            Ok(mut n) => *n = Arc::new(nodes),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(nodes),
        }
    }
}

impl PartialEq for NodeListener {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for NodeListener {}
