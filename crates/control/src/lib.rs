//! sandgate's control plane: temporary egress exceptions that a task or agent requests and a
//! person approves. It sits beside the proxy, never in its request loop: the pure model is
//! the policy crate's (`exception.rs`); here are the store ([`store`]), the service that
//! applies roles, transitions, persistence and publication to the proxy's rules
//! ([`service`]), and the admin API ([`api`]) mounted on the proxy's admin listener.

pub mod api;
pub mod events;
pub mod service;
pub mod store;
pub mod ui;

pub use api::{ApiState, router};
pub use service::{Clock, Control, ControlError};
pub use store::{ExceptionStore, SqliteStore, StoreError};

/// Expires approved exceptions at their second, until the runtime ends.
pub async fn expire_loop(state: std::sync::Arc<ApiState>) {
    let mut every = tokio::time::interval(std::time::Duration::from_millis(250));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(e) = state.control.tick().await {
            tracing::error!(error = %e, "expiring exceptions failed");
        }
    }
}
