//! sandgate's egress proxy: front ends that parse a wire format into one typed request and
//! render refusals, one egress core that decides, vets, records and dials, and the relays
//! below it.
//!
//! Data path, in module order: [`server`] accepts and admits connections ([`admission`]);
//! a front end ([`http1`], [`socks5`], a central's [`node`] streams) reads a bounded request
//! (the HTTP/1 parsers are [`h1`], the `sandgate-h1` crate) and makes one call into the core (`egress`,
//! `Egress::clear`), which fails closed on the audit trail, asks the pure policy crate, has
//! [`dial`] resolve, vet and connect (the only module that dials out), and records
//! decisions and closes in [`audit`]; the front end then forwards HTTP or answers CONNECT; a
//! tunnel's first bytes are checked against the tunnel rules ([`hello`] reads the TLS
//! ClientHello) before the sockets go to `relay`. [`refusal`] classifies every refusal once;
//! each front end renders it. [`transport`] is the node-to-central wire both ends share.
//! [`rules`] holds the rules in force and the handle that swaps them; `cuts` ends a grant
//! early when the exception that allowed it is revoked or the entry that allowed it
//! expires; [`reload`] watches the policy file.

pub(crate) mod admin;
pub mod admission;
pub mod ask;
pub use sandgate_audit as audit;
pub mod config;
pub(crate) mod cuts;
pub mod dial;
pub(crate) mod egress;
pub use sandgate_h1 as h1;
pub mod hello;
pub mod http1;
pub mod inspect;
pub mod metrics;
pub mod node;
pub mod refusal;
pub(crate) use sandgate_relay as relay;
pub mod reload;
pub mod rules;
pub(crate) mod server;
pub mod socks5;
pub mod transport;

pub use audit::query as audit_query;
pub use audit::{AuditDestination, AuditOptions, Event, EventKind, Outcome};
pub use config::{FrontEnd, Identity, Limits, Listener, PeerFilter, ProxyConfig, Remedies, Setting};
pub use dial::{Connector, Nameservers};
pub use egress::unix_now;
pub use h1::{framing, head};
pub use rules::PolicyHandle;
pub use server::{BoundListener, Proxy, StartError};
pub use transport::TlsHandle;
