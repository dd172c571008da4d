//! The node-to-central transport (docs/central.md): node-local proxies forward to central
//! ones over mutual TLS, each tunnel, or each client connection's plain HTTP requests to one
//! destination, one HTTP/2 stream (RFC 9113 section 8.5 CONNECT) on one connection per node
//! and central. This module is the central's front end (`serve.rs`: a `role: node`
//! listener: the TLS handshake requires a client certificate, the node is known by its
//! certificate's first name in `spec.nodes`, each stream's attribution is checked against the
//! node's entry; then a tunnel is a request like any other for the egress core, which
//! relays the stream itself (sandgate-relay's `leg.rs`), and a stream of plain HTTP requests is a
//! client connection of the HTTP/1 front end, each request decided on its own), with the
//! TLS files (`tls.rs`; `reload.rs` reads them again on SIGHUP and when they change on
//! disk), the attribution fields (`attribution.rs`) and the bridge that
//! gives the HTTP/1.1 transport's tunnels a socket (`bridge.rs`). The node's side, which
//! dials out, is `dial/central.rs`.

pub mod attribution;
pub(crate) mod bridge;
pub mod reload;
pub(crate) mod serve;
pub mod tls;

use std::sync::{Arc, RwLock};

use sandgate_policy::Nodes;

pub use reload::TlsHandle;
pub use tls::{ClientFiles, ServerFiles, TlsError};

/// Field naming whether a stream carries plain HTTP requests (`http`, in absolute form, for
/// the stream's destination only) rather than a tunnel: the central then serves it with its
/// HTTP/1 front end and decides each request.
pub const ACCESS_FIELD: &str = "sandgate-access";

/// PINGs a connection every [`serve::KEEPALIVE`]; returns when one goes unanswered for
/// [`serve::KEEPALIVE_TIMEOUT`] (the caller then drops the connection). Never returns
/// without `ping` (taken already).
pub(crate) async fn keepalive(ping: Option<h2::PingPong>) {
    let Some(mut ping) = ping else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(serve::KEEPALIVE).await;
        let answer = tokio::time::timeout(serve::KEEPALIVE_TIMEOUT, ping.ping(h2::Ping::opaque()));
        if !matches!(answer.await, Ok(Ok(_))) {
            return;
        }
    }
}

/// A central proxy's node listener: its TLS (reloadable) and the nodes it serves.
#[derive(Debug)]
pub struct NodeListener {
    pub tls: reload::Reloadable<rustls::ServerConfig, ServerFiles>,
    nodes: RwLock<Arc<Nodes>>,
}

impl NodeListener {
    /// Reads the TLS files.
    pub fn new(files: ServerFiles, nodes: Nodes) -> Result<NodeListener, TlsError> {
        Ok(NodeListener {
            tls: reload::Reloadable::new(files)?,
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
