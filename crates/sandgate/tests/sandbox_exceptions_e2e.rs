//! Issue 12's end-to-end flow with a real sandbox: `sandgate run` (net.mode proxy, so the
//! run's proxy forwards to a central `sandgate proxy` whose listener is bound to task t-1)
//! with real curl and Python inside. The command is denied an origin; a requester token asks
//! over HTTP; the CLI approves; the same request inside gets 200 within a second, with no
//! reload; a tunnel opened inside under the exception is cut within a second of the CLI's
//! revocation; the next request is refused; the central audit holds the lifecycle in order.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;
mod sandbox_support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::control::{api, cli, start, task_and_admin, write_policy as central_policy};
use common::{read_audit, runtime};
use sandbox_support::write_policy;
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::echo::EchoServer;
use sandgate_testkit::origin::Origin;

/// Inside the sandbox: ask until allowed (bounded), then hold a tunnel open until it is cut.
const INSIDE: &str = r#"
import os, socket, sys, time, urllib.request, urllib.error
url, echo, admin = sys.argv[1], sys.argv[2], sys.argv[3]
def status():
    try:
        return urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code
try:
    urllib.request.urlopen("http://%s/healthz" % admin, timeout=5)
    print("admin reachable", flush=True)
except urllib.error.HTTPError as e:
    print("admin", e.code, flush=True)
except OSError as e:
    print("admin unreachable", flush=True)
print("first", status(), flush=True)
deadline = time.time() + 20
while time.time() < deadline:
    s = status()
    if s == 200:
        print("then 200", flush=True)
        break
    time.sleep(0.1)
proxy = os.environ["HTTP_PROXY"].split("//")[1]
host, port = proxy.rsplit(":", 1)
t = socket.create_connection((host, int(port)), timeout=20)
t.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (echo, echo)).encode())
head = b""
while not head.endswith(b"\r\n\r\n"):
    head += t.recv(1)
print("tunnel", head.split()[1].decode(), flush=True)
t.sendall(b"ping"); print("echo", t.recv(4).decode(), flush=True)
opened = time.time()
print("tunnel open", flush=True)
rest = t.recv(100)
print("tunnel cut after %.1f s" % (time.time() - opened), flush=True)
print("after", status(), flush=True)
"#;

/// Runs [`INSIDE`] under `sandgate run RUN_ARGS --policy SANDBOX` and drives it: denied
/// first, a request filed and approved with the CLI, the next request allowed within a
/// second or two, a tunnel opened and cut within a second or two of the revocation, and the
/// next request refused. Returns the exception's id.
fn approve_and_revoke_inside(
    sandbox: &std::path::Path,
    run_args: &[&str],
    admin: std::net::SocketAddr,
    ports: [u16; 2],
) -> String {
    let url = format!("http://web.test:{}/", ports[0]);
    let echo_target = format!("echo.test:{}", ports[1]);
    let mut run = Command::new(common::sandgate_bin())
        .args(["run", "--quiet"])
        .args(run_args)
        .arg("--policy")
        .arg(sandbox)
        .args(["--", "python3", "-c", INSIDE])
        .args([&url, &echo_target, &admin.to_string()])
        .env("XDG_STATE_HOME", sandbox_support::state_home())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::io::BufRead::lines(std::io::BufReader::new(run.stdout.take().unwrap()));
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let next = |want: &str| {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no line; wanted {want}"));
        assert!(line.starts_with(want), "wanted {want}, got {line}");
        line
    };
    // Directly (NO_PROXY covers 127.0.0.1) there is nothing on the sandbox's own loopback.
    assert_eq!(
        next("admin"),
        "admin unreachable",
        "the admin API is not reachable from inside"
    );
    assert_eq!(next("first"), "first 403");
    // The requester asks over HTTP; the approver approves with the CLI.
    let ask = format!(
        r#"{{"task_id":"t-1","requested_hosts":["web.test","echo.test"],"requested_ports":[{},{}],"ttl_seconds":300,"reason":"the sandbox needs it"}}"#,
        ports[0], ports[1]
    );
    let (status, ex) = api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(&ask));
    assert_eq!(status, 201, "{ex}");
    let id = ex["id"].as_str().unwrap().to_owned();
    let approved_at = Instant::now();
    assert_eq!(cli(admin, "tok-alice", &["approve", &id]).0, 0);
    next("then 200");
    assert!(
        approved_at.elapsed() < Duration::from_secs(2),
        "the approval took effect late"
    );
    assert_eq!(next("tunnel"), "tunnel 200");
    assert_eq!(next("echo"), "echo ping");
    next("tunnel open");
    let revoked_at = Instant::now();
    assert_eq!(cli(admin, "tok-alice", &["revoke", &id, "--note", "done"]).0, 0);
    let cut = next("tunnel cut after");
    assert!(
        revoked_at.elapsed() < Duration::from_secs(2),
        "the tunnel outlived the revocation: {cut}"
    );
    assert_eq!(next("after"), "after 403");
    assert!(sandbox_support::wait_bounded(&mut run).success());
    id
}

#[test]
fn a_sandboxed_command_is_denied_asks_is_approved_and_is_cut_on_revocation() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("web.test", &["127.0.0.1"])
            .with("echo.test", &["127.0.0.1"]),
    ));
    let dir = tempfile::tempdir().unwrap();
    let policy = central_policy(dir.path(), &[origin.port(), echo.addr().port()]);
    let central = start(&dns, &policy, &dir.path().join("state"));
    let (listener, admin) = task_and_admin(&central);
    // The sandbox forwards everything to the central proxy's t-1 listener, which decides.
    let sandbox = write_policy(
        dir.path(),
        &format!(
            // `*` is the usual ports only (issue 30): the test ports are named.
            "net:\n  mode: proxy\n  allow_domains: [ \"*:{}\", \"*:{}\" ]\n  proxy: {{ upstream: \"{listener}\" }}\n",
            origin.port(),
            echo.addr().port()
        ),
    );
    let id = approve_and_revoke_inside(&sandbox, &[], admin, [origin.port(), echo.addr().port()]);
    let events = read_audit(&central.audit_path);
    let lifecycle: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["exception_id"] == id.as_str())
        .map(|e| (e["event"].as_str().unwrap(), e["subject"].as_str().unwrap_or("-")))
        .collect();
    assert_eq!(
        lifecycle,
        [
            ("exception_requested", "agent-7"),
            ("exception_approved", "alice"),
            ("exception_revoked", "alice")
        ]
    );
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "close" && e["outcome"] == "revoked")
    );
}

/// The same flow in `allowlist` mode, where the run's own proxy decides: it follows the
/// control plane (`net.exceptions`) for the run's task (`--task t-1`), so the approval
/// reaches it within a second and the revocation cuts its tunnel within a second. Before
/// `net.exceptions` (issue 31) an approval never reached such a run.
#[test]
fn an_allowlist_run_follows_the_control_plane_for_its_task() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let echo = rt.block_on(EchoServer::start());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("web.test", &["127.0.0.1"])
            .with("echo.test", &["127.0.0.1"]),
    ));
    let dir = tempfile::tempdir().unwrap();
    let ports = [origin.port(), echo.addr().port()];
    let policy = central_policy(dir.path(), &ports);
    // The control plane's policy gains a follower token.
    let follower = format!(
        "      - {{ name: run-follower, role: follower, secret_sha256: {} }}\n",
        sandgate_policy::auth::secret_hash("tok-follow")
    );
    let mut text = std::fs::read_to_string(&policy).unwrap();
    text.push_str(&follower);
    std::fs::write(&policy, text).unwrap();
    let control = start(&dns, &policy, &dir.path().join("state"));
    let (_, admin) = task_and_admin(&control);
    let token = dir.path().join("follow.token");
    std::fs::write(&token, "tok-follow\n").unwrap();
    let sandbox = write_policy(
        dir.path(),
        &format!(
            "net:\n  mode: allowlist\n  allow_domains: [ \"other.test:{p}\" ]\n  allow_ranges: [ 127.0.0.0/8 ]\n  resolver: {{ servers: [ \"{dns}\" ] }}\n  exceptions: {{ from: \"http://{admin}\", token_file: follow.token, ports: [ {p}, {e} ] }}\n",
            p = ports[0],
            e = ports[1],
            dns = dns.addr(),
        ),
    );
    approve_and_revoke_inside(&sandbox, &["--task", "t-1"], admin, ports);
}

/// The same as `nobody`.
#[test]
fn the_sandbox_exceptions_flow_passes_as_an_ordinary_user() {
    common::rerun_as_nobody(
        "sandbox_exceptions_e2e",
        "the_sandbox_exceptions_flow_passes_as_an_ordinary_user",
        2,
    );
}
