//! The loopback ports a command under Seatbelt reaches the run's proxy on: one listener on
//! `127.0.0.1:0` in front of each of the run's bridge sockets (HTTP, SOCKS5), relaying every
//! connection through it, as the init does inside a bwrap sandbox ([`crate::init`]).
//!
//! Why not the proxy's own listeners: they serve only connections their bridges vouched for
//! (the proxy's peer filter), the same as on Linux, so the proxy itself is set up the same way
//! on both platforms. macOS has no network namespace: these ports are on the host's loopback,
//! open to every local process for the length of the run (requests through them are decided
//! by the run's policy and recorded under the run's identity). The profile lets the command
//! reach these ports and nothing else.
//!
//! Each bridge is checked before the command starts (fail closed, as the init does).

use std::path::{Path, PathBuf};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The listeners while they serve; closed by [`Fronts::close`].
#[derive(Debug)]
pub struct Fronts {
    /// The ports, in the order of the bridges given to [`open`].
    pub ports: Vec<u16>,
    tasks: Vec<JoinHandle<()>>,
}

impl Fronts {
    /// Closes every listener (connections already relayed run on until either end closes).
    pub async fn close(self) {
        for task in &self.tasks {
            task.abort();
        }
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Listens on a loopback port for each bridge socket, once the bridge answers ready.
pub async fn open(bridges: &[PathBuf]) -> Result<Fronts, String> {
    let mut fronts = Fronts {
        ports: Vec::with_capacity(bridges.len()),
        tasks: Vec::with_capacity(bridges.len()),
    };
    for bridge in bridges {
        match listen(bridge).await {
            Ok((port, task)) => {
                fronts.ports.push(port);
                fronts.tasks.push(task);
            }
            Err(reason) => {
                fronts.close().await;
                return Err(reason);
            }
        }
    }
    Ok(fronts)
}

/// One listener in front of `bridge`: its port and the task that serves it.
async fn listen(bridge: &Path) -> Result<(u16, JoinHandle<()>), String> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| format!("cannot listen on host loopback: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on host loopback: {e}"))?
        .port();
    crate::init::open_bridge(bridge).await?;
    let bridge = bridge.to_path_buf();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(crate::init::relay(tcp, bridge.clone()));
        }
    });
    Ok((port, task))
}
