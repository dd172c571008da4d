//! The upstream connections of an intercepted tunnel. HTTP/1.1 carries one request at a time
//! on a connection, and hyper's sender is ready for the next only once the last response's
//! body has been read whole; so each request of an HTTP/2 client's parallel streams takes a
//! connection of its own for as long as its response lasts, and one long response (a
//! stream of events, a long poll, a download the client reads later) holds up no other.
//!
//! A request takes a turn ([`Upstreams::turn`]: at most [`MAX_UPSTREAMS`] at once in a
//! tunnel; past them it waits, for at most the response timeout), then a connection: one
//! kept idle from an earlier request, else the CONNECT's own socket while unused, else
//! none, and the exchange has the core dial and vet a new one (`Decided::open`), as it does
//! when the origin ends a connection. Its response body, once read whole, hands the
//! connection back ([`Lease::release`]); at most [`MAX_IDLE`] are kept, the rest closed.
//! This module dials nothing itself.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Sender;
use crate::relay::Upstream;

/// Upstream connections a tunnel may have busy at once: its parallel requests, each with a
/// connection of its own.
pub(super) const MAX_UPSTREAMS: usize = 8;

/// Idle upstream connections a tunnel keeps for its next requests; a connection handed
/// back past them is closed.
const MAX_IDLE: usize = 2;

/// How long an idle connection may take to be ready for the next request (hyper's sender is
/// ready once its connection has taken in the end of the last exchange).
const IDLE_READY: Duration = Duration::from_secs(1);

/// A tunnel's upstream connections.
pub(super) struct Upstreams {
    kept: Mutex<Kept>,
    turns: Arc<Semaphore>,
}

/// What is not in use: the socket the CONNECT opened, until a request takes it, and the
/// HTTP/1.1 connections whose last response was read whole.
struct Kept {
    spare: Option<Upstream>,
    idle: Vec<Sender>,
}

impl Upstreams {
    /// A tunnel's upstreams, starting from the socket its CONNECT opened.
    pub(super) fn new(spare: Upstream) -> Arc<Upstreams> {
        Arc::new(Upstreams {
            kept: Mutex::new(Kept {
                spare: Some(spare),
                idle: Vec::new(),
            }),
            turns: Arc::new(Semaphore::new(MAX_UPSTREAMS)),
        })
    }

    /// A turn to use one connection, waited for at most `within`; `None` when every one was
    /// busy that long.
    pub(super) async fn turn(self: &Arc<Self>, within: Duration) -> Option<Turn> {
        let permit = tokio::time::timeout(within, self.turns.clone().acquire_owned())
            .await
            .ok()?
            .ok()?;
        Some(Turn {
            upstreams: self.clone(),
            _permit: permit,
        })
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One request's right to a connection; dropped, it frees the turn.
pub(super) struct Turn {
    upstreams: Arc<Upstreams>,
    _permit: OwnedSemaphorePermit,
}

impl Turn {
    /// An idle connection ready for a request, newest first, if any. One the origin ended
    /// as it went idle, or still busy past [`IDLE_READY`] (its request body still going up
    /// after an early response), is closed and the next tried.
    pub(super) async fn idle(&self) -> Option<Sender> {
        loop {
            let mut sender = self.upstreams.kept().idle.pop()?;
            if sender.is_closed() {
                continue;
            }
            if let Ok(Ok(())) = tokio::time::timeout(IDLE_READY, sender.ready()).await {
                return Some(sender);
            }
        }
    }

    /// The CONNECT's own socket, if no request has taken it yet.
    pub(super) fn spare(&self) -> Option<Upstream> {
        self.upstreams.kept().spare.take()
    }

    /// This turn with the connection it uses, for the response body to hand back.
    pub(super) fn lease(self, sender: Sender) -> Lease {
        Lease {
            sender: Some(sender),
            turn: self,
        }
    }
}

/// A connection in use by one exchange. Dropped without [`Lease::release`] (the response
/// failed or was cut, or a request body was refused midway), the connection closes: the
/// origin may hold half a request or an unread response on it.
pub(super) struct Lease {
    // Dropped before the turn: the connection is closed (or kept) before another request
    // may take the turn.
    sender: Option<Sender>,
    turn: Turn,
}

impl Lease {
    /// The connection's sender.
    pub(super) fn sender(&mut self) -> Option<&mut Sender> {
        self.sender.as_mut()
    }

    /// Hands the connection back once its response was read whole: kept idle for the next
    /// request while the origin keeps it open and fewer than [`MAX_IDLE`] are kept.
    pub(super) fn release(mut self) {
        let Some(sender) = self.sender.take() else {
            return;
        };
        if sender.is_closed() {
            return;
        }
        let mut kept = self.turn.upstreams.kept();
        if kept.idle.len() < MAX_IDLE {
            kept.idle.push(sender);
        }
    }
}
