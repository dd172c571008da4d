//! The approvals page at `/ui` on the admin listener: pending requests with approve (a TTL
//! choice) and deny, active exceptions with a countdown and revoke, recently decided ones.
//!
//! Server-rendered HTML and a little plain JavaScript that refreshes the lists from
//! `/ui/state` every second: no build step, no CDN, works offline. A person logs in with an
//! approver or viewer token; the page keeps only a random session id in an `HttpOnly`,
//! `SameSite=Strict` cookie scoped to `/ui` (the token is never in a URL or the page). Every
//! form carries the session's CSRF token, checked on each POST. Sessions (`session.rs`) live
//! in memory for eight hours and end with the process. A refused login is recorded like a
//! refused API call (`admin_refused`, `POST /ui/login`) and counts against the same limits on
//! failed logins ([`crate::throttle`]): over one, the login is 429 with `Retry-After`, its
//! token unchecked.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use sandgate_policy::exception::Narrowing;
use sandgate_policy::{Exception, ExceptionState, Role};
use serde::Deserialize;
use serde_json::json;

use crate::call::{self, Call};
use crate::session::{COOKIE, Session};
use crate::state::ApiState;

/// The page's routes.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/ui", get(page))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/state", get(state_json))
        .route("/ui/events", get(ui_events))
        .route("/ui/{action}/{id}", post(act))
        .with_state(state)
        .layer(axum::middleware::map_response(guard_headers))
}

/// No framing (clickjacking from another app on localhost), no sniffing, no referrer, and
/// scripts and connections only from this page's own origin.
async fn guard_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
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
            Some(p) if p.role != Role::Requester => Ok(p.clone()),
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

/// The lists, as the page's script renders them.
async fn state_json(State(state): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    let Some(s) = state.sessions.get(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let now = sandgate_proxy::unix_now();
    let list = match state.control.list(&s.who).await {
        Ok(l) => l,
        Err(e) if e.is_store() => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let view = |e: &Exception| {
        json!({
            "id": e.id, "task": e.task_id, "hosts": e.hosts, "ports": e.ports, "ttl": e.ttl_seconds,
            "reason": e.reason, "by": e.requested_by, "state": e.state.as_str(),
            "decided_by": e.decided_by, "left": e.expires_at.map(|at| (at - now).max(0)),
        })
    };
    let pick = |st: ExceptionState| {
        list.iter()
            .filter(|e| e.state == st)
            .map(view)
            .collect::<Vec<_>>()
    };
    let mut recent: Vec<_> = list
        .iter()
        .filter(|e| !matches!(e.state, ExceptionState::Pending | ExceptionState::Approved))
        .collect();
    recent.sort_by_key(|e| std::cmp::Reverse(e.decided_at.unwrap_or(e.requested_at)));
    axum::Json(json!({
        "pending": pick(ExceptionState::Pending),
        "active": pick(ExceptionState::Approved),
        "recent": recent.into_iter().take(20).map(view).collect::<Vec<_>>(),
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

#[derive(Debug, Deserialize)]
struct ActForm {
    csrf: String,
    #[serde(default)]
    ttl: Option<u32>,
}

async fn act(
    State(state): State<Arc<ApiState>>,
    Path((action, id)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<ActForm>,
) -> Response {
    let Some(s) = state.sessions.get(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if form.csrf != s.csrf {
        return (StatusCode::FORBIDDEN, "stale or forged form").into_response();
    }
    let c = &state.control;
    let result = match action.as_str() {
        "approve" => {
            let narrow = Narrowing {
                hosts: None,
                ttl_seconds: form.ttl,
            };
            c.approve(&s.who, &id, &narrow).await
        }
        "deny" => {
            c.deny(&s.who, &id, Some("denied on the approvals page".into()))
                .await
        }
        "revoke" => {
            c.revoke(&s.who, &id, Some("revoked on the approvals page".into()))
                .await
        }
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    match result {
        Ok(_) => Redirect::to("/ui").into_response(),
        Err(e) => (
            if e.is_store() {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::CONFLICT
            },
            Html(format!(
                "<p>{}</p><p><a href=\"/ui\">back</a></p>",
                escape(&e.to_string())
            )),
        )
            .into_response(),
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

const STYLE: &str = "body{font:15px system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;width:100%;margin-bottom:1.5em}td,th{border-bottom:1px solid #ddd;padding:.4em;text-align:left;vertical-align:top}h2{margin-top:1.5em}form.inline{display:inline}button{margin-right:.3em}.muted{color:#777}";

fn login_page(message: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=utf-8><title>sandgate approvals</title><style>{STYLE}</style></head><body>\
         <h1>sandgate approvals</h1><p class=muted>{}</p>\
         <form method=post action=/ui/login><label>Admin token <input id=token name=token type=password autocomplete=off></label> \
         <button id=login type=submit>Log in</button></form></body></html>",
        escape(message)
    )
}

fn main_page(s: &Session) -> String {
    format!(
        "<!doctype html><html><head><meta charset=utf-8><title>sandgate approvals</title><style>{STYLE}</style></head><body>\
         <h1>sandgate approvals</h1><p class=muted>Logged in as {who} ({role}). \
         <form class=inline method=post action=/ui/logout><button>Log out</button></form></p>\
         <h2>Pending requests</h2><table id=pending><tbody></tbody></table>\
         <h2>Active exceptions</h2><table id=active><tbody></tbody></table>\
         <h2>Recently decided</h2><table id=recent><tbody></tbody></table>\
         <h2>Live denies</h2><table id=denies><tbody><tr><td class=muted>none yet</td></tr></tbody></table>\
         <script>const CSRF={csrf};{SCRIPT}</script></body></html>",
        who = escape(&s.who.name),
        role = s.who.role.as_str(),
        csrf = serde_json::to_string(&s.csrf).unwrap_or_default(),
    )
}

/// Renders the three lists from `/ui/state` every second; text goes in with textContent.
const SCRIPT: &str = r#"
function cell(tr, text) { const td = document.createElement('td'); td.textContent = text; tr.appendChild(td); return td; }
function form(action, id, label, extra) {
  const f = document.createElement('form'); f.method = 'post'; f.action = '/ui/' + action + '/' + encodeURIComponent(id); f.className = 'inline';
  const c = document.createElement('input'); c.type = 'hidden'; c.name = 'csrf'; c.value = CSRF; f.appendChild(c);
  if (extra) f.appendChild(extra);
  const b = document.createElement('button'); b.type = 'submit'; b.textContent = label; b.id = action + '-' + id; f.appendChild(b);
  return f;
}
function ttlChoice(e) {
  const s = document.createElement('select'); s.name = 'ttl'; s.id = 'ttl-' + e.id;
  for (const t of [60, 300, 900, 3600]) { if (t <= e.ttl) { const o = document.createElement('option'); o.value = t; o.textContent = (t / 60) + ' min'; s.appendChild(o); } }
  const o = document.createElement('option'); o.value = e.ttl; o.textContent = 'as asked (' + e.ttl + ' s)'; o.selected = true; s.appendChild(o);
  return s;
}
const shown = {};
function fill(id, rows, render) {
  // Re-rendered only when something changed, so a half-made choice is not reset.
  const key = JSON.stringify(rows); if (shown[id] === key) return; shown[id] = key;
  const body = document.querySelector('#' + id + ' tbody'); body.replaceChildren();
  if (!rows.length) { const tr = body.insertRow(); cell(tr, 'none').className = 'muted'; return; }
  for (const e of rows) { const tr = body.insertRow(); tr.id = id + '-row-' + e.id; render(tr, e); }
}
async function refresh() {
  let s;
  try { const r = await fetch('/ui/state', {credentials: 'same-origin'}); if (!r.ok) return; s = await r.json(); } catch (_) { return; }
  fill('pending', s.pending, (tr, e) => {
    cell(tr, e.task); cell(tr, e.hosts.join(', ') + ' : ' + e.ports.join(',')); cell(tr, e.reason); cell(tr, 'by ' + e.by);
    const td = cell(tr, '');
    if (s.can_decide) { td.appendChild(form('approve', e.id, 'Approve', ttlChoice(e))); td.appendChild(form('deny', e.id, 'Deny')); }
  });
  fill('active', s.active, (tr, e) => {
    cell(tr, e.task); cell(tr, e.hosts.join(', ') + ' : ' + e.ports.join(','));
    const left = cell(tr, e.left + ' s left'); left.className = 'countdown'; left.dataset.left = e.left;
    cell(tr, 'approved by ' + e.decided_by);
    const td = cell(tr, ''); if (s.can_decide) td.appendChild(form('revoke', e.id, 'Revoke'));
  });
  fill('recent', s.recent, (tr, e) => { cell(tr, e.state); cell(tr, e.task); cell(tr, e.hosts.join(', ')); cell(tr, e.decided_by || ''); });
}
refresh(); setInterval(refresh, 1000);
// Denies as they happen, and an immediate refresh on every exception change.
const live = new EventSource('/ui/events');
live.onmessage = (m) => {
  let e; try { e = JSON.parse(m.data); } catch (_) { return; }
  if (e.event && e.event.startsWith('exception_')) { shown.pending = shown.active = shown.recent = null; refresh(); return; }
  if (e.event !== 'decision' || e.decision !== 'deny') return;
  const body = document.querySelector('#denies tbody');
  if (body.querySelector('td.muted')) body.replaceChildren();
  const tr = body.insertRow(0); tr.className = 'deny';
  cell(tr, (e.created_at || '').slice(11, 19)); cell(tr, e.task_id || '-');
  cell(tr, (e.destination_host || '?') + ':' + (e.destination_port || '')); cell(tr, e.reason_code || '');
  while (body.rows.length > 50) body.deleteRow(-1);
};
"#;
