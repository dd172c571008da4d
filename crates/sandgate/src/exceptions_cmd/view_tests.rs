//! The table and the fields as an approver reads them, and as a requester would try to
//! bend them.

#![allow(clippy::indexing_slicing, reason = "tests")]

use serde_json::{Value, json};

use super::*;

fn pending(reason: &str) -> Value {
    json!({
        "id": "ex-00000000000000a1", "task_id": "t-1", "project_id": null,
        "hosts": ["pypi.org", "files.pythonhosted.org"], "ports": [443], "ttl_seconds": 900,
        "reason": reason, "requested_by": "agent-7", "requested_at": "2026-11-27T01:02:03Z",
        "state": "pending", "decided_by": null, "decided_at": null, "note": null, "expires_at": null
    })
}

#[test]
fn the_table_has_headers_the_ttl_and_the_reason() {
    let mut approved = pending("pip install");
    approved["state"] = json!("approved");
    approved["ttl_seconds"] = json!(300);
    approved["expires_at"] = json!("2026-11-27T01:08:03Z");
    let out = table(&[pending("the build needs the wheel"), approved], None);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    for h in HEADERS {
        assert!(lines[0].contains(h), "{h}: {out}");
    }
    assert!(
        lines[1].contains(" 15m ") && lines[1].ends_with("the build needs the wheel"),
        "{out}"
    );
    assert!(
        lines[2].contains(" 5m ") && lines[2].contains("2026-11-27T01:08:03Z"),
        "{out}"
    );
    // The columns line up: each header starts where its values do.
    let at = lines[0].find("REASON").unwrap();
    assert_eq!(lines[1].find("the build").unwrap(), at, "{out}");
    assert_eq!(lines[2].find("pip install").unwrap(), at, "{out}");
}

#[test]
fn a_long_reason_is_cut_with_an_ellipsis_on_a_character_boundary() {
    // Multi-byte characters at and around every cut point.
    let reason = "é漢🙂".repeat(50);
    let out = table(&[pending(&reason)], None);
    let line = out.lines().nth(1).unwrap();
    let shown = &line[out.lines().next().unwrap().find("REASON").unwrap()..];
    assert_eq!(shown.chars().count(), REASON_WIDTH, "{shown}");
    assert!(
        shown.ends_with('…') && reason.starts_with(shown.trim_end_matches('…')),
        "{shown}"
    );
    for n in 0..12 {
        let c = cut(&reason, n);
        assert!(c.chars().count() <= n.max(1), "{n}: {c}");
    }
    assert_eq!(cut("short", 40), "short");
}

#[test]
fn the_reason_fits_the_terminal_when_its_width_is_known() {
    let reason = "a".repeat(500);
    for columns in [120, 160, 240] {
        let out = table(&[pending(&reason)], Some(columns));
        for line in out.lines() {
            assert!(line.chars().count() <= columns, "{columns}: {line}");
        }
        assert!(out.lines().nth(1).unwrap().ends_with('…'));
    }
    // Too narrow for the rest: the reason still shows its start.
    let out = table(&[pending(&reason)], Some(20));
    assert!(
        out.lines()
            .nth(1)
            .unwrap()
            .ends_with(&format!("{}…", "a".repeat(MIN_REASON - 1)))
    );
}

/// A requester writes the reason. It cannot add a line, move the cursor, clear the screen
/// or reverse the text the approver reads.
#[test]
fn a_reason_cannot_forge_lines_or_drive_the_terminal() {
    let evil =
        "ok\nex-00000000000000ff  approved  t-1  evil.test\u{1b}[2J\u{1b}]0;title\u{7}\u{202e}gro.iypp\r";
    let out = table(&[pending(evil)], Some(400));
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(!out.contains(['\u{1b}', '\r', '\u{7}', '\u{202e}']), "{out:?}");
    assert!(out.contains("ok\\nex-"), "{out}");
    let shown = fields(&pending(evil));
    assert_eq!(shown.lines().filter(|l| l.starts_with("reason: ")).count(), 1);
    // Every field the exception has (one without methods or paths has none of those).
    let present = FIELDS.iter().filter(|f| pending(evil).get(**f).is_some()).count();
    assert_eq!(shown.lines().count(), present, "{shown}");
    assert!(
        !shown.contains(['\u{1b}', '\r', '\u{7}', '\u{202e}']),
        "{shown:?}"
    );
}

#[test]
fn show_prints_every_field_one_per_line() {
    let reason = format!("{}end", "long reason ".repeat(20));
    let mut e = pending(&reason);
    e["decided_at"] = json!(1_795_741_383); // an older control plane's Unix seconds
    e["added_later"] = json!({"x": 1});
    let out = fields(&e);
    let names: Vec<&str> = out.lines().map(|l| l.split_once(": ").unwrap().0).collect();
    let mut want: Vec<&str> = FIELDS.iter().copied().filter(|f| e.get(*f).is_some()).collect();
    want.push("added_later");
    assert_eq!(names, want, "{out}");
    assert!(
        out.contains("\nhosts: pypi.org, files.pythonhosted.org\n"),
        "{out}"
    );
    assert!(out.contains("\nttl_seconds: 900\n"), "{out}");
    assert!(out.contains("\nrequested_at: 2026-11-27T01:02:03Z\n"), "{out}");
    assert!(out.contains("\ndecided_at: 2026-11-27T01:03:03Z\n"), "{out}");
    assert!(out.contains("\ndecided_by: -\n"), "{out}");
    assert!(out.contains(&format!("\nreason: {reason}\n")), "{out}");
    assert!(!out.contains('…'), "show cuts nothing: {out}");
}

#[test]
fn durations_read_as_people_say_them() {
    for (secs, want) in [
        (0, "0s"),
        (45, "45s"),
        (300, "5m"),
        (900, "15m"),
        (3600, "1h"),
        (5400, "1h30m"),
        (3605, "1h5s"),
    ] {
        assert_eq!(duration(secs), want);
    }
}

/// A tweak is shown where hosts are (`list`) and on a line of its own (`show`).
#[test]
fn a_tweak_is_shown_in_the_hosts_column_and_by_show() {
    let mut e = pending("the suite takes ten minutes");
    e["hosts"] = json!([]);
    e["ports"] = json!([]);
    e["tweak"] = json!({"sandbox": "web", "max_seconds": 600, "network": true});
    let out = table(std::slice::from_ref(&e), Some(400));
    assert!(out.contains("tweak sandbox=web max_seconds=600 network"), "{out}");
    let shown = fields(&e);
    assert!(
        shown.contains("\ntweak: tweak sandbox=web max_seconds=600 network\n"),
        "{shown}"
    );
}

/// Methods and paths come right after the ports in `show`, and beside the hosts in `list`.
#[test]
fn methods_and_paths_show_beside_the_hosts() {
    let mut e = pending("r");
    e["methods"] = json!(["GET"]);
    e["paths"] = json!(["/org/**"]);
    let out = fields(&e);
    assert!(
        out.contains("\nports: 443\nmethods: GET\npaths: /org/**\nttl_seconds:"),
        "{out}"
    );
    let listed = table(&[e], Some(200));
    assert!(
        listed.contains("files.pythonhosted.org [GET /org/**]"),
        "{listed}"
    );
}
