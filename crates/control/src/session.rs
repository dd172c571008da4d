//! The approvals page's sessions: a random session id per logged-in person, carried in the
//! page's cookie, with a CSRF token of its own, for eight hours at most. Sessions live in
//! memory and end with the process. Logging in (the throttle, the token check) and the
//! cookie's attributes are `ui.rs`'s.

use std::collections::HashMap;
use std::io::Read as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use sandgate_policy::Principal;

/// The cookie that carries the session id.
pub(crate) const COOKIE: &str = "sandgate_session";
const SESSION_LIFE: Duration = Duration::from_secs(8 * 3600);

/// Logged-in people, by session id.
#[derive(Debug, Default)]
pub struct Sessions(Mutex<HashMap<String, Session>>);

#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub(crate) who: Principal,
    pub(crate) csrf: String,
    until: Instant,
}

/// 128 random bits, hex, from the kernel.
fn random_id() -> Option<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .ok()?
        .read_exact(&mut bytes)
        .ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Sessions {
    pub(crate) fn start(&self, who: Principal) -> Option<String> {
        let id = random_id()?;
        let csrf = random_id()?;
        let mut map = self.0.lock().ok()?;
        map.retain(|_, s| s.until > Instant::now());
        map.insert(
            id.clone(),
            Session {
                who,
                csrf,
                until: Instant::now() + SESSION_LIFE,
            },
        );
        Some(id)
    }

    pub(crate) fn get(&self, headers: &HeaderMap) -> Option<Session> {
        let cookies = headers.get(header::COOKIE)?.to_str().ok()?;
        let id = cookies
            .split(';')
            .filter_map(|c| c.trim().split_once('='))
            .find(|(k, _)| *k == COOKIE)?
            .1;
        let map = self.0.lock().ok()?;
        map.get(id).filter(|s| s.until > Instant::now()).cloned()
    }

    pub(crate) fn end(&self, headers: &HeaderMap) {
        if let Some(cookies) = headers.get(header::COOKIE).and_then(|v| v.to_str().ok()) {
            for (k, v) in cookies.split(';').filter_map(|c| c.trim().split_once('=')) {
                if k == COOKIE
                    && let Ok(mut map) = self.0.lock()
                {
                    map.remove(v);
                }
            }
        }
    }
}
