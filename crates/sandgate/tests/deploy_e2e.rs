//! Deployment as users run it (docs/deploy.md). The `FROM scratch` image is built with
//! podman (scripts/build-image), its file system exported, and `sandgate proxy` run from that
//! file system alone, as the image's user, then used with curl on loopback. The compose file,
//! the Kubernetes overlays and the systemd unit are checked by their own tools, and each is
//! held to what it must never allow: a sandbox with a second way out, a privileged proxy, a
//! flag the binary does not have.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    clippy::zombie_processes,
    reason = "integration tests: a failed setup step should fail loudly, and tests connect to their own loopback fixtures"
)]

mod common;
mod deploy_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::world::{World, events_of};
use common::{ProxyProcess, curl, is_root};
use deploy_support::{
    find, flag_names, is_static_elf, kustomize, output, proxy_flags, python_kustomize, real_kustomize, repo,
    run_ok, same_objects, script, tool, unit_settings, venv_bin, yaml_docs,
};
use sandgate_testkit::dns::Zone;
use serde_json::Value;

/// The image's user (deploy/container/Containerfile), which every manifest runs as too.
const IMAGE_UID: u32 = 65532;
/// Kubernetes versions the manifests are validated against: the oldest we claim, and the
/// newest kubernetes-validate knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];
/// The overlays in deploy/kubernetes, each one `kubectl apply -k` takes.
const OVERLAYS: [&str; 4] = ["node-local", "node-local-chained", "central", "sandboxes"];

/// podman with a private, throw-away storage (vfs: no overlay mounts, works anywhere).
struct Podman {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl Podman {
    fn new() -> Podman {
        let bin = tool("podman", "run ./scripts/test, which installs Debian's podman");
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{0}/graph\"\nrunroot = \"{0}/run\"\n",
            dir.path().display()
        );
        std::fs::write(dir.path().join("storage.conf"), conf).expect("storage.conf");
        Podman { dir, bin }
    }

    /// `cmd` with this storage.
    fn with<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.env("CONTAINERS_STORAGE_CONF", self.dir.path().join("storage.conf"))
    }

    fn podman(&self, args: &[&str]) -> String {
        run_ok(self.with(Command::new(&self.bin).args(args)))
    }
}

#[test]
fn the_image_runs_from_its_own_file_system_alone_as_its_user() {
    let podman = Podman::new();
    let tag = "localhost/sandgate:deploy-test";
    // No cargo build here while other tests run: it would relink the binary they run (one
    // once found it missing). scripts/test hands over what scripts/build-static made, kept
    // aside; a static binary under test will do too; else (a plain `cargo nextest` of a
    // dynamic build) the script builds one (scripts/build-static), under another directory.
    let under_test = Path::new(env!("CARGO_BIN_EXE_sandgate"));
    let profile_release = || match std::env::var("SANDGATE_STATIC_PROFILE") {
        Ok(profile) => profile == "release",
        Err(_) => true,
    };
    let mut build = script("build-image");
    let release = match std::env::var_os("SANDGATE_TEST_IMAGE_BINARY") {
        Some(kept) => {
            build.env("SANDGATE_BINARY", kept);
            profile_release()
        }
        None if is_static_elf(under_test) => {
            build.env("SANDGATE_BINARY", under_test);
            under_test.parent().and_then(Path::file_name) == Some("release".as_ref())
        }
        None => profile_release(),
    };
    let built = run_ok(podman.with(build.arg(tag)));
    assert_eq!(built.trim(), tag);

    // The image's configuration: a numeric non-root user, `sandgate proxy` as entry point,
    // configured by the environment.
    let inspect: Value = serde_json::from_str(&podman.podman(&["image", "inspect", tag])).unwrap();
    let image = &inspect[0];
    let config = &image["Config"];
    assert_eq!(config["User"], format!("{IMAGE_UID}:{IMAGE_UID}"));
    assert_eq!(config["Entrypoint"], serde_json::json!(["/sandgate", "proxy"]));
    let env: Vec<&str> = config["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(env.contains(&"PROXY_PORT=3128"), "{env:?}");
    // The health check: `sandgate health` in exec form (there is no shell), asking the
    // loopback admin listener the environment opens; kept only in a Docker-format image.
    assert!(env.contains(&"SANDGATE_ADMIN_LISTEN=127.0.0.1:9090"), "{env:?}");
    assert_eq!(
        image["Healthcheck"]["Test"],
        serde_json::json!(["CMD", "/sandgate", "health"]),
        "{image}"
    );
    let size = image["Size"].as_u64().unwrap();
    println!("image size: {size} bytes");
    // The release image stays small; scripts/test builds the binary unoptimised
    // (SANDGATE_STATIC_PROFILE=static-test, three times faster to build and three times the
    // size), and checks below that the image is that binary and nothing more.
    if release {
        assert!(size < 32 << 20, "the image grew to {size} bytes");
    }

    // Its file system, exported from a created (never started) container.
    let id = podman.podman(&["create", tag]);
    let export = tempfile::tempdir().unwrap();
    // Traversable by the image's user, who runs the proxy from it.
    std::fs::set_permissions(export.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let tar = export.path().join("rootfs.tar");
    podman.podman(&["export", "--output", tar.to_str().unwrap(), id.trim()]);
    podman.podman(&["rm", id.trim()]);
    let rootfs = export.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    run_ok(Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(&rootfs));
    // The binary is the image: what else it holds (two empty directories, completions and
    // man pages, the layers' metadata) stays under 1 MiB, whichever profile built the binary.
    let binary = std::fs::metadata(rootfs.join("sandgate")).unwrap().len();
    assert!(
        size.saturating_sub(binary) < 1 << 20,
        "the image holds {} bytes besides its {binary}-byte binary",
        size.saturating_sub(binary)
    );
    std::fs::remove_file(&tar).unwrap();
    assert_rootfs_is_the_binary_and_two_directories(&rootfs);

    // `sandgate proxy` from that file system and nothing else: no /etc, /dev or /proc, no
    // shell, no libraries; the environment is the image's own plus the allowlist.
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("denied.test", &["127.0.0.1"]),
    );
    let allowed = format!("allowed.test:{}", origin.port());
    let mut cmd = if is_root() {
        let mut c = Command::new(tool("setpriv", "run ./scripts/test (util-linux)"));
        c.arg(format!("--reuid={IMAGE_UID}"))
            .arg(format!("--regid={IMAGE_UID}"))
            .args(["--clear-groups", "--"])
            .arg(tool("bwrap", "run ./scripts/test (bubblewrap)"));
        c
    } else {
        Command::new(tool("bwrap", "run ./scripts/test (bubblewrap)"))
    };
    let log_dir = rootfs.join("var/log/sandgate");
    cmd.arg("--ro-bind").arg(&rootfs).arg("/");
    cmd.arg("--bind").arg(&log_dir).arg("/var/log/sandgate");
    cmd.args(["--die-with-parent", "--chdir", "/", "--clearenv"]);
    for kv in &env {
        let (k, v) = kv.split_once('=').unwrap();
        cmd.args(["--setenv", k, v]);
    }
    cmd.args([
        "--setenv",
        "PROXY_ALLOWLIST",
        &allowed,
        "--setenv",
        "SANDGATE_LOG",
        "info",
    ]);
    cmd.args(["--", "/sandgate"]);
    let dns_addr = dns.addr().to_string();
    let mut proxy = ProxyProcess::start_with_audit(
        cmd,
        Some(PathBuf::from("/var/log/sandgate/audit.jsonl")),
        &[
            "--dns-server",
            &dns_addr,
            "--allow-range",
            "127.0.0.0/8",
            "--admin-listen",
            "127.0.0.1:0",
        ],
    );
    proxy.audit_path = log_dir.join("audit.jsonl");

    let (code, body, err) = curl(&proxy.url(), &["-i", &format!("http://{allowed}/hello")]);
    assert_eq!(code, 0, "{err}");
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    let denied = format!("http://denied.test:{}/", origin.port());
    let (_, body, _) = curl(&proxy.url(), &["-i", &denied]);
    assert!(body.starts_with("HTTP/1.1 403"), "{body}");
    let events = proxy.audit_events(3);
    let decisions = events_of(&events, "decision");
    assert!(
        decisions
            .iter()
            .any(|e| e["decision"] == "allow" && e["destination_host"] == "allowed.test"),
        "{events:?}"
    );
    assert!(
        decisions
            .iter()
            .any(|e| e["decision"] == "deny" && e["destination_host"] == "denied.test"),
        "{events:?}"
    );
    assert_eq!(origin.connections(), 1, "the denied request reached the origin");

    // The probes' paths on the admin listener (no exceptions API here).
    let admin = admin_addr(&proxy);
    assert_eq!(http_code(&format!("http://{admin}/metrics")), "200");
    assert_eq!(http_code(&format!("http://{admin}/healthz")), "200");
    assert_eq!(http_code(&format!("http://{admin}/readyz")), "200");
    // The image's health check as the engine runs it: its own binary, from its file system
    // alone, with its environment (SANDGATE_ADMIN points it at the port this proxy took).
    let mut check = Command::new(tool("bwrap", "run ./scripts/test (bubblewrap)"));
    check
        .arg("--ro-bind")
        .arg(&rootfs)
        .arg("/")
        .args(["--die-with-parent", "--chdir", "/", "--clearenv"]);
    for kv in &env {
        let (k, v) = kv.split_once('=').unwrap();
        check.args(["--setenv", k, v]);
    }
    let health = check
        .args(["--setenv", "SANDGATE_ADMIN", &format!("http://{admin}")])
        .args(["--", "/sandgate", "health"])
        .output()
        .unwrap();
    assert!(
        health.status.success(),
        "{}",
        String::from_utf8_lossy(&health.stderr)
    );

    // The proxy runs as the image's user with no capabilities and cannot gain any.
    let (pid, status) = proxy_status(proxy.child.id());
    let line = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_default()
            .to_owned()
    };
    let uid = if is_root() { IMAGE_UID } else { current_uid() };
    assert_eq!(
        line("Uid:"),
        format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}"),
        "{status}"
    );
    assert_eq!(line("CapEff:"), "CapEff:\t0000000000000000", "{status}");
    assert_eq!(line("NoNewPrivs:"), "NoNewPrivs:\t1", "{status}");
    // SIGTERM to the proxy (bwrap passes no signal on): a clean stop, and bwrap exits with it.
    run_ok(Command::new("kill").args(["-TERM", &pid.to_string()]));
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = proxy.child.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "the proxy did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit}");
}

/// The exported file system holds the static binary, the two writable directories and the
/// binary's completions and man pages, and nothing else: no shell, no second binary, no
/// library.
fn assert_rootfs_is_the_binary_and_two_directories(rootfs: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut entries = Vec::new();
    let mut stack = vec![rootfs.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path.clone());
            }
            let rel = path.strip_prefix(rootfs).unwrap().display().to_string();
            entries.push((rel, meta));
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    // The man pages: one per command the binary lists (`sandgate man` made them at build).
    let pages: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| n.starts_with("usr/share/man/man1/"))
        .collect();
    assert!(
        pages.contains(&"usr/share/man/man1/sandgate.1")
            && pages.contains(&"usr/share/man/man1/sandgate-proxy.1")
            && pages.len() >= 20,
        "{pages:?}"
    );
    let others: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !n.starts_with("usr/share/man/man1/"))
        .collect();
    assert_eq!(
        others,
        [
            "sandgate",
            "usr",
            "usr/share",
            "usr/share/bash-completion",
            "usr/share/bash-completion/completions",
            "usr/share/bash-completion/completions/sandgate",
            "usr/share/fish",
            "usr/share/fish/vendor_completions.d",
            "usr/share/fish/vendor_completions.d/sandgate.fish",
            "usr/share/man",
            "usr/share/man/man1",
            "usr/share/zsh",
            "usr/share/zsh/vendor-completions",
            "usr/share/zsh/vendor-completions/_sandgate",
            "var",
            "var/lib",
            "var/lib/sandgate",
            "var/log",
            "var/log/sandgate"
        ],
        "the image holds more than the proxy"
    );
    // What the image installs is what its binary makes.
    for (shell, file) in [
        ("bash", "usr/share/bash-completion/completions/sandgate"),
        ("zsh", "usr/share/zsh/vendor-completions/_sandgate"),
        ("fish", "usr/share/fish/vendor_completions.d/sandgate.fish"),
    ] {
        let made = run_ok(Command::new(rootfs.join("sandgate")).args(["completions", shell]));
        assert_eq!(
            std::fs::read_to_string(rootfs.join(file)).unwrap(),
            made,
            "{file}"
        );
    }
    let owned_by_root = is_root();
    for (name, meta) in &entries {
        let mode = meta.permissions().mode() & 0o7777;
        if name == "var/lib/sandgate" || name == "var/log/sandgate" {
            assert_eq!(mode, 0o700, "{name}");
            if owned_by_root {
                assert_eq!((meta.uid(), meta.gid()), (IMAGE_UID, IMAGE_UID), "{name}");
            }
        } else {
            // The binary and the parents: the proxy's user can neither change nor add to them.
            assert_eq!(mode & 0o022, 0, "{name} is writable by others: {mode:o}");
            if owned_by_root {
                assert_eq!(meta.uid(), 0, "{name}");
            }
        }
    }
    assert!(
        is_static_elf(&rootfs.join("sandgate")),
        "the image's binary is dynamically linked"
    );
}

/// The status code of a direct GET of `url`.
fn http_code(url: &str) -> String {
    run_ok(Command::new("curl").args([
        "-sS",
        "--max-time",
        "10",
        "--noproxy",
        "*",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        url,
    ]))
}

/// The admin listener's address, from the start-up log.
fn admin_addr(proxy: &ProxyProcess) -> String {
    let line = proxy
        .log_line("admin listening")
        .expect("the admin listener's log line");
    line.split("addr=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// The pid and /proc/PID/status of the proxy: the child bwrap (`pid`) runs it as.
fn proxy_status(pid: u32) -> (u32, String) {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|p| {
            Some((
                p.parse().ok()?,
                std::fs::read_to_string(format!("/proc/{p}/status")).ok()?,
            ))
        })
        .find(|(_, s): &(u32, String)| s.starts_with("Name:\tsandgate"))
        .unwrap_or_else(|| panic!("no sandgate process under {pid}: {children:?}"))
}

fn current_uid() -> u32 {
    run_ok(Command::new("id").arg("-u")).trim().parse().unwrap()
}

/// A ConfigMap mounted as a directory is a symlink farm the kubelet swaps atomically
/// (`policy.yaml -> ..data/policy.yaml`, `..data -> ..TIMESTAMP`); the proxy must pick the
/// new file up without a restart.
#[test]
fn a_policy_mounted_from_a_configmap_reloads_when_the_kubelet_swaps_it() {
    use std::os::unix::fs::symlink;
    let w = World::new();
    let origin = w.origin();
    let dns = w.dns(
        Zone::new()
            .with("a.test", &["127.0.0.1"])
            .with("b.test", &["127.0.0.1"]),
    );
    let dir = tempfile::tempdir().unwrap();
    let version = |n: u32, host: &str| {
        let ts = dir.path().join(format!("..2026_11_23_00_00_0{n}.00000000{n}"));
        std::fs::create_dir(&ts).unwrap();
        let doc = common::world::policy_doc(&format!(
            "  network:\n    allowlist: [ \"{host}:{}\" ]\n",
            origin.port()
        ));
        std::fs::write(ts.join("policy.yaml"), doc).unwrap();
        ts
    };
    let first = version(1, "a.test");
    symlink(first.file_name().unwrap(), dir.path().join("..data")).unwrap();
    symlink("..data/policy.yaml", dir.path().join("policy.yaml")).unwrap();
    let policy = dir.path().join("policy.yaml");
    let dns_addr = dns.addr().to_string();
    let proxy = ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--policy",
        policy.to_str().unwrap(),
    ]);
    let status =
        |host: &str| common::control::get_status(proxy.addr, &format!("http://{host}:{}/", origin.port()));
    assert_eq!(status("a.test"), "200");
    assert_eq!(status("b.test"), "403");

    // The kubelet's update: a new timestamped directory, `..data_tmp` pointing at it, renamed
    // over `..data` in one step, then the old directory removed.
    let second = version(2, "b.test");
    symlink(second.file_name().unwrap(), dir.path().join("..data_tmp")).unwrap();
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
    std::fs::remove_dir_all(&first).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while status("b.test") != "200" {
        assert!(Instant::now() < deadline, "the swapped policy was not picked up");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(status("a.test"), "403");
    let events = proxy.audit_events(1);
    assert!(
        events_of(&events, "policy_reload")
            .iter()
            .any(|e| e["outcome"] == "applied"),
        "{events:?}"
    );
}

#[test]
fn the_compose_file_validates_and_leaves_the_sandbox_one_way_out() {
    let file = repo().join("deploy/compose/compose.yaml");
    // The compose specification's JSON schema (Debian's docker-compose; it reads the file and
    // contacts no daemon), then podman-compose's own reading, which the assertions use.
    let schema = tool(
        "docker-compose",
        "run ./scripts/test, which installs Debian's docker-compose",
    );
    run_ok(
        Command::new(schema)
            .arg("-f")
            .arg(&file)
            .args(["config", "-q"])
            .env_remove("PROXY_ALLOWLIST"),
    );
    let config = run_ok(
        Command::new(venv_bin("podman-compose"))
            .arg("-f")
            .arg(&file)
            .arg("config")
            .env_remove("PROXY_ALLOWLIST"),
    );
    let doc = &yaml_docs(&config)[0];
    let (proxy, sandbox) = (&doc["services"]["proxy"], &doc["services"]["sandbox"]);

    // The sandbox: on the internal network only, nothing published, nothing shared.
    assert_eq!(doc["networks"]["sandbox"]["internal"], true);
    assert_eq!(sandbox["networks"], serde_json::json!(["sandbox"]));
    for key in [
        "ports",
        "network_mode",
        "extra_hosts",
        "external_links",
        "volumes",
        "privileged",
        "cap_add",
        "pid",
        "ipc",
    ] {
        assert!(sandbox.get(key).is_none(), "the sandbox has {key}: {sandbox}");
    }
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        assert_eq!(sandbox["environment"][var], "http://proxy:3128", "{var}");
    }
    // No DNS of its own: the engine's DNS server still names `proxy`, and forwards every other
    // name to the sandbox's own loopback, where nothing answers (CVE-2024-29018: Docker
    // before 26.0.0 and 25.0.4 forwarded them from internal networks through the host).
    assert_eq!(sandbox["dns"], serde_json::json!(["127.0.0.1"]), "{sandbox}");
    // It starts once the proxy's health check passes.
    assert_eq!(
        sandbox["depends_on"]["proxy"]["condition"], "service_healthy",
        "{sandbox}"
    );

    // The proxy: on both networks, nothing published, no privileges, the audit on a volume.
    let mut nets: Vec<&str> = proxy["networks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    nets.sort();
    assert_eq!(nets, ["egress", "sandbox"]);
    assert!(doc["networks"]["egress"]["internal"] != true);
    assert!(
        proxy.get("ports").is_none() && proxy.get("privileged").is_none() && proxy.get("cap_add").is_none()
    );
    assert_eq!(proxy["cap_drop"], serde_json::json!(["ALL"]));
    assert_eq!(proxy["read_only"], true);
    assert_eq!(proxy["environment"]["PROXY_PORT"], "3128");
    assert_eq!(
        proxy["environment"]["PROXY_ALLOWLIST"], "",
        "an unset allowlist must stay empty (deny all)"
    );
    let command: Vec<&str> = proxy["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let audit = command
        .iter()
        .position(|a| *a == "--audit-log")
        .map(|i| command[i + 1]);
    assert_eq!(audit, Some("/var/log/sandgate/audit.jsonl"));
    assert!(proxy["volumes"].as_array().unwrap().iter().any(|v| {
        v.as_str()
            .is_some_and(|s| s.starts_with("audit:/var/log/sandgate"))
    }));
    assert_real_flags("compose.yaml", &command);
    // The health check: `sandgate health` (exec form: the image has no shell), asking the
    // admin listener the environment opens on the container's loopback.
    assert_eq!(
        proxy["healthcheck"]["test"],
        serde_json::json!(["CMD", "/sandgate", "health"])
    );
    assert_eq!(proxy["environment"]["SANDGATE_ADMIN_LISTEN"], "127.0.0.1:9090");
    assert_real_env(
        "compose.yaml",
        proxy["environment"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str),
    );
}

#[test]
fn kubernetes_overlays_validate_and_sandboxes_reach_only_the_node_local_proxy() {
    let validate = venv_bin("kubernetes-validate");
    let dir = tempfile::tempdir().unwrap();
    let mut rendered = Vec::new();
    for overlay in OVERLAYS {
        let text = kustomize(overlay);
        let file = dir.path().join(format!("{overlay}.yaml"));
        std::fs::write(&file, &text).unwrap();
        rendered.push((overlay, file, yaml_docs(&text)));
    }
    let example = repo().join("deploy/kubernetes/sandboxes/example-pod.yaml");
    for version in KUBERNETES_VERSIONS {
        let mut cmd = Command::new(&validate);
        cmd.args(["--strict", "--quiet", "--kubernetes-version", version]);
        cmd.args(rendered.iter().map(|(_, f, _)| f)).arg(&example);
        run_ok(&mut cmd);
    }
    let docs = |name: &str| &rendered.iter().find(|(o, _, _)| *o == name).unwrap().2;

    // Every overlay that makes the proxies' namespace makes the same one: applying one
    // again must not change what another needs (node-local's hostPort and Pod Security).
    let namespaces: Vec<(&str, &Value)> = rendered
        .iter()
        .filter_map(|(o, _, d)| {
            d.iter()
                .find(|x| x["kind"] == "Namespace" && x["metadata"]["name"] == "sandgate")
                .map(|n| (*o, n))
        })
        .collect();
    assert!(namespaces.len() >= 3, "{namespaces:?}");
    for (overlay, ns) in &namespaces {
        assert_eq!(*ns, namespaces[0].1, "{overlay} and {} differ", namespaces[0].0);
    }

    // The sandbox namespace's policy: every pod, no way in, one way out.
    let np = find(docs("sandboxes"), "NetworkPolicy", "egress-only-through-sandgate");
    assert_eq!(np["metadata"]["namespace"], "sandboxes");
    assert_eq!(
        np["spec"]["podSelector"],
        serde_json::json!({}),
        "a pod could opt out by its labels"
    );
    assert_eq!(
        np["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    assert!(np["spec"]["ingress"].as_array().is_none_or(Vec::is_empty));
    let egress = np["spec"]["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 1, "more than one way out: {egress:?}");
    let peers = egress[0]["to"]
        .as_array()
        .expect("an egress rule without `to` allows everywhere");
    assert_eq!(peers.len(), 1, "{peers:?}");
    assert!(peers[0].get("ipBlock").is_none());
    assert_eq!(
        egress[0]["ports"],
        serde_json::json!([{ "protocol": "TCP", "port": 3128 }])
    );

    // ...and that one way selects exactly the node-local proxies, on the port they serve.
    let ds = find(docs("node-local"), "DaemonSet", "sandgate-node-local");
    assert_eq!(
        peers[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        ds["metadata"]["namespace"]
    );
    let selects = peers[0]["podSelector"]["matchLabels"]
        .as_object()
        .expect("a pod selector");
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    assert!(
        selects.iter().all(|(k, v)| &labels[k] == v),
        "{selects:?} does not select the proxies"
    );
    assert_eq!(
        selects.get("app.kubernetes.io/component"),
        Some(&Value::from("node-local")),
        "selects more than the node-local proxies"
    );
    for doc in docs("central") {
        let other = &doc["spec"]["template"]["metadata"]["labels"];
        assert!(
            !selects.iter().all(|(k, v)| &other[k] == v),
            "the sandboxes' way out also reaches {}",
            doc["metadata"]["name"]
        );
    }
    let port = &ds["spec"]["template"]["spec"]["containers"][0]["ports"][0];
    assert_eq!(
        (&port["name"], &port["containerPort"], &port["hostPort"]),
        (&"proxy".into(), &3128.into(), &3128.into())
    );

    // The example sandbox pod lives where that policy applies and finds the proxy without DNS.
    let pod = &yaml_docs(&std::fs::read_to_string(&example).unwrap())[0];
    assert_eq!(pod["metadata"]["namespace"], np["metadata"]["namespace"]);
    let env = pod["spec"]["containers"][0]["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|e| e["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP")
    );
    assert!(
        env.iter()
            .any(|e| e["name"] == "HTTPS_PROXY" && e["value"] == "http://$(NODE_IP):3128")
    );

    // Chained: the node-local proxies keep no service links (the central is reached by its
    // Service's name over mutual TLS: deploy_central_e2e runs it).
    let chained = find(docs("node-local-chained"), "DaemonSet", "sandgate-node-local");
    assert_eq!(chained["spec"]["template"]["spec"]["enableServiceLinks"], false);
}

#[test]
fn kubernetes_workloads_run_unprivileged_and_probe_the_admin_listener() {
    for overlay in ["node-local", "node-local-chained", "central"] {
        let docs = yaml_docs(&kustomize(overlay));
        let workloads: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"] == "DaemonSet" || d["kind"] == "Deployment")
            .collect();
        assert_eq!(workloads.len(), 1, "{overlay}");
        let w = workloads[0];
        let pod = &w["spec"]["template"];
        let spec = &pod["spec"];
        assert_eq!(spec["automountServiceAccountToken"], false, "{overlay}");
        assert!(
            spec.get("hostNetwork").is_none() && spec.get("hostPID").is_none(),
            "{overlay}"
        );
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
        assert_eq!(spec["securityContext"]["runAsUser"], IMAGE_UID);
        assert_eq!(
            spec["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let c = &spec["containers"][0];
        assert_eq!(
            c["image"], "localhost/sandgate:0.1.0",
            "{overlay}: kustomize's images did not apply"
        );
        let sc = &c["securityContext"];
        assert_eq!(
            (&sc["allowPrivilegeEscalation"], &sc["readOnlyRootFilesystem"]),
            (&false.into(), &true.into())
        );
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
        assert!(sc.get("privileged").is_none() && sc["capabilities"].get("add").is_none());
        assert!(
            c["resources"]["requests"]["cpu"].is_string() && c["resources"]["requests"]["memory"].is_string()
        );
        assert!(
            c["resources"]["limits"]["memory"].is_string(),
            "{overlay}: no memory limit"
        );

        // Probes and Prometheus on the admin listener the arguments open.
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_real_flags(overlay, &args);
        assert!(args.contains(&"--admin-listen=0.0.0.0:9090"), "{overlay}");
        // Off loopback on purpose: the argument names the NetworkPolicy that keeps others
        // off it (and so silences the proxy's warning), and that policy is real: it selects
        // this pod and admits the admin port.
        let guard = args
            .iter()
            .find_map(|a| a.strip_prefix("--admin-guarded-by=NetworkPolicy "))
            .unwrap_or_else(|| panic!("{overlay}: no --admin-guarded-by=NetworkPolicy NAME: {args:?}"));
        let netpol = find(&docs, "NetworkPolicy", guard);
        let labels = &pod["metadata"]["labels"];
        let selects = netpol["spec"]["podSelector"]["matchLabels"]
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| &labels[k] == v);
        assert!(selects, "{overlay}: {guard} does not select the pod");
        let admits_admin = netpol["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|rule| rule["ports"].as_array().cloned().unwrap_or_default())
            .any(|p| p["port"] == 9090);
        assert!(admits_admin, "{overlay}: {guard} says nothing of port 9090");
        let admin_port = c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "admin")
            .unwrap();
        assert_eq!(admin_port["containerPort"], 9090);
        for (probe, path) in [
            ("startupProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
            ("livenessProbe", "/healthz"),
        ] {
            assert_eq!(
                c[probe]["httpGet"],
                serde_json::json!({ "path": path, "port": "admin" }),
                "{overlay} {probe}"
            );
        }
        let ann = &pod["metadata"]["annotations"];
        assert_eq!(
            (
                &ann["prometheus.io/scrape"],
                &ann["prometheus.io/port"],
                &ann["prometheus.io/path"]
            ),
            (&"true".into(), &"9090".into(), &"/metrics".into())
        );

        // The policy: a ConfigMap mounted as a directory (a subPath mount never updates), read
        // from where it is mounted.
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "policy")
            .unwrap();
        assert!(
            mount.get("subPath").is_none(),
            "{overlay}: a subPath mount is never updated"
        );
        let policy_arg = format!("--policy={}/policy.yaml", mount["mountPath"].as_str().unwrap());
        assert!(args.contains(&policy_arg.as_str()), "{overlay}: {args:?}");
        let volume = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "policy")
            .unwrap();
        let cm = find(&docs, "ConfigMap", volume["configMap"]["name"].as_str().unwrap());
        let policy = cm["data"]["policy.yaml"].as_str().unwrap();
        if let Some(vars) = c["env"].as_array() {
            assert_real_env(overlay, vars.iter().map(|v| v["name"].as_str().unwrap()));
        }
        // The central's policy reads its TLS files, which only its Secret has:
        // deploy_central_e2e starts a central from it, with certificates where they would be.
        if overlay == "central" {
            assert!(policy.contains("role: node"));
            continue;
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), policy).unwrap();
        run_ok(
            Command::new(env!("CARGO_BIN_EXE_sandgate"))
                .arg("check-config")
                .arg(file.path()),
        );
    }
    let docs = yaml_docs(&kustomize("central"));
    let deployment = find(&docs, "Deployment", "sandgate-central");
    let pdb = find(&docs, "PodDisruptionBudget", "sandgate-central");
    assert_eq!(pdb["spec"]["selector"], deployment["spec"]["selector"]);
    assert!(pdb["spec"]["minAvailable"].as_u64().unwrap() < deployment["spec"]["replicas"].as_u64().unwrap());
    let service = find(&docs, "Service", "sandgate-central");
    assert_eq!(
        &service["spec"]["selector"],
        &deployment["spec"]["selector"]["matchLabels"]
    );
}

/// kustomize.py, which renders the overlays where there is no kubectl, renders what kubectl
/// renders: its fixture (every feature it implements, in combinations) against kubectl's
/// output stored beside it, everywhere; and, where kubectl exists, the fixture and every
/// overlay against kubectl itself.
#[test]
fn the_fallback_kustomize_renders_what_kubectl_renders() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/deploy_support/kustomize_fixture");
    let expected = yaml_docs(&std::fs::read_to_string(fixture.join("expected.yaml")).unwrap());
    let rendered = yaml_docs(&run_ok(python_kustomize().arg(&fixture)));
    if let Err(diff) = same_objects(
        ("kustomize.py", &rendered),
        ("kubectl (kustomize_fixture/expected.yaml)", &expected),
    ) {
        panic!(
            "kustomize.py renders {} unlike kubectl:\n{diff}",
            fixture.display()
        );
    }

    let Some(mut real) = real_kustomize() else {
        eprintln!(
            "no kubectl or kustomize on PATH (or SANDGATE_TEST_NO_KUBECTL is set): kustomize.py was \
             held to kubectl's stored rendering of its fixture, not to kubectl itself"
        );
        return;
    };
    let kubectl = yaml_docs(&run_ok(real.arg(&fixture)));
    if let Err(diff) = same_objects(("kubectl", &kubectl), ("expected.yaml", &expected)) {
        panic!(
            "{}/expected.yaml is stale: regenerate it with `kubectl kustomize` (its README.md):\n{diff}",
            fixture.display()
        );
    }
    for overlay in OVERLAYS {
        let dir = repo().join("deploy/kubernetes").join(overlay);
        let theirs = yaml_docs(&run_ok(real_kustomize().unwrap().arg(&dir)));
        let ours = yaml_docs(&run_ok(python_kustomize().arg(&dir)));
        assert!(!theirs.is_empty(), "{overlay}: kubectl rendered nothing");
        if let Err(diff) = same_objects(("kustomize.py", &ours), ("kubectl", &theirs)) {
            panic!(
                "deploy/kubernetes/{overlay}: kustomize.py renders it unlike kubectl, so machines \
                 without kubectl would test other manifests; fix tests/deploy_support/kustomize.py:\n{diff}"
            );
        }
    }
}

/// kustomize.py fails, naming what it lacks, on every kustomization field, option, patch or
/// YAML form it does not implement exactly: it can never render something else quietly.
#[test]
fn the_fallback_kustomize_refuses_what_it_does_not_implement() {
    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: { name: p, namespace: ns }\n\
                       spec: { containers: [{ name: c, image: \"app:1\" }] }\n";
    let patch = |ops: &str| {
        format!("resources: [pod.yaml]\npatches:\n  - target: {{ kind: Pod, name: p }}\n    patch: |\n{ops}")
    };
    let cases: Vec<(&str, String, &str, &str)> = vec![
        ("namePrefix", "resources: [pod.yaml]\nnamePrefix: x-\n".into(), POD, "namePrefix: not implemented"),
        ("namespace", "resources: [pod.yaml]\nnamespace: other\n".into(), POD, "namespace: not implemented"),
        (
            "a hashed ConfigMap name",
            "configMapGenerator: [{ name: c, files: [pod.yaml] }]\n".into(),
            POD,
            "options.disableNameSuffixHash: true is required",
        ),
        (
            "configMapGenerator literals",
            "configMapGenerator: [{ name: c, literals: [a=b], files: [], options: { disableNameSuffixHash: true } }]\n"
                .into(),
            POD,
            "literals: not implemented",
        ),
        (
            "a strategic merge patch",
            patch("      metadata: { labels: { a: b } }\n"),
            POD,
            "not a strategic merge patch",
        ),
        (
            "a move operation",
            patch("      - { op: move, from: /spec, path: /x }\n"),
            POD,
            "op 'move' is not implemented",
        ),
        (
            "a replace of a missing key",
            patch("      - { op: replace, path: /metadata/labels, value: {} }\n"),
            POD,
            "no such key (kustomize would add it",
        ),
        (
            "an index past the end",
            patch("      - { op: add, path: /spec/containers/2, value: {} }\n"),
            POD,
            "index 2 is out of range",
        ),
        (
            "a target matching nothing",
            "resources: [pod.yaml]\npatches:\n  - target: { kind: Pod, name: q }\n    patch: '[]'\n".into(),
            POD,
            "matches nothing",
        ),
        (
            "a regular expression in a target",
            "resources: [pod.yaml]\npatches:\n  - target: { kind: Pod, name: \"p.*\" }\n    patch: '[]'\n".into(),
            POD,
            "only letters, digits and '-'",
        ),
        (
            "a patch from a file",
            "resources: [pod.yaml]\npatches:\n  - path: pod.yaml\n".into(),
            POD,
            "path: not implemented",
        ),
        (
            "labels on selectors",
            "resources: [pod.yaml]\nlabels: [{ pairs: { a: b }, includeSelectors: true }]\n".into(),
            POD,
            "includeSelectors: only false",
        ),
        (
            "labels on templates",
            "resources: [pod.yaml]\nlabels: [{ pairs: { a: b }, includeTemplates: true }]\n".into(),
            POD,
            "includeTemplates: only false",
        ),
        (
            "an image digest",
            "resources: [pod.yaml]\nimages: [{ name: app, digest: \"sha256:00\" }]\n".into(),
            POD,
            "digest: not implemented",
        ),
        (
            "an image by digest",
            "resources: [pod.yaml]\nimages: [{ name: app, newTag: \"2\" }]\n".into(),
            "apiVersion: v1\nkind: Pod\nmetadata: { name: p }\nspec: { containers: [{ name: c, image: \"app@sha256:00\" }] }\n",
            "matching it against 'app' is not implemented",
        ),
        (
            "an unquoted tag YAML reads as a number",
            "resources: [pod.yaml]\nimages: [{ name: app, newTag: 1.10 }]\n".into(),
            POD,
            "newTag: expected a string",
        ),
        (
            "a YAML 1.1 boolean",
            "resources: [pod.yaml]\n".into(),
            "apiVersion: v1\nkind: Pod\nmetadata: { name: p, labels: { enabled: on } }\n",
            "'on' means different things in YAML 1.1 and YAML 1.2",
        ),
        (
            "a duplicate key",
            "resources: [pod.yaml]\n".into(),
            "apiVersion: v1\nkind: Pod\nmetadata: { name: p }\nmetadata: { name: q }\n",
            "duplicate key 'metadata'",
        ),
        (
            "a YAML alias",
            "resources: [pod.yaml]\n".into(),
            "apiVersion: v1\nkind: Pod\nmetadata: &m { name: p }\nspec: { x: *m }\n",
            "anchors are not supported",
        ),
        (
            "the same object twice",
            "resources: [pod.yaml, again.yaml]\n".into(),
            POD,
            "Pod ns/p is already in the kustomization",
        ),
        (
            "a file outside the kustomization",
            "resources: [../outside.yaml]\n".into(),
            POD,
            "not in or below",
        ),
        (
            "a remote resource",
            "resources: [\"https://example.com/x.yaml\"]\n".into(),
            POD,
            "remote resources are not implemented",
        ),
    ];
    // All at once: each is a Python start-up, and they are independent.
    let runs: Vec<_> = cases
        .iter()
        .map(|(what, kustomization, pod, _)| {
            let top = tempfile::tempdir().unwrap();
            std::fs::write(top.path().join("outside.yaml"), POD).unwrap();
            let dir = top.path().join("k");
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("kustomization.yaml"), kustomization).unwrap();
            std::fs::write(dir.join("pod.yaml"), pod).unwrap();
            std::fs::write(dir.join("again.yaml"), pod).unwrap();
            let child = python_kustomize()
                .arg(&dir)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{what}: cannot run kustomize.py: {e}"));
            (top, child)
        })
        .collect();
    for ((what, kustomization, _, message), (_top, child)) in cases.iter().zip(runs) {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "kustomize.py rendered {what} instead of refusing it:\n{kustomization}\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            stderr.contains(message) && stderr.starts_with("kustomize.py: "),
            "kustomize.py refused {what}, but not with {message:?}: {stderr}"
        );
    }
}

#[test]
fn the_systemd_unit_verifies_clean_and_holds_no_privilege() {
    let unit = repo().join("deploy/systemd/sandgate-proxy.service");
    let analyze = tool(
        "systemd-analyze",
        "run ./scripts/test, which installs Debian's systemd",
    );
    let bwrap = tool("bwrap", "run ./scripts/test (bubblewrap)");
    // verify also checks that ExecStart's binary exists: the binary under test stands at
    // /usr/local/bin/sandgate in a private mount namespace, the host's own left alone.
    let out = output(
        Command::new(bwrap)
            .args(["--dev-bind", "/", "/", "--tmpfs", "/usr/local/bin", "--ro-bind"])
            .arg(env!("CARGO_BIN_EXE_sandgate"))
            .args(["/usr/local/bin/sandgate", "--"])
            .arg(&analyze)
            .arg("verify")
            .arg(&unit),
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );

    let security = run_ok(
        Command::new(&analyze)
            .args(["security", "--offline=yes", "--no-pager"])
            .arg(&unit),
    );
    let score: f64 = security
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for sandgate-proxy.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{security}"));
    println!("systemd-analyze security: {score}");
    assert!(
        score <= 1.5,
        "exposure level {score} (docs/deploy.md states 1.1):\n{security}"
    );

    let text = std::fs::read_to_string(&unit).unwrap();
    let settings = unit_settings(&text);
    let get = |key: &str| {
        settings
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        get("CapabilityBoundingSet"),
        [""],
        "the bounding set must be empty"
    );
    assert_eq!(get("AmbientCapabilities"), [""]);
    for (key, want) in [
        // sd_notify READY=1 once the listeners serve (service_e2e checks the datagrams).
        ("Type", "notify"),
        ("DynamicUser", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("StateDirectory", "sandgate"),
        ("LogsDirectory", "sandgate"),
    ] {
        assert_eq!(get(key), [want], "{key}");
    }
    assert!(
        get("User").is_empty() && get("Group").is_empty(),
        "DynamicUser chooses the user"
    );
    assert!(
        get("RestrictAddressFamilies")[0].split_whitespace().all(|f| [
            "AF_INET",
            "AF_INET6",
            "AF_NETLINK",
            "AF_UNIX"
        ]
        .contains(&f))
    );
    assert!(!get("SystemCallFilter").is_empty());
    assert_eq!(get("ExecReload"), ["/bin/kill -HUP $MAINPID"]);
    let exec = get("ExecStart")[0];
    let args: Vec<&str> = exec.split_whitespace().collect();
    assert_eq!(&args[..2], ["/usr/local/bin/sandgate", "proxy"]);
    assert_real_flags("sandgate-proxy.service", &args);
    // SIGHUP reloads the policy file the unit names.
    let at = |flag: &str| args.iter().position(|a| *a == flag).map(|i| args[i + 1]);
    assert_eq!(
        at("--policy"),
        Some("/etc/sandgate/policy.yaml"),
        "ConfigurationDirectory=sandgate"
    );
    assert!(
        at("--audit-log").is_some_and(|p| p.starts_with("/var/log/sandgate/")),
        "LogsDirectory=sandgate"
    );
    assert!(
        at("--admin-listen").is_some_and(|a| a.starts_with("127.0.0.1:")),
        "keep the admin listener on loopback"
    );
}

/// The shipped policy files are valid, and the deploy files name only flags and environment
/// variables the binary has.
#[test]
fn shipped_policies_check_and_deploy_files_use_only_real_settings() {
    for policy in ["deploy/systemd/policy.yaml", "deploy/kubernetes/base/policy.yaml"] {
        run_ok(
            Command::new(env!("CARGO_BIN_EXE_sandgate"))
                .arg("check-config")
                .arg(repo().join(policy)),
        );
    }
    let containerfile = std::fs::read_to_string(repo().join("deploy/container/Containerfile")).unwrap();
    assert!(containerfile.contains("ENTRYPOINT [\"/sandgate\", \"proxy\"]"));
    // The ENV instruction with its continuation lines.
    let env_line = containerfile
        .lines()
        .skip_while(|l| !l.starts_with("ENV "))
        .scan(true, |more, l| {
            let this = more.then_some(l)?;
            *more = l.trim_end().ends_with('\\');
            Some(this)
        })
        .collect::<String>();
    let vars: Vec<&str> = env_line
        .split_whitespace()
        .filter_map(|w| w.split_once('=').map(|(k, _)| k))
        .collect();
    assert!(vars.contains(&"SANDGATE_ADMIN_LISTEN"), "{env_line}");
    assert_real_env("Containerfile", vars);
}

/// Fails unless every `--flag` in `args` is one `sandgate proxy --help` documents.
fn assert_real_flags(origin: &str, args: &[&str]) {
    let (flags, _) = proxy_flags();
    for flag in flag_names(args.iter().copied()) {
        assert!(
            flags.contains(&flag),
            "{origin} uses {flag}, which `sandgate proxy` does not have"
        );
    }
}

/// Fails unless every variable is one `sandgate proxy --help` names.
fn assert_real_env<'a>(origin: &str, vars: impl IntoIterator<Item = &'a str>) {
    let (_, help) = proxy_flags();
    for var in vars {
        assert!(
            help.contains(var),
            "{origin} sets {var}, which `sandgate proxy` does not read"
        );
    }
}
