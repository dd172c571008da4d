//! sandgate's pure policy core: what a destination is ([`Target`], [`Host`]), which patterns
//! allow or deny it ([`Pattern`], [`Ruleset`]), and which addresses may be dialled
//! ([`AddressGuard`]).
//!
//! Nothing in this crate opens a socket, reads a file, reads the clock or spawns a task:
//! time, when a later rule needs it, is an argument. That keeps every decision table-testable
//! and property-testable, the way rustls keeps its protocol core free of I/O.

pub mod addr;
pub mod decision;
pub mod host;
pub mod pattern;
pub mod target;

pub use addr::{AddrClass, AddressGuard, Prohibited, classify};
pub use decision::{Decision, PolicyReason, Ruleset, Verdict};
pub use host::{DomainName, Host, HostError};
pub use pattern::{HostPattern, Pattern, PatternError};
pub use target::{Access, HttpTarget, Target, TargetError, parse_connect_target, parse_http_target};
