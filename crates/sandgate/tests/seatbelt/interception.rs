//! Interception under the Seatbelt stand-in: an entry with method rules (here
//! `read_only`) makes the run's proxy open its HTTPS, so the command's TLS clients must
//! trust the run's CA with no flag. macOS has no `/run/sandgate`: the CA goes into the
//! run's own state directory, the variables that name it point there, and the profile lets
//! the command read those two files and write neither. Before, the variables named
//! `/run/sandgate/...`, which does not exist there, and every HTTPS request of the run
//! failed in its client ("000").

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;
use sandgate_testkit::tls::TestCa;

use super::{StandIn, write_policy};
use crate::common::runtime;
use crate::sandbox_support::text;

/// curl and Debian's Python, each a GET and a POST on the read-only entry.
const SCRIPT: &str = r#"c() { timeout -k 5 30 curl -sS -o /dev/null -w '%{http_code}' "$@"; }
echo "CURL GET=$(c https://ro.test:PORT/curl) POST=$(c --data x=1 https://ro.test:PORT/curl)"
timeout -k 5 30 python3 - <<'PY'
import urllib.error, urllib.request
out = []
for body in [None, b"x=1"]:
    try:
        out.append(urllib.request.urlopen("https://ro.test:PORT/py", data=body, timeout=20).status)
    except urllib.error.HTTPError as e:
        out.append(e.code)
print(f"PY GET={out[0]} POST={out[1]}")
PY
"#;

#[test]
fn intercepted_https_works_under_seatbelt_with_the_ca_in_the_runs_own_directory() {
    let rt = runtime();
    let ca = TestCa::new(&["ro.test"]);
    let origin = rt.block_on(Origin::https(ca.server_config.clone()));
    let dns = rt.block_on(DnsServer::start(Zone::new().with("ro.test", &["127.0.0.1"])));
    let stand_in = StandIn::new();
    let work = tempfile::tempdir().unwrap();
    // The roots the run's proxy trusts for the origin: the test's CA alone.
    let roots = work.path().join("roots.pem");
    std::fs::write(&roots, &ca.ca_pem).unwrap();
    let port = origin.port();
    let policy = write_policy(
        work.path(),
        &format!(
            "net:\n  mode: allowlist\n  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\n  allowlist:\n    - host: ro.test\n      ports: [{port}]\n      read_only: true\n",
            dns.addr()
        ),
    );
    // The run's state directory goes under TMPDIR: one of this test's own, to look in.
    let state = tempfile::tempdir().unwrap();
    let out = stand_in
        .command(
            &policy,
            &[],
            &["sh", "-c", &SCRIPT.replace("PORT", &port.to_string())],
        )
        .env("SSL_CERT_FILE", &roots)
        .env_remove("SSL_CERT_DIR")
        .env("TMPDIR", state.path())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for want in ["CURL GET=200 POST=403", "PY GET=200 POST=403"] {
        assert!(stdout.contains(want), "missing {want}:\n{stdout}\n{stderr}");
    }
    // What the command was told, and what the profile lets it do with it.
    let state_dir = std::fs::canonicalize(state.path()).unwrap();
    let profile = stand_in.recorded("profile.sb");
    let mut named = Vec::new();
    for (var, file) in [
        ("SSL_CERT_FILE", "ca-bundle.pem"),
        ("REQUESTS_CA_BUNDLE", "ca-bundle.pem"),
        ("CURL_CA_BUNDLE", "ca-bundle.pem"),
        ("GIT_SSL_CAINFO", "ca-bundle.pem"),
        ("NODE_EXTRA_CA_CERTS", "ca.pem"),
    ] {
        let value = stand_in.env(var).unwrap_or_default();
        assert!(
            value.starts_with(&state_dir.display().to_string()) && value.ends_with(&format!("/{file}")),
            "{var}={value}: not the run's own {file}"
        );
        named.push(value);
    }
    for (i, file) in ["ca.pem", "ca-bundle.pem"].iter().enumerate() {
        let param = stand_in.param(&format!("CA_{i}")).unwrap_or_default();
        assert!(
            param.ends_with(&format!("/{file}")) && named.contains(&param),
            "CA_{i}={param}\n{profile}"
        );
        assert!(
            profile.contains(&format!("(allow file-read* (literal (param \"CA_{i}\")))")),
            "{profile}"
        );
        let protected = stand_in
            .recorded("params")
            .lines()
            .any(|l| l.starts_with("PROTECT_") && l.split_once('=').is_some_and(|(_, p)| p == param));
        assert!(
            protected,
            "the profile does not keep {file} from writes:\n{profile}"
        );
    }
    // After the run its directory, the CA with it, is gone.
    assert!(
        std::fs::read_dir(state.path()).unwrap().next().is_none(),
        "the run left its state behind"
    );
}
