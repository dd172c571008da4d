//! What the admin listener's handlers share ([`ApiState`]: the exceptions service, the
//! principals, the proxy's handle, the approvals page's sessions and the throttle on failed
//! logins), and the control plane's two background loops started with it (their bodies are
//! [`Control`]'s, in `service/sync.rs`).

use std::sync::Arc;
use std::time::Duration;

use sandgate_policy::Principals;
use sandgate_proxy::PolicyHandle;

use crate::service::Control;
use crate::session::Sessions;
use crate::throttle::Throttle;

/// What the handlers share.
#[derive(Debug)]
pub struct ApiState {
    pub control: Control,
    pub principals: Principals,
    pub proxy: PolicyHandle,
    /// Logged-in people on the approvals page.
    pub sessions: Sessions,
    /// Failed logins and wrong bearer tokens, limited per client address and in all.
    pub throttle: Throttle,
}

/// Expires approved exceptions at their second, until the runtime ends
/// ([`Control::expire_loop`]).
pub async fn expire_loop(state: Arc<ApiState>) {
    state.control.expire_loop().await;
}

/// With a shared store, reads it again on every notification and at least every `every`
/// ([`Control::sync_loop`]); returns at once for a store only this proxy writes.
pub async fn sync_loop(state: Arc<ApiState>, every: Duration) {
    state.control.sync_loop(every).await;
}
