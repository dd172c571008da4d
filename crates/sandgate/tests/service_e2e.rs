//! sandgate under a service manager or a container engine (issue 34), with the real binary:
//! `READY=1` reaches the socket `$NOTIFY_SOCKET` names (a path, or an `@abstract` name) only
//! once every listener answers, never from a proxy that could not bind, and `STOPPING=1`
//! follows SIGTERM; `sandgate health` exits 0 and 1 as the proxy's `/readyz` says, finding
//! the admin listener by the variable the image sets for both; and an admin listener off
//! loopback is warned about unless `--admin-guarded-by` says what keeps others off it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ProxyProcess, exit_of, raw, sandgate_bin, status_of};
use sandgate_testkit::closed::ClosedPort;

/// The next datagram on `socket`, waiting at most `limit`; None when none came.
fn next_message(socket: &UnixDatagram, limit: Duration) -> Option<String> {
    socket.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    match socket.recv(&mut buf) {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(e) => panic!("recv: {e}"),
    }
}

/// Each listener of a proxy started with one HTTP, one SOCKS5 and the admin listener
/// answers: a 403 for a name no rule allows, a SOCKS5 method choice, a 200 from /readyz.
fn every_listener_answers(proxy: &ProxyProcess) {
    let reply = raw(
        proxy.addr,
        b"GET http://nowhere.test/ HTTP/1.1\r\nHost: nowhere.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status_of(&reply), 403, "{reply}");
    let socks = proxy.listener(&["role=socks5"]);
    let mut s = TcpStream::connect(socks).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).unwrap();
    assert_eq!(choice, [5, 0]);
    let admin = proxy.admin();
    let reply = raw(
        admin,
        format!("GET /readyz HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&reply), 200, "{reply}");
}

/// A proxy with three listeners on loopback, told of `notify_socket`.
fn notified_proxy(notify_socket: &str) -> ProxyProcess {
    let mut cmd = Command::new(sandgate_bin());
    cmd.env("NOTIFY_SOCKET", notify_socket);
    ProxyProcess::start_with(
        cmd,
        &["--socks-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
    )
}

#[test]
fn ready_reaches_the_notify_socket_once_every_listener_answers_and_stopping_follows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    let mut proxy = notified_proxy(path.to_str().unwrap());
    let ready = next_message(&socket, Duration::from_secs(10)).expect("no READY=1");
    assert_eq!(ready, "READY=1");
    every_listener_answers(&proxy);
    assert!(proxy.terminate().success(), "{}", proxy.log_text());
    let stopping = next_message(&socket, Duration::from_secs(1)).expect("no STOPPING=1");
    assert_eq!(stopping, "STOPPING=1");
    assert_eq!(next_message(&socket, Duration::from_millis(200)), None);

    // A listener that cannot be bound: the proxy exits, and never says it is ready.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    for args in [
        vec!["--listen", taken.as_str()],
        vec!["--listen", "127.0.0.1:0", "--admin-listen", taken.as_str()],
    ] {
        let child = Command::new(sandgate_bin())
            .arg("proxy")
            .args(&args)
            .env("NOTIFY_SOCKET", &path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (status, err) = exit_of(
            child,
            Duration::from_secs(20),
            "a proxy that could not bind ran on",
        );
        assert!(!status.success() && err.contains(&taken), "{status}: {err}");
        assert_eq!(
            next_message(&socket, Duration::from_millis(200)),
            None,
            "{args:?}"
        );
    }
}

#[test]
fn an_abstract_notify_socket_is_told_too() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!(
        "sandgate-notify-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let socket = UnixDatagram::bind_addr(&addr).unwrap();
    let mut proxy = notified_proxy(&format!("@{name}"));
    let ready = next_message(&socket, Duration::from_secs(10)).expect("no READY=1");
    assert_eq!(ready, "READY=1");
    every_listener_answers(&proxy);
    assert!(proxy.terminate().success());
    assert_eq!(
        next_message(&socket, Duration::from_secs(1)).as_deref(),
        Some("STOPPING=1")
    );
}

/// `sandgate health ARGS` with `env`: (exit code, stdout, stderr).
fn health(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(sandgate_bin());
    cmd.arg("health")
        .args(args)
        .env_remove("SANDGATE_ADMIN")
        .env_remove("SANDGATE_ADMIN_LISTEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    common::outcome(&mut cmd)
}

#[test]
fn health_exits_0_while_the_proxy_is_ready_and_1_when_it_is_not() {
    // The admin listener from the variable the image sets, and the health check finding it
    // by the same variable.
    let mut cmd = Command::new(sandgate_bin());
    cmd.env("SANDGATE_ADMIN_LISTEN", "127.0.0.1:0");
    let proxy = ProxyProcess::start_with(cmd, &[]);
    let admin = proxy.admin().to_string();
    let (code, out, err) = health(&[], &[("SANDGATE_ADMIN_LISTEN", &admin)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, format!("ready: http://{admin}\n"));
    let (code, _, err) = health(&["--admin", &format!("http://{admin}")], &[]);
    assert_eq!(code, 0, "{err}");
    drop(proxy);

    // Nothing there: 1, saying why. A port held closed, not the proxy's freed one, which
    // another test's listener may bind meanwhile and answer 200.
    let closed = ClosedPort::new();
    let nothing = closed.addr().to_string();
    let (code, out, err) = health(&["--admin", &format!("http://{nothing}")], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.starts_with("sandgate: not ready: cannot reach") && err.contains(&nothing),
        "{err}"
    );

    // An audit log that cannot be written (a full disk): /readyz says 503, health says 1.
    let proxy = ProxyProcess::start_with_audit(
        Command::new(sandgate_bin()),
        Some("/dev/full".into()),
        &["--admin-listen", "127.0.0.1:0"],
    );
    let admin = proxy.admin().to_string();
    let url = format!("http://{admin}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let (code, err) = loop {
        // A request makes the writer write (and fail).
        let _ = raw(
            proxy.addr,
            b"GET http://nowhere.test/ HTTP/1.1\r\nHost: nowhere.test\r\nConnection: close\r\n\r\n",
        );
        let (code, _, err) = health(&["--admin", &url], &[]);
        if code != 0 || Instant::now() > deadline {
            break (code, err);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("503") && err.contains("audit log cannot be written"),
        "{err}"
    );

    // A URL that cannot be asked is a usage error.
    let (code, _, err) = health(&["--admin", "http://proxy.example:9090"], &[]);
    assert_eq!(code, 64, "{err}");
}

#[test]
fn an_admin_listener_off_loopback_is_warned_about_unless_guarded() {
    // Every interface of a private network namespace: nothing outside this test sees it.
    if common::rerun_in_private_netns("an_admin_listener_off_loopback_is_warned_about_unless_guarded") {
        return;
    }
    let warning = "is not on loopback";
    let open = ProxyProcess::start(&["--admin-listen", "0.0.0.0:0"]);
    let line = open
        .log_line(warning)
        .unwrap_or_else(|| panic!("no warning:\n{}", open.log_text()));
    assert!(line.contains("--admin-guarded-by"), "{line}");
    drop(open);
    let mut cmd = Command::new(sandgate_bin());
    cmd.env("SANDGATE_ADMIN_GUARDED_BY", "NetworkPolicy sandgate-node-local");
    let guarded = ProxyProcess::start_with(cmd, &["--admin-listen", "0.0.0.0:0"]);
    guarded.admin();
    assert!(!guarded.log_text().contains(warning), "{}", guarded.log_text());
}
