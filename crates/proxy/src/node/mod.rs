//! The central's front end for node-local proxies (`serve.rs`: a `role: node` listener, see
//! docs/central.md): the TLS handshake requires a client certificate, the node is known by
//! its certificate's first name in `spec.nodes`, each HTTP/2 stream's attribution is checked
//! against the node's entry; then a tunnel is a request like any other for the egress core,
//! which relays the stream itself (sandgate-relay's `leg.rs`), and a stream of plain HTTP
//! requests is a client connection of the HTTP/1 front end, each request decided on its
//! own. The wire both ends share (TLS files, attribution fields, the bridge, the HTTP/2
//! settings) is [`crate::transport`]; the node's side, which dials out, is `dial/central.rs`.

pub(crate) mod serve;
