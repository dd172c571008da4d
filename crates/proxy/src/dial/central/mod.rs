//! The node-local side of the node-to-central transport: one mutual-TLS HTTP/2 connection
//! to each central proxy (`--upstream https://HOST:PORT`), made when first needed and kept;
//! each tunnel or request is one CONNECT stream on it (RFC 9113 section 8.5), carrying the
//! request's attribution. Centrals are tried in the order given: one that cannot be reached
//! is marked down and left to a health check (a task that tries it again after a back-off,
//! 1 s doubling to 30 s, and marks it up once a connection is made), so no request waits on
//! a central known to be down; the next is tried, and with none left the request fails (502,
//! naming the last hop tried); it never goes direct. A central that answers (200, or a
//! refusal) is not failed over: its answer is the answer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use sandgate_policy::{Access, Identity, Target};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::DialError;
use crate::relay::{StreamSlot, Upstream};
use crate::transport::reload::Reloadable;
use crate::transport::tls::{ClientFiles, TlsError};
use crate::transport::{CONNECTION_WINDOW, MAX_FRAME, MAX_HEADER_LIST, MAX_STREAMS, STREAM_WINDOW};

mod stream;
use stream::{connect_request, exchange_http1, open_stream};

const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Why an `--upstream` URL is not usable.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamUrlError {
    #[error("a central proxy is https://HOST:PORT")]
    NotHttps(String),
    #[error("{1}")]
    Bad(String, String),
}

/// Why central proxies could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CentralsError {
    #[error("{0:?}: {1}")]
    Url(String, UpstreamUrlError),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// One central proxy as configured: where it is and the name its certificate must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// As given, for messages (`central-a:3130`).
    pub name: String,
    pub host: String,
    pub port: u16,
}

impl Hop {
    /// Parses `https://HOST:PORT` (an IPv6 host in brackets; the port defaults to 443).
    pub fn parse(url: &str) -> Result<Hop, UpstreamUrlError> {
        let rest = url
            .strip_prefix("https://")
            .ok_or_else(|| UpstreamUrlError::NotHttps(url.to_owned()))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '@', '?', '#']) {
            return Err(UpstreamUrlError::Bad(
                url.to_owned(),
                "only a host and a port".into(),
            ));
        }
        let with_port = if rest.starts_with('[') {
            rest.contains("]:")
        } else {
            rest.contains(':')
        };
        let authority = if with_port {
            rest.to_owned()
        } else {
            format!("{rest}:443")
        };
        let target = sandgate_policy::target::parse_connect_target(&authority)
            .map_err(|e| UpstreamUrlError::Bad(url.to_owned(), e.to_string()))?;
        Ok(Hop {
            name: target.to_string(),
            host: match &target.host {
                sandgate_policy::Host::Ip(ip) => ip.to_string(),
                sandgate_policy::Host::Name(n) => n.as_str().to_owned(),
            },
            port: target.port,
        })
    }
}

/// One kept connection to a central, and how many of its streams are open.
#[derive(Debug)]
struct Conn {
    sender: SendRequest<Bytes>,
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    /// Cancelled when the connection has ended, or failed a stream.
    closed: CancellationToken,
    /// The TLS configuration's generation it was made with: after a reload (a rotated
    /// certificate) it takes no new streams, so the next ones present the new files.
    generation: u64,
}

/// Room for one stream on a connection to a central.
struct Room {
    sender: SendRequest<Bytes>,
    addr: SocketAddr,
    slot: StreamSlot,
    /// The connection was kept from earlier streams (its token, to give it up if it
    /// fails); `None` for one made for this stream.
    kept: Option<CancellationToken>,
}

/// The connections to one central, and whether it is down. A connection carries at most
/// as many streams as the central allows; when every one is full another is opened, so
/// clients holding many tunnels open cannot make the others wait for a stream.
#[derive(Debug, Default)]
struct HopState {
    conns: Vec<Conn>,
    /// Down since a connection failed: requests pass it by while its health check runs.
    down: bool,
}

/// The central proxies of a node-local proxy.
#[derive(Debug)]
pub struct Centrals {
    hops: Vec<(Hop, Mutex<HopState>)>,
    tls: Arc<Reloadable<rustls::ClientConfig, ClientFiles>>,
    /// A TLS connection per tunnel with HTTP/1.1 CONNECT, instead of HTTP/2 streams.
    http1: bool,
}

/// Why one central could not carry a request.
#[derive(Debug, thiserror::Error)]
enum HopError {
    /// Unreachable, or the connection broke: try the next.
    #[error("{0}")]
    Unavailable(String),
    /// It answered with this status: the request's answer.
    #[error("answered {0}")]
    Refused(u16),
    /// A kept connection could not take the stream (GOAWAY, closed, REFUSED_STREAM): the
    /// request never reached the central, so it may go on another connection.
    #[error("{0}")]
    NotSent(String),
}

/// At most this many kept connections are given up, one after another, for one request
/// whose stream none of them could take, before a new connection is made or the central
/// counts as down.
const KEPT_RETRIES: usize = 8;

impl PartialEq for Centrals {
    /// The same connector, not an equal one (it holds live connections).
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Centrals {}

impl Centrals {
    /// Parses each `https://HOST:PORT` of `urls` and reads the TLS files (what both the
    /// proxy's `--upstream` and a sandbox policy's `net.proxy.upstream` give).
    pub fn from_urls(urls: &[String], files: ClientFiles) -> Result<Centrals, CentralsError> {
        let hops = urls
            .iter()
            .map(|u| Hop::parse(u).map_err(|e| CentralsError::Url(u.clone(), e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Centrals::new(hops, files)?)
    }

    /// Reads the TLS files; connections are made when first needed.
    pub fn new(hops: Vec<Hop>, files: ClientFiles) -> Result<Centrals, TlsError> {
        let http1 = files.http1;
        // Centrals know a node by its certificate's first name only (`spec.nodes`).
        if let Ok(Some(name)) = crate::transport::tls::node_name(&files.cert) {
            tracing::info!(node = %name, "node name (its certificate's first name; list it in the centrals' spec.nodes)");
        }
        Ok(Centrals {
            http1,
            hops: hops
                .into_iter()
                .map(|h| (h, Mutex::new(HopState::default())))
                .collect(),
            tls: Arc::new(Reloadable::new(files)?),
        })
    }

    /// The client configuration and its files (SIGHUP reloads them: [`crate::TlsHandle`]).
    pub(crate) fn tls(&self) -> Arc<Reloadable<rustls::ClientConfig, ClientFiles>> {
        self.tls.clone()
    }

    /// Opens a stream to `target` on a central, attributed to `identity`; returns the core's
    /// end of it and the central's address.
    pub(super) async fn open(
        &self,
        dialer: &Arc<super::Dialer>,
        target: &Target,
        access: Access,
        identity: &Identity,
        times: super::HopTimes,
    ) -> Result<(Upstream, SocketAddr), DialError> {
        let timeout = times.answer;
        let request = || connect_request(target, access, identity);
        let mut last = String::from("no central proxy configured");
        for (hop, state) in &self.hops {
            let attempt = if self.http1 {
                self.tunnel_http1(dialer, hop, state, request, times).await
            } else {
                // A kept connection that could not take the stream (the central sent
                // GOAWAY on its way out or on a reload): given up, and the request goes on
                // another, or a new one, before the central counts as down. Only a
                // request that never reached the central is sent again.
                let mut attempt = self.stream(dialer, hop, state, request, timeout).await;
                for _ in 0..KEPT_RETRIES {
                    let Err((HopError::NotSent(why), Some(failed))) = &attempt else {
                        break;
                    };
                    tracing::debug!(central = %hop.name, error = %why, "a kept connection takes no new streams; trying another");
                    failed.cancel();
                    attempt = self.stream(dialer, hop, state, request, timeout).await;
                }
                attempt.map_err(|(e, _)| e)
            };
            match attempt {
                Ok(Some(opened)) => return Ok(opened),
                Ok(None) => last = format!("{}: down (its health check retries it)", hop.name),
                Err(HopError::Refused(status)) => return Err(DialError::UpstreamRefused(status)),
                Err(HopError::Unavailable(why) | HopError::NotSent(why)) => {
                    tracing::warn!(central = %hop.name, error = %why, "central proxy unavailable; trying the next");
                    let mut state = state.lock().await;
                    state.conns.clear();
                    if !state.down {
                        state.down = true;
                        tokio::spawn(health_check(Arc::downgrade(dialer), hop.clone()));
                    }
                    last = format!("{}: {why}", hop.name);
                }
            }
        }
        Err(DialError::CentralUnavailable(last))
    }

    /// Opens a stream on the hop (`None` while it is down). On failure, the kept
    /// connection the stream was tried on, if it was a kept one.
    async fn stream(
        &self,
        dialer: &super::Dialer,
        hop: &Hop,
        state: &Mutex<HopState>,
        request: impl FnOnce() -> Result<hyper::Request<()>, HopError>,
        timeout: Duration,
    ) -> Result<Option<(Upstream, SocketAddr)>, (HopError, Option<CancellationToken>)> {
        match self.sender(dialer, hop, state).await {
            Ok(Some(room)) => open_stream(room.sender, request, timeout, room.slot)
                .await
                .map(|up| Some((up, room.addr)))
                .map_err(|e| (e, room.kept)),
            Ok(None) => Ok(None),
            Err(e) => Err((e, None)),
        }
    }

    /// A connection to the hop with room for one more stream, and that stream's slot: a
    /// kept one, or one made now; `None` while the hop is down. The lock is held only while
    /// connecting, so streams are opened on the connections concurrently.
    async fn sender(
        &self,
        dialer: &super::Dialer,
        hop: &Hop,
        state: &Mutex<HopState>,
    ) -> Result<Option<Room>, HopError> {
        let mut state = state.lock().await;
        let generation = self.tls.generation();
        // Dropped from the list, a connection still carries its streams to their end.
        state
            .conns
            .retain(|c| !c.closed.is_cancelled() && c.generation == generation);
        let room = state
            .conns
            .iter()
            .find(|c| c.open.load(Ordering::Relaxed) < MAX_STREAMS as usize);
        if let Some(c) = room {
            c.open.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(Room {
                sender: c.sender.clone(),
                addr: c.addr,
                slot: StreamSlot(c.open.clone()),
                kept: Some(c.closed.clone()),
            }));
        }
        if state.down {
            return Ok(None);
        }
        let conn = self.h2_connect(dialer, hop).await?;
        let room = Room {
            sender: conn.sender.clone(),
            addr: conn.addr,
            slot: StreamSlot(conn.open.clone()),
            kept: None,
        };
        conn.open.store(1, Ordering::Relaxed);
        state.conns.push(conn);
        Ok(Some(room))
    }

    /// A new mutual-TLS HTTP/2 connection to the hop, its driver (and keep-alive) running in
    /// a task of its own; no stream open on it yet.
    async fn h2_connect(&self, dialer: &super::Dialer, hop: &Hop) -> Result<Conn, HopError> {
        let generation = self.tls.generation();
        let (tls, addr) = self.tls_connect(dialer, hop).await?;
        let mut builder = h2::client::Builder::new();
        builder
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME)
            .max_header_list_size(MAX_HEADER_LIST);
        let handshake = builder.handshake::<_, Bytes>(tls);
        let (sender, mut connection) = tokio::time::timeout(dialer.connect_timeout, handshake)
            .await
            .map_err(|_| HopError::Unavailable("HTTP/2: no settings in time".into()))?
            .map_err(|e| HopError::Unavailable(format!("HTTP/2: {e}")))?;
        let name = hop.name.clone();
        let closed = CancellationToken::new();
        let ended = closed.clone();
        let ping = connection.ping_pong();
        tokio::spawn(async move {
            tokio::select! {
                r = &mut connection => if let Err(e) = r {
                    tracing::warn!(central = %name, error = %e, "connection to the central proxy ended");
                },
                () = crate::transport::keepalive(ping) => {
                    tracing::warn!(central = %name, "the central proxy stopped answering pings; connection dropped");
                }
            }
            ended.cancel();
        });
        Ok(Conn {
            sender,
            addr,
            open: Arc::new(AtomicUsize::new(0)),
            closed,
            generation,
        })
    }

    /// One health check of a hop that is down: a connection attempt; the first that
    /// succeeds is kept and marks the hop up. Whether the hop is still down.
    async fn check(&self, dialer: &super::Dialer, hop: &Hop) -> bool {
        let Some((_, state)) = self.hops.iter().find(|(h, _)| h == hop) else {
            return false;
        };
        if !state.lock().await.down {
            return false;
        }
        let attempt = if self.http1 {
            self.tls_connect(dialer, hop).await.map(|_| None)
        } else {
            self.h2_connect(dialer, hop).await.map(Some)
        };
        let mut state = state.lock().await;
        match attempt {
            Ok(conn) => {
                tracing::info!(central = %hop.name, "central proxy reachable again");
                state.conns.extend(conn);
                state.down = false;
                false
            }
            Err(e) => {
                tracing::debug!(central = %hop.name, error = %e, "central proxy still unavailable");
                true
            }
        }
    }

    /// `--upstream-transport http1`: a new mutual-TLS connection for this one tunnel, with
    /// an HTTP/1.1 CONNECT on it (what multiplexing saves, for comparison).
    async fn tunnel_http1(
        &self,
        dialer: &super::Dialer,
        hop: &Hop,
        state: &Mutex<HopState>,
        request: impl FnOnce() -> Result<hyper::Request<()>, HopError>,
        times: super::HopTimes,
    ) -> Result<Option<(Upstream, SocketAddr)>, HopError> {
        if state.lock().await.down {
            return Ok(None);
        }
        let (tls, addr) = self.tls_connect(dialer, hop).await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| HopError::Unavailable(format!("HTTP/1.1: {e}")))?;
        tokio::spawn(connection.with_upgrades());
        let core = exchange_http1(sender, request, times).await?;
        Ok(Some((Upstream::Tcp(core), addr)))
    }

    /// A TCP connection to `hop` and the mutual-TLS handshake on it.
    async fn tls_connect(
        &self,
        dialer: &super::Dialer,
        hop: &Hop,
    ) -> Result<(tokio_rustls::client::TlsStream<TcpStream>, SocketAddr), HopError> {
        let addr = dialer
            .central_addr(hop)
            .await
            .map_err(|e| HopError::Unavailable(e.to_string()))?;
        let tcp = dialer
            .connect_central(addr)
            .await
            .map_err(|e| HopError::Unavailable(e.to_string()))?;
        let server_name = ServerName::try_from(hop.host.clone())
            .map_err(|e| HopError::Unavailable(format!("{}: {e}", hop.host)))?;
        let connector = tokio_rustls::TlsConnector::from(self.tls.get());
        let tls = tokio::time::timeout(dialer.connect_timeout, connector.connect(server_name, tcp))
            .await
            .map_err(|_| HopError::Unavailable("TLS handshake timed out".into()))?
            .map_err(|e| HopError::Unavailable(format!("TLS: {e}")))?;
        Ok((tls, addr))
    }
}

/// Checks a hop that went down, after each back-off (1 s, doubling to 30 s), until it is
/// up again or the proxy is gone (the dialer, and with it the centrals, dropped; it is held
/// only during an attempt, never across a back-off).
async fn health_check(dialer: Weak<super::Dialer>, hop: Hop) {
    let mut wait = BACKOFF_FIRST;
    loop {
        tokio::time::sleep(wait).await;
        let Some(d) = dialer.upgrade() else { return };
        let Some(centrals) = d.centrals().cloned() else {
            return;
        };
        if !centrals.check(&d, &hop).await {
            return;
        }
        wait = (wait * 2).min(BACKOFF_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        let h = Hop::parse("https://central.example:3130").unwrap();
        assert_eq!((h.host.as_str(), h.port), ("central.example", 3130));
        assert_eq!(Hop::parse("https://10.0.0.1/").unwrap().port, 443);
        assert_eq!(Hop::parse("https://[::1]:9").unwrap().host, "::1");
        assert!(matches!(
            Hop::parse("http://c:1"),
            Err(UpstreamUrlError::NotHttps(_))
        ));
        assert!(Hop::parse("https://c:1/path").is_err());
        assert!(Hop::parse("https://u@c:1").is_err());
        assert!(Hop::parse("https://c:99999").is_err());
    }
}
