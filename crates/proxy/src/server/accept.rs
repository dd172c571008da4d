//! One listener's accept loop: each connection admitted against the proxy's, the
//! listener's and the client address's limits ([`crate::admission`]), a local peer the
//! listener does not serve refused, and the connection handed to its front end in a tracked
//! task of its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::future::FutureExt as _;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ListenerMeta;
use crate::admission::{Admission, ListenerSlots};
use crate::config::FrontEnd;
use crate::egress::Egress;
use crate::http1::{self, ClientConn};
use crate::metrics::KindLabels;
use crate::refusal::Refusal;

/// Connections answered 503 at once (each for at most two seconds); beyond this many,
/// further ones are closed without an answer rather than tie up descriptors in a flood.
pub(super) const MAX_REFUSALS_IN_FLIGHT: usize = 256;
/// At most one "unexpected local peer" warning per interval.
const PEER_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Everything a listener checks before it serves a connection.
#[derive(Debug)]
pub(super) struct Gate {
    pub(super) admission: Arc<Admission>,
    pub(super) slots: ListenerSlots,
    pub(super) refusals: Arc<Semaphore>,
}

impl ListenerMeta {
    /// Logs a refused peer, at most once per interval, with the number refused meanwhile.
    fn warn_refused_peer(&self, peer: SocketAddr) {
        let refused = self.refused_peers.fetch_add(1, Ordering::Relaxed) + 1;
        let Ok(mut last) = self.last_peer_warning.lock() else {
            return;
        };
        if last.is_some_and(|at| at.elapsed() < PEER_WARNING_INTERVAL) {
            return;
        }
        *last = Some(std::time::Instant::now());
        self.refused_peers.store(0, Ordering::Relaxed);
        tracing::warn!(%peer, refused, "connections from unexpected local peers refused");
    }
}

pub(super) async fn accept_loop(
    listener: TcpListener,
    meta: ListenerMeta,
    gate: Gate,
    egress: Arc<Egress>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if meta.peers.as_ref().is_some_and(|f| !f.permits(peer)) {
            // Not this listener's bridge: closed before a byte is read or written.
            meta.warn_refused_peer(peer);
            continue;
        }
        let permit = match gate.admission.admit(&gate.slots, peer.ip()) {
            Ok(p) => p,
            Err(kind) => {
                egress
                    .metrics
                    .connections_refused
                    .get_or_create(&KindLabels {
                        kind: kind.as_str().into(),
                    })
                    .inc();
                // Answered 503 at once, never left waiting; in a flood beyond the refusal
                // budget the connection is simply closed.
                if let Ok(slot) = gate.refusals.clone().try_acquire_owned() {
                    let droppable = egress.dropped.child_token();
                    let egress = egress.clone();
                    let identity = meta.identity.clone();
                    let refusal = Refusal::ConnectionLimit(kind);
                    let answered = matches!(meta.front_end, FrontEnd::Http1 { .. });
                    let work = async move {
                        if answered {
                            let client = ClientConn::new(stream, peer, identity);
                            http1::refuse_connection(&egress, client, refusal).await;
                        } else {
                            // SOCKS5 has no answer before its greeting, a node none before
                            // its TLS handshake: record and close.
                            let pending = egress.begin(peer, identity, None);
                            let _ = egress.refuse(pending, None, refusal).await;
                        }
                        drop(slot);
                    };
                    tracker.spawn(work.with_cancellation_token_owned(droppable));
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let egress = egress.clone();
        let stop = stop.clone();
        let identity = meta.identity.clone();
        let front_end = meta.front_end.clone();
        let tunnels = tracker.clone();
        let streams = crate::node::serve::StreamGate {
            admission: gate.admission.clone(),
            slots: gate.slots.clone(),
        };
        egress.metrics.connections.inc();
        egress.metrics.connections_active.inc();
        // Boxed: every idle tunnel's task holds it, and a pointer costs its task less than
        // the admission held inline would (issue 32).
        let open = Box::new(Open {
            egress: egress.clone(),
            _permit: permit,
        });
        // Each front end's task is a future type of its own, sized for that front end alone:
        // every HTTP/1 connection (every idle tunnel) pays only for what it needs (issue 32).
        // A client front end makes its own work droppable, all of it but a tunnel's long
        // waits, which end at the tunnel's stop token ([`Egress::droppable`]).
        match front_end {
            FrontEnd::Http1 { require_auth } => {
                let mut client = ClientConn::new(stream, peer, identity);
                client.standing = Some(Arc::new(gate.admission.standing(&gate.slots, peer.ip())));
                tracker.spawn(http1::serve(egress.clone(), client, require_auth, stop, open));
            }
            FrontEnd::Socks5 { require_auth } => {
                let work = crate::socks5::serve(egress.clone(), stream, peer, identity, require_auth, open);
                tracker.spawn(work);
            }
            FrontEnd::Node(node) => {
                // Boxed: awaited from the block that holds it, it would be held twice.
                let serve = Box::pin(crate::node::serve::serve(
                    egress.clone(),
                    stream,
                    peer,
                    node,
                    streams,
                    tunnels,
                    stop,
                ));
                let work = async move {
                    let _open = open;
                    serve.await;
                };
                tracker.spawn(egress.droppable(work));
            }
        }
    }
}

/// A connection being served: counted as active, and holding its admission, until its task
/// ends or is dropped.
struct Open {
    egress: Arc<Egress>,
    _permit: crate::admission::Permit,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.egress.metrics.connections_active.dec();
    }
}
