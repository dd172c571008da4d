//! Which admission pool each listener draws on (its listener limit, and each client address's
//! share on it, in `admission.rs`).
//!
//! Each listener has a pool of its own, but for one pairing: an HTTP/1 listener and a SOCKS5
//! listener that are one tenant's two doors share one, so a lone client of a proxy serving
//! both protocols (`--listen` beside `--socks-listen`, or a run's two bridges) is not held to
//! half the cap. Two listeners are such a pair only if everything that could make them
//! different tenants is the same: the task, project and job they attribute traffic to,
//! whether they ask for credentials, the peers they admit (a run's filter), and the address
//! they are bound to (a listener open to the network never pairs with a loopback one). Two
//! listeners of one protocol stay two pools (separate ports may be separate tenants), and a
//! node listener never pairs. Each listener joins the first pool of its pairing that has no
//! listener of its protocol yet.

use std::net::IpAddr;

use crate::config::{FrontEnd, Identity, PeerFilter};

/// The protocol a listener speaks, as far as pairing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Socks5,
    Node,
}

/// What decides whether two listeners are one tenant's doors.
#[derive(Debug, Clone)]
pub(super) struct Door<'a> {
    task: Option<&'a str>,
    project: Option<&'a str>,
    job: Option<&'a str>,
    protocol: Protocol,
    auth: bool,
    peers: Option<&'a PeerFilter>,
    /// The address bound; `None` (not known) pairs with nothing.
    ip: Option<IpAddr>,
}

impl<'a> Door<'a> {
    pub(super) fn new(
        identity: &'a Identity,
        front_end: &FrontEnd,
        peers: Option<&'a PeerFilter>,
        ip: Option<IpAddr>,
    ) -> Door<'a> {
        let (protocol, auth) = match front_end {
            FrontEnd::Http1 { require_auth } => (Protocol::Http1, *require_auth),
            FrontEnd::Socks5 { require_auth } => (Protocol::Socks5, *require_auth),
            FrontEnd::Node(_) => (Protocol::Node, true),
        };
        Door {
            task: identity.task.as_deref(),
            project: identity.project.as_deref(),
            job: identity.job.as_deref(),
            protocol,
            auth,
            peers,
            ip,
        }
    }

    /// Whether `other` is this tenant's other door: the same in everything but the protocol.
    fn pairs_with(&self, other: &Door<'_>) -> bool {
        let peers = match (self.peers, other.peers) {
            (None, None) => true,
            (Some(a), Some(b)) => a.same(b),
            _ => false,
        };
        self.protocol != other.protocol
            && self.protocol != Protocol::Node
            && other.protocol != Protocol::Node
            && (self.task, self.project, self.job) == (other.task, other.project, other.job)
            && self.auth == other.auth
            && peers
            && self.ip.is_some()
            && self.ip == other.ip
    }
}

/// One `T` per pool (`make` is given the number of pools), and for each door, in order, its
/// pool's `T`.
pub(super) fn share<T: Clone>(doors: &[Door<'_>], make: impl Fn(usize) -> T) -> Vec<T> {
    let which = assign(doors);
    let count = which.iter().max().map_or(0, |last| last + 1);
    let pools: Vec<T> = (0..count).map(|_| make(count)).collect();
    // Every index is below `count`, so nothing is left out.
    which.into_iter().filter_map(|i| pools.get(i).cloned()).collect()
}

/// Each door's pool, numbered from 0 in order of first appearance.
fn assign(doors: &[Door<'_>]) -> Vec<usize> {
    // Each pool's doors so far.
    let mut pools: Vec<Vec<&Door<'_>>> = Vec::new();
    doors
        .iter()
        .map(|door| {
            let joins = pools
                .iter()
                .position(|members| members.iter().all(|m| door.pairs_with(m)));
            match joins.and_then(|i| pools.get_mut(i).map(|members| (i, members))) {
                Some((i, members)) => {
                    members.push(door);
                    i
                }
                None => {
                    pools.push(vec![door]);
                    pools.len() - 1
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(task: Option<&str>) -> Identity {
        Identity {
            task: task.map(str::to_owned),
            ..Identity::default()
        }
    }

    fn http(auth: bool) -> FrontEnd {
        FrontEnd::Http1 { require_auth: auth }
    }

    fn socks(auth: bool) -> FrontEnd {
        FrontEnd::Socks5 { require_auth: auth }
    }

    const LOOPBACK: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    const ANY: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));

    #[test]
    fn an_http_and_a_socks_listener_of_one_tenant_share_a_pool() {
        let none = identity(None);
        let doors = [
            Door::new(&none, &http(false), None, LOOPBACK),
            Door::new(&none, &socks(false), None, LOOPBACK),
        ];
        assert_eq!(assign(&doors), [0, 0]);
        assert_eq!(share(&doors, |count| count), [1, 1]);
    }

    /// Each pairing a second tenant could hide behind keeps the pools apart: another task,
    /// credentials on one side only, another bound address, another peer filter, the same
    /// protocol twice, an unknown address.
    #[test]
    fn anything_that_makes_another_tenant_keeps_its_own_pool() {
        let (none, a, b) = (identity(None), identity(Some("a")), identity(Some("b")));
        let (f, g) = (PeerFilter::new(), PeerFilter::new());
        let apart = |x: Door<'_>, y: Door<'_>| assign(&[x, y]) == [0, 1];
        assert!(apart(
            Door::new(&a, &http(false), None, LOOPBACK),
            Door::new(&b, &socks(false), None, LOOPBACK)
        ));
        assert!(apart(
            Door::new(&none, &http(true), None, ANY),
            Door::new(&none, &socks(false), None, ANY)
        ));
        assert!(apart(
            Door::new(&none, &http(false), None, ANY),
            Door::new(&none, &socks(false), None, LOOPBACK)
        ));
        assert!(apart(
            Door::new(&a, &http(false), Some(&f), LOOPBACK),
            Door::new(&a, &socks(false), Some(&g), LOOPBACK)
        ));
        assert!(apart(
            Door::new(&a, &http(false), Some(&f), LOOPBACK),
            Door::new(&a, &socks(false), None, LOOPBACK)
        ));
        assert!(apart(
            Door::new(&none, &http(false), None, LOOPBACK),
            Door::new(&none, &http(false), None, LOOPBACK)
        ));
        assert!(apart(
            Door::new(&none, &http(false), None, None),
            Door::new(&none, &socks(false), None, None)
        ));
        // A run's two bridges: one task, one filter.
        assert!(!apart(
            Door::new(&a, &http(false), Some(&f), LOOPBACK),
            Door::new(&a, &socks(false), Some(&f), LOOPBACK)
        ));
    }

    /// Two HTTP/1 listeners and a SOCKS5 one of one tenant: the SOCKS5 listener joins the
    /// first; a later SOCKS5 one joins the second; a node listener is never joined.
    #[test]
    fn a_socks_listener_joins_the_first_pool_without_one() {
        let none = identity(None);
        let doors = [
            Door::new(&none, &http(false), None, LOOPBACK),
            Door::new(&none, &http(false), None, LOOPBACK),
            Door::new(&none, &socks(false), None, LOOPBACK),
            Door::new(&none, &socks(false), None, LOOPBACK),
            Door::new(&none, &socks(false), None, LOOPBACK),
        ];
        assert_eq!(assign(&doors), [0, 1, 0, 1, 2]);
        assert_eq!(share(&doors, |count| count), [3, 3, 3, 3, 3]);
        let node = Door {
            protocol: Protocol::Node,
            ..Door::new(&none, &http(false), None, LOOPBACK)
        };
        let doors = [node, Door::new(&none, &socks(false), None, LOOPBACK)];
        assert_eq!(assign(&doors), [0, 1]);
    }
}
