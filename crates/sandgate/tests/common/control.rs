//! Fixtures of the exceptions tests: a policy with a task listener, exceptions enabled and
//! four admin tokens; the admin API and CLI called as a client would; the proxy started with
//! a state directory.

#![allow(dead_code, reason = "each test file uses a different part of the harness")]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sandgate_testkit::dns::DnsServer;
use serde_json::Value;

use super::ProxyProcess;

/// The policy: task t-1 on its own listener, exceptions enabled for t-1 on the test ports,
/// four admin tokens. Both listeners are on port 0: [`task_and_admin`] says where they are.
pub fn write_policy(dir: &Path, ports: &[u16]) -> std::path::PathBuf {
    let hash = |s: &str| sandgate_policy::auth::secret_hash(s);
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let text = format!(
        "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: {{ name: ex }}\nspec:\n\
         \x20 listeners:\n    - {{ listen: \"127.0.0.1:0\", task: t-1, project: p-1 }}\n\
         \x20 exceptions:\n    - {{ scope: {{ task: t-1 }}, ports: [ {ports} ], max_ttl_seconds: 600 }}\n\
         \x20 admin:\n    listen: \"127.0.0.1:0\"\n    tokens:\n\
         \x20     - {{ name: agent-7, role: requester, secret_sha256: {a}, tasks: [ t-1 ] }}\n\
         \x20     - {{ name: agent-8, role: requester, secret_sha256: {o}, tasks: [ t-2 ] }}\n\
         \x20     - {{ name: alice, role: approver, secret_sha256: {b} }}\n\
         \x20     - {{ name: victor, role: viewer, secret_sha256: {v} }}\n",
        ports = ports.join(", "),
        a = hash("tok-agent"),
        o = hash("tok-other"),
        b = hash("tok-alice"),
        v = hash("tok-viewer"),
    );
    let path = dir.join("policy.yaml");
    std::fs::write(&path, text).expect("test setup");
    path
}

/// Where a proxy started with [`write_policy`]'s file listens: its t-1 listener and its
/// admin listener, as its start-up log says.
pub fn task_and_admin(p: &ProxyProcess) -> (SocketAddr, SocketAddr) {
    (p.listener(&["task=t-1"]), p.admin())
}

/// Calls the admin API with curl; returns (status, JSON body).
pub fn api(
    admin: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let mut args = vec!["-X".to_owned(), method.to_owned()];
    if let Some(t) = token {
        args.extend(["-H".to_owned(), format!("Authorization: Bearer {t}")]);
    }
    if let Some(b) = body {
        args.extend(["-H", "Content-Type: application/json", "--data", b].map(str::to_owned));
    }
    let (status, body) = admin_call(admin, path, &args);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// A plain HTTP GET of `path` on the admin listener: (status, body).
pub fn admin_get(admin: SocketAddr, path: &str) -> (u16, String) {
    admin_call(admin, path, &[])
}

/// curl to the admin listener with `args`: (status, body as text).
fn admin_call(admin: SocketAddr, path: &str, args: &[String]) -> (u16, String) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "--noproxy",
            "*",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
        ])
        .args(args)
        .arg(format!("http://{admin}{path}"))
        .output()
        .expect("test setup");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (status.parse().unwrap_or(0), body.to_owned())
}

/// Runs `sandgate exceptions ARGS` against `admin` with `token` in the environment.
pub fn cli(admin: SocketAddr, token: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(super::sandgate_bin())
        .arg("exceptions")
        .args(args)
        .env("SANDGATE_ADMIN", format!("http://{admin}"))
        .env("SANDGATE_TOKEN", token)
        .output()
        .expect("test setup");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn get_status(proxy: SocketAddr, url: &str) -> String {
    super::curl(
        &format!("http://{proxy}"),
        &["-o", "/dev/null", "-w", "%{http_code}", url],
    )
    .1
}

pub fn start(dns: &DnsServer, policy: &Path, state: &Path) -> ProxyProcess {
    start_with(dns, policy, &["--state-dir", state.to_str().expect("test setup")])
}

/// The proxy with `policy` and `args` (where its exceptions live, and more).
pub fn start_with(dns: &DnsServer, policy: &Path, args: &[&str]) -> ProxyProcess {
    let dns_addr = dns.addr().to_string();
    let mut all = vec![
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--policy",
        policy.to_str().expect("test setup"),
    ];
    all.extend_from_slice(args);
    ProxyProcess::start(&all)
}

/// Waits until `cond` holds (at most `secs`).
pub fn within(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// The proxy with its exceptions in the shared PostgreSQL database `url` (`--state`), and
/// `extra` arguments.
pub fn start_shared(dns: &DnsServer, policy: &Path, url: &str, extra: &[&str]) -> ProxyProcess {
    let mut args = vec!["--state", url];
    args.extend_from_slice(extra);
    start_with(dns, policy, &args)
}
