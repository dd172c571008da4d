//! A loopback port with nothing behind it that stays so while the test runs: a TCP socket
//! bound to 127.0.0.1:0 and never listened on.
//!
//! A connection to it is refused (the kernel answers the SYN with RST, as for any port
//! without a listener), and while the socket is held the port is not free: it is bound
//! without SO_REUSEADDR, so no other socket can bind it, and the kernel does not pick it as
//! another connection's local port. A port found free, then released and named later, can
//! be taken in between; this one cannot.

use std::net::{Ipv4Addr, SocketAddr};

use socket2::{Domain, Socket, Type};

/// A refusing loopback port; free again when dropped.
#[derive(Debug)]
pub struct ClosedPort {
    addr: SocketAddr,
    _socket: Socket,
}

impl ClosedPort {
    pub fn new() -> ClosedPort {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        let any_port = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        socket.bind(&any_port.into()).expect("bind a closed port");
        let addr = socket
            .local_addr()
            .expect("closed port address")
            .as_socket()
            .expect("an IP address");
        ClosedPort {
            addr,
            _socket: socket,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Default for ClosedPort {
    fn default() -> ClosedPort {
        ClosedPort::new()
    }
}

#[cfg(test)]
mod tests {
    use super::ClosedPort;

    #[test]
    #[expect(clippy::disallowed_methods, reason = "connects to its own loopback port")]
    fn it_refuses_connections_and_no_one_else_can_bind_it() {
        let closed = ClosedPort::new();
        let refused = std::net::TcpStream::connect(closed.addr()).expect_err("connected to a closed port");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        // std binds with SO_REUSEADDR, as tokio and most servers do: still refused.
        assert!(
            std::net::TcpListener::bind(closed.addr()).is_err(),
            "another socket bound the held port"
        );
    }
}
