//! The SOCKS5 front end (RFC 1928, CONNECT only; RFC 1929 username/password as task
//! credentials). It owns the wire format only: the method negotiation, the login, the
//! request and the reply. Deciding, vetting, dialling and recording are the egress core's,
//! exactly as for HTTP/1; refusals are classified once (`refusal.rs`) and rendered here as
//! SOCKS5 reply codes.
//!
//! Every read is bounded by the protocol itself (at most 255 methods, a 255-byte name or
//! login field) and in time by the head timeout. BIND and UDP ASSOCIATE are refused with
//! "command not supported"; domain names are resolved by the proxy under the address guard;
//! IPv4 and IPv6 addresses follow the IP-literal rules.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use sandgate_policy::{Access, AuthError, Identity, Target, parse_connect_target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::audit::event::Outcome;
use crate::egress::{Egress, End, Refused};
use crate::http1::head::HeadError;
use crate::refusal::Refusal;
use crate::relay;

const VERSION: u8 = 5;
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
/// to the core and relay the tunnel.
pub(crate) async fn serve(
    egress: &Egress,
    mut stream: TcpStream,
    peer: SocketAddr,
    listener: Arc<Identity>,
    require_auth: bool,
) {
    let handshake = tokio::time::timeout(
        egress.limits.head_timeout,
        handshake(egress, &mut stream, &listener, require_auth),
    )
    .await;
    let (identity, target) = match handshake {
        Ok(Ok(pair)) => pair,
        Ok(Err(Stop::Gone)) => return,
        Ok(Err(Stop::Refuse(refusal, say))) => {
            let pending = egress.begin(peer, listener, None);
            let refused = egress.refuse(pending, None, refusal).await;
            let code = match say {
                Say::Done => return,
                Say::Code(code) => code,
                Say::Classified => refused.classified.socks5_reply(),
            };
            let _ = stream.write_all(&reply(code)).await;
            return;
        }
        Err(_) => {
            let pending = egress.begin(peer, listener, None);
            let _ = egress.refuse(pending, None, Refusal::HeadTimeout).await;
            return;
        }
    };
    let pending = egress.begin(peer, identity, Some("CONNECT".into()));
    // Fail closed: while the audit trail cannot be written, nothing new passes.
    if let Err(cause) = egress.audit.available() {
        let refused = egress
            .refuse(pending, None, Refusal::AuditUnavailable(cause))
            .await;
        return answer(&mut stream, &refused).await;
    }
    let opened = match egress.decide(pending, &target, Access::Socks5).await {
        Ok(decided) => decided.open(egress).await,
        Err(refused) => Err(refused),
    };
    let opened = match opened {
        Ok(o) => o,
        Err(refused) => return answer(&mut stream, &refused).await,
    };
    let end = |sent, received, outcome| End {
        sent,
        received,
        status: None,
        outcome,
    };
    let end = if stream.write_all(&reply(SUCCEEDED)).await.is_err() {
        end(0, 0, Outcome::ClientFailure)
    } else {
        let (sent, received, outcome) = relay::tunnel(
            &stream,
            &opened.stream,
            egress.limits.tunnel_idle_timeout,
            opened.grant.stop(),
        )
        .await;
        let outcome = match outcome {
            Outcome::Shutdown if !egress.hard_stop.is_cancelled() => Outcome::Revoked,
            other => other,
        };
        end(sent, received, outcome)
    };
    egress.close(opened.grant, end).await;
}

async fn answer(stream: &mut TcpStream, refused: &Refused) {
    let _ = stream.write_all(&reply(refused.classified.socks5_reply())).await;
}

/// A reply with an unspecified bound address (clients of CONNECT do not use it).
fn reply(code: u8) -> [u8; 10] {
    [VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

async fn handshake(
    egress: &Egress,
    s: &mut TcpStream,
    listener: &Arc<Identity>,
    require_auth: bool,
) -> Result<(Arc<Identity>, Target), Stop> {
    let [version, count] = read_array::<2>(s).await?;
    if version != VERSION {
        return Err(malformed("not SOCKS version 5"));
    }
    let mut methods = vec![0u8; usize::from(count)];
    s.read_exact(&mut methods).await.map_err(|_| Stop::Gone)?;
    let wanted = if require_auth { USER_PASS } else { NO_AUTH };
    if !methods.contains(&wanted) {
        let _ = s.write_all(&[VERSION, NO_ACCEPTABLE]).await;
        return Err(Stop::Refuse(
            if require_auth {
                Refusal::ProxyAuth(AuthError::Missing)
            } else {
                malformed_refusal("no acceptable SOCKS5 method")
            },
            Say::Done,
        ));
    }
    s.write_all(&[VERSION, wanted]).await.map_err(|_| Stop::Gone)?;
    let identity = if require_auth {
        login(egress, s, listener).await?
    } else {
        listener.clone()
    };
    let [version, command, _reserved, kind] = read_array::<4>(s).await?;
    if version != VERSION {
        return Err(malformed("not SOCKS version 5"));
    }
    let host = match kind {
        1 => IpAddr::V4(Ipv4Addr::from(read_array::<4>(s).await?)).to_string(),
        4 => format!("[{}]", Ipv6Addr::from(read_array::<16>(s).await?)),
        3 => {
            let [len] = read_array::<1>(s).await?;
            let mut name = vec![0u8; usize::from(len)];
            s.read_exact(&mut name).await.map_err(|_| Stop::Gone)?;
            String::from_utf8(name).map_err(|_| malformed("the name is not UTF-8"))?
        }
        _ => {
            return Err(Stop::Refuse(
                malformed_refusal("unknown SOCKS5 address type"),
                Say::Code(ADDRESS_TYPE_NOT_SUPPORTED),
            ));
        }
    };
    let port = u16::from_be_bytes(read_array::<2>(s).await?);
    if command != 1 {
        // BIND (2) and UDP ASSOCIATE (3) are not offered.
        return Err(Stop::Refuse(
            malformed_refusal("only SOCKS5 CONNECT is supported"),
            Say::Code(COMMAND_NOT_SUPPORTED),
        ));
    }
    let target = parse_connect_target(&format!("{host}:{port}"))
        .map_err(|e| Stop::Refuse(Refusal::Target(e), Say::Classified))?;
    Ok((identity, target))
}

/// RFC 1929: the user is the task id, the password its secret.
async fn login(egress: &Egress, s: &mut TcpStream, listener: &Identity) -> Result<Arc<Identity>, Stop> {
    let [version, user_len] = read_array::<2>(s).await?;
    if version != 1 {
        return Err(malformed("not an RFC 1929 login"));
    }
    let mut user = vec![0u8; usize::from(user_len)];
    s.read_exact(&mut user).await.map_err(|_| Stop::Gone)?;
    let [pass_len] = read_array::<1>(s).await?;
    let mut pass = vec![0u8; usize::from(pass_len)];
    s.read_exact(&mut pass).await.map_err(|_| Stop::Gone)?;
    let user = String::from_utf8_lossy(&user);
    let pass = String::from_utf8_lossy(&pass);
    let rules = egress.rules();
    match rules.credentials().verify_login(&user, &pass) {
        Ok(cred) => {
            s.write_all(&[1, 0]).await.map_err(|_| Stop::Gone)?;
            Ok(Arc::new(Identity {
                task: Some(cred.task.clone()),
                project: cred.project.clone(),
                job: listener.job.clone(),
            }))
        }
        Err(e) => {
            let _ = s.write_all(&[1, 1]).await;
            Err(Stop::Refuse(Refusal::ProxyAuth(e), Say::Done))
        }
    }
}

async fn read_array<const N: usize>(s: &mut TcpStream) -> Result<[u8; N], Stop> {
    let mut buf = [0u8; N];
    s.read_exact(&mut buf).await.map_err(|_| Stop::Gone)?;
    Ok(buf)
}

fn malformed_refusal(what: &'static str) -> Refusal {
    Refusal::Head(HeadError::Syntax(what))
}

/// A broken greeting or request: recorded, and the connection closed without an answer
/// the client could misread.
fn malformed(what: &'static str) -> Stop {
    Stop::Refuse(malformed_refusal(what), Say::Done)
}
