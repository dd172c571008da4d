//! The SOCKS5 front end (RFC 1928, CONNECT only; RFC 1929 username/password as task
//! credentials). It owns the wire format only: the method negotiation, the login, the
//! request and the reply. Deciding, vetting, dialling and recording are the egress core's,
//! exactly as for HTTP/1; refusals are classified once (`refusal.rs`) and rendered here as
//! SOCKS5 reply codes.
//!
//! The messages are parsed without I/O in [`wire`] (fuzzed); every read is bounded by the
//! protocol itself (at most 255 methods, a 255-byte name or login field) and in time by the
//! head timeout. Bytes a client sends behind its request are the tunnel's first bytes. BIND and UDP ASSOCIATE are refused with
//! "command not supported"; domain names are resolved by the proxy under the address guard;
//! IPv4 and IPv6 addresses follow the IP-literal rules.

use std::net::SocketAddr;
use std::sync::Arc;

use sandgate_policy::{Access, AuthError, Identity, Target, parse_connect_target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::egress::{Dialed, Egress, Refused, Request};
use crate::h1::head::HeadError;
use crate::refusal::Refusal;

pub mod wire;

use wire::{Parse, VERSION, WireError};

const CONNECT: u8 = 0x01;
const NO_AUTH: u8 = 0x00;
const USER_PASS: u8 = 0x02;
const NO_ACCEPTABLE: u8 = 0xFF;

/// Reply codes (RFC 1928 section 6).
const SUCCEEDED: u8 = 0x00;
const COMMAND_NOT_SUPPORTED: u8 = 0x07;
const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 0x08;

/// Why the handshake ended before a destination was decided.
#[derive(Debug)]
enum Stop {
    /// The client went away or broke the protocol in a way that deserves no answer.
    Gone,
    /// Record the refusal and answer as said.
    Refuse(Refusal, Say),
}

/// How a handshake refusal is answered.
#[derive(Debug, Clone, Copy)]
enum Say {
    /// Already answered in the stage's own terms (no acceptable method, failed login).
    Done,
    /// A request reply with this code.
    Code(u8),
    /// A request reply with the code the refusal's classification maps to.
    Classified,
}

/// Serves one SOCKS5 connection: negotiate, log in, read the request, then hand the target
/// to the core and relay the tunnel. `held` (the connection's admission) is kept until the
/// end. The handshake runs boxed and is freed before the tunnel is carried, so a long-lived
/// tunnel's task holds only what carrying it needs. The handshake is droppable
/// ([`Egress::droppable`]); the tunnel's own waits end at its stop token.
pub(crate) fn serve<H: Send>(
    egress: Arc<Egress>,
    stream: TcpStream,
    peer: SocketAddr,
    listener: Arc<Identity>,
    require_auth: bool,
    held: H,
) -> impl Future<Output = ()> + Send {
    // A plain function returning an `async` block, the handshake boxed before it: an
    // `async fn` would hold its arguments twice, and the block keeps only what it captures
    // (this future is every idle tunnel's).
    let opened = Box::pin(open(egress.clone(), stream, peer, listener, require_auth));
    async move {
        let Some((stream, dialed, early)) = egress.droppable(opened).await.flatten() else {
            return;
        };
        egress
            .carry(crate::relay::Leg::Tcp(&stream), dialed, early, None)
            .await;
        drop(held);
    }
}

/// The handshake, the core's decision and the dial, and the reply: the tunnel to carry,
/// with the bytes the client sent behind its request, or `None` when it ended here
/// (refused and answered, or gone).
async fn open(
    egress: Arc<Egress>,
    mut stream: TcpStream,
    peer: SocketAddr,
    listener: Arc<Identity>,
    require_auth: bool,
) -> Option<(TcpStream, Dialed, Vec<u8>)> {
    let egress = &*egress;
    let handshake = tokio::time::timeout(
        egress.limits.head_timeout,
        handshake(egress, &mut stream, &listener, require_auth),
    )
    .await;
    let (identity, target, early) = match handshake {
        Ok(Ok(pair)) => pair,
        Ok(Err(Stop::Gone)) => return None,
        Ok(Err(Stop::Refuse(refusal, say))) => {
            let pending = egress.begin(peer, listener, None);
            let refused = egress.refuse(pending, None, refusal).await;
            let code = match say {
                Say::Done => return None,
                Say::Code(code) => code,
                Say::Classified => refused.classified.socks5_reply(),
            };
            let _ = stream.write_all(&reply(code)).await;
            return None;
        }
        Err(_) => {
            let pending = egress.begin(peer, listener, None);
            let _ = egress.refuse(pending, None, Refusal::HeadTimeout).await;
            return None;
        }
    };
    let request = Request {
        peer,
        identity,
        node: None,
        method: "CONNECT".into(),
        path: None,
        dest: Ok((target, Access::Socks5)),
    };
    // The core refuses it while the audit log cannot be written (a general failure here).
    let dialed = match egress.clear(request).await {
        Ok(decided) => decided.dial(egress).await,
        Err(refused) => Err(refused),
    };
    let dialed = match dialed {
        Ok(d) => d,
        Err(refused) => {
            answer(&mut stream, &refused).await;
            return None;
        }
    };
    if stream.write_all(&reply(SUCCEEDED)).await.is_err() {
        egress.abandon(dialed, None).await;
        return None;
    }
    Some((stream, dialed, early))
}

async fn answer(stream: &mut TcpStream, refused: &Refused) {
    let _ = stream.write_all(&reply(refused.classified.socks5_reply())).await;
}

/// A reply with an unspecified bound address (clients of CONNECT do not use it).
fn reply(code: u8) -> [u8; 10] {
    [VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

/// The bytes read from the client and not yet parsed. A client may send its greeting,
/// login and request (and even the tunnel's first bytes) without waiting for replies; what
/// follows the request is handed on as the tunnel's early bytes.
struct Incoming<'a> {
    s: &'a mut TcpStream,
    buf: Vec<u8>,
}

impl Incoming<'_> {
    /// Reads until `parse` has a whole message; consumes it.
    async fn next<T>(&mut self, parse: fn(&[u8]) -> Result<Parse<T>, WireError>) -> Result<T, Stop> {
        loop {
            match parse(&self.buf) {
                Ok(Parse::Done(message, used)) => {
                    self.buf.drain(..used);
                    return Ok(message);
                }
                Ok(Parse::Incomplete) => {}
                Err(WireError::AddressType(_)) => {
                    return Err(Stop::Refuse(
                        malformed_refusal("unknown SOCKS5 address type"),
                        Say::Code(ADDRESS_TYPE_NOT_SUPPORTED),
                    ));
                }
                Err(WireError::NotVersion5) => return Err(malformed("not SOCKS version 5")),
                Err(WireError::NotLogin) => return Err(malformed("not an RFC 1929 login")),
                Err(WireError::NameNotUtf8) => return Err(malformed("the name is not UTF-8")),
            }
            // Bounded: no message is longer than MAX_MESSAGE, so a parser asking for more
            // than that past the buffer's start never happens; the read is capped anyway.
            let mut chunk = [0u8; 1024];
            let room = (2 * wire::MAX_MESSAGE)
                .saturating_sub(self.buf.len())
                .min(chunk.len());
            if room == 0 {
                return Err(malformed("SOCKS5 message too long"));
            }
            match self.s.read(chunk.get_mut(..room).unwrap_or_default()).await {
                Ok(0) | Err(_) => return Err(Stop::Gone),
                Ok(n) => self.buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            }
        }
    }
}

/// The identity, the target, and any bytes the client sent behind its request.
type Handshake = (Arc<Identity>, Target, Vec<u8>);

async fn handshake(
    egress: &Egress,
    s: &mut TcpStream,
    listener: &Arc<Identity>,
    require_auth: bool,
) -> Result<Handshake, Stop> {
    let mut incoming = Incoming { s, buf: Vec::new() };
    let greeting = incoming.next(wire::greeting).await?;
    let wanted = if require_auth { USER_PASS } else { NO_AUTH };
    if !greeting.methods.contains(&wanted) {
        let _ = incoming.s.write_all(&[VERSION, NO_ACCEPTABLE]).await;
        return Err(Stop::Refuse(
            if require_auth {
                Refusal::ProxyAuth(AuthError::Missing)
            } else {
                malformed_refusal("no acceptable SOCKS5 method")
            },
            Say::Done,
        ));
    }
    incoming
        .s
        .write_all(&[VERSION, wanted])
        .await
        .map_err(|_| Stop::Gone)?;
    let identity = if require_auth {
        let login = incoming.next(wire::login).await?;
        self::login(egress, incoming.s, listener, &login).await?
    } else {
        listener.clone()
    };
    let request = incoming.next(wire::request).await?;
    if request.command != CONNECT {
        // BIND (2) and UDP ASSOCIATE (3) are not offered.
        return Err(Stop::Refuse(
            malformed_refusal("only SOCKS5 CONNECT is supported"),
            Say::Code(COMMAND_NOT_SUPPORTED),
        ));
    }
    let target = parse_connect_target(&format!("{}:{}", request.host, request.port))
        .map_err(|e| Stop::Refuse(Refusal::Target(e), Say::Classified))?;
    Ok((identity, target, incoming.buf))
}

/// RFC 1929: the user is the task id, the password its secret.
async fn login(
    egress: &Egress,
    s: &mut TcpStream,
    listener: &Identity,
    login: &wire::Login,
) -> Result<Arc<Identity>, Stop> {
    let user = String::from_utf8_lossy(&login.user);
    let pass = String::from_utf8_lossy(&login.pass);
    match egress.login(&user, &pass, listener) {
        Ok(identity) => {
            s.write_all(&[1, 0]).await.map_err(|_| Stop::Gone)?;
            Ok(identity)
        }
        Err(e) => {
            let _ = s.write_all(&[1, 1]).await;
            Err(Stop::Refuse(Refusal::ProxyAuth(e), Say::Done))
        }
    }
}

fn malformed_refusal(what: &'static str) -> Refusal {
    Refusal::Head(HeadError::Syntax(what))
}

/// A broken greeting or request: recorded, and the connection closed without an answer
/// the client could misread.
fn malformed(what: &'static str) -> Stop {
    Stop::Refuse(malformed_refusal(what), Say::Done)
}
