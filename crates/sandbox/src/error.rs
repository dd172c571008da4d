//! The crate's two error types, in a module of their own below every module that returns
//! them: [`PolicyError`] (what is wrong with a policy, from [`crate::policy`] and the host
//! paths it names in [`crate::paths`]) and [`RunError`] (why a run could not start, from
//! [`crate::run`] and the `EgressPolicy` it reads in [`crate::egress`]). Each is re-exported
//! where it has always been named (`policy::PolicyError`, `run::RunError`).
//!
//! Plain data: no conversion between the two and no exit codes (the CLI maps those).

/// What is wrong with a policy; the message names the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

/// Why a run could not start. The CLI exits 64 for `Usage`, 69 for `Unavailable`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Unavailable(String),
}
