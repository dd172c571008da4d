//! sandgate's egress proxy: an HTTP/1.1 forward proxy (absolute-form `http://` and CONNECT
//! tunnels) in front of a default-deny policy and an address guard.
//!
//! Data path, in module order: [`server`] accepts and reads a bounded request head ([`head`],
//! [`framing`]); the pure policy crate parses the target and decides; [`dial`] resolves,
//! vets every address and connects to a vetted one (the only module that dials out);
//! [`tunnel`] relays CONNECT bytes, [`forward`] relays HTTP messages; [`respond`] renders
//! every response the proxy writes itself; [`audit`] records every decision and close.

pub(crate) mod admin;
pub mod admission;
pub mod audit;
pub mod audit_query;
pub(crate) mod audit_sink;
pub mod config;
pub mod dial;
pub(crate) mod forward;
pub mod framing;
pub mod head;
pub mod metrics;
pub mod reload;
pub mod respond;
pub(crate) mod server;
pub(crate) mod tunnel;

pub use audit::{AuditDestination, AuditEvent, AuditOptions, EventKind};
pub use config::{Identity, Limits, Listener, PeerFilter, ProxyConfig};
pub use dial::Nameservers;
pub use server::{PolicyHandle, Proxy, StartError, unix_now};
