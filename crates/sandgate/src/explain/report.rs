//! How `explain --request-id` prints what it found: as text (the first line in the words a
//! refusal's body begins with, `denied CONNECT pypi.org:443: not in allowlist`, then one
//! labelled line each) or as one JSON object with the lines as written.

use sandgate_policy::Verdict;
use sandgate_proxy::audit::record::DecisionRecord;
use serde_json::{Value, json};

use super::remedy::{EXIT_REFUSED, Remedy};
use super::request::{Found, Line};
use super::target::Explanation;

/// `denied CONNECT host:443`: the words a refusal's body begins with.
pub(super) fn headline(found: &Found, remedy: &Remedy) -> String {
    let request = found.request();
    let answer = match remedy.exit {
        EXIT_REFUSED => "denied",
        _ => "allowed",
    };
    let dest = request
        .decision
        .and_then(|d| d.dest.as_ref())
        .or_else(|| request.close.and_then(|c| c.dest.as_ref()));
    let method = found
        .requester()
        .and_then(|r| r.method.clone())
        .or_else(|| {
            dest.and_then(|d| d.access)
                .map(|a| a.scheme().to_ascii_uppercase())
        })
        .unwrap_or_else(|| "-".to_owned());
    let dest = dest.map_or_else(|| "(no valid destination)".to_owned(), ToString::to_string);
    format!("{answer} {method} {dest}: {}", remedy.summary)
}

pub(super) fn text(id: &str, found: &Found, remedy: &Remedy, now: Option<&Explanation>) -> Vec<String> {
    let first = found.first();
    let mut out = vec![headline(found, remedy)];
    if let Some(l) = first {
        out.push(format!("  request: {id} at {}", l.record.created_at));
    }
    let logged: Vec<String> = [(&found.decision, "decision"), (&found.close, "close")]
        .into_iter()
        .filter_map(|(l, kind)| {
            Some(format!(
                "{}:{} ({kind})",
                l.as_ref()?.file.display(),
                l.as_ref()?.line
            ))
        })
        .collect();
    out.push(format!("  logged:  {}", logged.join(", ")));
    out.extend(who(found).map(|w| format!("  who:     {w}")));
    out.extend(
        found
            .request()
            .decision
            .map(|d| format!("  reason:  {}", reason(d))),
    );
    if let Some(c) = found.request().close {
        let status = c.status.map(|s| format!(", status {s}")).unwrap_or_default();
        out.push(format!("  ended:   {}{status}", c.outcome.as_str()));
    }
    out.push(format!("  why:     {}", remedy.meaning));
    if !remedy.fixes.is_empty() {
        out.push("  what to do:".to_owned());
        for fix in &remedy.fixes {
            out.extend(fix.lines().map(|l| format!("    {l}")));
        }
    }
    match now {
        Some(now) => {
            out.push("  now, with the policy given:".to_owned());
            out.extend(now.lines().into_iter().map(|l| format!("    {l}")));
        }
        None => out.push(
            "  (with --policy FILE, --allow or --deny: how that policy decides it now, and by which rule)"
                .to_owned(),
        ),
    }
    out
}

/// `task t-1, project p, subject alice, client 127.0.0.1:5000`, from what the line holds.
fn who(found: &Found) -> Option<String> {
    let r = found.requester()?;
    let parts: Vec<String> = [
        ("task", r.task_id.clone()),
        ("project", r.project_id.clone()),
        ("job", r.job_id.clone()),
        ("subject", r.subject.clone()),
        ("agent", r.agent.clone()),
        ("node", r.node.clone()),
        ("client", r.client_addr.map(|a| a.to_string())),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some(format!("{k} {}", v?)))
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// `not_allowlisted, answered 403` or `allowlisted, by allow:a.test (policy.yaml:3)`.
fn reason(d: &DecisionRecord) -> String {
    let code = d.reason_code.as_deref().unwrap_or("-");
    match d.verdict {
        Verdict::Deny => {
            let status = d.status.map(|s| format!(", answered {s}")).unwrap_or_default();
            let rule = d
                .rule
                .as_deref()
                .map(|r| format!(", rule {r}"))
                .unwrap_or_default();
            format!("{code}{status}{rule}")
        }
        Verdict::Allow => match d.rule.as_deref() {
            Some(rule) => format!("{code}, by {rule}"),
            None => code.to_owned(),
        },
    }
}

pub(super) fn json(id: &str, found: &Found, remedy: &Remedy, now: Option<&Explanation>) -> Value {
    let located = |l: &Option<Line>| {
        l.as_ref().map(|l| {
            json!({
                "file": l.file.display().to_string(),
                "line": l.line,
                // The line as written; `null` if it is somehow not JSON (it was read as such).
                "record": serde_json::from_str::<Value>(&l.text).ok(),
            })
        })
    };
    let request = found.request();
    let decision = request.decision;
    json!({
        "request_id": id,
        "summary": headline(found, remedy),
        "decision": decision.map(|d| match d.verdict {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
        }),
        "reason_code": decision.and_then(|d| d.reason_code.clone()),
        "outcome": request.close.map(|c| c.outcome.as_str()),
        "meaning": remedy.meaning,
        "what_to_do": remedy.fixes,
        "exit_status": remedy.exit,
        "decision_line": located(&found.decision),
        "close_line": located(&found.close),
        "now": now.map(Explanation::json),
    })
}
