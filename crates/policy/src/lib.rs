//! sandgate's pure policy core: what a destination is ([`Target`], [`Host`]), which patterns
//! allow or deny it ([`Pattern`], [`Ruleset`]), and which addresses may be dialled
//! ([`AddressGuard`]).
//!
//! Nothing in this crate opens a socket, reads a file, reads the clock or spawns a task:
//! time is an argument ([`Context::now`]). Policy files are parsed from text handed in. That keeps every decision table-testable
//! and property-testable, the way rustls keeps its protocol core free of I/O.

pub mod addr;
pub mod auth;
pub mod credential;
pub mod decision;
pub mod document;
pub mod entry;
pub mod exception;
pub mod host;
pub mod ids;
pub mod node;
pub mod pattern;
pub mod preset;
pub mod request;
pub mod rfc3339;
pub mod target;
pub mod tunnel;

pub use addr::{AddrClass, AddressGuard, Prohibited, classify};
pub use auth::{AuthError, Credentials, Principal, Principals, Role, TaskCredential};
pub use credential::{BodyScan, BoundSecrets, Carried, Leak, Secret};
pub use decision::{Context, Decision, Identity, PolicyReason, RequestLine, Rule, Ruleset, Verdict};
pub use document::{
    AdminSpec, DocError, DocErrors, FirstLoaded, ListenerSpec, PolicyFile, SecretSource, TaskSecretSpec,
    TokenSpec, binds_overlap, parse_policy, parse_policy_since,
};
pub use entry::{Entry, Scope};
pub use exception::{
    Exception, ExceptionPolicy, NewRequest, RequestError, State as ExceptionState, TransitionError,
};
pub use host::{DomainName, Host, HostError};
pub use node::{NodeSpec, Nodes, VouchError};
pub use pattern::{HostPattern, Pattern, PatternError};
pub use request::{CanonicalPath, PathError, PathPattern, RequestRules, RulesError, judgeable};
pub use target::{
    Access, HttpTarget, Target, TargetError, parse_connect_target, parse_host_field, parse_http_target,
};
pub use tunnel::{FirstBytes, TunnelRefusal, TunnelRules};
