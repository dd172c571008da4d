//! Connection admission: how many client connections the proxy, each listener and each
//! client address on a listener may hold at once.
//!
//! A connection is admitted only when all three have room; the permit it then holds gives
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

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

/// The proxy-wide counter, shared by every listener, and the size of a client's share.
#[derive(Debug)]
pub(crate) struct Admission {
    proxy: Arc<Semaphore>,
    per_client: usize,
}

/// Connections held per client address on one listener.
type Clients = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// One listener's own limit, and its clients' shares, on top of the proxy's cap.
#[derive(Debug, Clone)]
pub(crate) struct ListenerSlots {
    slots: Arc<Semaphore>,
    clients: Clients,
}

/// Held for the life of an admitted connection.
#[derive(Debug)]
pub(crate) struct Permit {
    _proxy: OwnedSemaphorePermit,
    _listener: OwnedSemaphorePermit,
    _client: ClientSlot,
}

#[derive(Debug)]
struct ClientSlot {
    ip: IpAddr,
    clients: Clients,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut clients = match self.clients.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(n) = clients.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                clients.remove(&self.ip);
            }
        }
    }
}

impl Admission {
    pub fn new(limits: &Limits) -> Admission {
        Admission {
            proxy: Arc::new(Semaphore::new(limits.max_connections)),
            per_client: limits.per_client(),
        }
    }

    /// The slots of one of `listeners` listeners.
    pub fn listener(limits: &Limits, listeners: usize) -> ListenerSlots {
        ListenerSlots {
            slots: Arc::new(Semaphore::new(limits.per_listener(listeners))),
            clients: Arc::default(),
        }
    }

    /// Admits a connection from `ip` on `listener`, or says which limit is full.
    pub fn admit(&self, listener: &ListenerSlots, ip: IpAddr) -> Result<Permit, LimitKind> {
        let ip = ip.to_canonical();
        let client = {
            let mut clients = match listener.clients.lock() {
                Ok(c) => c,
                Err(poisoned) => poisoned.into_inner(),
            };
            let held = clients.entry(ip).or_insert(0);
            if *held >= self.per_client {
                if *held == 0 {
                    clients.remove(&ip);
                }
                return Err(LimitKind::Client);
            }
            *held += 1;
            ClientSlot {
                ip,
                clients: listener.clients.clone(),
            }
        };
        // `client` gives its slot back if either of the others is full.
        let listener = listener
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| LimitKind::Listener)?;
        let proxy = self
            .proxy
            .clone()
            .try_acquire_owned()
            .map_err(|_| LimitKind::Proxy)?;
        Ok(Permit {
            _proxy: proxy,
            _listener: listener,
            _client: client,
        })
    }
}

impl ListenerSlots {
    /// Connections `ip` holds on this listener now (for tests).
    #[cfg(test)]
    fn held_by(&self, ip: IpAddr) -> usize {
        self.clients
            .lock()
            .map_or(0, |c| c.get(&ip).copied().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, listener: Option<usize>, client: Option<usize>) -> Limits {
        Limits {
            max_connections: total,
            max_connections_per_listener: listener,
            max_connections_per_client: client,
            ..Limits::default()
        }
    }

    #[test]
    fn each_limit_refuses_with_its_own_kind_and_gives_room_back() {
        let l = limits(5, Some(4), Some(3));
        let adm = Admission::new(&l);
        let a = Admission::listener(&l, 2);
        let b = Admission::listener(&l, 2);
        let ip1: IpAddr = "127.0.0.1".parse().unwrap();
        let ip2: IpAddr = "::ffff:127.0.0.2".parse().unwrap();
        let held: Vec<Permit> = (0..3).map(|_| adm.admit(&a, ip1).unwrap()).collect();
        assert_eq!(adm.admit(&a, ip1).unwrap_err(), LimitKind::Client);
        let fourth = adm.admit(&a, ip2).unwrap();
        assert_eq!(adm.admit(&a, ip2).unwrap_err(), LimitKind::Listener);
        // A refusal takes no slot.
        assert_eq!(a.held_by("127.0.0.2".parse().unwrap()), 1);
        let fifth = adm.admit(&b, ip2).unwrap();
        assert_eq!(
            adm.admit(&b, "10.0.0.9".parse().unwrap()).unwrap_err(),
            LimitKind::Proxy
        );
        assert_eq!(b.held_by("10.0.0.9".parse().unwrap()), 0);
        drop(held);
        assert_eq!(a.held_by(ip1), 0);
        assert!(adm.admit(&b, ip1).is_ok());
        drop((fourth, fifth));
    }

    /// Issue 28: tenant A holding its whole share on its listener from 127.0.0.1 must not
    /// lock tenant B, from the same address, out of B's own listener.
    #[test]
    fn a_tenant_on_its_own_listener_gets_in_while_another_holds_its_share_from_the_same_address() {
        let l = limits(40, None, Some(4));
        let adm = Admission::new(&l);
        let (a, b) = (Admission::listener(&l, 2), Admission::listener(&l, 2));
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let tenant_a: Vec<Permit> = (0..4).map(|_| adm.admit(&a, ip).unwrap()).collect();
        assert_eq!(
            adm.admit(&a, ip).unwrap_err(),
            LimitKind::Client,
            "A's share holds"
        );
        let tenant_b = adm.admit(&b, ip).expect("B on its own listener");
        // The same address written as IPv4-mapped IPv6 is the same client.
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let more_b: Vec<Permit> = (0..3).map(|_| adm.admit(&b, mapped).unwrap()).collect();
        assert_eq!(
            adm.admit(&b, ip).unwrap_err(),
            LimitKind::Client,
            "B's share holds"
        );
        drop((tenant_a, tenant_b, more_b));
        let again: Vec<Permit> = (0..4).map(|_| adm.admit(&a, ip).unwrap()).collect();
        assert!(adm.admit(&b, ip).is_ok(), "both shares were given back");
        drop(again);
    }

    #[test]
    fn defaults_leave_room_for_other_tenants() {
        let one = limits(1000, None, None);
        assert_eq!(one.per_listener(1), 1000);
        assert_eq!(one.per_listener(2), 500);
        assert_eq!(one.per_listener(10), 250);
        assert_eq!(one.per_client(), 250);
        let small = limits(40, None, None);
        assert_eq!(small.per_client(), 10);
        assert_eq!(limits(40, Some(7), Some(3)).per_listener(2), 7);
        assert_eq!(connections_for_fd_limit(1024), 384);
        assert_eq!(connections_for_fd_limit(100), 0);
    }
}
