//! The upstream connections of an intercepted tunnel. HTTP/1.1 carries one request at a time
//! on a connection, and hyper's sender is ready for the next only once the last exchange is
//! over both ways; so each request of an HTTP/2 client's parallel streams takes a
//! connection of its own for as long as its exchange lasts, and one long response (a
//! stream of events, a long poll, a download the client reads later) holds up no other.
//!
//! A request takes a turn ([`Upstreams::turn`]: at most [`MAX_UPSTREAMS`] at once in a
//! tunnel; past them it waits, for at most the response timeout), then a connection: one
//! kept idle from an earlier request, else the CONNECT's own socket while unused, else
//! none, and the exchange has the core dial and vet a new one (`Decided::open`), as it does
//! when the origin ends a connection. Every connection but one counts against the
//! connection limits as a connection of its own ([`Turn::slot`]): the one the CONNECT's
//! admission covers is the CONNECT's socket, or, once that one closed, the next opened.
//! Once both its request body and its response body ended whole, an exchange hands its
//! connection back ([`Lease::release`]); at most [`MAX_IDLE`] are kept, the rest closed,
//! and a connection dropped closes (its task ends with it). This module dials nothing
//! itself.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Sender;
use crate::admission::{Permit, Standing};
use crate::refusal::LimitKind;
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
    /// The CONNECT's admission is free for a connection: the socket it opened was used and
    /// has closed since.
    own: Arc<AtomicBool>,
    /// What the client's connection was admitted as: every other connection is admitted
    /// the same way (`None`: none is opened).
    standing: Option<Arc<Standing>>,
}

/// What is not in use: the socket the CONNECT opened, until a request takes it, and the
/// HTTP/1.1 connections whose last exchange ended whole.
struct Kept {
    spare: Option<Upstream>,
    idle: Vec<Conn>,
}

/// What a connection counts against.
pub(super) enum Slot {
    /// The CONNECT's admission, given back to the tunnel when the connection closes.
    Own(Arc<AtomicBool>),
    /// A slot of the connection limits of its own.
    Admitted { _permit: Permit },
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Slot::Own(free) = self {
            free.store(true, Ordering::Release);
        }
    }
}

/// An upstream HTTP/1.1 connection: its sender, the address it goes to (what a request on
/// it records), what it counts against, and its task, ended when the connection is dropped.
pub(super) struct Conn {
    sender: Sender,
    addr: SocketAddr,
    task: tokio::task::AbortHandle,
    _slot: Slot,
}

impl Conn {
    pub(super) fn new(sender: Sender, addr: SocketAddr, slot: Slot, task: tokio::task::AbortHandle) -> Conn {
        Conn {
            sender,
            addr,
            task,
            _slot: slot,
        }
    }

    /// The address the connection goes to.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Not kept: the origin may hold half a request or an unread response on it.
        self.task.abort();
    }
}

impl Upstreams {
    /// A tunnel's upstreams, starting from the socket its CONNECT opened.
    pub(super) fn new(spare: Upstream, standing: Option<Arc<Standing>>) -> Arc<Upstreams> {
        Arc::new(Upstreams {
            kept: Mutex::new(Kept {
                spare: Some(spare),
                idle: Vec::new(),
            }),
            turns: Arc::new(Semaphore::new(MAX_UPSTREAMS)),
            own: Arc::new(AtomicBool::new(false)),
            standing,
        })
    }

    /// A turn to use one connection, waited for until `deadline`; `None` when every one was
    /// busy that long.
    pub(super) async fn turn(self: &Arc<Self>, deadline: Instant) -> Option<Turn> {
        let permit = tokio::time::timeout_at(deadline, self.turns.clone().acquire_owned())
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
    /// as it went idle, or not ready within [`IDLE_READY`], is closed and the next tried.
    pub(super) async fn idle(&self) -> Option<Conn> {
        loop {
            // (The lock is released before a connection is closed or waited on.)
            let mut conn = self.upstreams.kept().idle.pop()?;
            if conn.sender.is_closed() {
                continue;
            }
            if let Ok(Ok(())) = tokio::time::timeout(IDLE_READY, conn.sender.ready()).await {
                return Some(conn);
            }
        }
    }

    /// The CONNECT's own socket, if no request has taken it yet, with its slot.
    pub(super) fn spare(&self) -> Option<(Upstream, Slot)> {
        let spare = self.upstreams.kept().spare.take()?;
        Some((spare, Slot::Own(self.upstreams.own.clone())))
    }

    /// What a new connection counts against: the CONNECT's admission when it is free,
    /// else a slot of the connection limits taken as the client's connection was, waited
    /// for until `deadline`. Past it, the limit that stayed full.
    pub(super) async fn slot(&self, deadline: Instant) -> Result<Slot, LimitKind> {
        let upstreams = &self.upstreams;
        if upstreams.own.swap(false, Ordering::AcqRel) {
            return Ok(Slot::Own(upstreams.own.clone()));
        }
        let Some(standing) = &upstreams.standing else {
            return Err(LimitKind::Client);
        };
        let within = deadline.saturating_duration_since(Instant::now());
        standing
            .admit_within(within)
            .await
            .map(|permit| Slot::Admitted { _permit: permit })
    }

    /// This turn with the connection it uses, for the exchange's bodies to hand back.
    pub(super) fn lease(self, conn: Conn) -> Lease {
        Lease {
            conn: Some(conn),
            turn: self,
        }
    }
}

/// A connection in use by one exchange. Dropped without [`Lease::release`] (the exchange
/// failed or was cut, or a request body was refused midway), the connection closes: the
/// origin may hold half a request or an unread response on it.
pub(super) struct Lease {
    // Dropped before the turn: the connection is closed (or kept) before another request
    // may take the turn.
    conn: Option<Conn>,
    turn: Turn,
}

impl Lease {
    /// The connection's sender.
    pub(super) fn sender(&mut self) -> Option<&mut Sender> {
        self.conn.as_mut().map(|c| &mut c.sender)
    }

    /// Hands the connection back once its exchange ended whole both ways: kept idle for
    /// the next request while the origin keeps it open and fewer than [`MAX_IDLE`] are kept.
    pub(super) fn release(mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if conn.sender.is_closed() {
            return;
        }
        let mut kept = self.turn.upstreams.kept();
        if kept.idle.len() < MAX_IDLE {
            kept.idle.push(conn);
            return;
        }
        drop(kept);
        drop(conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CONNECT's admission covers one connection: taken, it is not free; its
    /// connection closed, the next one takes it again.
    #[test]
    fn the_connects_own_admission_goes_to_one_connection_at_a_time() {
        let own = Arc::new(AtomicBool::new(false));
        let slot = Slot::Own(own.clone());
        assert!(!own.load(Ordering::Acquire));
        drop(slot);
        assert!(
            own.swap(false, Ordering::AcqRel),
            "free once its connection closed"
        );
        assert!(!own.load(Ordering::Acquire), "taken again by the next");
    }
}
