//! `sandgate mcp` with a real MCP client (the Python `mcp` SDK over stdio), in both protocol
//! revisions (2025-11-25 with its initialize handshake, 2026-07-28 stateless): the tools and
//! their schemas, runs in a `none` sandbox, every gate refusing by name, a run killed at its
//! time limit, output cut at its limit; then egress: a run blocked by the central proxy, a
//! request that an auto-accepting client cannot approve, a person's approval through the
//! CLI that lets the next run through, and a revocation that stops it again. As the agent
//! turned attacker: a command that writes JSON-RPC to its stdout, a workspace that escapes
//! through a symlink, fields the schema does not have, the terminal of a client started in
//! one (tests/mcp/with_terminal.py makes it), the server's own files under a policy's write
//! path, a workspace holding them (refused at start); and each run's limits.

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
#[path = "mcp/tweak_narrowing.rs"]
mod tweak_narrowing;
#[path = "mcp/tweaks.rs"]
mod tweaks;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::control::{cli, start, task_and_admin, write_policy as central_policy};
use common::{read_audit, runtime};
use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;
use serde_json::{Value, json};

/// The Python client, driven one command per line.
struct Driver {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    protocol: String,
    /// The server's `serverInfo`, as the client read it (`null` when it sent none).
    server_info: Value,
}

impl Driver {
    fn start(config: &Path, mode: &str) -> Driver {
        let bin = common::sandgate_bin();
        Driver::start_with(mode, &[bin.as_str(), "mcp", "--config", config.to_str().unwrap()])
    }

    /// The client runs the server with `server` (its whole command line).
    fn start_with(mode: &str, server: &[&str]) -> Driver {
        Driver::start_as(None, mode, server)
    }

    /// [`Driver::start_with`], the client declaring `name` as its own (else the SDK's).
    fn start_as(name: Option<&str>, mode: &str, server: &[&str]) -> Driver {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/driver.py");
        let mut client = Command::new(common::python());
        if let Some(name) = name {
            client.env("SANDGATE_TEST_CLIENT_NAME", name);
        }
        let mut child = client
            .arg(script)
            .arg(mode)
            .args(server)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the Python MCP client");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut d = Driver {
            child,
            stdin,
            lines,
            protocol: String::new(),
            server_info: Value::Null,
        };
        let hello = d.next();
        d.protocol = hello["protocol_version"].as_str().unwrap().to_owned();
        d.server_info = hello["server_info"].clone();
        d
    }

    fn next(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(90))
            .expect("the MCP client answered within 90 s");
        serde_json::from_str(&line).unwrap()
    }

    fn send(&mut self, cmd: Value) -> Value {
        self.send_only(cmd);
        self.next()
    }

    /// Sends `cmd` without waiting for its answer ([`Driver::next_within`] reads it).
    fn send_only(&mut self, cmd: Value) {
        writeln!(self.stdin, "{cmd}").unwrap();
    }

    /// The next answer, if one comes within `wait`.
    fn next_within(&mut self, wait: Duration) -> Option<Value> {
        let line = self.lines.recv_timeout(wait).ok()?;
        Some(serde_json::from_str(&line).unwrap())
    }

    fn call(&mut self, tool: &str, args: Value) -> Value {
        self.send(json!({"call": tool, "args": args}))
    }

    fn run(&mut self, args: Value) -> Value {
        let r = self.call("run", args);
        assert!(r["protocol_error"].is_null(), "{r}");
        r
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sandbox policy with a working userland, the workspace read-write, and `net`.
fn sandbox_policy(dir: &Path, name: &str, net: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let text =
        sandbox_support::base().replacen("fs:\n", "fs:\n  write_paths: [ \"${WORKSPACE}\" ]\n", 1) + net;
    std::fs::write(&path, text).unwrap();
    path
}

fn write_config(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("mcp.yaml");
    std::fs::write(
        &path,
        format!("apiVersion: sandgate.dev/v1\nkind: McpServer\nmetadata: {{ name: t }}\nspec:\n{body}"),
    )
    .unwrap();
    path
}

/// An offline sandbox whose gates allow python3, 20 s, 4 KiB of output, workspaces under
/// `dir/work`.
fn offline_config(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("work/project")).unwrap();
    sandbox_policy(dir, "offline", "net:\n  mode: none\n");
    write_config(
        dir,
        "  task: t-1\n  audit_log: audit.jsonl\n  sandboxes:\n\
         \x20   - name: offline\n      description: no network\n      policy: offline.yaml\n\
         \x20     gates: { commands: [ python3 ], max_seconds: 20, max_output_bytes: 4096, workspaces: [ work ] }\n",
    )
}

fn tool_events(dir: &Path) -> Vec<Value> {
    read_audit(&dir.join("audit.jsonl"))
}

#[test]
fn a_real_client_runs_commands_within_the_gates_in_both_protocol_revisions() {
    for (mode, version) in [("legacy", "2025-11-25"), ("auto", "2026-07-28")] {
        let dir = tempfile::tempdir().unwrap();
        let config = offline_config(dir.path());
        let mut d = Driver::start(&config, mode);
        assert_eq!(d.protocol, version);
        // Issue 31: the server names itself and its version, not the SDK (required in the
        // 2025-11-25 handshake; the stateless revision's stamp is optional).
        if mode == "legacy" || !d.server_info.is_null() {
            assert_eq!(d.server_info["name"], "sandgate", "{}", d.server_info);
            assert_eq!(
                d.server_info["version"],
                env!("CARGO_PKG_VERSION"),
                "{}",
                d.server_info
            );
        }

        let tools = d.send(json!({"list": true}));
        let names: Vec<&str> = tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "egress_status",
                "list_sandboxes",
                "request_egress",
                "request_tweak",
                "run"
            ]
        );
        let run_schema = &tools["tools"][4]["input_schema"];
        assert_eq!(run_schema["additionalProperties"], false, "{run_schema}");
        assert_eq!(
            run_schema["required"],
            json!(["sandbox", "command"]),
            "{run_schema}"
        );
        let listed = d.call("list_sandboxes", json!({}));
        assert_eq!(
            listed["structured"]["sandboxes"][0]["network_mode"], "none",
            "{listed}"
        );

        let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", "print(6*7)"]}));
        assert_eq!(r["structured"]["stdout"], "42\n", "{r}");
        assert_eq!(r["structured"]["exit_code"], 0);
        let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", "import sys; print(sys.stdin.read().upper())"], "stdin": "hi"}));
        assert_eq!(r["structured"]["stdout"], "HI\n", "{r}");
        // The network is not there at all.
        let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), 2)"]}));
        assert_ne!(r["structured"]["exit_code"], 0, "{r}");

        // Each gate refuses by name.
        for (args, gate) in [
            (
                json!({"sandbox": "offline", "command": ["sh", "-c", "id"]}),
                "commands",
            ),
            (
                json!({"sandbox": "offline", "command": ["/usr/bin/python3", "-c", "1"]}),
                "commands",
            ),
            (json!({"sandbox": "nope", "command": ["python3"]}), "sandbox"),
            (
                json!({"sandbox": "offline", "command": ["python3"], "timeout_seconds": 999}),
                "max_seconds",
            ),
            (
                json!({"sandbox": "offline", "command": ["python3"], "workspace": "/etc"}),
                "workspaces",
            ),
        ] {
            let r = d.run(args.clone());
            assert_eq!(r["is_error"], true, "{args}: {r}");
            assert!(
                r["text"].as_str().unwrap().contains(&format!("gate `{gate}`")),
                "{args}: {r}"
            );
        }

        // Killed at its time limit, the output so far kept.
        let started = Instant::now();
        let r = d.run(json!({"sandbox": "offline", "timeout_seconds": 2,
            "command": ["python3", "-c", "import time; print('begun', flush=True); time.sleep(60)"]}));
        assert_eq!(r["structured"]["timed_out"], true, "{r}");
        // sandgate run ends on the SIGTERM (143), taking the sandbox with it.
        assert_ne!(r["structured"]["exit_code"], 0, "{r}");
        assert_eq!(r["structured"]["stdout"], "begun\n", "{r}");
        assert!(started.elapsed() < Duration::from_secs(15));

        // Output beyond the limit is counted, not kept.
        let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", "print('x' * 200000)"]}));
        let out = r["structured"]["stdout"].as_str().unwrap();
        assert!(out.len() < 4096 + 100, "{}", out.len());
        assert!(
            out.ends_with("[sandgate: output truncated: 4096 of 200001 bytes shown]"),
            "{out}"
        );
        assert_eq!(r["structured"]["stdout_bytes"], 200001);

        let events = tool_events(dir.path());
        let runs: Vec<&Value> = events
            .iter()
            .filter(|e| e["tool"] == "run" && e["event"] == "tool_call")
            .collect();
        assert!(
            runs.iter()
                .any(|e| e["gate"] == "commands" && e["outcome"] == "refused")
        );
        assert!(runs.iter().any(|e| e["outcome"] == "timeout"));
        assert!(
            runs.iter()
                .all(|e| e["command_sha256"].as_str().is_some_and(|d| d.len() == 64))
        );
        if mode == "legacy" {
            assert!(
                runs.iter()
                    .any(|e| e["subject"].as_str().unwrap().starts_with("mcp")),
                "{runs:#?}"
            );
            // Issue 30: a run is the server's user's (`--subject`), for the client
            // (`--agent mcp:NAME`, the name the client stated in its handshake), and the
            // command is told the agent.
            let client = runs[0]["subject"].as_str().unwrap();
            let name = client.split(' ').next().unwrap();
            let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", "import os; print(os.environ.get('SANDGATE_AGENT'))"]}));
            assert_eq!(r["structured"]["stdout"], format!("mcp:{name}\n"), "{r}");
        }
    }
}

#[test]
fn the_agent_cannot_reach_the_protocol_stream_or_escape_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let config = offline_config(dir.path());
    let mut d = Driver::start(&config, "legacy");
    // A command that writes a forged JSON-RPC answer to its stdout: it lands in the
    // report, and the session goes on.
    let forged = r#"{"jsonrpc":"2.0","id":99,"result":{"content":[],"isError":false}}"#;
    let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", format!("print({forged:?})")]}));
    assert_eq!(r["structured"]["stdout"], format!("{forged}\n"), "{r}");
    let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", "print('still here')"]}));
    assert_eq!(r["structured"]["stdout"], "still here\n", "{r}");
    // A symlink inside an allowed workspace that points out of it.
    let link = dir.path().join("work/escape");
    std::os::unix::fs::symlink("/etc", &link).unwrap();
    let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", "1"], "workspace": link}));
    assert!(r["text"].as_str().unwrap().contains("gate `workspaces`"), "{r}");
    // An allowed workspace is the run's ${WORKSPACE}; another run without one sees an
    // empty directory of its own.
    let ws = dir.path().join("work/project");
    let r = d.run(json!({"sandbox": "offline", "workspace": ws,
        "command": ["python3", "-c", format!("open({:?} + '/note', 'w').write('kept'); print('ok')", ws.display().to_string())]}));
    assert_eq!(r["structured"]["stdout"], "ok\n", "{r}");
    assert_eq!(std::fs::read_to_string(ws.join("note")).unwrap(), "kept");
    // A workspace whose name would rewrite the policy it is pasted into (a second, host-wide
    // writable path): refused by the gate, and nothing is written outside.
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let evil = dir
        .path()
        .join("work")
        .join(format!("x\", \"{}", outside.display()));
    std::fs::create_dir_all(&evil).unwrap();
    let r = d.run(json!({"sandbox": "offline", "workspace": evil,
        "command": ["python3", "-c", format!("open({:?} + '/PWNED', 'w')", outside.display().to_string())]}));
    assert!(r["text"].as_str().unwrap().contains("gate `workspaces`"), "{r}");
    assert!(!outside.join("PWNED").exists());
    // Two runs at once: the second is refused (`max_concurrent_runs` is 1 by default).
    let slow = json!({"call": "run", "args": {"sandbox": "offline", "command": ["python3", "-c", "import time; time.sleep(2)"]}});
    let both = d.send(json!({"parallel": [slow, slow]}));
    let errors: Vec<&Value> = both["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["is_error"] == true)
        .collect();
    assert_eq!(errors.len(), 1, "{both}");
    assert!(
        errors[0]["text"].as_str().unwrap().contains("gate `concurrency`"),
        "{both}"
    );
    // A field the schema does not have is refused, not ignored.
    let r = d.call(
        "run",
        json!({"sandbox": "offline", "command": ["python3", "-c", "1"], "net": "all"}),
    );
    assert!(r["is_error"] == true || !r["protocol_error"].is_null(), "{r}");
    // There is no tool that approves anything.
    let tools = d.send(json!({"list": true}));
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.contains("approve") && !n.contains("decide")),
        "{names:?}"
    );
}

/// curl in the `web` sandbox: the status it got from web.test.
fn fetch(d: &mut Driver, port: u16) -> Value {
    let url = format!("http://web.test:{port}/");
    d.run(json!({"sandbox": "web", "command": ["curl", "-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", url]}))
}

#[test]
fn egress_is_approved_by_a_person_and_ends_with_the_revocation() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let policy = central_policy(dir.path(), &[origin.port()]);
    let central = start(&dns, &policy, &dir.path().join("state"));
    let (listener, admin) = task_and_admin(&central);
    std::fs::write(dir.path().join("agent.token"), "tok-agent\n").unwrap();
    // Everything leaves through the central proxy's t-1 listener, which decides.
    sandbox_policy(
        dir.path(),
        "web",
        &format!(
            // `*` is the usual ports only (issue 30): the origin's port is named.
            "net:\n  mode: proxy\n  allow_domains: [ \"*:{}\" ]\n  proxy: {{ upstream: \"{listener}\" }}\n",
            origin.port()
        ),
    );
    let config = write_config(
        dir.path(),
        &format!(
            "  task: t-1\n  audit_log: audit.jsonl\n  egress: {{ admin: \"http://{admin}\", token_file: agent.token }}\n  sandboxes:\n\
             \x20   - name: web\n      policy: web.yaml\n      gates: {{ commands: [ curl ], max_seconds: 30, network: true }}\n"
        ),
    );
    let mut d = Driver::start(&config, "legacy");
    let r = fetch(&mut d, origin.port());
    assert_eq!(r["structured"]["stdout"], "403", "{r}");
    assert_eq!(
        r["structured"]["blocked"],
        json!([{"host": "web.test", "port": origin.port(), "reason": "upstream_denied"}]),
        "{r}"
    );

    // The client accepts every elicitation at once; that approves nothing.
    let asked = d.call(
        "request_egress",
        json!({"hosts": ["web.test"], "ports": [origin.port()], "ttl_seconds": 300,
               "reason": "fetch the test page", "wait_seconds": 2}),
    );
    assert_eq!(asked["structured"]["state"], "pending", "{asked}");
    let id = asked["structured"]["id"].as_str().unwrap().to_owned();
    let status = d.call("egress_status", json!({}));
    assert_eq!(status["structured"]["pending"][0]["id"], id.as_str(), "{status}");
    // The agent's own token cannot approve it either.
    let (code, _, err) = cli(admin, "tok-agent", &["approve", &id]);
    assert_ne!(code, 0, "{err}");

    let (code, _, err) = cli(admin, "tok-alice", &["approve", &id]);
    assert_eq!(code, 0, "{err}");
    let status = d.call("egress_status", json!({}));
    assert_eq!(status["structured"]["active"][0]["id"], id.as_str(), "{status}");
    // Times as the audit log writes them (RFC 3339), not Unix seconds.
    let expires = status["structured"]["active"][0]["expires_at"]
        .as_str()
        .unwrap_or_default();
    assert!(
        expires.parse::<jiff::Timestamp>().is_ok() && expires.ends_with('Z'),
        "{status}"
    );
    let r = fetch(&mut d, origin.port());
    assert_eq!(r["structured"]["stdout"], "200", "{r}");
    assert_eq!(r["structured"]["blocked"], json!([]), "{r}");

    let (code, _, err) = cli(admin, "tok-alice", &["revoke", &id]);
    assert_eq!(code, 0, "{err}");
    let r = fetch(&mut d, origin.port());
    assert_eq!(r["structured"]["stdout"], "403", "{r}");

    let events = tool_events(dir.path());
    assert!(
        events.iter().any(|e| e["tool"] == "request_egress"
            && e["exception_id"] == id.as_str()
            && e["outcome"] == "requested"),
        "{events:#?}"
    );
}

/// Fail closed: with an audit log that cannot be written (a full disk: /dev/full), nothing
/// runs and no egress request reaches the control plane.
#[test]
fn nothing_happens_unrecorded() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let policy = central_policy(dir.path(), &[443]);
    let central = start(&dns, &policy, &dir.path().join("state"));
    let (listener, admin) = task_and_admin(&central);
    std::fs::write(dir.path().join("agent.token"), "tok-agent\n").unwrap();
    sandbox_policy(dir.path(), "offline", "net:\n  mode: none\n");
    // A sandbox an approval reaches (the central proxy decides), so the request gets as far
    // as its record.
    sandbox_policy(
        dir.path(),
        "web",
        &format!(
            "net:\n  mode: proxy\n  allow_domains: [ \"a.test\" ]\n  proxy: {{ upstream: \"{listener}\" }}\n"
        ),
    );
    let config = write_config(
        dir.path(),
        &format!(
            "  task: t-1\n  audit_log: /dev/full\n  egress: {{ admin: \"http://{admin}\", token_file: agent.token }}\n  sandboxes:\n\
             \x20   - name: offline\n      policy: offline.yaml\n      gates: {{ commands: [ python3 ] }}\n\
             \x20   - name: web\n      policy: web.yaml\n      gates: {{ commands: [ curl ], network: true }}\n"
        ),
    );
    let mut d = Driver::start(&config, "legacy");
    let marker = dir.path().join("ran");
    std::fs::create_dir(&marker).unwrap();
    let r = d.call(
        "run",
        json!({"sandbox": "offline", "command": ["python3", "-c", "print(1)"]}),
    );
    assert_eq!(r["is_error"], true, "{r}");
    assert!(
        r["text"].as_str().unwrap().contains("nothing runs unrecorded"),
        "{r}"
    );
    let r = d.call(
        "request_egress",
        json!({"hosts": ["exfil.example"], "ttl_seconds": 60, "reason": "unrecorded"}),
    );
    assert_eq!(r["is_error"], true, "{r}");
    assert!(
        r["text"].as_str().unwrap().contains("nothing runs unrecorded"),
        "{r}"
    );
    let (status, list) = common::control::api(admin, "GET", "/v1/exceptions", Some("tok-alice"), None);
    assert_eq!(status, 200);
    assert_eq!(
        list,
        json!([]),
        "a request the MCP log never saw reached the control plane"
    );
}

/// An allowlist sandbox: a destination its policy does not list is refused by the run's own
/// proxy, and the run's report names it as blocked.
#[test]
fn an_allowlist_run_reports_what_was_blocked() {
    let dir = tempfile::tempdir().unwrap();
    sandbox_policy(
        dir.path(),
        "web",
        "net:\n  mode: allowlist\n  allow_domains: [ \"pypi.org\" ]\n",
    );
    let config = write_config(
        dir.path(),
        "  task: t-1\n  audit_log: audit.jsonl\n  sandboxes:\n\
         \x20   - name: web\n      policy: web.yaml\n      gates: { commands: [ curl ], max_seconds: 30, network: true }\n",
    );
    let mut d = Driver::start(&config, "legacy");
    let listed = d.call("list_sandboxes", json!({}));
    assert_eq!(
        listed["structured"]["sandboxes"][0]["network_mode"], "allowlist",
        "{listed}"
    );
    let r = d.run(json!({"sandbox": "web", "command":
        ["curl", "-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", "http://denied.test/"]}));
    assert_eq!(r["structured"]["stdout"], "403", "{r}");
    assert_eq!(
        r["structured"]["blocked"],
        json!([{"host": "denied.test", "port": 80, "reason": "not_allowlisted"}]),
        "{r}"
    );
    let events = tool_events(dir.path());
    assert!(
        events.iter().any(|e| e["tool"] == "run" && e["blocked"] == 1),
        "{events:#?}"
    );
}

/// Issue 30: what a run's own proxy records (the run's audit log, not the server's) names
/// the person the server runs as (`subject`, its user) and the client acting for them
/// (`agent`, `mcp:` and the name the client declared). The runner removes the run's log
/// when the run ends, so the run waits (for `go` in its workspace) while the test reads it
/// from the server's temporary directory.
#[test]
fn a_runs_own_audit_log_names_the_servers_user_and_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("work/project");
    std::fs::create_dir_all(&ws).unwrap();
    let server_tmp = dir.path().join("server-tmp");
    std::fs::create_dir(&server_tmp).unwrap();
    sandbox_policy(
        dir.path(),
        "web",
        "net:\n  mode: allowlist\n  allow_domains: [ \"pypi.org\" ]\n",
    );
    let config = write_config(
        dir.path(),
        "  task: t-1\n  audit_log: audit.jsonl\n  sandboxes:\n\
         \x20   - name: web\n      policy: web.yaml\n      gates: { commands: [ sh ], max_seconds: 60, network: true, workspaces: [ work ] }\n",
    );
    let (tmpdir, bin) = (format!("TMPDIR={}", server_tmp.display()), common::sandgate_bin());
    let server = [
        "env",
        &tmpdir,
        "USER=server-person",
        bin.as_str(),
        "mcp",
        "--config",
        config.to_str().unwrap(),
    ];
    let mut d = Driver::start_as(Some("e2e-client"), "legacy", &server);
    let script = "curl -sS -m 10 -o /dev/null -w %{http_code} http://denied.test/; \
                  i=0; while [ ! -e go ] && [ $i -lt 400 ]; do sleep 0.1; i=$((i+1)); done";
    let call = json!({"call": "run", "args": {"sandbox": "web", "workspace": ws.canonicalize().unwrap(),
        "command": ["sh", "-c", script]}});
    writeln!(d.stdin, "{call}").unwrap();
    // The run's log: `--audit-log` in the runner's temporary directory, under the server's.
    let mut events = Vec::new();
    let found = sandbox_support::eventually(Duration::from_secs(30), || {
        let logs = std::fs::read_dir(&server_tmp).unwrap().flatten();
        events = logs
            .map(|e| e.path().join("audit.jsonl"))
            .flat_map(|log| read_audit(&log))
            .collect();
        events.iter().any(|e| e["event"] == "decision")
    });
    std::fs::write(ws.join("go"), "").unwrap();
    let r = d.next();
    assert!(found, "no decision in the run's audit log: {events:#?}\n{r}");
    assert_eq!(r["structured"]["stdout"], "403", "{r}");
    let decision = events.iter().find(|e| e["event"] == "decision").unwrap();
    assert_eq!(decision["destination_host"], "denied.test", "{decision}");
    assert_eq!(decision["task_id"], "t-1", "{decision}");
    for event in events.iter().filter(|e| e.get("subject").is_some()) {
        assert_eq!(event["subject"], "server-person", "{event}");
        assert_eq!(event["agent"], "mcp:e2e-client", "{event}");
    }
}

#[test]
fn the_documented_example_starts_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/examples");
    std::fs::copy(format!("{examples}/mcp.yaml"), dir.path().join("mcp.yaml")).unwrap();
    std::fs::create_dir(dir.path().join("sandboxes")).unwrap();
    for f in ["python-offline.yaml", "python-packages.yaml"] {
        std::fs::copy(
            format!("{examples}/sandboxes/{f}"),
            dir.path().join("sandboxes").join(f),
        )
        .unwrap();
    }
    // The tool audit log goes under the state directory, not beside the configuration.
    let state = tempfile::tempdir().unwrap();
    let bin = common::sandgate_bin();
    let config = dir.path().join("mcp.yaml");
    // The Python client hands a server only a few variables of its own: set it there.
    let xdg = format!("XDG_STATE_HOME={}", state.path().display());
    let mut d = Driver::start_with(
        "auto",
        &[
            "env",
            xdg.as_str(),
            bin.as_str(),
            "mcp",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let listed = d.call("list_sandboxes", json!({}));
    let modes: Vec<&str> = listed["structured"]["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["network_mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["none", "allowlist"], "{listed}");
    assert!(listed.to_string().contains("pypi.org:443"), "{listed}");
    // Neither takes approvals as written (no spec.egress, no net.exceptions), and each says
    // what would.
    let approvals = &listed["structured"]["sandboxes"][1]["approvals"];
    assert_eq!(approvals["path"], "none", "{listed}");
    assert!(
        approvals["detail"]
            .as_str()
            .unwrap()
            .contains("add to the policy net.exceptions"),
        "{listed}"
    );
    let r = d.run(json!({"sandbox": "python-offline", "command": ["python3", "-c", "import os; print(len(os.listdir(os.environ.get('HOME', '/tmp'))))"]}));
    assert_eq!(r["structured"]["exit_code"], 0, "{r}");
    let kept = state.path().join("sandgate/mcp/example-agent-tools.jsonl");
    let events = read_audit(&kept);
    assert!(events.iter().any(|e| e["tool"] == "run"), "{events:#?}");
    let beside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".jsonl"))
        .collect();
    assert!(
        beside.is_empty(),
        "an audit log beside the configuration: {beside:?}"
    );
}

/// The example with its egress block and the sandbox's `net.exceptions` both uncommented,
/// as the comments say, is a configuration `check-config` accepts, saying how approvals
/// reach each sandbox; with only the egress block, it is refused, naming the sandbox.
#[test]
fn the_documented_example_with_egress_needs_the_sandboxes_to_follow_the_control_plane() {
    let dir = tempfile::tempdir().unwrap();
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/examples");
    let uncomment = |text: &str, lines: &[(&str, &str)]| {
        lines
            .iter()
            .fold(text.to_owned(), |t, (from, to)| t.replacen(from, to, 1))
    };
    let mcp = uncomment(
        &std::fs::read_to_string(format!("{examples}/mcp.yaml")).unwrap(),
        &[
            ("  # egress:", "  egress:"),
            ("  #   admin:", "    admin:"),
            ("  #   token_file:", "    token_file:"),
        ],
    );
    std::fs::write(dir.path().join("mcp.yaml"), mcp).unwrap();
    std::fs::write(dir.path().join("agent.token"), "tok-agent\n").unwrap();
    std::fs::create_dir(dir.path().join("sandboxes")).unwrap();
    std::fs::write(dir.path().join("sandboxes/follower.token"), "tok-follow\n").unwrap();
    for f in ["python-offline.yaml", "python-packages.yaml"] {
        std::fs::copy(
            format!("{examples}/sandboxes/{f}"),
            dir.path().join("sandboxes").join(f),
        )
        .unwrap();
    }
    let state = tempfile::tempdir().unwrap();
    let check = || {
        let out = Command::new(common::sandgate_bin())
            .arg("check-config")
            .arg(dir.path().join("mcp.yaml"))
            .env("XDG_STATE_HOME", state.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, err) = check();
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("spec.sandboxes[1].policy: sandbox \"python-packages\"")
            && err.contains(
                "add to the policy net.exceptions: { from: \"http://127.0.0.1:9090\", token_file: FILE }"
            ),
        "{err}"
    );
    let packages = dir.path().join("sandboxes/python-packages.yaml");
    let text = uncomment(
        &std::fs::read_to_string(&packages).unwrap(),
        &[("  # exceptions:", "  exceptions:")],
    );
    std::fs::write(&packages, text).unwrap();
    let (code, out, err) = check();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("python-packages: net mode allowlist, runs of task agent-example; approvals: followed control plane"),
        "{out}"
    );
}

#[test]
fn a_bad_configuration_is_refused_naming_each_field() {
    let dir = tempfile::tempdir().unwrap();
    sandbox_policy(
        dir.path(),
        "net",
        "net:\n  mode: allowlist\n  allow_domains: [ \"a.test\" ]\n",
    );
    let config = write_config(
        dir.path(),
        "  task: \"bad task\"\n  audit_log: audit.jsonl\n  egress: { admin: \"https://x\", token_file: missing.token }\n  sandboxes:\n\
         \x20   - name: net\n      policy: net.yaml\n      gates: { commands: [ \"bin/sh\" ], max_seconds: 0 }\n\
         \x20   - name: net\n      policy: nope.yaml\n      gates: { commands: [ python3 ] }\n",
    );
    let out = Command::new(common::sandgate_bin())
        .args(["mcp", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    // Each at its line, as the policy kinds say theirs.
    let at_line = format!("{}:11: spec.sandboxes[0].gates.max_seconds", config.display());
    assert!(err.contains(&at_line), "{at_line} in\n{err}");
    for want in [
        "spec.task",
        "spec.egress.admin",
        "spec.egress.token_file",
        "spec.sandboxes[0].gates.max_seconds",
        "spec.sandboxes[0].gates.commands: \"bin/sh\"",
        "spec.sandboxes[0].gates.network: the policy's net.mode is allowlist",
        "spec.sandboxes[1].name: \"net\" is named twice",
        "spec.sandboxes[1].policy",
    ] {
        assert!(err.contains(want), "{want} in\n{err}");
    }
    // An audit log that cannot be opened: the server does not start.
    let config = offline_config(dir.path());
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("audit.jsonl", "no/such/dir/audit.jsonl");
    std::fs::write(&config, text).unwrap();
    let out = Command::new(common::sandgate_bin())
        .args(["mcp", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(69),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs at once may take workspaces (once refused at start, since one run could swap a
/// directory of another's workspace path for a symlink between its check and its bind;
/// `sandgate run` now binds only what it opened at the canonical path checked, the attack
/// itself is in sandbox_escape_e2e.rs). Each run overlaps the other and writes its own.
#[test]
fn two_runs_at_once_each_write_their_own_workspace() {
    let dir = tempfile::tempdir().unwrap();
    for ws in ["work/a", "work/b"] {
        std::fs::create_dir_all(dir.path().join(ws)).unwrap();
    }
    sandbox_policy(dir.path(), "offline", "net:\n  mode: none\n");
    let config = write_config(
        dir.path(),
        "  task: t-1\n  audit_log: audit.jsonl\n  max_concurrent_runs: 2\n  sandboxes:\n\
         \x20   - name: offline\n      policy: offline.yaml\n\
         \x20     gates: { commands: [ python3 ], max_seconds: 20, workspaces: [ work ] }\n",
    );
    let mut d = Driver::start(&config, "legacy");
    let write = |name: &str| {
        let ws = dir.path().join("work").join(name);
        json!({"call": "run", "args": {"sandbox": "offline", "workspace": ws, "command": ["python3", "-c",
            "import os, time; open(os.environ['SANDGATE_WORKSPACE'] + '/note', 'w').write('mine'); time.sleep(1); print('ok')"]}})
    };
    let both = d.send(json!({"parallel": [write("a"), write("b")]}));
    for r in both["results"].as_array().unwrap() {
        assert_eq!(r["structured"]["stdout"], "ok\n", "{both}");
    }
    for name in ["a", "b"] {
        let note = dir.path().join("work").join(name).join("note");
        assert_eq!(std::fs::read_to_string(note).unwrap(), "mine");
    }
}

/// The server (and so every sandbox it starts) as an ordinary user, the client as root.
#[test]
fn the_server_runs_as_an_ordinary_user() {
    use std::os::unix::fs::PermissionsExt;
    if !common::is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let config = offline_config(dir.path());
    let bin = dir.path().join("sandgate");
    common::place_binary(common::sandgate_bin(), &bin);
    let mut d = Driver::start_with(
        "legacy",
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            bin.to_str().unwrap(),
            "mcp",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let r =
        d.run(json!({"sandbox": "offline", "command": ["python3", "-c", "import os; print(os.getuid())"]}));
    assert_eq!(r["structured"]["stdout"], "65534\n", "{r}");
    let events = tool_events(dir.path());
    assert!(events.iter().any(|e| e["outcome"] == "exited"), "{events:#?}");
}

/// Issue 28, item 1: a server started by a client in a person's terminal shares that
/// terminal (its controlling terminal). A run must not reach it: no `/dev/tty` to open (to
/// write over the agent's screen, take the foreground, read what the person types), no
/// controlling terminal at all, a session other than the server's.
#[test]
fn a_run_cannot_reach_the_terminal_of_the_agent_client() {
    let dir = tempfile::tempdir().unwrap();
    let config = offline_config(dir.path());
    let bin = common::sandgate_bin();
    let with_terminal = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/with_terminal.py");
    let python = common::python();
    let mut d = Driver::start_with(
        "legacy",
        &[
            python.as_str(),
            with_terminal,
            bin.as_str(),
            "mcp",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    // /proc/self/stat after the command name: state ppid pgrp session tty_nr ...
    let probe = r#"
import errno, json, os
stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
r = {"tty_nr": int(stat[4]), "ttys": [fd for fd in fds if os.isatty(fd)]}
try:
    fd = os.open("/dev/tty", os.O_RDWR)
    os.write(fd, b"\r\nsandgate test: written over the agent's screen\r\n")
    r["dev_tty"] = "opened"
except OSError as e:
    r["dev_tty"] = errno.errorcode[e.errno]
print(json.dumps(r))
"#;
    let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", probe]}));
    let seen: Value = serde_json::from_str(r["structured"]["stdout"].as_str().unwrap_or("null"))
        .unwrap_or_else(|e| panic!("{e}: {r}"));
    assert_eq!(
        seen["dev_tty"], "ENXIO",
        "the run opened the agent's terminal: {r}"
    );
    assert_eq!(seen["tty_nr"], 0, "the run has a controlling terminal: {r}");
    assert_eq!(seen["ttys"], json!([]), "{r}");
    // Nothing of the terminal either through a shell's job control.
    let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c",
        "import os, subprocess; print(subprocess.run(['sh', '-c', 'exec 3<>/dev/tty && echo opened'], capture_output=True).returncode)"]}));
    assert_eq!(r["structured"]["stdout"], "2\n", "{r}");
}

/// The server's files in `dir/server` (configuration, two sandboxes' policies, the tool
/// audit log); `open`'s policy writes all of `dir` (a write path the workspace check does
/// not see), `offline`'s nothing but the workspace.
fn server_files_under_a_write_path(dir: &Path) -> PathBuf {
    let server = dir.join("server");
    std::fs::create_dir_all(&server).unwrap();
    sandbox_policy(&server, "offline", "net:\n  mode: none\n");
    let open = sandbox_policy(&server, "open", "net:\n  mode: none\n");
    let text = std::fs::read_to_string(&open).unwrap().replacen(
        "write_paths: [ \"${WORKSPACE}\" ]",
        &format!("write_paths: [ \"${{WORKSPACE}}\", \"{}\" ]", dir.display()),
        1,
    );
    std::fs::write(&open, text).unwrap();
    write_config(
        &server,
        "  task: t-1\n  audit_log: audit.jsonl\n  sandboxes:\n\
         \x20   - name: open\n      policy: open.yaml\n      gates: { commands: [ python3 ] }\n\
         \x20   - name: offline\n      policy: offline.yaml\n      gates: { commands: [ python3 ] }\n",
    )
}

/// Issue 28, item 2: a run whose policy may write where the server keeps its files cannot
/// change one: not the configuration, not another sandbox's policy (whose next run would
/// have the host's network), not the tool audit log; not by writing, replacing or renaming
/// the directory that holds them.
#[test]
fn a_run_cannot_change_the_servers_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let config = server_files_under_a_write_path(&dir);
    let server = dir.join("server");
    let mut d = Driver::start(&config, "legacy");
    d.call("list_sandboxes", json!({}));
    let before: Vec<(String, String)> = ["mcp.yaml", "offline.yaml", "open.yaml"]
        .iter()
        .map(|f| ((*f).to_owned(), std::fs::read_to_string(server.join(f)).unwrap()))
        .collect();
    let attack = format!(
        r#"
import errno, json, os
base = {server:?}
r = {{}}
def attempt(name, act):
    try:
        act()
        r[name] = "done"
    except OSError as e:
        r[name] = errno.errorcode[e.errno]
for f in ["mcp.yaml", "offline.yaml", "open.yaml", "audit.jsonl"]:
    attempt("append " + f, lambda: open(base + "/" + f, "a").write("\nnet: {{ mode: all }}\n"))
attempt("truncate audit.jsonl", lambda: open(base + "/audit.jsonl", "w").close())
def replace():
    with open(base + "/forged.yaml", "w") as f:
        f.write("forged")
    os.replace(base + "/forged.yaml", base + "/offline.yaml")
attempt("replace offline.yaml", replace)
attempt("remove mcp.yaml", lambda: os.unlink(base + "/mcp.yaml"))
attempt("rename the directory", lambda: os.rename(base, base + ".old"))
print(json.dumps(r))
"#,
        server = server.display().to_string()
    );
    let r = d.run(json!({"sandbox": "open", "command": ["python3", "-c", attack]}));
    let seen: Value = serde_json::from_str(r["structured"]["stdout"].as_str().unwrap_or("null"))
        .unwrap_or_else(|e| panic!("{e}: {r}"));
    for (attempt, outcome) in seen.as_object().unwrap() {
        assert_ne!(outcome, "done", "{attempt} succeeded: {seen}");
    }
    assert_eq!(seen.as_object().unwrap().len(), 8, "{seen}");
    for (file, text) in &before {
        assert_eq!(
            &std::fs::read_to_string(server.join(file)).unwrap(),
            text,
            "{file}"
        );
    }
    let events = tool_events(&server);
    assert_eq!(
        events[0]["tool"], "list_sandboxes",
        "the audit log lost its start: {events:#?}"
    );
    // The other sandbox is what it was: no network at all.
    let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c",
        "import socket; socket.create_connection(('1.1.1.1', 53), 2)"]}));
    assert_ne!(r["structured"]["exit_code"], 0, "{r}");
}

/// Issue 28, item 2: a workspace that holds one of the server's own files (here the whole
/// directory with the configuration, the policy and the audit log, through a symlink) is
/// refused at start, naming the workspace and the file.
#[test]
fn a_workspace_holding_the_servers_files_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().canonicalize().unwrap();
    sandbox_policy(dir.path(), "offline", "net:\n  mode: none\n");
    std::os::unix::fs::symlink(&real, real.join("alias")).unwrap();
    let config = write_config(
        dir.path(),
        "  task: t-1\n  audit_log: audit.jsonl\n  sandboxes:\n\
         \x20   - name: offline\n      policy: offline.yaml\n      gates: { commands: [ python3 ], workspaces: [ alias ] }\n",
    );
    let out = Command::new(common::sandgate_bin())
        .args(["mcp", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    let ws = real.display();
    for want in [
        format!("spec.sandboxes[0].gates.workspaces: {ws} holds {ws}/mcp.yaml (the server's configuration)"),
        format!("{ws} holds {ws}/offline.yaml (the policy of sandbox \"offline\")"),
        format!("{ws} holds {ws}/audit.jsonl (the tool audit log)"),
    ] {
        assert!(err.contains(&want), "{want}\nin\n{err}");
    }
    // A workspace beside them is fine.
    std::fs::create_dir(real.join("work")).unwrap();
    let config = offline_config(dir.path());
    let mut d = Driver::start(&config, "legacy");
    let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", "print(1)"], "workspace": real.join("work/project")}));
    assert_eq!(r["structured"]["stdout"], "1\n", "{r}");
}

/// Issue 28, item 3: a run gets the sandbox's limits (the lower of the gates' and the
/// policy's): a small `/tmp`, CPU time bounded by the run's time limit; listed for the
/// agent and recorded.
#[test]
fn a_run_gets_its_sandboxs_limits() {
    let dir = tempfile::tempdir().unwrap();
    sandbox_policy(
        dir.path(),
        "offline",
        "net:\n  mode: none\nlimits: { processes: 64 }\n",
    );
    let config = write_config(
        dir.path(),
        "  task: t-1\n  audit_log: audit.jsonl\n  sandboxes:\n\
         \x20   - name: offline\n      policy: offline.yaml\n\
         \x20     gates: { commands: [ python3 ], max_seconds: 30, limits: { tmpfs: 8MiB, memory: 2GiB } }\n",
    );
    let mut d = Driver::start(&config, "legacy");
    let listed = d.call("list_sandboxes", json!({}));
    assert_eq!(
        listed["structured"]["sandboxes"][0]["limits"],
        json!([
            "processes=64",
            "memory=2GiB",
            "tmpfs=8MiB",
            "cpu_seconds=30",
            "open_files=off"
        ]),
        "{listed}"
    );
    let probe = r#"
import errno, json, os, resource
r = {"cpu": resource.getrlimit(resource.RLIMIT_CPU)[0]}
s = os.statvfs("/tmp")
r["tmp_bytes"] = s.f_blocks * s.f_frsize
try:
    with open("/tmp/fill", "wb") as f:
        for _ in range(32):
            f.write(b"x" * (1 << 20))
            f.flush()
    r["fill"] = "done"
except OSError as e:
    r["fill"] = errno.errorcode[e.errno]
print(json.dumps(r))
"#;
    let r = d.run(json!({"sandbox": "offline", "timeout_seconds": 20, "command": ["python3", "-c", probe]}));
    let seen: Value = serde_json::from_str(r["structured"]["stdout"].as_str().unwrap_or("null"))
        .unwrap_or_else(|e| panic!("{e}: {r}"));
    assert_eq!(seen["cpu"], 20, "CPU seconds: the run's time limit: {r}");
    assert_eq!(seen["tmp_bytes"], 8 << 20, "{r}");
    assert_eq!(seen["fill"], "ENOSPC", "{r}");
    let events = tool_events(dir.path());
    let started = events.iter().find(|e| e["event"] == "tool_call_started").unwrap();
    assert_eq!(
        started["limits"],
        json!([
            "processes=64",
            "memory=2GiB",
            "tmpfs=8MiB",
            "cpu_seconds=20",
            "open_files=off"
        ]),
        "{started}"
    );
    // A limit the sandbox would refuse is refused at start, naming the field.
    for (limits, want) in [
        (
            "{ memory: 1.5GiB }",
            "spec.sandboxes[0].gates.limits.memory: \"1.5GiB\"",
        ),
        ("{ swap: 1 }", "swap"),
    ] {
        let bad = write_config(
            dir.path(),
            &format!(
                "  task: t-1\n  audit_log: audit.jsonl\n  sandboxes:\n\
                 \x20   - name: offline\n      policy: offline.yaml\n\
                 \x20     gates: {{ commands: [ python3 ], limits: {limits} }}\n"
            ),
        );
        let out = Command::new(common::sandgate_bin())
            .args(["mcp", "--config"])
            .arg(&bad)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{err}");
        assert!(err.contains(want), "{want} in\n{err}");
    }
}

/// Issue 28, finding 1, through `sandgate mcp` (the docs' offline sandbox, where PID 1 was
/// bubblewrap's own unfiltered, dumpable reaper): PID 1 is sandgate's init, /proc/1/mem does
/// not open for writing, and every process of the run shows the filter.
#[test]
fn a_runs_pid_1_is_filtered_and_cannot_be_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let config = offline_config(dir.path());
    let mut d = Driver::start(&config, "legacy");
    let script = r#"
import os
print("pid1", open("/proc/1/cmdline", "rb").read().split(b"\0")[1].decode())
try:
    os.open("/proc/1/mem", os.O_RDWR)
    print("mem OPENED")
except OSError as e:
    print("mem refused", e.errno)
modes = set()
for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Seccomp:"):
            modes.add(line.split()[1])
print("seccomp", sorted(modes))
"#;
    let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", script]}));
    let out = r["structured"]["stdout"].as_str().unwrap_or_default().to_owned();
    assert!(out.contains("pid1 sandbox-init"), "{r}");
    assert!(
        out.contains("mem refused 13"),
        "PID 1's memory opened for writing: {r}"
    );
    assert!(
        out.contains("seccomp ['2']"),
        "a process of the run without the filter: {r}"
    );
}

/// Issue 28, finding 7, through `sandgate mcp`: a fork bomb and a memory fill in a run meet
/// the gates' limits, and the server answers the next call at once.
#[test]
fn a_fork_bomb_or_a_memory_fill_leaves_the_server_responsive() {
    let dir = tempfile::tempdir().unwrap();
    sandbox_policy(dir.path(), "offline", "net:\n  mode: none\n");
    let config = write_config(
        dir.path(),
        "  task: t-1\n  audit_log: audit.jsonl\n  sandboxes:\n\
         \x20   - name: offline\n      policy: offline.yaml\n\
         \x20     gates: { commands: [ python3 ], max_seconds: 30, limits: { processes: 32, memory: 256MiB } }\n",
    );
    let mut d = Driver::start(&config, "legacy");
    // Forks until refused (at most 500, each child sleeping), then says how far it got.
    let bomb = "import os, signal, time\nkids = []\nfor i in range(500):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    kids.append(pid)\nprint(len(kids))\nfor k in kids:\n    os.kill(k, signal.SIGKILL)\n";
    let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", bomb]}));
    let forked: usize = r["structured"]["stdout"]
        .as_str()
        .unwrap_or("")
        .trim()
        .parse()
        .unwrap_or(usize::MAX);
    assert!(
        forked < 32,
        "the fork bomb made {forked} processes under a limit of 32: {r}"
    );
    let fill = "try:\n    b = b'x' * (1 << 30)\n    print('allocated')\nexcept MemoryError:\n    print('MemoryError')\n";
    let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", fill]}));
    let shown = r["structured"]["stdout"].as_str().unwrap_or("");
    assert!(
        shown.contains("MemoryError")
            || r["structured"]["signal"] == 9
            || r["structured"]["exit_code"] == 137,
        "1 GiB under a 256 MiB limit: {r}"
    );
    let started = std::time::Instant::now();
    let listed = d.call("list_sandboxes", json!({}));
    assert!(listed["structured"]["sandboxes"].is_array(), "{listed}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the server was slow to answer after the runs"
    );
}

/// The acceptance test's world: a control plane (a `sandgate proxy` with its exceptions in
/// SQLite and the admin API: a requester token for t-1, an approver, and a follower), an
/// origin at `web.test`, and an MCP server for task t-1 whose `web` sandbox is in
/// `allowlist` mode, its own proxy following that control plane (`net.exceptions`, with a
/// token of role `follower`) for the origin's port.
struct Followed {
    dir: tempfile::TempDir,
    origin: Origin,
    _dns: DnsServer,
    /// The control plane (a test may stop it).
    control: common::ProxyProcess,
    admin: std::net::SocketAddr,
    config: PathBuf,
}

fn followed(rt: &tokio::runtime::Runtime) -> Followed {
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(Zone::new().with("web.test", &["127.0.0.1"])));
    let dir = tempfile::tempdir().unwrap();
    let policy = central_policy(dir.path(), &[origin.port()]);
    let mut text = std::fs::read_to_string(&policy).unwrap();
    text.push_str(&format!(
        "      - {{ name: run-follower, role: follower, secret_sha256: {} }}\n",
        sandgate_policy::auth::secret_hash("tok-follow")
    ));
    std::fs::write(&policy, text).unwrap();
    let control = start(&dns, &policy, &dir.path().join("state"));
    let admin = control.admin();
    std::fs::write(dir.path().join("agent.token"), "tok-agent\n").unwrap();
    std::fs::write(dir.path().join("follow.token"), "tok-follow\n").unwrap();
    sandbox_policy(
        dir.path(),
        "web",
        &format!(
            "net:\n  mode: allowlist\n  allow_domains: [ \"other.test:{p}\" ]\n  allow_ranges: [ 127.0.0.0/8 ]\n  resolver: {{ servers: [ \"{dns}\" ] }}\n  exceptions: {{ from: \"http://{admin}\", token_file: follow.token, ports: [ {p} ] }}\n",
            p = origin.port(),
            dns = dns.addr(),
        ),
    );
    let config = write_config(
        dir.path(),
        &format!(
            "  task: t-1\n  audit_log: audit.jsonl\n  egress: {{ admin: \"http://{admin}\", token_file: agent.token }}\n  sandboxes:\n\
             \x20   - name: web\n      policy: web.yaml\n      gates: {{ commands: [ curl, python3 ], max_seconds: 30, network: true }}\n"
        ),
    );
    Followed {
        dir,
        origin,
        _dns: dns,
        control,
        admin,
        config,
    }
}

/// The task's exceptions in `state`, as an approver lists them.
fn exceptions_in(admin: std::net::SocketAddr, state: &str) -> Vec<Value> {
    let (status, list) = common::control::api(admin, "GET", "/v1/exceptions", Some("tok-alice"), None);
    assert_eq!(status, 200, "{list}");
    list.as_array()
        .unwrap()
        .iter()
        .filter(|e| e["task_id"] == "t-1" && e["state"] == state)
        .cloned()
        .collect()
}

/// Waits (at most 30 s) for the first pending request of t-1; its id.
fn first_pending(admin: std::net::SocketAddr) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(e) = exceptions_in(admin, "pending").first() {
            return e["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "no request reached the control plane");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 31, acceptance: an MCP agent in an allowlist sandbox whose own proxy follows the
/// control plane. Blocked; `request_egress` with a wait; a person approves with the CLI;
/// the wait returns `approved` at once, and the next run passes; after a revocation the
/// next run is refused. The exception is for the task the runs carry. Before issue 31 the
/// server said "approved" for such a sandbox without `net.exceptions`, and the next run was
/// refused again (the server now refuses that configuration at start: below).
#[test]
fn an_agent_in_an_allowlist_sandbox_that_follows_the_control_plane_is_approved_by_a_person() {
    let rt = runtime();
    let f = followed(&rt);
    let port = f.origin.port();
    let admin = f.admin;
    let mut d = Driver::start(&f.config, "legacy");
    let listed = d.call("list_sandboxes", json!({}));
    let web = &listed["structured"]["sandboxes"][0];
    assert_eq!(web["approvals"]["path"], "followed control plane", "{listed}");
    assert_eq!(web["task"], "t-1", "{listed}");
    let r = d.run(json!({"sandbox": "web", "command": ["python3", "-c", "import os; print(os.environ['SANDGATE_TASK'])"]}));
    assert_eq!(r["structured"]["stdout"], "t-1\n", "the runs' task: {r}");

    let r = fetch(&mut d, port);
    assert_eq!(r["structured"]["stdout"], "403", "{r}");
    assert_eq!(
        r["structured"]["blocked"],
        json!([{"host": "web.test", "port": port, "reason": "not_allowlisted"}]),
        "{r}"
    );

    // A person approves while the agent waits.
    let approver = std::thread::spawn(move || {
        let id = first_pending(admin);
        std::thread::sleep(Duration::from_millis(1500));
        let (code, _, err) = cli(admin, "tok-alice", &["approve", &id]);
        assert_eq!(code, 0, "{err}");
        (id, Instant::now())
    });
    let asked = d.call(
        "request_egress",
        json!({"sandbox": "web", "hosts": ["web.test"], "ports": [port], "ttl_seconds": 300,
               "reason": "fetch the test page", "wait_seconds": 60}),
    );
    let answered_at = Instant::now();
    let (id, approved_at) = approver.join().unwrap();
    let late = answered_at.saturating_duration_since(approved_at);
    assert!(
        late < Duration::from_secs(5),
        "the wait outlived the approval by {late:?}: {asked}"
    );
    assert_eq!(asked["structured"]["state"], "approved", "{asked}");
    assert_eq!(asked["structured"]["id"], id.as_str(), "{asked}");
    assert_eq!(asked["structured"]["reaches"], json!(["web"]), "{asked}");
    // Requested for the task the runs carry.
    let (_, ex) = common::control::api(
        admin,
        "GET",
        &format!("/v1/exceptions/{id}"),
        Some("tok-alice"),
        None,
    );
    assert_eq!(ex["task_id"], "t-1", "{ex}");

    let r = fetch(&mut d, port);
    assert_eq!(r["structured"]["stdout"], "200", "{r}");
    assert_eq!(r["structured"]["blocked"], json!([]), "{r}");

    let (code, _, err) = cli(admin, "tok-alice", &["revoke", &id]);
    assert_eq!(code, 0, "{err}");
    let r = fetch(&mut d, port);
    assert_eq!(r["structured"]["stdout"], "403", "{r}");
    let events = tool_events(f.dir.path());
    assert!(
        events.iter().any(|e| e["tool"] == "request_egress"
            && e["exception_id"] == id.as_str()
            && e["task_id"] == "t-1"
            && e["outcome"] == "requested"),
        "{events:#?}"
    );
}

/// Issue 33: an agent asks for read-only access (`read_only: true`) through
/// `request_egress`; once a person approves, the next run of the sandbox that follows the
/// control plane reads and cannot write, each refusal on record as the exception's. An
/// approval the agent could read as "approved" for more than it asked is never given: asked
/// again for writes, it files a new request rather than answering with the read-only one.
#[test]
fn an_agent_granted_read_only_access_reads_and_cannot_write() {
    let rt = runtime();
    let f = followed(&rt);
    let port = f.origin.port();
    let admin = f.admin;
    let mut d = Driver::start(&f.config, "legacy");
    let approver = std::thread::spawn(move || {
        let id = first_pending(admin);
        let (code, _, err) = cli(admin, "tok-alice", &["approve", &id]);
        assert_eq!(code, 0, "{err}");
        id
    });
    let asked = d.call(
        "request_egress",
        json!({"sandbox": "web", "hosts": ["web.test"], "ports": [port], "ttl_seconds": 300,
               "reason": "read the test page", "read_only": true, "wait_seconds": 60}),
    );
    let id = approver.join().unwrap();
    assert_eq!(asked["structured"]["state"], "approved", "{asked}");
    let (_, ex) = common::control::api(
        admin,
        "GET",
        &format!("/v1/exceptions/{id}"),
        Some("tok-alice"),
        None,
    );
    assert_eq!(ex["read_only"], true, "{ex}");
    let url = format!("http://web.test:{port}/page");
    let status = |d: &mut Driver, method: &str| {
        let r = d.run(json!({"sandbox": "web", "command": ["curl", "-sS", "-m", "10", "-X", method, "-o", "/dev/null", "-w", "%{http_code}", url]}));
        r["structured"]["stdout"].as_str().unwrap_or_default().to_owned()
    };
    assert_eq!(status(&mut d, "GET"), "200");
    assert_eq!(status(&mut d, "POST"), "403");
    assert_eq!(status(&mut d, "DELETE"), "403");
    // Writes are another request: filed, pending, not answered by the read-only exception.
    let more = d.call(
        "request_egress",
        json!({"sandbox": "web", "hosts": ["web.test"], "ports": [port], "ttl_seconds": 300,
               "reason": "write it too", "methods": ["POST"]}),
    );
    assert_eq!(more["structured"]["state"], "pending", "{more}");
    assert_ne!(more["structured"]["id"], id.as_str(), "{more}");
    // Rules the grammar refuses are refused before anything is filed.
    let bad = d.send(
        json!({"call": "request_egress", "args": {"hosts": ["web.test"], "ports": [port],
        "ttl_seconds": 60, "reason": "r", "paths": ["/a/../b"]}}),
    );
    assert!(bad.to_string().contains("paths"), "{bad}");
    assert_eq!(
        exceptions_in(admin, "pending").len(),
        1,
        "only the write request is pending"
    );
}

/// Issue 31: the wait ends as soon as any exception that covers the request is active for
/// the task, not only the one the agent filed (here a wider request an approver granted
/// instead); the agent's own request stays pending for the approver to deny or leave.
#[test]
fn the_wait_ends_when_any_exception_covering_the_request_is_approved() {
    let rt = runtime();
    let f = followed(&rt);
    let port = f.origin.port();
    let admin = f.admin;
    let mut d = Driver::start(&f.config, "legacy");
    // The client's first result of a tool is slow to read under load (its schema
    // validation warms up); the time measured below is the server's.
    let warm = d.call("egress_status", json!({}));
    assert_eq!(warm["structured"]["pending"], json!([]), "{warm}");
    let approver = std::thread::spawn(move || {
        let mine = first_pending(admin);
        let ask = format!(
            r#"{{"task_id":"t-1","requested_hosts":["web.test","cdn.test"],"requested_ports":[{port}],"ttl_seconds":300,"reason":"the wider one"}}"#
        );
        let (status, wider) =
            common::control::api(admin, "POST", "/v1/exceptions", Some("tok-agent"), Some(&ask));
        assert_eq!(status, 201, "{wider}");
        let wider = wider["id"].as_str().unwrap().to_owned();
        std::thread::sleep(Duration::from_millis(1000));
        let (code, _, err) = cli(admin, "tok-alice", &["approve", &wider]);
        assert_eq!(code, 0, "{err}");
        (mine, wider, Instant::now())
    });
    let asked = d.call(
        "request_egress",
        json!({"hosts": ["web.test"], "ports": [port], "ttl_seconds": 300,
               "reason": "fetch the test page", "wait_seconds": 30}),
    );
    let answered_at = Instant::now();
    let (mine, wider, approved_at) = approver.join().unwrap();
    assert_eq!(asked["structured"]["state"], "approved", "{asked}");
    let late = answered_at.saturating_duration_since(approved_at);
    assert!(
        late < Duration::from_secs(5),
        "{late:?} after the approval: {asked}"
    );
    assert_eq!(asked["structured"]["id"], wider.as_str(), "{asked}");
    assert_eq!(asked["structured"]["requested_id"], mine.as_str(), "{asked}");
    let pending: Vec<Value> = exceptions_in(admin, "pending");
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["id"], mine.as_str());
    let r = fetch(&mut d, port);
    assert_eq!(r["structured"]["stdout"], "200", "{r}");
}

/// Issue 31, as an attacker: an agent that asks again and again (in turn, at once, with the
/// hosts spelt otherwise) leaves one pending row for an approver; once approved, a request
/// it covers files nothing and answers `approved` at once. (A sandbox whose traffic a
/// central proxy decides: what is tested is the control plane's answers as the server
/// reads them.)
#[test]
fn an_agents_duplicate_requests_leave_one_pending_row() {
    let rt = runtime();
    let dns = rt.block_on(DnsServer::start(Zone::new()));
    let dir = tempfile::tempdir().unwrap();
    let policy = central_policy(dir.path(), &[443]);
    let central = start(&dns, &policy, &dir.path().join("state"));
    let (listener, admin) = task_and_admin(&central);
    std::fs::write(dir.path().join("agent.token"), "tok-agent\n").unwrap();
    sandbox_policy(
        dir.path(),
        "web",
        &format!(
            "net:\n  mode: proxy\n  allow_domains: [ \"a.test\" ]\n  proxy: {{ upstream: \"{listener}\" }}\n"
        ),
    );
    let config = write_config(
        dir.path(),
        &format!(
            "  task: t-1\n  audit_log: audit.jsonl\n  egress: {{ admin: \"http://{admin}\", token_file: agent.token }}\n  sandboxes:\n\
             \x20   - name: web\n      policy: web.yaml\n      gates: {{ commands: [ curl ], network: true }}\n"
        ),
    );
    let mut d = Driver::start(&config, "legacy");
    let ask = |hosts: Value, reason: &str| json!({"call": "request_egress", "args": {"hosts": hosts, "ports": [443], "ttl_seconds": 300, "reason": reason}});
    let first = d.send(ask(json!(["web.test"]), "one"));
    let id = first["structured"]["id"].as_str().unwrap().to_owned();
    assert_eq!(first["structured"]["state"], "pending", "{first}");
    let again = d.send(ask(json!(["Web.Test."]), "two"));
    assert_eq!(again["structured"]["id"], id.as_str(), "{again}");
    let both =
        d.send(json!({"parallel": [ask(json!(["web.test"]), "three"), ask(json!(["web.test"]), "four")]}));
    for r in both["results"].as_array().unwrap() {
        assert_eq!(r["structured"]["id"], id.as_str(), "{both}");
    }
    assert_eq!(exceptions_in(admin, "pending").len(), 1, "{both}");

    let (code, _, err) = cli(admin, "tok-alice", &["approve", &id]);
    assert_eq!(code, 0, "{err}");
    let covered = d.send(ask(json!(["web.test"]), "five"));
    assert_eq!(covered["structured"]["state"], "approved", "{covered}");
    assert_eq!(covered["structured"]["id"], id.as_str(), "{covered}");
    let (_, all) = common::control::api(admin, "GET", "/v1/exceptions", Some("tok-alice"), None);
    assert_eq!(all.as_array().unwrap().len(), 1, "{all}");
}

/// Issue 31, as an attacker on the configuration: `spec.egress` with a sandbox whose own
/// proxy follows no control plane (or another one) would tell an agent "approved" for runs
/// that stay refused. The server does not start, and names each such sandbox and the
/// setting to add; a sandbox with no network is fine.
#[test]
fn egress_with_a_sandbox_no_approval_reaches_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("agent.token"), "tok-agent\n").unwrap();
    sandbox_policy(
        dir.path(),
        "web",
        "net:\n  mode: allowlist\n  allow_domains: [ \"a.test\" ]\n",
    );
    sandbox_policy(
        dir.path(),
        "elsewhere",
        "net:\n  mode: allowlist\n  allow_domains: [ \"a.test\" ]\n  exceptions: { from: \"http://127.0.0.1:9\", token_file: f.token }\n",
    );
    sandbox_policy(dir.path(), "offline", "net:\n  mode: none\n");
    let config = write_config(
        dir.path(),
        "  task: t-1\n  audit_log: audit.jsonl\n  egress: { admin: \"http://127.0.0.1:8\", token_file: agent.token }\n  sandboxes:\n\
         \x20   - name: offline\n      policy: offline.yaml\n      gates: { commands: [ python3 ] }\n\
         \x20   - name: web\n      policy: web.yaml\n      gates: { commands: [ curl ], network: true }\n\
         \x20   - name: elsewhere\n      policy: elsewhere.yaml\n      gates: { commands: [ curl ], network: true }\n",
    );
    let out = Command::new(common::sandgate_bin())
        .args(["mcp", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    for want in [
        "spec.sandboxes[1].policy: sandbox \"web\"",
        "net.mode allowlist: the run's own proxy decides and follows no control plane",
        "add to the policy net.exceptions: { from: \"http://127.0.0.1:8\", token_file: FILE }",
        "spec.sandboxes[2].policy: sandbox \"elsewhere\"",
        "net.exceptions.from is \"http://127.0.0.1:9\", not \"http://127.0.0.1:8\"",
    ] {
        assert!(err.contains(want), "{want}\nin\n{err}");
    }
    assert!(!err.contains("\"offline\""), "{err}");
    assert!(!dir.path().join("audit.jsonl").exists(), "it started");
}

/// Issue 31: a run is told its workspace (`SANDGATE_WORKSPACE`) and starts in it, whether
/// the agent named one or the run got a fresh one of its own.
#[test]
fn a_run_starts_in_its_workspace_and_is_told_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let config = offline_config(dir.path());
    let mut d = Driver::start(&config, "legacy");
    let probe = "import os; print(os.getcwd()); print(os.environ.get('SANDGATE_WORKSPACE')); open('written-here', 'w').write('x')";
    let ws = dir.path().canonicalize().unwrap().join("work/project");
    let r = d.run(json!({"sandbox": "offline", "workspace": ws, "command": ["python3", "-c", probe]}));
    assert_eq!(
        r["structured"]["stdout"],
        format!("{0}\n{0}\n", ws.display()),
        "{r}"
    );
    assert!(ws.join("written-here").exists(), "{r}");
    let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", probe]}));
    let out = r["structured"]["stdout"].as_str().unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{r}");
    assert_eq!(lines[0], lines[1], "{r}");
    assert!(lines[0].ends_with("/workspace"), "{r}");
    assert_eq!(r["structured"]["exit_code"], 0, "{r}");
}

/// Issue 31: `check-config` reads an McpServer as `sandgate mcp` would, says how approvals
/// reach each sandbox, and reports a missing required field as the other kinds do:
/// `file:line: field: what to write`.
#[test]
fn check_config_reads_an_mcp_server() {
    let dir = tempfile::tempdir().unwrap();
    let config = offline_config(dir.path());
    let out = Command::new(common::sandgate_bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!(
            "{}: ok: t (McpServer: task t-1, 1 sandboxes",
            config.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("offline: net mode none, runs of task t-1; approvals: none"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("  task: t-1\n", "");
    std::fs::write(&config, text).unwrap();
    let out = Command::new(common::sandgate_bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    let want = format!(
        "{}:6: spec.task: required, but missing; write task: agent-7",
        config.display()
    );
    assert!(stderr.contains(&want), "{want}\nin\n{stderr}");
}
