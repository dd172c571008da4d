//! Issue 31, dynamic tweaks, the approver's side: a person grants less than an agent asked
//! (`sandgate exceptions approve ID --tweak-sandbox NAME --max-seconds N`), and the next
//! run gets what was granted, not what was asked. As attackers: an approval that widens the
//! tweak is refused naming the field, and a viewer's or a follower's token cannot approve.

use super::*;

/// The agent asks for a time limit of 120 s (the sandbox's gates give 10, its bounds 120);
/// the approver grants 30 with the CLI. Before that, approvals that widen (more time, the
/// network, a workspace, another sandbox) are refused with 400 naming the field, and
/// a viewer and a follower cannot approve; the request stays pending as asked. Then a run
/// of 30 s passes and one of 31 or 120 is refused; `list_sandboxes` says 30 is granted, and
/// the agent is never told `approved` for the 120 it asked.
#[test]
fn an_approver_grants_less_time_than_asked_and_the_run_gets_that() {
    let rt = runtime();
    let f = followed(&rt);
    let admin = f.admin;
    let config = write_config(
        f.dir.path(),
        &format!(
            "  task: t-1\n  audit_log: audit.jsonl\n  egress: {{ admin: \"http://{admin}\", token_file: agent.token }}\n  sandboxes:\n\
             \x20   - name: web\n      policy: web.yaml\n      gates: {{ commands: [ python3 ], max_seconds: 10, network: true, tweaks: {{ max_seconds: 120, network: true }} }}\n"
        ),
    );
    let mut d = Driver::start(&config, "legacy");
    let run_of = |seconds: u64| json!({"sandbox": "web", "command": ["python3", "-c", "print('ok')"], "timeout_seconds": seconds});
    let refused =
        |r: &Value| r["is_error"] == true && r["text"].as_str().unwrap_or("").contains("gate `max_seconds`");
    let asked = d.call(
        "request_tweak",
        json!({"sandbox": "web", "max_seconds": 120, "ttl_seconds": 300, "reason": "the suite takes two minutes"}),
    );
    assert_eq!(asked["structured"]["state"], "pending", "{asked}");
    let id = asked["structured"]["requested_id"].as_str().unwrap().to_owned();

    for (widening, field) in [
        (
            vec!["--max-seconds", "121"],
            "tweak.max_seconds 121 is more than the 120 asked",
        ),
        (vec!["--max-seconds", "30", "--network"], "tweak.network"),
        (
            vec!["--max-seconds", "30", "--workspace", "/tmp"],
            "tweak.workspace /tmp",
        ),
    ] {
        let mut args = vec!["approve", id.as_str(), "--tweak-sandbox", "web"];
        args.extend(&widening);
        let (code, out, err) = cli(admin, "tok-alice", &args);
        assert_eq!(code, 1, "{widening:?}: {out}");
        assert!(err.contains("400") && err.contains(field), "{widening:?}: {err}");
    }
    let (code, _, err) = cli(
        admin,
        "tok-alice",
        &["approve", &id, "--tweak-sandbox", "other", "--max-seconds", "30"],
    );
    assert!(code == 1 && err.contains("tweak.sandbox"), "{err}");
    for token in ["tok-viewer", "tok-follow"] {
        let (code, _, err) = cli(
            admin,
            token,
            &["approve", &id, "--tweak-sandbox", "web", "--max-seconds", "30"],
        );
        assert!(code == 1 && err.contains("403"), "{token}: {err}");
    }
    let (_, pending) = common::control::api(
        admin,
        "GET",
        &format!("/v1/exceptions/{id}"),
        Some("tok-alice"),
        None,
    );
    assert_eq!(
        (&pending["state"], &pending["tweak"]),
        (&json!("pending"), &json!({"sandbox": "web", "max_seconds": 120})),
        "{pending}"
    );
    assert!(refused(&d.run(run_of(30))), "nothing granted yet");

    let (code, out, err) = cli(
        admin,
        "tok-alice",
        &["approve", &id, "--tweak-sandbox", "web", "--max-seconds", "30"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("max_seconds=30"), "{out}");
    let (_, shown, _) = cli(admin, "tok-alice", &["show", &id]);
    assert!(
        shown.contains("state: approved") && shown.contains("sandbox=web max_seconds=30\n"),
        "{shown}"
    );

    let r = d.run(run_of(30));
    assert_eq!(r["structured"]["stdout"], "ok\n", "the granted 30 s: {r}");
    for over in [31, 120] {
        let r = d.run(run_of(over));
        assert!(refused(&r), "{over} s is more than granted: {r}");
    }
    let listed = d.call("list_sandboxes", json!({}));
    let granted = &listed["structured"]["sandboxes"][0]["tweaks"]["granted"];
    assert_eq!(
        (&granted["max_seconds"], &granted["exceptions"]),
        (&json!(30), &json!([id])),
        "{listed}"
    );
    let again = d.call(
        "request_tweak",
        json!({"sandbox": "web", "max_seconds": 120, "ttl_seconds": 300, "reason": "still two minutes"}),
    );
    assert_ne!(
        again["structured"]["state"], "approved",
        "120 s was not granted: {again}"
    );
}
