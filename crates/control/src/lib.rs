//! sandgate's control plane: temporary egress exceptions that a task or agent requests and a
//! person approves. It sits beside the proxy, never in its request loop: the pure model is
//! the policy crate's (`exception.rs`); here are the store ([`store`]: SQLite for one proxy,
//! PostgreSQL shared by several), the service that
//! applies roles, transitions, persistence and publication to the proxy's rules
//! ([`service`]), and the admin API ([`api`]) mounted on the proxy's admin listener, with the
//! approvals page ([`ui`]) and the limit on failed logins both share ([`throttle`]).

pub mod api;
pub mod events;
pub mod service;
pub mod store;
pub mod throttle;
pub mod ui;

pub use api::{ApiState, router};
pub use service::{Clock, Control, ControlError, expire_loop, sync_loop};
pub use store::{ExceptionStore, PgStore, SqliteStore, StoreError};
