//! The service manager's readiness protocol, sd_notify(3), spoken without libsystemd: one
//! datagram of `KEY=VALUE` lines to the Unix socket `$NOTIFY_SOCKET` names, a path or, with
//! a leading `@`, a name in the abstract namespace. `READY=1` once every listener is bound
//! and serving (what `Type=notify` waits for before starting what comes `After=` the
//! proxy), `STOPPING=1` when shutdown begins. Without `$NOTIFY_SOCKET` nothing is sent.
//!
//! Written here rather than with the sd-notify crate: the protocol is one `sendto`, std has
//! every piece (`UnixDatagram`, abstract addresses on Linux), and the crate would be a
//! dependency for twenty lines. Not here: `WATCHDOG=1` (the unit sets no `WatchdogSec=`),
//! passing descriptors, and the `vsock:` addresses of virtual machines' managers (logged as
//! not understood).

use std::future::Future;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

/// Where `$NOTIFY_SOCKET` points.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Socket {
    Path(PathBuf),
    /// The name after `@` (Linux's abstract namespace).
    Abstract(Vec<u8>),
}

impl Socket {
    /// `$NOTIFY_SOCKET`'s value: an absolute path, or `@` and an abstract name.
    fn parse(value: &std::ffi::OsStr) -> Option<Socket> {
        use std::os::unix::ffi::OsStrExt;
        match value.as_bytes() {
            [b'/', ..] => Some(Socket::Path(PathBuf::from(value))),
            [b'@', name @ ..] if !name.is_empty() => Some(Socket::Abstract(name.to_vec())),
            _ => None,
        }
    }

    fn send(&self, state: &str) -> std::io::Result<()> {
        let socket = UnixDatagram::unbound()?;
        match self {
            Socket::Path(path) => socket.send_to(state.as_bytes(), path).map(drop),
            Socket::Abstract(name) => send_abstract(&socket, name, state),
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn send_abstract(socket: &UnixDatagram, name: &[u8], state: &str) -> std::io::Result<()> {
    #[cfg(target_os = "android")]
    use std::os::android::net::SocketAddrExt;
    #[cfg(target_os = "linux")]
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    socket.send_to_addr(state.as_bytes(), &addr).map(drop)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn send_abstract(_socket: &UnixDatagram, _name: &[u8], _state: &str) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "abstract socket names are Linux's",
    ))
}

/// The service manager's socket, read once at start.
#[derive(Debug)]
pub struct Notifier {
    socket: Option<Socket>,
}

impl Notifier {
    /// From `$NOTIFY_SOCKET`; an unset variable means no manager is listening.
    pub fn from_env() -> Notifier {
        let socket = std::env::var_os("NOTIFY_SOCKET").and_then(|value| {
            let parsed = Socket::parse(&value);
            if parsed.is_none() && !value.is_empty() {
                tracing::warn!(
                    notify_socket = %value.to_string_lossy(),
                    "NOTIFY_SOCKET is neither a path nor an @abstract name; the service manager is not told of readiness"
                );
            }
            parsed
        });
        Notifier { socket }
    }

    /// Sends `state` (`READY=1`, ...); a failure is logged, never fatal: the proxy serves
    /// whether or not its manager hears of it.
    pub fn notify(&self, state: &str) {
        if let Some(socket) = &self.socket
            && let Err(e) = socket.send(state)
        {
            tracing::warn!(error = %e, state, "cannot notify the service manager");
        }
    }

    /// `shutdown`, wrapped for [`sandgate_proxy::Proxy::run`], which polls it first once
    /// every accept loop and the admin listener are running: `READY=1` then (after one poll,
    /// so the signal handlers `shutdown` registers are in place before anyone is told to
    /// rely on the proxy), `STOPPING=1` when it completes and the proxy begins to stop.
    pub async fn around(self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let early = std::future::poll_fn(|cx| std::task::Poll::Ready(shutdown.as_mut().poll(cx))).await;
        if early.is_pending() {
            self.notify("READY=1");
            shutdown.await;
        }
        self.notify("STOPPING=1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_abstract_names_are_understood_and_nothing_else() {
        let parse = |s: &str| Socket::parse(std::ffi::OsStr::new(s));
        assert_eq!(
            parse("/run/systemd/notify"),
            Some(Socket::Path("/run/systemd/notify".into()))
        );
        assert_eq!(parse("@sd-notify"), Some(Socket::Abstract(b"sd-notify".to_vec())));
        assert_eq!(parse("@"), None);
        assert_eq!(parse("vsock:2:1234"), None);
        assert_eq!(parse("relative/path"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn a_datagram_reaches_a_socket_at_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        Socket::Path(path).send("READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
