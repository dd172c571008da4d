//! Fixtures of the method and path rule tests (issue 33, plain HTTP): a git smart-HTTP
//! origin ([`git_origin`]), a raw HTTP/1.1 client that writes its own request lines
//! ([`wire`]), lookups of the decisions in an audit log and of the entries in a policy
//! file ([`decisions`]), and the policy text itself ([`entries`]). The tests themselves are
//! in [`read_only`], [`spelling`] and [`sandboxed`] (the git and CONNECT tests are in
//! `l7_e2e.rs`); the HTTPS interception tests load these fixtures on their own
//! (`l7_tls_e2e.rs`).

pub mod decisions;
pub mod entries;
pub mod git_origin;
pub mod wire;

mod query;
mod read_only;
mod sandboxed;
mod spelling;

pub use entries::{egress_policy, entry, entry_at, fetch_only};
