//! A raw HTTP/1.1 client for the spelling attacks: it writes the request line itself, byte for
//! byte, so nothing between the test and the proxy normalises the target (curl and Python
//! both would: curl squashes `/../`, Python quotes). Responses are framed by Content-Length
//! or chunked (RFC 9112 section 6.3), else read to the close; every read is bounded in size
//! and by a timeout (10 s on a connection of its own). The same client speaks inside a TLS
//! tunnel ([`Conn::over`]), for the requests of an intercepted CONNECT.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Largest response head or body these tests read.
const MAX: usize = 1 << 20;

/// What came back for one request.
#[derive(Debug)]
pub struct Reply {
    /// 0 when no status line came back.
    pub status: u16,
    pub body: String,
}

/// One client connection (to the proxy, or inside a tunnel), kept alive across exchanges.
pub struct Conn<S = TcpStream> {
    reader: BufReader<S>,
}

impl Conn {
    pub fn open(proxy: SocketAddr) -> Conn {
        let stream = TcpStream::connect(proxy).expect("connect to the proxy");
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Conn::over(stream)
    }
}

impl<S: Read + Write> Conn<S> {
    /// The client on `stream`, already connected (a TLS stream in a tunnel, with a read
    /// timeout of its own).
    pub fn over(stream: S) -> Conn<S> {
        Conn {
            reader: BufReader::new(stream),
        }
    }

    /// Sends `METHOD TARGET HTTP/1.1` with `host` as Host (and `close` asking to end the
    /// connection after it) and reads the response.
    pub fn exchange(&mut self, method: &str, target: &str, host: &str, close: bool) -> Reply {
        self.send(&request(method, target, host, close));
        self.read_reply()
    }

    /// Writes `bytes` as they are (several requests at once: pipelining).
    pub fn send(&mut self, bytes: &str) {
        self.reader.get_mut().write_all(bytes.as_bytes()).unwrap();
    }

    /// Reads the next response.
    pub fn read_reply(&mut self) -> Reply {
        let mut head = String::new();
        while !head.ends_with("\r\n\r\n") && head.len() < MAX {
            match self.reader.read_line(&mut head) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let field = |name: &str| {
            head.lines().find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_ascii_lowercase())
            })
        };
        let mut body = Vec::new();
        if let Some(n) = field("content-length").and_then(|v| v.parse::<usize>().ok()) {
            body.resize(n.min(MAX), 0);
            self.reader.read_exact(&mut body).unwrap();
        } else if field("transfer-encoding").is_some_and(|v| v.ends_with("chunked")) {
            body = self.read_chunked();
        } else if status != 0 {
            let _ = self.reader.by_ref().take(MAX as u64).read_to_end(&mut body);
        }
        Reply {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    fn read_chunked(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            self.reader.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16).unwrap();
            let mut chunk = vec![0; n + 2];
            self.reader.read_exact(&mut chunk).unwrap();
            if n == 0 || body.len() > MAX {
                return body;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A request without a body: `METHOD TARGET HTTP/1.1`, Host, and whether to close after it.
pub fn request(method: &str, target: &str, host: &str, close: bool) -> String {
    let connection = if close { "close" } else { "keep-alive" };
    format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: {connection}\r\n\r\n")
}

/// A request with more header fields (`(name, value)`, written as given) and a body
/// (`Content-Length` when it has one), asking to close the connection after it.
#[allow(
    dead_code,
    reason = "the credential tests use it; the plain-HTTP tests' binary does not"
)]
pub fn request_with(method: &str, target: &str, host: &str, fields: &[(&str, &str)], body: &str) -> String {
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in fields {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    format!("{head}\r\n{body}")
}

/// One request on a connection of its own, `Connection: close`.
pub fn once(proxy: SocketAddr, method: &str, target: &str, host: &str) -> Reply {
    Conn::open(proxy).exchange(method, target, host, true)
}
