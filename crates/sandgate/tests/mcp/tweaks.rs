//! Issue 31, dynamic tweaks, through the real MCP client: a longer time limit, the
//! sandbox's network, more output and a workspace, each only while a person grants it and
//! never beyond the sandbox's `gates.tweaks` bounds; and a run that holds a tweak stopped
//! within about a second of its revocation (its result and the tool audit say which), or
//! at its expiry when the control plane cannot be read. A run signals that it is going by
//! writing a line to a FIFO in its workspace, which the test awaits.

use super::*;

/// A FIFO `name` in `dir`, and the first line a run writes to it: the test awaits the
/// run's own word that it is going. Opening it blocks until the run opens it to write.
fn signal_from_run(dir: &Path, name: &str) -> mpsc::Receiver<String> {
    let path = dir.join(name);
    let made = Command::new("mkfifo")
        .arg("-m")
        .arg("0666")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        if let Ok(f) = std::fs::File::open(&path) {
            let _ = BufReader::new(f).read_line(&mut line);
        }
        let _ = tx.send(line);
    });
    rx
}

/// Python that writes `up` to the FIFO `name` in its workspace, then runs `then`.
/// Writes the time (`time.time()`) to `beat` in the workspace every 50 ms, for 100 s.
const HEARTBEAT: &str = "beat = os.environ['SANDGATE_WORKSPACE'] + '/beat'\nfor _ in range(2000):\n    with open(beat + '.new', 'w') as f:\n        f.write(repr(time.time()))\n    os.replace(beat + '.new', beat)\n    time.sleep(0.05)";

fn signals_then(name: &str, then: &str) -> String {
    format!(
        "import os, time\nwith open(os.environ['SANDGATE_WORKSPACE'] + '/{name}', 'w') as f:\n    f.write('up\\n')\n{then}\n"
    )
}

/// Asks for `args` with `request_tweak`, a person approving it with the CLI (`approve ID`
/// and `extra`) while the agent waits; the answer (`id`, `expires_at`).
fn grant(d: &mut Driver, admin: std::net::SocketAddr, args: Value, extra: &[&str]) -> Value {
    let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
    let approver = std::thread::spawn(move || {
        let id = first_pending(admin);
        let mut words = vec!["approve", id.as_str()];
        words.extend(extra.iter().map(String::as_str));
        let (code, _, err) = cli(admin, "tok-alice", &words);
        assert_eq!(code, 0, "{err}");
        id
    });
    let mut args = args;
    args.as_object_mut().unwrap().extend([
        ("wait_seconds".to_owned(), json!(60)),
        ("reason".to_owned(), json!("the task needs it")),
    ]);
    let asked = d.call("request_tweak", args);
    let id = approver.join().unwrap();
    assert_eq!(asked["structured"]["state"], "approved", "{asked}");
    assert_eq!(asked["structured"]["id"], id.as_str(), "{asked}");
    asked["structured"].clone()
}

/// [`grant`], the id only.
fn granted_id(d: &mut Driver, admin: std::net::SocketAddr, args: Value) -> String {
    grant(d, admin, args, &[])["id"].as_str().unwrap().to_owned()
}

/// A config of one sandbox `name` with `policy` and `gates`, filing with the control plane
/// at `admin`.
fn tweak_config(dir: &Path, admin: std::net::SocketAddr, name: &str, policy: &str, gates: &str) -> PathBuf {
    write_config(
        dir,
        &format!(
            "  task: t-1\n  audit_log: audit.jsonl\n  egress: {{ admin: \"http://{admin}\", token_file: agent.token }}\n  sandboxes:\n\
             \x20   - name: {name}\n      policy: {policy}\n      gates: {gates}\n"
        ),
    )
}

/// Approves, as a person, a tweak filed with the requester token directly: a control plane
/// that publishes whatever it was asked, beyond any sandbox's bounds.
fn published(admin: std::net::SocketAddr, tweak: Value) -> String {
    let body = json!({"task_id": "t-1", "requested_hosts": [], "ttl_seconds": 300, "reason": "more", "tweak": tweak});
    let (status, filed) = common::control::api(
        admin,
        "POST",
        "/v1/exceptions",
        Some("tok-agent"),
        Some(&body.to_string()),
    );
    assert_eq!(status, 201, "{filed}");
    let id = filed["id"].as_str().unwrap().to_owned();
    let (code, _, err) = cli(admin, "tok-alice", &["approve", &id]);
    assert_eq!(code, 0, "{err}");
    id
}

fn refused_by(r: &Value, gate: &str) -> bool {
    r["is_error"] == true
        && r["text"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("gate `{gate}`"))
}

/// The tool audit's close of the run the end of tweak `stopped_id` stopped.
fn run_close<'a>(events: &'a [Value], stopped_id: &str) -> Option<&'a Value> {
    events
        .iter()
        .find(|e| e["tool"] == "run" && e["outcome"] == "stopped" && e["stopped_by"][0]["id"] == stopped_id)
}

/// Issue 31, dynamic tweaks: an agent asks for more than a sandbox's gates give (here a
/// longer time limit), within the bounds its operator set (`gates.tweaks`), and a person
/// approves with the CLI. A run over the gate's `max_seconds` is refused; once approved,
/// the same run passes; after the revocation it is refused again. As attackers: an ask
/// beyond the bounds is refused and nothing is filed; a tweak for `web` does not widen
/// `other`; a tweak the control plane publishes with more than the bounds (filed with the
/// requester token directly, and approved) gives only the bounds.
#[test]
fn an_agent_gets_a_longer_time_limit_only_while_a_person_grants_it_within_the_bounds() {
    let rt = runtime();
    let f = followed(&rt);
    let admin = f.admin;
    let gates = "gates: { commands: [ curl, python3 ], max_seconds: 30, network: true, tweaks: { max_seconds: 120 } }";
    let config = write_config(
        f.dir.path(),
        &format!(
            "  task: t-1\n  audit_log: audit.jsonl\n  egress: {{ admin: \"http://{admin}\", token_file: agent.token }}\n  sandboxes:\n\
             \x20   - name: web\n      policy: web.yaml\n      {gates}\n\
             \x20   - name: other\n      policy: web.yaml\n      {gates}\n",
        ),
    );
    let mut d = Driver::start(&config, "legacy");
    let listed = d.call("list_sandboxes", json!({}));
    let web = &listed["structured"]["sandboxes"][0];
    assert_eq!(web["tweaks"]["bounds"]["max_seconds"], 120, "{listed}");
    assert_eq!(web["tweaks"]["granted"], json!({}), "{listed}");
    let long = |sandbox: &str, seconds: u64| json!({"sandbox": sandbox, "command": ["python3", "-c", "print('ok')"], "timeout_seconds": seconds});
    let refused_by = |r: &Value, gate: &str| {
        r["is_error"] == true
            && r["text"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("gate `{gate}`"))
    };
    let r = d.run(long("web", 60));
    assert!(refused_by(&r, "max_seconds"), "{r}");

    // Beyond the bounds: refused before anything is filed.
    let beyond = d.call(
        "request_tweak",
        json!({"sandbox": "web", "max_seconds": 121, "ttl_seconds": 300, "reason": "a long suite"}),
    );
    assert_eq!(beyond["is_error"], true, "{beyond}");
    assert!(
        beyond["text"].as_str().unwrap().contains("gate `tweaks`")
            && beyond["text"]
                .as_str()
                .unwrap()
                .contains("tweaks.max_seconds: 120"),
        "{beyond}"
    );
    for network in [json!({"network": true}), json!({"workspace": "/tmp"})] {
        let mut args = json!({"sandbox": "web", "ttl_seconds": 300, "reason": "r"});
        args.as_object_mut()
            .unwrap()
            .extend(network.as_object().unwrap().clone());
        let r = d.call("request_tweak", args);
        assert!(refused_by(&r, "tweaks"), "{r}");
    }
    assert!(exceptions_in(admin, "pending").is_empty(), "nothing filed");

    // A person approves while the agent waits.
    let approver = std::thread::spawn(move || {
        let id = first_pending(admin);
        let (code, _, err) = cli(admin, "tok-alice", &["approve", &id]);
        assert_eq!(code, 0, "{err}");
        id
    });
    let asked = d.call(
        "request_tweak",
        json!({"sandbox": "web", "max_seconds": 60, "ttl_seconds": 300,
               "reason": "the test suite takes a minute", "wait_seconds": 60}),
    );
    let id = approver.join().unwrap();
    assert_eq!(asked["structured"]["state"], "approved", "{asked}");
    assert_eq!(asked["structured"]["id"], id.as_str(), "{asked}");
    let (_, ex) = common::control::api(
        admin,
        "GET",
        &format!("/v1/exceptions/{id}"),
        Some("tok-alice"),
        None,
    );
    assert_eq!(ex["tweak"], json!({"sandbox": "web", "max_seconds": 60}), "{ex}");
    assert_eq!(ex["hosts"], json!([]), "{ex}");

    let r = d.run(long("web", 60));
    assert_eq!(r["structured"]["stdout"], "ok\n", "the granted time limit: {r}");
    let r = d.run(long("web", 61));
    assert!(refused_by(&r, "max_seconds"), "no more than granted: {r}");
    let r = d.run(long("other", 60));
    assert!(refused_by(&r, "max_seconds"), "web's tweak widens only web: {r}");
    let listed = d.call("list_sandboxes", json!({}));
    assert_eq!(
        listed["structured"]["sandboxes"][0]["tweaks"]["granted"]["max_seconds"], 60,
        "{listed}"
    );

    let (code, _, err) = cli(admin, "tok-alice", &["revoke", &id]);
    assert_eq!(code, 0, "{err}");
    let r = d.run(long("web", 60));
    assert!(refused_by(&r, "max_seconds"), "revoked: {r}");

    // The control plane publishes more than the bounds: the run gets the bounds only.
    let (status, big) = common::control::api(
        admin,
        "POST",
        "/v1/exceptions",
        Some("tok-agent"),
        Some(
            &json!({"task_id": "t-1", "requested_hosts": [], "ttl_seconds": 300, "reason": "more",
                    "tweak": {"sandbox": "web", "max_seconds": 3600}})
            .to_string(),
        ),
    );
    assert_eq!(status, 201, "{big}");
    let big = big["id"].as_str().unwrap().to_owned();
    let (code, _, err) = cli(admin, "tok-alice", &["approve", &big]);
    assert_eq!(code, 0, "{err}");
    let r = d.run(long("web", 121));
    assert!(refused_by(&r, "max_seconds"), "beyond the bounds: {r}");
    let r = d.run(long("web", 120));
    assert_eq!(r["structured"]["stdout"], "ok\n", "up to the bounds: {r}");

    let events = tool_events(f.dir.path());
    assert!(
        events.iter().any(|e| e["tool"] == "request_tweak"
            && e["exception_id"] == id.as_str()
            && e["tweak"] == "sandbox=web max_seconds=60"
            && e["outcome"] == "requested"),
        "{events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["tool"] == "request_tweak" && e["outcome"] == "refused" && e["gate"] == "tweaks"),
        "{events:#?}"
    );
}

/// Issue 31, dynamic tweaks: a sandbox whose policy has a network the gates keep off
/// (`network: false`, `tweaks: { network: true }`) starts, and each run is refused (gate
/// `network`) until a person grants the network with a tweak; after the revocation it is
/// refused again.
#[test]
fn a_sandboxs_network_opens_only_while_a_person_grants_it() {
    let rt = runtime();
    let f = followed(&rt);
    let admin = f.admin;
    let config = write_config(
        f.dir.path(),
        &format!(
            "  task: t-1\n  audit_log: audit.jsonl\n  egress: {{ admin: \"http://{admin}\", token_file: agent.token }}\n  sandboxes:\n\
             \x20   - name: web\n      policy: web.yaml\n      gates: {{ commands: [ python3 ], max_seconds: 30, network: false, tweaks: {{ network: true }} }}\n"
        ),
    );
    let mut d = Driver::start(&config, "legacy");
    let ok = json!({"sandbox": "web", "command": ["python3", "-c", "print('ok')"]});
    let r = d.run(ok.clone());
    assert!(
        r["is_error"] == true && r["text"].as_str().unwrap().contains("gate `network`"),
        "{r}"
    );
    // An egress approval reaches no run while the sandbox's network is closed: never
    // `approved` then (the next run would be refused at gate `network`).
    let port = f.origin.port();
    let egress_ask = json!({"sandbox": "web", "hosts": ["web.test"], "ports": [port], "ttl_seconds": 300, "reason": "fetch"});
    let filed = d.call("request_egress", egress_ask.clone());
    assert_eq!(filed["structured"]["state"], "pending", "{filed}");
    let egress_id = filed["structured"]["requested_id"].as_str().unwrap().to_owned();
    let (code, _, err) = cli(admin, "tok-alice", &["approve", &egress_id]);
    assert_eq!(code, 0, "{err}");
    let closed = d.call("request_egress", egress_ask.clone());
    assert_eq!(closed["structured"]["state"], "not_applied", "{closed}");
    assert!(
        closed["structured"]["message"]
            .as_str()
            .unwrap()
            .contains("request_tweak"),
        "{closed}"
    );
    let approver = std::thread::spawn(move || {
        let id = first_pending(admin);
        let (code, _, err) = cli(admin, "tok-alice", &["approve", &id]);
        assert_eq!(code, 0, "{err}");
        id
    });
    let asked = d.call(
        "request_tweak",
        json!({"sandbox": "web", "network": true, "ttl_seconds": 300, "reason": "pip install", "wait_seconds": 60}),
    );
    let id = approver.join().unwrap();
    assert_eq!(asked["structured"]["state"], "approved", "{asked}");
    let r = d.run(ok.clone());
    assert_eq!(r["structured"]["stdout"], "ok\n", "{r}");
    let open = d.call("request_egress", egress_ask);
    assert_eq!(
        open["structured"]["state"], "approved",
        "with the network granted: {open}"
    );
    let (code, _, err) = cli(admin, "tok-alice", &["revoke", &id]);
    assert_eq!(code, 0, "{err}");
    let r = d.run(ok);
    assert!(
        r["is_error"] == true && r["text"].as_str().unwrap().contains("gate `network`"),
        "{r}"
    );
}

/// Revokes `id` with the CLI, then awaits the run's answer: it must come within a bounded
/// wait; how long after the revocation it came.
fn revoke_and_await(d: &mut Driver, admin: std::net::SocketAddr, id: &str) -> (Value, Duration) {
    let (code, _, err) = cli(admin, "tok-alice", &["revoke", id]);
    assert_eq!(code, 0, "{err}");
    let revoked_at = Instant::now();
    let r = d
        .next_within(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the run went on 20 s after the tweak it holds ({id}) was revoked"));
    (r, revoked_at.elapsed())
}

/// The run was stopped, within a bounded time, because tweak `id` ended in `state`; its
/// result says so, and so does the tool audit's close of the run.
fn assert_stopped(r: &Value, took: Duration, id: &str, state: &str, dir: &Path) {
    assert!(
        took < Duration::from_secs(3),
        "the run ended {took:?} after its tweak ended: {r}"
    );
    let stopped = &r["structured"]["stopped"];
    assert_eq!(stopped["tweaks"][0]["id"], id, "{r}");
    assert_eq!(stopped["tweaks"][0]["state"], state, "{r}");
    let message = stopped["message"].as_str().unwrap_or("");
    assert!(message.contains(state) && message.contains(id), "{r}");
    assert!(
        r["structured"]["stderr"].as_str().unwrap().contains(message),
        "said where the command's own output is read: {r}"
    );
    let events = tool_events(dir);
    let close = run_close(&events, id).unwrap_or_else(|| panic!("no close of the stopped run: {events:#?}"));
    assert_eq!(close["stopped_by"][0]["state"], state, "{close}");
}

/// A sandbox without a network, with a workspace `work` and `gates`: the followed control
/// plane's directory and the server's config.
fn offline_with(f: &Followed, gates: &str) -> PathBuf {
    sandbox_policy(f.dir.path(), "offline", "net:\n  mode: none\n");
    std::fs::create_dir_all(f.dir.path().join("work")).unwrap();
    tweak_config(f.dir.path(), f.admin, "offline", "offline.yaml", gates)
}

/// Issue 31, a revocation reaches a run already going: a run over the plain time limit,
/// which only the tweak let through, ends within about a second of a person's revocation,
/// and its result says the tweak it ran under was revoked, and which. Before, it went on to
/// its own limit (here 100 s). A run within the plain gates holds no tweak and a revocation
/// while it goes leaves it be.
#[test]
fn a_run_that_holds_a_longer_time_limit_ends_within_a_second_of_its_revocation() {
    let rt = runtime();
    let f = followed(&rt);
    let admin = f.admin;
    let config = offline_with(
        &f,
        "{ commands: [ python3 ], max_seconds: 30, workspaces: [ work ], tweaks: { max_seconds: 120 } }",
    );
    let work = f.dir.path().join("work").canonicalize().unwrap();
    let mut d = Driver::start(&config, "legacy");
    let run = |fifo: &str, then: &str, timeout: u64| {
        json!({"call": "run", "args": {"sandbox": "offline", "workspace": work, "timeout_seconds": timeout,
               "command": ["python3", "-c", signals_then(fifo, then)]}})
    };
    let longer = json!({"sandbox": "offline", "max_seconds": 120, "ttl_seconds": 300});

    let first = granted_id(&mut d, admin, longer.clone());
    let ready = signal_from_run(&work, "plain");
    d.send_only(run("plain", "time.sleep(2); print('done')", 20));
    ready
        .recv_timeout(Duration::from_secs(60))
        .expect("the plain run began");
    let (r, _) = revoke_and_await(&mut d, admin, &first);
    assert_eq!(r["structured"]["stdout"], "done\n", "a run holding no tweak: {r}");
    assert!(r["structured"]["stopped"].is_null(), "{r}");

    let id = granted_id(&mut d, admin, longer);
    let ready = signal_from_run(&work, "long");
    d.send_only(run("long", "time.sleep(100); print('finished')", 110));
    ready
        .recv_timeout(Duration::from_secs(60))
        .expect("the long run began");
    let (r, took) = revoke_and_await(&mut d, admin, &id);
    assert_stopped(&r, took, &id, "revoked", f.dir.path());
    assert_eq!(r["structured"]["timed_out"], false, "{r}");
    assert_ne!(r["structured"]["stdout"], "finished\n", "{r}");
    let events = tool_events(f.dir.path());
    assert!(
        events
            .iter()
            .any(|e| e["tool"] == "run" && e["outcome"] == "started" && e["tweaks"] == json!([id])),
        "{events:#?}"
    );
}

/// Issue 31, as an attacker: a run with the network only a tweak opened keeps a connection
/// through its proxy open, asks again and again (opening a new connection when one fails)
/// and ignores SIGTERM; a person revokes the tweak, and the run is stopped within about a
/// second, nothing of it left to ask again. Before, it went on to its time limit (30 s).
#[test]
fn a_run_with_a_revoked_network_tweak_is_stopped_though_it_keeps_asking() {
    let rt = runtime();
    let f = followed(&rt);
    let admin = f.admin;
    let port = f.origin.port();
    std::fs::create_dir_all(f.dir.path().join("work")).unwrap();
    let work = f.dir.path().join("work").canonicalize().unwrap();
    let config = tweak_config(
        f.dir.path(),
        admin,
        "web",
        "web.yaml",
        "{ commands: [ python3 ], max_seconds: 30, network: false, workspaces: [ work ], tweaks: { network: true } }",
    );
    let mut d = Driver::start(&config, "legacy");
    let id = granted_id(
        &mut d,
        admin,
        json!({"sandbox": "web", "network": true, "ttl_seconds": 300}),
    );
    // The origin's name, approved for the task as egress by a person too.
    let egress = d.call(
        "request_egress",
        json!({"sandbox": "web", "hosts": ["web.test"], "ports": [port], "ttl_seconds": 300, "reason": "fetch"}),
    );
    let egress_id = egress["structured"]["requested_id"].as_str().unwrap().to_owned();
    let (code, _, err) = cli(admin, "tok-alice", &["approve", &egress_id]);
    assert_eq!(code, 0, "{err}");
    let attack = format!(
        r#"import http.client, os, signal, time, urllib.parse
signal.signal(signal.SIGTERM, signal.SIG_IGN)
proxy = urllib.parse.urlsplit(os.environ['http_proxy'])
url = 'http://web.test:{port}/'
def connect():
    return http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=5)
c = connect()
c.request('GET', url)
r = c.getresponse()
r.read()
assert r.status == 200, r.status
with open(os.environ['SANDGATE_WORKSPACE'] + '/net', 'w') as f:
    f.write('up\n')
while True:
    try:
        c.request('GET', url)
        c.getresponse().read()
    except Exception:
        c = connect()
    time.sleep(0.05)
"#
    );
    let ready = signal_from_run(&work, "net");
    d.send_only(json!({"call": "run", "args": {"sandbox": "web", "workspace": work, "command": ["python3", "-c", attack]}}));
    if ready.recv_timeout(Duration::from_secs(60)).is_err() {
        panic!(
            "the run did not reach the origin: {:?}",
            d.next_within(Duration::from_secs(1))
        );
    }
    assert!(!f.origin.requests().is_empty());
    let (r, took) = revoke_and_await(&mut d, admin, &id);
    assert_stopped(&r, took, &id, "revoked", f.dir.path());
    // An observation window for an absence, not a synchronisation: nothing of the run asks
    // again once it is reported stopped.
    let after = f.origin.requests().len();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(f.origin.requests().len(), after, "the run's processes still ask");
}

/// Issue 31, fail closed: the control plane stops answering while a run holds a tweak; the run
/// keeps what the tweak's known expiry allows and no more, and its result says the tweak
/// expired.
#[test]
fn a_run_that_holds_a_tweak_ends_at_its_expiry_when_the_control_plane_stops_answering() {
    let rt = runtime();
    let f = followed(&rt);
    let admin = f.admin;
    let config = offline_with(
        &f,
        "{ commands: [ python3 ], max_seconds: 30, workspaces: [ work ], tweaks: { max_seconds: 120 } }",
    );
    let work = f.dir.path().join("work").canonicalize().unwrap();
    let mut d = Driver::start(&config, "legacy");
    let answer = grant(
        &mut d,
        admin,
        json!({"sandbox": "offline", "max_seconds": 120, "ttl_seconds": 300}),
        &["--ttl", "20"],
    );
    let id = answer["id"].as_str().unwrap().to_owned();
    let expires: jiff::Timestamp = answer["expires_at"].as_str().unwrap().parse().unwrap();
    let granted_at = jiff::Timestamp::now();
    let ready = signal_from_run(&work, "long");
    d.send_only(
        json!({"call": "run", "args": {"sandbox": "offline", "workspace": work, "timeout_seconds": 110,
        "command": ["python3", "-c", signals_then("long", HEARTBEAT)]}}),
    );
    if ready.recv_timeout(Duration::from_secs(60)).is_err() {
        let (_, ex) = common::control::api(
            admin,
            "GET",
            &format!("/v1/exceptions/{id}"),
            Some("tok-alice"),
            None,
        );
        panic!(
            "the long run did not begin: {:?}\n{answer}\n{ex}\ngranted at {granted_at} now {}",
            d.next_within(Duration::from_secs(1)),
            jiff::Timestamp::now()
        );
    }
    // Gone, as a control plane that no longer answers; its address still held. A killed one
    // gave its port up, and another test's server could bind it: a control plane with the
    // same tokens that knows no such tweak, or an origin answering 200 with JSON (which the
    // watch read as "nothing approved" until control.rs refused it). One run so stopped
    // 3 s early, `ended`.
    let Followed { mut control, dir, .. } = f;
    control.freeze();
    let r = d
        .next_within(Duration::from_secs(30))
        .expect("the run ended at its tweak's expiry");
    // What the expiry guarantees: the command stops at that second. Its last heartbeat (the
    // host's clock, read inside) says when it last ran; the result then takes the run's
    // teardown and its report (the proxy drained, the summary), which a loaded machine
    // slows: bounded apart, loosely. The result once had to come within 2 s, and the
    // clean-clone CI of c34f133 took 3.6.
    let late = jiff::Timestamp::now().duration_since(expires);
    assert!(
        late >= jiff::SignedDuration::ZERO && late < jiff::SignedDuration::from_secs(10),
        "ended {late:?} after the expiry: {r}"
    );
    let beat: f64 = std::fs::read_to_string(work.join("beat"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let ran_on = beat - expires.as_millisecond() as f64 / 1000.0;
    assert!(
        ran_on < 1.0,
        "the command still ran {ran_on:.3} s after the expiry: {r}"
    );
    assert_stopped(&r, Duration::ZERO, &id, "expired", dir.path());
}

/// Issue 31, more output: without a grant a run's output is cut at the gate's cap; with a
/// person's grant it gets more, never beyond `gates.tweaks` (a control plane that publishes
/// more gives only the bounds); after the revocation it is cut at the gate again.
#[test]
fn an_agent_gets_more_output_only_while_a_person_grants_it_within_the_bounds() {
    let rt = runtime();
    let f = followed(&rt);
    let admin = f.admin;
    let config = offline_with(
        &f,
        "{ commands: [ python3 ], max_seconds: 30, max_output_bytes: 4096, workspaces: [ work ], tweaks: { max_output_bytes: 65536 } }",
    );
    let work = f.dir.path().join("work").canonicalize().unwrap();
    let mut d = Driver::start(&config, "legacy");
    let shown = |d: &mut Driver| {
        let r = d.run(json!({"sandbox": "offline", "command": ["python3", "-c", "print('x' * 200000)"]}));
        let out = r["structured"]["stdout"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_owned();
        let kept = out.split('\n').next().unwrap().len();
        assert!(
            out.ends_with(&format!(
                "[sandgate: output truncated: {kept} of 200001 bytes shown]"
            )),
            "{r}"
        );
        kept
    };
    assert_eq!(shown(&mut d), 4096, "the gate's cap");
    let beyond = d.call(
        "request_tweak",
        json!({"sandbox": "offline", "max_output_bytes": 65537, "ttl_seconds": 300, "reason": "r"}),
    );
    assert!(refused_by(&beyond, "tweaks"), "{beyond}");
    assert!(exceptions_in(admin, "pending").is_empty(), "nothing filed");

    let id = granted_id(
        &mut d,
        admin,
        json!({"sandbox": "offline", "max_output_bytes": 16384, "ttl_seconds": 300}),
    );
    assert_eq!(shown(&mut d), 16384, "as granted");
    // As an attacker: a run holding the grant waits for its revocation, then prints as
    // much as the grant allowed. It is stopped, and what it printed after the revocation is
    // not handed over beyond the plain cap. (Before, all 16384 bytes came back.)
    let ready = signal_from_run(&work, "out");
    let then = "while not os.path.exists(os.environ['SANDGATE_WORKSPACE'] + '/go'): time.sleep(0.01)\n\
                print('y' * 20000, flush=True)\ntime.sleep(60)";
    d.send_only(
        json!({"call": "run", "args": {"sandbox": "offline", "workspace": work,
        "command": ["python3", "-c", signals_then("out", then)]}}),
    );
    ready
        .recv_timeout(Duration::from_secs(60))
        .expect("the run began");
    let (code, _, err) = cli(admin, "tok-alice", &["revoke", &id]);
    assert_eq!(code, 0, "{err}");
    std::fs::write(work.join("go"), "").unwrap();
    let r = d
        .next_within(Duration::from_secs(20))
        .expect("the run went on 20 s after its output tweak was revoked");
    assert!(!r["structured"]["stopped"].is_null(), "{r}");
    let kept = r["structured"]["stdout"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"));
    assert!(
        kept.split('\n').next().unwrap().len() <= 4096,
        "more than the plain cap after the revocation: {} bytes",
        kept.len()
    );
    let id = granted_id(
        &mut d,
        admin,
        json!({"sandbox": "offline", "max_output_bytes": 16384, "ttl_seconds": 300}),
    );
    let big = published(
        admin,
        json!({"sandbox": "offline", "max_output_bytes": 10_000_000}),
    );
    assert_eq!(shown(&mut d), 65536, "the bounds, not what was published");
    let listed = d.call("list_sandboxes", json!({}));
    assert_eq!(
        listed["structured"]["sandboxes"][0]["tweaks"]["granted"]["max_output_bytes"], 65536,
        "{listed}"
    );
    for id in [&id, &big] {
        let (code, _, err) = cli(admin, "tok-alice", &["revoke", id]);
        assert_eq!(code, 0, "{err}");
    }
    assert_eq!(shown(&mut d), 4096, "revoked");
}

/// Issue 31, a workspace: without a grant a run cannot name it (gate `workspaces`); with a
/// person's grant it writes there, and only there (not a sibling, not a directory a control
/// plane published beyond `gates.tweaks`); a run in it is stopped within about a second of
/// the revocation, and the next run naming it is refused. (A tweak past its expiry second
/// grants nothing: `tweaks_tests.rs`, and the run it held stops then: above.)
#[test]
fn an_agent_gets_a_workspace_only_while_a_person_grants_it_within_the_bounds() {
    let rt = runtime();
    let f = followed(&rt);
    let admin = f.admin;
    for sub in ["extra/proj", "extra/other", "elsewhere"] {
        std::fs::create_dir_all(f.dir.path().join(sub)).unwrap();
    }
    let config = offline_with(
        &f,
        "{ commands: [ python3 ], max_seconds: 30, workspaces: [ work ], tweaks: { workspaces: [ extra ] } }",
    );
    let at = |sub: &str| f.dir.path().join(sub).canonicalize().unwrap();
    let (proj, other, elsewhere) = (at("extra/proj"), at("extra/other"), at("elsewhere"));
    let mut d = Driver::start(&config, "legacy");
    let write = |ws: &Path| {
        json!({"sandbox": "offline", "workspace": ws,
               "command": ["python3", "-c", "import os; open(os.environ['SANDGATE_WORKSPACE'] + '/out.txt', 'w').write('hi')"]})
    };
    let r = d.run(write(&proj));
    assert!(refused_by(&r, "workspaces"), "{r}");
    assert!(!proj.join("out.txt").exists());
    let outside = d.call(
        "request_tweak",
        json!({"sandbox": "offline", "workspace": elsewhere, "ttl_seconds": 300, "reason": "r"}),
    );
    assert!(refused_by(&outside, "tweaks"), "{outside}");

    let id = granted_id(
        &mut d,
        admin,
        json!({"sandbox": "offline", "workspace": proj, "ttl_seconds": 300}),
    );
    let r = d.run(write(&proj));
    assert_eq!(r["structured"]["exit_code"], 0, "{r}");
    assert_eq!(std::fs::read_to_string(proj.join("out.txt")).unwrap(), "hi");
    let r = d.run(write(&other));
    assert!(refused_by(&r, "workspaces"), "only the directory granted: {r}");
    published(admin, json!({"sandbox": "offline", "workspace": elsewhere}));
    let r = d.run(write(&elsewhere));
    assert!(refused_by(&r, "workspaces"), "beyond the bounds: {r}");

    let ready = signal_from_run(&proj, "ws");
    d.send_only(
        json!({"call": "run", "args": {"sandbox": "offline", "workspace": proj,
        "command": ["python3", "-c", signals_then("ws", "time.sleep(100)")]}}),
    );
    ready
        .recv_timeout(Duration::from_secs(60))
        .expect("the run began");
    let (r, took) = revoke_and_await(&mut d, admin, &id);
    assert_stopped(&r, took, &id, "revoked", f.dir.path());
    let r = d.run(write(&proj));
    assert!(refused_by(&r, "workspaces"), "revoked: {r}");
}
