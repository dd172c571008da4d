//! A DNS server on 127.0.0.1:0 (UDP) that answers A/AAAA questions from a table the test
//! gives, NXDOMAIN for anything else, stays silent for names marked silent (to provoke
//! timeouts), and records every question it was asked.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;

/// A running fixture DNS server; stops when dropped.
#[derive(Debug)]
pub struct DnsServer {
    addr: SocketAddr,
    questions: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the server knows: name (lowercase, no trailing dot) to addresses.
#[derive(Debug, Default, Clone)]
pub struct Zone {
    records: HashMap<String, Vec<IpAddr>>,
    silent: Vec<String>,
}

impl Zone {
    pub fn new() -> Zone {
        Zone::default()
    }

    /// Answers `name` with these addresses (A and AAAA as their family says).
    pub fn with(mut self, name: &str, ips: &[&str]) -> Zone {
        let ips = ips.iter().map(|s| s.parse().expect("test IP")).collect();
        self.records.insert(name.to_ascii_lowercase(), ips);
        self
    }

    /// Never answers `name`.
    pub fn silent(mut self, name: &str) -> Zone {
        self.silent.push(name.to_ascii_lowercase());
        self
    }
}

impl DnsServer {
    pub async fn start(zone: Zone) -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind DNS fixture");
        let addr = socket.local_addr().expect("DNS fixture address");
        let questions = Arc::new(Mutex::new(Vec::new()));
        let log = questions.clone();
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                let Some(query) = buf.get(..n).and_then(|b| Message::from_vec(b).ok()) else {
                    continue;
                };
                if let Some(reply) = answer(&zone, &query, &log) {
                    #[expect(
                        clippy::disallowed_methods,
                        reason = "the fixture answers the SocketAddr its query came from; no name"
                    )]
                    let _ = socket.send_to(&reply, peer).await;
                }
            }
        });
        DnsServer {
            addr,
            questions,
            task,
        }
    }

    /// Where to send questions (`--dns-server`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every question asked so far, as `name TYPE`.
    pub fn questions(&self) -> Vec<String> {
        self.questions.lock().map(|q| q.clone()).unwrap_or_default()
    }

    /// Questions about `name` (any type).
    pub fn questions_about(&self, name: &str) -> usize {
        let name = name.to_ascii_lowercase();
        self.questions()
            .iter()
            .filter(|q| q.split(' ').next() == Some(name.as_str()))
            .count()
    }
}

fn answer(zone: &Zone, query: &Message, log: &Mutex<Vec<String>>) -> Option<Vec<u8>> {
    let q = query.queries.first()?;
    let name = q.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
    if let Ok(mut log) = log.lock() {
        log.push(format!("{name} {}", q.query_type()));
    }
    if zone.silent.contains(&name) {
        return None;
    }
    let mut reply = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.add_query(q.clone());
    match zone.records.get(&name) {
        None => reply.metadata.response_code = ResponseCode::NXDomain,
        Some(ips) => {
            let owner = Name::from_ascii(format!("{name}.")).ok()?;
            for ip in ips {
                let rdata = match (ip, q.query_type()) {
                    (IpAddr::V4(v4), RecordType::A) => RData::A(A(*v4)),
                    (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(*v6)),
                    _ => continue,
                };
                reply.add_answer(Record::from_rdata(owner.clone(), 60, rdata));
            }
        }
    }
    reply.to_vec().ok()
}
