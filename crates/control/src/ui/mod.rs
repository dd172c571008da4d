//! The approvals page at `/ui` on the admin listener: pending requests with approve (a TTL
//! choice; for a tweak, what is granted, each field at most what was asked) and deny (a note), active exceptions with a countdown and revoke (a note, after a
//! confirmation), recently decided ones with who decided, when, for how long and why, and
//! the proxy's denies as they happen, each with a one-click "allow for N minutes" for an
//! approver.
//!
//! The page is a static HTML shell (`page.html`, the session's name, role and CSRF token
//! filled in) and a plain script (`page.js`, served from this origin: no build step, no CDN,
//! works offline) that draws the lists from `/ui/state`, follows `/ui/events`, and makes
//! every decision with `fetch`, updating the lists in place; it needs JavaScript, and says
//! so without it. A person logs in with an approver or viewer token; the page keeps only a
//! random session id in an `HttpOnly`, `SameSite=Strict` cookie scoped to `/ui` (the token
//! is never in a URL or the page). Every action carries the session's CSRF token, checked on
//! each POST (`act.rs`). Sessions (`session.rs`) live in memory for eight hours and end with
//! the process. A refused login is recorded like a refused API call (`admin_refused`, `POST
//! /ui/login`) and counts against the same limits on failed logins ([`crate::throttle`]):
//! over one, the login is 429 with `Retry-After`, its token unchecked.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Form, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use sandgate_policy::{ExceptionState, Role};
use serde::Deserialize;
use serde_json::json;

use crate::call::{self, Call};
use crate::session::{COOKIE, Session};
use crate::state::ApiState;

mod act;

/// The page's routes.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/ui", get(page))
        .route(
            "/ui/page.js",
            get(|| asset("text/javascript; charset=utf-8", SCRIPT)),
        )
        .route("/ui/page.css", get(|| asset("text/css; charset=utf-8", STYLE)))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/state", get(state_json))
        .route("/ui/events", get(ui_events))
        .route("/ui/allow", post(act::allow))
        .route("/ui/{action}/{id}", post(act::act))
        .with_state(state)
        // Forms carry a token, a CSRF token, a note: small.
        .layer(DefaultBodyLimit::max(16 * 1024))
        .layer(axum::middleware::map_response(guard_headers))
}

/// No framing (clickjacking from another app on localhost), no sniffing, no referrer, and
/// scripts, styles and connections only from this origin (no inline script or style, so
/// text that reached the page could not run even if it escaped its escaping).
async fn guard_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        header::HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

/// The page's script and style: the same for everyone, no secret in them.
async fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
}

/// A login: checked only while the throttle lets the client's address try; a wrong token
/// and a requester's token are failures, each recorded (both get the same answer, so the
/// page does not tell a requester's token from a wrong one).
async fn login(State(state): State<Arc<ApiState>>, call: Call, Form(form): Form<LoginForm>) -> Response {
    let now = Instant::now();
    let checked = state.throttle.attempt(call.peer, now, || {
        match state.principals.verify_bearer(form.token.trim()) {
            Some(p) if p.role.uses_page() => Ok(p.clone()),
            Some(p) => Err((Some(p.name.clone()), "a requester's token cannot log in")),
            None => Err((None, "unknown token")),
        }
    });
    let who = match checked {
        Ok(Ok(who)) => who,
        Ok(Err((name, reason))) => {
            let status = StatusCode::UNAUTHORIZED;
            call::record_refusal(&state, name.as_deref(), call.parts(), status, reason).await;
            let page = login_page("That token is not an approver's or a viewer's.");
            return (status, Html(page)).into_response();
        }
        Err(wait) => {
            call::throttled(&state, call.parts(), &wait).await;
            let page = login_page(&format!("{}.", capitalised(&wait.reason())));
            let retry = [(header::RETRY_AFTER, wait.retry_after.to_string())];
            return (StatusCode::TOO_MANY_REQUESTS, retry, Html(page)).into_response();
        }
    };
    state.throttle.vouch(call.peer, now);
    match state.sessions.start(who) {
        Some(id) => (
            [(
                header::SET_COOKIE,
                format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=28800"),
            )],
            Redirect::to("/ui"),
        )
            .into_response(),
        None => (StatusCode::INTERNAL_SERVER_ERROR, "no randomness for a session").into_response(),
    }
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

async fn logout(State(state): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    state.sessions.end(&headers);
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0"),
        )],
        Redirect::to("/ui"),
    )
        .into_response()
}

async fn page(State(state): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    match state.sessions.get(&headers) {
        None => Html(login_page("")).into_response(),
        Some(s) => Html(main_page(&s)).into_response(),
    }
}

/// The lists, as the page's script draws them: each exception in the API's JSON (so its
/// times are in whatever form the API writes them), and the server's clock in Unix seconds
/// (with a fraction) for the countdowns.
async fn state_json(State(state): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    let Some(s) = state.sessions.get(&headers) else {
        return act::refusal(StatusCode::UNAUTHORIZED, "not logged in");
    };
    let list = match state.control.list(&s.who).await {
        Ok(l) => l,
        Err(e) => return act::refusal(crate::call::status_of(&e), &e.to_string()),
    };
    let pick = |st: ExceptionState| list.iter().filter(|e| e.state == st).collect::<Vec<_>>();
    let mut recent: Vec<_> = list
        .iter()
        .filter(|e| !matches!(e.state, ExceptionState::Pending | ExceptionState::Approved))
        .collect();
    // Newest decision first; within one second, the later request first.
    recent.sort_by_key(|e| std::cmp::Reverse((e.decided_at.unwrap_or(e.requested_at), e.requested_at)));
    recent.truncate(20);
    axum::Json(json!({
        // To the millisecond: the page's countdowns take their offset from it.
        "now": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        "pending": pick(ExceptionState::Pending),
        "active": pick(ExceptionState::Approved),
        "recent": recent,
        "can_decide": s.who.role == Role::Approver,
    }))
    .into_response()
}

async fn ui_events(State(state): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    match state.sessions.get(&headers) {
        Some(s) => crate::events::stream(&state, s.who).into_response(),
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

/// HTML text escaping.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");
const PAGE: &str = include_str!("page.html");

fn login_page(message: &str) -> String {
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>sandgate approvals</title>\
         <link rel=stylesheet href=/ui/page.css></head><body>\
         <h1>sandgate approvals</h1><p class=muted>{}</p>\
         <form method=post action=/ui/login><label>Admin token <input id=token name=token type=password autocomplete=off></label> \
         <button id=login type=submit>Log in</button></form></body></html>",
        escape(message)
    )
}

/// `page.html` with the session's values put in, in one pass: a value is never read again
/// for placeholders, so a name cannot pull the CSRF token (or anything else) into the page.
fn main_page(s: &Session) -> String {
    let values = [
        ("who", escape(&s.who.name)),
        ("role", escape(s.who.role.as_str())),
        ("csrf", escape(&s.csrf)),
    ];
    let mut out = String::with_capacity(PAGE.len() + 128);
    let mut rest = PAGE;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            rest = &rest[open..];
            break;
        };
        let key = &after[..close];
        match values.iter().find(|(k, _)| *k == key) {
            Some((_, v)) => out.push_str(v),
            None => out.push_str(&rest[open..open + 2 + close + 2]),
        }
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn the_page_is_filled_in_once_and_escaped() {
        let all = sandgate_policy::Principals::new(vec![(
            "<b>{{csrf}}</b>".into(),
            Role::Viewer,
            sandgate_policy::auth::secret_hash("t"),
            vec![],
        )])
        .unwrap();
        let sessions = crate::session::Sessions::default();
        let id = sessions.start(all.verify_bearer("t").cloned().unwrap()).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, format!("{COOKIE}={id}").parse().unwrap());
        let s = sessions.get(&headers).unwrap();
        let page = main_page(&s);
        assert!(page.contains("&lt;b&gt;{{csrf}}&lt;/b&gt;"), "{page}");
        assert!(page.contains(&format!("content=\"{}\"", s.csrf)), "{page}");
        assert!(page.contains("data-role=\"viewer\""), "{page}");
        assert!(!page.contains("<script>"), "no inline script");
    }
}
