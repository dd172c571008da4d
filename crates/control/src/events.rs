//! Live events as server-sent events: every audit event as it is recorded (decisions,
//! closes, exception changes), one JSON line per SSE `data:` field, in the audit log's own
//! format. `/v1/events` takes a bearer token (a requester sees its tasks' events only);
//! `/ui/events` the approvals page's session. A subscriber that falls behind is told how
//! many events it missed (`event: lagged`); every stream ends when the proxy shuts down.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::{self, Stream, StreamExt as _};
use sandgate_policy::{Principal, Role};
use sandgate_proxy::audit::{Line, Stamped};
use tokio::sync::broadcast::error::RecvError;

use crate::state::ApiState;

/// The stream of events `who` may see.
pub fn stream(
    state: &ApiState,
    who: Principal,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>> + use<>> {
    let rx = state.proxy.subscribe();
    let stopping = state.proxy.stopping();
    let events = stream::unfold((rx, stopping, who), |(mut rx, stopping, who)| async move {
        loop {
            let next = tokio::select! {
                _ = stopping.cancelled() => return None,
                next = rx.recv() => next,
            };
            match next {
                Ok(ev) if visible(&who, &ev) => {
                    let line = serde_json::to_string(&Line::of(&ev)).unwrap_or_default();
                    return Some((Ok(SseEvent::default().data(line)), (rx, stopping, who)));
                }
                Ok(_) => {}
                Err(RecvError::Lagged(n)) => {
                    let note = SseEvent::default().event("lagged").data(n.to_string());
                    return Some((Ok(note), (rx, stopping, who)));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    });
    // A comment first: the response (and the subscription made above) reaches the client at
    // once, rather than with the first event or keep-alive (15 s), so a client knows when it
    // is subscribed. Readers of server-sent events skip comments.
    let subscribed = stream::once(async { Ok(SseEvent::default().comment("subscribed")) });
    Sse::new(subscribed.chain(events)).keep_alive(KeepAlive::default())
}

/// A requester sees events of its tasks only, a follower the exception changes only; the
/// other roles see everything.
fn visible(who: &Principal, ev: &Arc<Stamped>) -> bool {
    match who.role {
        Role::Approver | Role::Viewer => return true,
        Role::Follower => return matches!(ev.event, sandgate_proxy::audit::event::Event::Exception(_)),
        Role::Requester => {}
    }
    let line = Line::of(ev);
    line.task_id
        .is_some_and(|t| sandgate_policy::ids::listed(&who.tasks, t))
}
