//! Connection admission: how many client connections the proxy, each listener and each
//! client address on a listener may hold at once.
//!
//! A listener here is a pool of slots: an HTTP/1 and a SOCKS5 listener of one tenant are
//! its two doors and share one (`server/pools.rs` says when two listeners are one tenant's);
//! two of one protocol, or a node listener, have their own. A connection is admitted only when all three have room; the permit it then holds gives
//! the room back when the connection ends. A full limit is never a silent wait in the listen
//! backlog: the caller answers 503 at once (see `server.rs`). The per-listener limit keeps
//! one tenant (a task-bound listener) from taking every slot; the per-client limit keeps one
//! client address from starving the others on a shared listener.
//!
//! The per-client share is counted per listener, per (listener, client address): what an
//! address holds on one listener never counts on another. Tenants reached from one address
//! (the task-bound listeners of one host, all reached from its loopback address) would otherwise
//! starve each other: one tenant's idle tunnels would use up the address's share and lock
//! the next tenant out of its own listener (issue 28). One address that reaches several
//! listeners may hold a share on each; the listener limits and the proxy's cap bound the sum.
//!
//! A client may go past its share, by default (issue 32). The share alone left a lone client
//! (the sidecar case: one agent or one `sandgate run` is the only client) a quarter of the
//! capacity with the rest unused. So, unless `--max-connections-per-client` is set:
//! - a client may take a slot past its share only while a reserve stays free after the
//!   take, on its listener and on the proxy: a quarter of the pool (at least one slot per
//!   share the pool holds). A lone client gets three quarters; whoever comes next finds the
//!   reserve.
//! - while any slot of a pool is held past a share, a client that already holds a
//!   connection leaves the last slots of that pool (one per share the pool holds) to addresses
//!   that hold none. Without this, two addresses would lock a third out (the first past its
//!   share, the second filling the reserve within its own), where the share alone took
//!   four. See [`decide`] for why it then always takes more addresses than the share alone.
//!
//! An explicit `--max-connections-per-client` keeps its meaning: a hard cap, never passed.
//!
//! The counts live under one lock per listener and one for the proxy, taken in that order
//! and held from the check to the take, so two connections racing for the last free slots
//! cannot both see the reserve free.
//!
//! A connection may need more upstream sockets than its own: an intercepted tunnel opens
//! one per HTTP/2 stream in flight (`http1/intercept/`). Each takes a slot of its own,
//! charged to the connection's client address on its listener by the same rule
//! ([`Standing::admit_within`]), so the descriptors [`FDS_PER_CONNECTION`] counts still
//! bound what the proxy holds; that one waits a while for a slot to free, where a new
//! connection is answered at once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::config::Limits;
use crate::refusal::LimitKind;

/// Open descriptors kept back for the resolver, the audit log, splice pipes and listeners
/// when the connection cap is derived from `RLIMIT_NOFILE`.
pub const RESERVED_FDS: u64 = 256;
/// Descriptors one connection may hold: the client's socket and the upstream's.
pub const FDS_PER_CONNECTION: u64 = 2;

/// The most connections a descriptor limit of `nofile` supports.
pub fn connections_for_fd_limit(nofile: u64) -> usize {
    usize::try_from(nofile.saturating_sub(RESERVED_FDS) / FDS_PER_CONNECTION).unwrap_or(usize::MAX)
}

/// How far one client address may go on one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Share {
    /// `--max-connections-per-client`: never more than this.
    Cap(usize),
    /// The default share: past it only while the pools' reserves stay free.
    Flexible(usize),
}

impl Share {
    fn of(limits: &Limits) -> Share {
        match limits.max_connections_per_client {
            Some(n) => Share::Cap(n),
            None => Share::Flexible(limits.per_client()),
        }
    }

    fn size(self) -> usize {
        match self {
            Share::Cap(n) | Share::Flexible(n) => n,
        }
    }
}

/// The slots of one pool: one listener's, or the whole proxy's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pool {
    limit: usize,
    held: usize,
    /// Of `held`, the slots held past their client's share.
    borrowed: usize,
    /// Free slots a take past a share must leave.
    reserve: usize,
    /// Free slots a client already holding one must leave while any here are borrowed.
    newcomers: usize,
}

/// Whether a slot is taken within its client's share or past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Within,
    Borrowed,
}

impl Pool {
    /// A pool of `limit` slots, of which at most `room` can ever be in use (a listener's
    /// limit may exceed the proxy's cap), for clients with a share of `share`.
    fn new(limit: usize, room: usize, share: usize) -> Pool {
        // How many addresses fill the room when none goes past its share.
        let newcomers = room.div_ceil(share.max(1)).max(1);
        Pool {
            limit,
            held: 0,
            borrowed: 0,
            reserve: (room / 4).max(newcomers),
            newcomers,
        }
    }

    /// The free slots left once one more is taken; `None` when none is free.
    fn free_after_take(&self) -> Option<usize> {
        self.limit.checked_sub(self.held)?.checked_sub(1)
    }

    fn take(&mut self, slot: Slot) {
        self.held += 1;
        if slot == Slot::Borrowed {
            self.borrowed += 1;
        }
    }

    fn give_back(&mut self, borrowed: bool) {
        self.held = self.held.saturating_sub(1);
        if borrowed {
            self.borrowed = self.borrowed.saturating_sub(1);
        }
    }
}

/// The rule, on counts alone: may a client holding `held` slots on `listener` take one
/// more? Refusals name the limit that refused, as the 503 and the audit record do.
///
/// Why a newcomer (an address holding nothing) is locked out only when at least as many
/// addresses hold slots as fixed shares need to fill the pool (its `newcomers`: one per
/// share it holds), and one more while anything is borrowed. Take one pool, full. If nothing in it is borrowed, every client holds at most
/// its share: as with fixed shares. Otherwise, something has stayed borrowed since a take
/// past a share that left `reserve` ≥ `newcomers` free; look at the last moment after it
/// with `newcomers` free or more. From then on a take past a share needs `reserve` free and
/// a take by a client already in needs `newcomers` free once done: only first slots were
/// taken, and a client that took one has taken no other. The slots held then were at most
/// the pool less `newcomers`, so at least `newcomers` addresses now hold one slot each,
/// and a borrower holds more: one address more than fixed shares need. Per listener, an
/// address is a client; on the proxy's pool, a (listener, address) pair, as shares are
/// counted. The model check in the tests walks every reachable state of small pools.
fn decide(share: Share, held: usize, listener: &Pool, proxy: &Pool) -> Result<Slot, LimitKind> {
    if held >= share.size() {
        let keeps_reserve = |p: &Pool| p.free_after_take().is_some_and(|free| free >= p.reserve);
        return match share {
            Share::Flexible(_) if keeps_reserve(listener) && keeps_reserve(proxy) => Ok(Slot::Borrowed),
            _ => Err(LimitKind::Client),
        };
    }
    let on_listener = listener.free_after_take().ok_or(LimitKind::Listener)?;
    let on_proxy = proxy.free_after_take().ok_or(LimitKind::Proxy)?;
    let leaves_newcomers = |p: &Pool, free: usize| p.borrowed == 0 || free >= p.newcomers;
    if held > 0 && !(leaves_newcomers(listener, on_listener) && leaves_newcomers(proxy, on_proxy)) {
        return Err(LimitKind::Client);
    }
    Ok(Slot::Within)
}

/// The proxy-wide pool, shared by every listener, and the size of a client's share.
#[derive(Debug)]
pub(crate) struct Admission {
    proxy: Arc<Mutex<Pool>>,
    share: Share,
    /// Woken whenever a slot is given back, for who waits for one ([`Standing`]).
    freed: Arc<Notify>,
}

/// One listener's pool and what each client address holds of it.
#[derive(Debug)]
struct ListenerCounts {
    pool: Pool,
    clients: HashMap<IpAddr, usize>,
}

/// One listener's own limit, and its clients' shares, on top of the proxy's cap.
#[derive(Debug, Clone)]
pub(crate) struct ListenerSlots(Arc<Mutex<ListenerCounts>>);

/// Held for the life of an admitted connection; gives its slot back when dropped.
#[derive(Debug)]
pub(crate) struct Permit {
    ip: IpAddr,
    share: usize,
    listener: Arc<Mutex<ListenerCounts>>,
    proxy: Arc<Mutex<Pool>>,
    freed: Arc<Notify>,
}

/// What one admitted connection was admitted as (its client address on its listener),
/// to admit the further upstream connections it opens on the same terms.
#[derive(Debug, Clone)]
pub(crate) struct Standing {
    admission: Arc<Admission>,
    listener: ListenerSlots,
    ip: IpAddr,
}

/// Counts stay right even if a holder panicked: nothing here leaves them half-changed.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Admission {
    pub fn new(limits: &Limits) -> Admission {
        let share = Share::of(limits);
        let cap = limits.max_connections;
        Admission {
            proxy: Arc::new(Mutex::new(Pool::new(cap, cap, share.size()))),
            share,
            freed: Arc::new(Notify::new()),
        }
    }

    /// The slots of one of `listeners` listeners.
    pub fn listener(limits: &Limits, listeners: usize) -> ListenerSlots {
        let limit = limits.per_listener(listeners);
        let room = limit.min(limits.max_connections);
        ListenerSlots(Arc::new(Mutex::new(ListenerCounts {
            pool: Pool::new(limit, room, limits.per_client()),
            clients: HashMap::new(),
        })))
    }

    /// Admits a connection from `ip` on `listener`, or says which limit is full.
    pub fn admit(&self, listener: &ListenerSlots, ip: IpAddr) -> Result<Permit, LimitKind> {
        let ip = ip.to_canonical();
        // Listener, then proxy: the one order, so no two admissions wait on each other.
        let mut counts = lock(&listener.0);
        let mut proxy = lock(&self.proxy);
        let held = counts.clients.get(&ip).copied().unwrap_or(0);
        let slot = decide(self.share, held, &counts.pool, &proxy)?;
        proxy.take(slot);
        counts.pool.take(slot);
        *counts.clients.entry(ip).or_insert(0) += 1;
        Ok(Permit {
            ip,
            share: self.share.size(),
            listener: listener.0.clone(),
            proxy: self.proxy.clone(),
            freed: self.freed.clone(),
        })
    }

    /// The standing of a connection admitted from `ip` on `listener`.
    pub fn standing(self: &Arc<Self>, listener: &ListenerSlots, ip: IpAddr) -> Standing {
        Standing {
            admission: self.clone(),
            listener: listener.clone(),
            ip,
        }
    }
}

impl Standing {
    /// Admits one more connection for this client on its listener, by the rule that admits
    /// connections; while none is free, waits for a slot to be given back, for at most
    /// `within`, then says which limit is full.
    pub async fn admit_within(&self, within: Duration) -> Result<Permit, LimitKind> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Registered before the check, so a slot given back between the two wakes it.
            let freed = self.admission.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            let kind = match self.admission.admit(&self.listener, self.ip) {
                Ok(permit) => return Ok(permit),
                Err(kind) => kind,
            };
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(kind);
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let borrowed = {
            let mut counts = lock(&self.listener);
            let held = counts.clients.get(&self.ip).copied().unwrap_or(0);
            // Slots are alike: while the client holds more than its share, the one given
            // back is one of those past it.
            let borrowed = held > self.share;
            if held > 1 {
                counts.clients.insert(self.ip, held - 1);
            } else {
                counts.clients.remove(&self.ip);
            }
            counts.pool.give_back(borrowed);
            borrowed
        };
        // Not nested in the listener's lock: for a moment the proxy counts one slot more,
        // which only ever refuses, never admits, too much.
        lock(&self.proxy).give_back(borrowed);
        self.freed.notify_waiters();
    }
}

impl ListenerSlots {
    /// Connections `ip` holds on this listener now (for tests).
    #[cfg(test)]
    fn held_by(&self, ip: IpAddr) -> usize {
        lock(&self.0).clients.get(&ip).copied().unwrap_or(0)
    }
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
