//! sandgate's control plane: temporary egress exceptions that a task or agent requests and a
//! person approves. It sits beside the proxy, never in its request loop: the pure model is
//! the policy crate's (`exception.rs`); here are the store ([`store`]: SQLite for one proxy,
//! PostgreSQL shared by several), the service that
//! applies roles, transitions, persistence and publication to the proxy's rules
//! ([`service`]), and the admin API ([`api`]) mounted on the proxy's admin listener, with the
//! approvals page ([`ui`], its sessions in [`session`]) and the limit on failed logins both
//! share ([`throttle`]). Below the API and the page: what their handlers share and the
//! background loops over it ([`state`]), a call and the one path that records a refused one
//! (`call.rs`), and live events ([`events`]).

pub mod api;
mod applied;
mod call;
pub mod client;
pub mod events;
pub mod follow;
pub mod service;
pub mod session;
pub mod state;
pub mod store;
pub mod throttle;
pub mod ui;

pub use api::router;
pub use follow::{FeedError, FeedSpec, Follower};
pub use service::{Clock, Control, ControlError};
pub use state::{ApiState, expire_loop, sync_loop};
pub use store::{ExceptionStore, PgStore, SqliteStore, StoreError};
