//! Python's requests and httpx inside `sandgate run` trust the run's CA with no flag: with
//! a read-only entry in the SandboxPolicy's `net.allowlist`, each reads (GET 200) and is
//! refused a write (POST 403, answered inside the tunnel the run's proxy intercepts),
//! taking the proxy from `https_proxy` and the CA from the run's variables
//! (`REQUESTS_CA_BUNDLE`, `SSL_CERT_FILE`). requests is Debian's (`/usr/bin/python3`, as
//! `scripts/test` installs it); httpx is the venv's under target/, bound read-only into the
//! sandbox through the policy's `fs.read_paths` and run with the venv's own Python. A
//! client that is missing fails the test: nothing here is skipped.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use sandgate_testkit::dns::Zone;
use sandgate_testkit::tls::TestCa;

use super::pem_file;
use crate::common::world::World;
use crate::l7::decisions::{assert_refused_by, decision, entry_lines};
use crate::l7::entry_at;
use crate::sandbox_support::{base, run_command, wait_bounded};

/// Inside the sandbox: `CLIENT GET=STATUS POST=STATUS` for the client named in argv[2]
/// against the base URL in argv[1], or `CLIENT failed: ERROR`. No CA, no proxy is named.
const PY: &str = r#"import sys
base, client = sys.argv[1], sys.argv[2]
out = []
try:
    if client == "requests":
        import requests
        for m in ["GET", "POST"]:
            r = requests.request(m, f"{base}/requests/{m}", data=b"x=1" if m == "POST" else None, timeout=20)
            out.append(f"{m}={r.status_code}")
    else:
        import httpx
        with httpx.Client(timeout=20) as c:
            for m in ["GET", "POST"]:
                r = c.request(m, f"{base}/httpx/{m}", content=b"x=1" if m == "POST" else None)
                out.append(f"{m}={r.status_code}")
    print(client.upper() + " " + " ".join(out))
except Exception as e:
    print(f"{client.upper()} failed: {e!r}")
"#;

/// The venv the tests' Python lives in (`target/venv`, or where `SANDGATE_TEST_PYTHON`
/// points), made absolute, and the installation its interpreter links to (the venv's
/// `python` is a symlink to it: `/usr`, or wherever the `python3` that made it lives):
/// bubblewrap binds both at their own paths.
fn venv() -> (PathBuf, PathBuf) {
    let python = PathBuf::from(crate::common::python());
    let dir = python
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("no venv around {}", python.display()));
    let real = std::fs::canonicalize(&python).unwrap();
    let install = real
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("no installation around {}", real.display()));
    (std::fs::canonicalize(dir).unwrap(), install.to_path_buf())
}

#[test]
fn requests_and_httpx_in_a_sandbox_trust_the_runs_ca_with_no_flag_and_the_rules_hold() {
    let w = World::new();
    let ca = TestCa::new(&["ro.test"]);
    let origin = w.tls_origin(&ca);
    let port = origin.port();
    let dns = w.dns(Zone::new().with("ro.test", &["127.0.0.1"]));
    let dir = tempfile::tempdir().unwrap();
    let roots = pem_file(dir.path(), "roots.pem", &ca.ca_pem);
    let (venv, install) = venv();
    let python = venv.join("bin/python");
    let mut read = vec![venv.display().to_string()];
    if !install.starts_with("/usr") {
        read.push(install.display().to_string());
    }
    let yaml = format!(
        "{}net:\n  mode: allowlist\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\n  allowlist:\n{}",
        base().replace("read_paths: [ ", &format!("read_paths: [ {}, ", read.join(", "))),
        dns.addr(),
        entry_at(4, "ro.test", port, &["read_only: true"]),
    );
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, &yaml).unwrap();
    let lines = entry_lines(&yaml);
    let audit = dir.path().join("audit.jsonl");
    let script = format!(
        "cat > /tmp/check.py <<'EOF'\n{PY}EOF\n\
         timeout -k 5 60 /usr/bin/python3 /tmp/check.py https://ro.test:{port} requests\n\
         timeout -k 5 60 {} /tmp/check.py https://ro.test:{port} httpx\n",
        python.display()
    );
    let mut child = run_command(
        &policy,
        &["--audit-log", audit.to_str().unwrap()],
        &["sh", "-c", &script],
    )
    .env("SSL_CERT_FILE", &roots)
    .env_remove("SSL_CERT_DIR")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let status = wait_bounded(&mut child);
    let stdout = std::io::read_to_string(child.stdout.take().unwrap()).unwrap();
    let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    let value = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key:?} line in:\n{stdout}\n{stderr}"))
            .to_owned()
    };
    assert_eq!(value("REQUESTS "), "GET=200 POST=403", "{stdout}\n{stderr}");
    assert_eq!(value("HTTPX "), "GET=200 POST=403", "{stdout}\n{stderr}");
    assert_eq!(
        origin.requests(),
        ["GET /requests/GET", "GET /httpx/GET"],
        "only the reads reach the origin"
    );
    for client in ["requests", "httpx"] {
        let d = decision(&audit, "ro.test", "POST", &format!("/{client}/POST"));
        assert_refused_by(&d, "request_not_allowed", "policy.yaml", &lines);
        assert_eq!(d["scheme"], "https", "{d:#}");
    }
}
