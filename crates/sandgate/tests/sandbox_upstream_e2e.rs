//! `sandgate run` in `net.mode: proxy` chained through a real upstream `sandgate proxy` that
//! refuses one host the run's own policy allows: the upstream's refusal of a plain request,
//! of a CONNECT tunnel and of a SOCKS5 tunnel is said live on stderr like the run's own
//! refusals, and the exit summary counts each as denied, not allowed. Then `sandgate
//! explain --request-id` explains each id the command saw, from the kept run log and from
//! the upstream's log.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and the shared harness connects to its own loopback fixtures"
)]

mod common;
mod sandbox_support;

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;

use common::runtime;
use sandbox_support::{run, text, write_policy};

#[test]
fn an_upstream_refusal_is_said_live_and_counted_as_denied() {
    let rt = runtime();
    let origin = rt.block_on(Origin::http());
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("refused.test", &["127.0.0.1"]),
    ));
    let port = origin.port();
    let dns_addr = dns.addr().to_string();
    let allowed = format!("allowed.test:{port}");
    let refused = format!("refused.test:{port}");
    // The upstream allows one host; the run's own policy allows both.
    let upstream = common::ProxyProcess::start(&[
        "--dns-server",
        &dns_addr,
        "--allow-range",
        "127.0.0.0/8",
        "--allow",
        &allowed,
    ]);
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(
        dir.path(),
        &format!(
            "net:\n  mode: proxy\n  allow_domains: [ \"{allowed}\", \"{refused}\" ]\n  proxy: {{ upstream: \"{}\" }}\n",
            upstream.addr
        ),
    );
    // Each curl prints its status (a refused CONNECT's in %{http_connect}; a refused SOCKS5
    // tunnel has none) and never fails the script; the last one is refused by the run's
    // own proxy. The two plain refusals print their bodies: the upstream's, and the run's.
    let script = format!(
        "curl -sS -o /dev/null -w 'allowed=%{{http_code}}\\n' http://{allowed}/ok; \
         curl -sS -w 'plain=%{{http_code}}\\n' http://{refused}/plain; \
         curl -sS -p -o /dev/null -w 'connect=%{{http_connect}}\\n' http://{refused}/tunnel; \
         curl -sS --socks5-hostname 127.0.0.1:1080 -o /dev/null -w 'socks5=%{{http_code}}\\n' http://{refused}/socks; \
         curl -sS -w 'local=%{{http_code}}\\n' http://elsewhere.test:{port}/; true"
    );
    let out = run(&policy, &[], &["sh", "-c", &script]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for want in ["allowed=200", "plain=403", "connect=403", "local=403"] {
        assert!(stdout.contains(want), "missing {want}:\n{stdout}\n{stderr}");
    }
    // Said live, as the run's own refusals are (the SOCKS5 client saw only a reply code).
    let live = format!(
        "sandgate: blocked {refused} (upstream denied: the upstream proxy answered 403; its own policy refused it)"
    );
    assert_eq!(stderr.matches(&live).count(), 3, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "sandgate: blocked elsewhere.test:{port} (not allowlisted"
        )),
        "{stderr}"
    );
    // And counted as denied: one request reached its origin, four were refused.
    assert!(
        stderr.contains(&format!("blocked: {refused} (upstream denied), 3 times")),
        "{stderr}"
    );
    assert!(stderr.contains("sandgate: 1 allowed, 4 denied,"), "{stderr}");
    // The run's audit log holds each upstream refusal as an allow here whose close says
    // the upstream refused it, with the upstream's status.
    let audit = stderr
        .lines()
        .find_map(|l| l.split_once("; audit log: ").map(|(_, p)| p.trim().to_owned()))
        .expect("the summary names the kept audit log");
    let events = common::read_audit(std::path::Path::new(&audit));
    let closes: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "close" && e["destination_host"] == "refused.test")
        .collect();
    assert_eq!(closes.len(), 3, "{events:#?}");
    assert!(
        closes
            .iter()
            .all(|e| e["outcome"] == "upstream_failure:upstream_denied" && e["status"] == 403),
        "{closes:#?}"
    );

    // Why: each id the command saw explains its refusal. The run's own, from the kept run
    // logs (no flag needed); the upstream's, from the upstream's log.
    let ids: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("request id: "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert_eq!(ids.len(), 2, "{stdout}");
    let explain = |args: &[&str]| {
        common::outcome(
            std::process::Command::new(common::sandgate_bin())
                .arg("explain")
                .args(args)
                .current_dir(dir.path())
                .env_remove("SANDGATE_AUDIT_LOG")
                .env("XDG_STATE_HOME", sandbox_support::state_home()),
        )
    };
    let (code, out, err) = explain(&["--request-id", ids[1]]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with(&format!("denied GET elsewhere.test:{port}: not in allowlist\n")),
        "{out}"
    );
    assert!(out.contains(&format!("  logged:  {audit}:")), "{out}");
    assert!(
        out.contains(&format!("sandgate run --allow-domain elsewhere.test:{port}")),
        "{out}"
    );
    assert!(out.contains("sandgate exceptions request --task run-"), "{out}");
    let upstream_log = upstream.audit_path.to_str().unwrap();
    let (code, out, err) = explain(&["--request-id", ids[0], "--audit-log", upstream_log]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with(&format!("denied GET {refused}: not in allowlist\n")),
        "{out}"
    );
    // The tunnel the upstream refused, by the run proxy's id (curl -v shows it as
    // Sandgate-Request-Id): allowed here, refused there.
    let tunnel = closes.iter().find(|e| e["scheme"] == "connect").unwrap();
    let (code, out, err) = explain(&["--request-id", tunnel["request_id"].as_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with(&format!(
            "denied CONNECT {refused}: refused by the upstream proxy\n"
        )),
        "{out}"
    );
    assert!(
        out.contains("  ended:   upstream_failure:upstream_denied, status 403"),
        "{out}"
    );
}
