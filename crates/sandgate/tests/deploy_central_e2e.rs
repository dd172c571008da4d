//! Central mode as the Kubernetes manifests deploy it (docs/deploy.md, "Central"), run as
//! rendered: the certificates made with the commands the page gives and laid out as the
//! Secrets are mounted, a central and a node-local proxy started from the rendered policies,
//! arguments and environment, and curl through the node. Only what cannot be on loopback in
//! a test changes: fixed ports become ones the kernel picks, and the cluster DNS becomes a
//! test server answering the central Service's name.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod central;
mod common;
mod deploy_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::world::World;
use common::{ProxyProcess, curl};
use deploy_support::{find, kustomize, repo, yaml_docs};
use sandgate_testkit::dns::Zone;
use serde_json::Value;

/// The first container's arguments of a workload.
fn args_of(workload: &Value) -> Vec<String> {
    workload["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// Where the workload mounts its volume `name`, and the Secret that volume is.
fn secret_mount(workload: &Value, name: &str) -> (String, String) {
    let spec = &workload["spec"]["template"]["spec"];
    let mount = spec["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no {name} mount"));
    assert!(mount.get("subPath").is_none(), "a subPath mount is never updated");
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap();
    assert_eq!(
        volume["secret"]["defaultMode"], 0o440,
        "the key readable by the proxy's group only"
    );
    (
        mount["mountPath"].as_str().unwrap().to_owned(),
        volume["secret"]["secretName"].as_str().unwrap().to_owned(),
    )
}

/// The value of `--flag=VALUE` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    let prefix = format!("{name}=");
    args.iter()
        .find_map(|a| a.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in {args:?}"))
}

/// The commands of the page's code block that holds `marker`, continuation lines joined.
fn doc_commands(marker: &str) -> Vec<String> {
    let page = std::fs::read_to_string(repo().join("docs/deploy.md")).unwrap();
    let block = page
        .split("```")
        .find(|b| b.contains(marker))
        .unwrap_or_else(|| panic!("docs/deploy.md has no code block with {marker}"));
    block
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && *l != "sh")
        .map(str::to_owned)
        .collect()
}

/// Runs the page's `sandgate pki` commands in `dir` and lays out each Secret its `kubectl
/// create secret generic NAME --from-file=KEY=FILE` commands make as a directory of files
/// (what a Secret volume holds). Returns the Secrets' directories by name.
fn secrets_as_documented(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut secrets = Vec::new();
    for command in doc_commands("sandgate pki init") {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["sandgate", "pki", rest @ ..] => {
                let out = Command::new(env!("CARGO_BIN_EXE_sandgate"))
                    .arg("pki")
                    .args(rest)
                    .current_dir(dir)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{command}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            [
                "kubectl",
                "-n",
                "sandgate",
                "create",
                "secret",
                "generic",
                name,
                files @ ..,
            ] => {
                let to = dir.join(format!("secret-{name}"));
                std::fs::create_dir(&to).unwrap();
                for f in files {
                    let (key, file) = f
                        .strip_prefix("--from-file=")
                        .and_then(|kv| kv.split_once('='))
                        .unwrap_or_else(|| panic!("{command}: {f}"));
                    std::fs::copy(dir.join(file), to.join(key))
                        .unwrap_or_else(|e| panic!("{command}: {file}: {e}"));
                }
                secrets.push(((*name).to_owned(), to));
            }
            ["kubectl", "apply", ..] => {}
            _ => panic!("a command the test does not know: {command}"),
        }
    }
    secrets
}

/// The rendered arguments, made runnable on loopback: the policy at `policy`, the admin
/// listener on a port the kernel picks, text logs (the harness reads them), and each
/// mount path `from` replaced by the directory `to`.
fn loopback_args(args: &[String], policy: &Path, mounts: &[(&str, &Path)]) -> Vec<String> {
    args.iter()
        .filter(|a| !a.starts_with("--log-format="))
        .map(|a| {
            if a.starts_with("--policy=") {
                return format!("--policy={}", policy.display());
            }
            if a.starts_with("--admin-listen=") {
                return "--admin-listen=127.0.0.1:0".to_owned();
            }
            mounts
                .iter()
                .fold(a.clone(), |a, (from, to)| a.replace(from, to.to_str().unwrap()))
        })
        .collect()
}

/// The manifests' central mode works as rendered: through the node-local proxy, what the
/// central allows passes and is attributed to the node; what only the node allows is the
/// central's 403; a node-local proxy with a certificate the central does not list (another
/// node of the same CA) gets nothing, on record; the central's plain listener is on
/// loopback only; and everything the flags, the policy and the Service name is where the
/// Secrets are mounted and the Service points.
#[test]
fn kubernetes_central_mode_runs_as_rendered() {
    let central_docs = yaml_docs(&kustomize("central"));
    let node_docs = yaml_docs(&kustomize("node-local-chained"));
    let deployment = find(&central_docs, "Deployment", "sandgate-central");
    let daemonset = find(&node_docs, "DaemonSet", "sandgate-node-local");
    let service = find(&central_docs, "Service", "sandgate-central");

    // The node-local proxies' --upstream is the Service's name and port, which lead to the
    // central's node listener.
    let node_args = args_of(daemonset);
    let upstream = flag(&node_args, "--upstream");
    let (host, port) = upstream
        .strip_prefix("https://")
        .unwrap()
        .rsplit_once(':')
        .unwrap();
    let svc_port = &service["spec"]["ports"][0];
    assert_eq!(
        host,
        format!(
            "{}.{}.svc.cluster.local",
            service["metadata"]["name"].as_str().unwrap(),
            service["metadata"]["namespace"].as_str().unwrap()
        )
    );
    assert_eq!(port, svc_port["port"].to_string());
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let target = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == svc_port["targetPort"])
        .expect("the Service's targetPort names a port of the central");
    let policy_cm = find(&central_docs, "ConfigMap", "sandgate-central-policy");
    let policy_text = policy_cm["data"]["policy.yaml"].as_str().unwrap();
    let policy = yaml_docs(policy_text).remove(0);
    let listeners = policy["spec"]["listeners"].as_array().unwrap();
    assert_eq!(listeners.len(), 1, "one way in: {listeners:?}");
    let listener = &listeners[0];
    assert_eq!(listener["role"], "node");
    let listen: SocketAddr = listener["listen"].as_str().unwrap().parse().unwrap();
    assert_eq!(Some(u64::from(listen.port())), target["containerPort"].as_u64());

    // No plain listener (the image's PROXY_PORT; the running central below shows it);
    // the store from an optional Secret.
    let env = container["env"].as_array().unwrap();
    let var = |name: &str| env.iter().find(|e| e["name"] == name).unwrap();
    assert_eq!(var("SANDGATE_LISTEN")["value"], "");
    assert_eq!(
        var("SANDGATE_STATE")["valueFrom"]["secretKeyRef"],
        serde_json::json!({ "name": "sandgate-state", "key": "url", "optional": true })
    );

    // The Secrets, as the page says to make them, where the manifests mount them.
    let dir = tempfile::tempdir().unwrap();
    let secrets = secrets_as_documented(dir.path());
    let secret = |name: &str| {
        secrets
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d.clone())
            .unwrap_or_else(|| panic!("docs/deploy.md makes no {name} Secret"))
    };
    let (central_mount, central_secret) = secret_mount(deployment, "tls");
    let (node_mount, node_secret) = secret_mount(daemonset, "tls");
    let central_tls = secret(&central_secret);
    let node_tls = secret(&node_secret);
    for path in ["cert", "key", "client_ca"].map(|k| listener["tls"][k].as_str().unwrap()) {
        assert!(path.starts_with(&format!("{central_mount}/")), "{path}");
    }
    for f in ["--upstream-ca", "--client-cert", "--client-key"] {
        assert!(flag(&node_args, f).starts_with(&format!("{node_mount}/")), "{f}");
    }

    // A loopback world: an origin the central allows (by flag, beside the file's), and a
    // DNS server answering for it and for the central's Service name.
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("ok.test", &["127.0.0.1"])
            .with("other.test", &["127.0.0.1"])
            .with(host, &["127.0.0.1"]),
    );
    let ok = format!("ok.test:{}", origin.port());
    let other = format!("other.test:{}", origin.port());

    let central_policy = dir.path().join("central.yaml");
    let listen_loopback = "127.0.0.1:0";
    std::fs::write(
        &central_policy,
        policy_text
            .replace(&central_mount, central_tls.to_str().unwrap())
            .replace(listener["listen"].as_str().unwrap(), listen_loopback),
    )
    .unwrap();
    let mut c_args = loopback_args(&args_of(deployment), &central_policy, &[]);
    c_args.extend(
        [
            "--dns-server",
            &dns.addr().to_string(),
            "--allow-range",
            "127.0.0.0/8",
            "--allow",
            &ok,
        ]
        .map(str::to_owned),
    );
    let refs: Vec<&str> = c_args.iter().map(String::as_str).collect();
    // The image's PROXY_PORT, on a port this test holds: were SANDGATE_LISTEN not to
    // override it, the central could not bind it and would not start.
    let held = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandgate"));
    command.env("PROXY_PORT", held.local_addr().unwrap().port().to_string());
    for (name, value) in env
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
    {
        command.env(name, value);
    }
    let c = ProxyProcess::start_as_configured(command, &refs);
    let node_addr = c.listener(&["role=node"]);
    let listeners: Vec<String> = c
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(" listening ") && l.contains("role="))
        .cloned()
        .collect();
    assert!(
        listeners.len() == 1 && listeners[0].contains("role=node"),
        "the node listener is the one way in: {listeners:?}"
    );

    // The node-local proxy: base's policy, the rendered flags, its own allowlist wider than
    // the central's (other.test), the central's port as the kernel picked it.
    let node_cm = find(&node_docs, "ConfigMap", "sandgate-policy");
    let node_policy = dir.path().join("node.yaml");
    std::fs::write(&node_policy, node_cm["data"]["policy.yaml"].as_str().unwrap()).unwrap();
    let start_node = |tls: &Path| {
        let mut args = loopback_args(&node_args, &node_policy, &[(node_mount.as_str(), tls)]);
        for a in &mut args {
            if a.starts_with("--upstream=") {
                *a = format!("--upstream=https://{host}:{}", node_addr.port());
            }
        }
        args.extend(
            [
                "--dns-server",
                &dns.addr().to_string(),
                "--allow",
                &ok,
                "--allow",
                &other,
            ]
            .map(str::to_owned),
        );
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        ProxyProcess::start(&refs)
    };
    let n = start_node(&node_tls);
    let get = |proxy: &ProxyProcess, dest: &str| {
        curl(
            &format!("http://{}", proxy.addr),
            &[
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &format!("http://{dest}/"),
            ],
        )
        .1
    };
    assert_eq!(get(&n, &ok), "200", "what the central allows passes");
    assert_eq!(
        get(&n, &other),
        "403",
        "what only the node allows is the central's 403"
    );
    let node_name = policy["spec"]["nodes"][0]["name"].as_str().unwrap();
    let allowed = central::events_where(&c.audit_path, 1, |e| {
        e["event"] == "decision" && e["decision"] == "allow" && e["destination_host"] == "ok.test"
    });
    assert_eq!(allowed[0]["node"], node_name, "{allowed:?}");
    let denied = central::events_where(&c.audit_path, 1, |e| {
        e["event"] == "decision" && e["decision"] == "deny" && e["destination_host"] == "other.test"
    });
    assert_eq!(denied[0]["node"], node_name, "{denied:?}");

    // Another node of the same CA, which spec.nodes does not list.
    let out = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["pki", "issue", "--dir", "pki", "--node", "intruder"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let intruder = dir.path().join("intruder");
    std::fs::create_dir(&intruder).unwrap();
    for (key, file) in [
        ("tls.crt", "node-intruder.pem"),
        ("tls.key", "node-intruder.key"),
        ("ca.crt", "ca.pem"),
    ] {
        std::fs::copy(dir.path().join("pki").join(file), intruder.join(key)).unwrap();
    }
    let stranger = start_node(&intruder);
    assert_eq!(get(&stranger, &ok), "502", "an unlisted node gets nothing");
    let refused = central::events_where(&c.audit_path, 1, |e| e["reason_code"] == "node_unknown");
    assert!(!refused.is_empty(), "the refusal is on record");
}

/// Makes everything under `dir` readable (and its directories enterable) by anyone: the
/// central below runs as `nobody`, and `sandgate pki` writes keys for its owner only.
fn open_up(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            open_up(&path);
        } else {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
}

/// docs/deploy.md: without the sandgate-state Secret, a central whose policy has admin
/// tokens does not start, rather than keep exceptions of its own that the other replica
/// never sees. Run as the pod runs: not root, its state directory (the image's
/// STATE_DIRECTORY) not writable, as under `readOnlyRootFilesystem`.
#[test]
fn a_central_with_admin_tokens_and_no_shared_database_does_not_start() {
    use std::os::unix::fs::PermissionsExt;
    let docs = yaml_docs(&kustomize("central"));
    let deployment = find(&docs, "Deployment", "sandgate-central");
    let (mount, secret_name) = secret_mount(deployment, "tls");
    let dir = tempfile::tempdir().unwrap();
    let secrets = secrets_as_documented(dir.path());
    let tls = &secrets.iter().find(|(n, _)| *n == secret_name).unwrap().1;
    let cm = find(&docs, "ConfigMap", "sandgate-central-policy");
    let text = format!(
        "{}  admin:\n    tokens:\n      - {{ name: alice, role: approver, secret_sha256: {} }}\n",
        cm["data"]["policy.yaml"]
            .as_str()
            .unwrap()
            .replace(&mount, tls.to_str().unwrap())
            .replace("0.0.0.0:3130", "127.0.0.1:0"),
        sandgate_policy::auth::secret_hash("tok-alice")
    );
    let policy = dir.path().join("central.yaml");
    std::fs::write(&policy, text).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    open_up(dir.path());
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o555)).unwrap();

    let (mut command, _bin_dir) = common::unprivileged_sandgate();
    let args = loopback_args(&args_of(deployment), &policy, &[]);
    command
        .arg("proxy")
        .args(&args)
        .env("SANDGATE_LISTEN", "")
        .env("STATE_DIRECTORY", &state)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("a central with admin tokens and nowhere to keep exceptions started");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("exceptions.sqlite3"), "{stderr}");
}
