//! `sandgate sandbox-init`: the first process inside a proxied sandbox.
//!
//! For each forward (`--forward 127.0.0.1:3128=/run/sandgate/proxy.sock`) it listens on the
//! sandbox's own loopback and relays every connection to the bridge socket, behind which the
//! run's proxy (or a bridged host loopback port) waits. It refuses to start the command if
//! any end is not ready (fail closed): the command never runs with a broken or missing way
//! out. Then it starts the command, waits for it and exits with its status. It ignores
//! SIGINT/SIGTERM/SIGHUP itself: the runner signals the command directly, and the init stays
//! until the command is gone.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

use tokio::net::{TcpListener, UnixStream};

/// Exit status when the bridge is not ready (EX_SOFTWARE).
pub const EXIT_BRIDGE: i32 = 70;
/// Exit status when the command cannot be started (as a shell does).
pub const EXIT_NO_COMMAND: i32 = 127;

/// Runs the init; returns the process exit status.
pub fn run(forwards: &[(SocketAddr, PathBuf)], command: &[OsString]) -> i32 {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        eprintln!("sandgate: sandbox init: cannot start its runtime");
        return EXIT_BRIDGE;
    };
    rt.block_on(serve(forwards, command))
}

/// Parses `ADDR=SOCKET`.
pub fn parse_forward(text: &str) -> Result<(SocketAddr, PathBuf), String> {
    let (addr, socket) = text
        .split_once('=')
        .ok_or_else(|| format!("invalid --forward {text:?}: expected ADDR=SOCKET"))?;
    let addr = addr
        .parse()
        .map_err(|_| format!("invalid --forward {text:?}: {addr:?} is not IP:PORT"))?;
    Ok((addr, PathBuf::from(socket)))
}

async fn serve(forwards: &[(SocketAddr, PathBuf)], command: &[OsString]) -> i32 {
    let mut ready = Vec::with_capacity(forwards.len());
    for (listen, bridge) in forwards {
        let listener = match TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("sandgate: bridge not ready: cannot listen on {listen} in the sandbox: {e}");
                return EXIT_BRIDGE;
            }
        };
        if let Err(e) = UnixStream::connect(bridge).await {
            eprintln!("sandgate: bridge not ready: {}: {e}", bridge.display());
            return EXIT_BRIDGE;
        }
        ready.push((listener, bridge.clone()));
    }
    for kind in [
        tokio::signal::unix::SignalKind::interrupt(),
        tokio::signal::unix::SignalKind::terminate(),
        tokio::signal::unix::SignalKind::hangup(),
    ] {
        // Installing a handler is what keeps these signals from ending the init.
        if let Ok(mut s) = tokio::signal::unix::signal(kind) {
            tokio::spawn(async move { while s.recv().await.is_some() {} });
        }
    }
    for (listener, bridge) in ready {
        tokio::spawn(async move {
            loop {
                let Ok((mut tcp, _)) = listener.accept().await else {
                    continue;
                };
                let bridge = bridge.clone();
                tokio::spawn(async move {
                    if let Ok(mut unix) = UnixStream::connect(&bridge).await {
                        let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                    }
                });
            }
        });
    }
    let Some((program, args)) = command.split_first() else {
        eprintln!("sandgate: sandbox init: no command");
        return EXIT_NO_COMMAND;
    };
    let mut child = match tokio::process::Command::new(program).args(args).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandgate: cannot run {}: {e}", program.to_string_lossy());
            return EXIT_NO_COMMAND;
        }
    };
    match child.wait().await {
        Ok(status) => status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
        Err(e) => {
            eprintln!("sandgate: waiting for the command failed: {e}");
            EXIT_BRIDGE
        }
    }
}
