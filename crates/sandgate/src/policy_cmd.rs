//! `sandgate policy suggest`: what the allowlist kept out of a run (the `report_only`
//! decisions of `sandgate proxy --report-only`, and optionally plain `not_allowlisted`
//! denies) written as an `EgressPolicy`: one exact-host entry per destination with the
//! ports seen and a reason naming the log, commented, for a person to review. Hosts a
//! deny entry refused are listed as comments only: an allow entry would change nothing.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use sandgate_proxy::audit_query::{self as q, Learned};

use crate::EX_USAGE;
use crate::cli::PolicyCommand;

pub fn run(cmd: PolicyCommand) -> ExitCode {
    let PolicyCommand::Suggest {
        from,
        include_denied,
        name,
        reason,
        output,
    } = cmd;
    match suggest(&from, include_denied, &name, reason, output.as_ref()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("sandgate: {message}");
            ExitCode::from(EX_USAGE)
        }
    }
}

fn suggest(
    from: &[PathBuf],
    include_denied: bool,
    name: &str,
    reason: Option<String>,
    output: Option<&PathBuf>,
) -> Result<(), String> {
    let mut files = Vec::new();
    for f in from {
        let found = q::log_files(f);
        if found.is_empty() {
            return Err(format!("no audit log at {}", f.display()));
        }
        files.extend(found);
    }
    let (events, skipped) = q::read_events(&files).map_err(|e| e.to_string())?;
    for s in &skipped {
        eprintln!("sandgate: {s}");
    }
    let sources: Vec<String> = from.iter().map(|f| f.display().to_string()).collect();
    let reason = reason.unwrap_or_else(|| format!("learned from {}", sources.join(", ")));
    let learned = q::learned(events.iter().map(|e| &e.record), include_denied);
    let text = render(name, &reason, &sources, &learned);
    match output {
        Some(path) => {
            std::fs::write(path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            let entries = learned.iter().filter(|l| !l.denylisted).count();
            eprintln!(
                "sandgate: wrote {} to {}",
                counted(entries, "entry", "entries"),
                path.display()
            );
        }
        None => {
            let mut out = std::io::stdout().lock();
            // A reader that stops early is no error.
            let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        }
    }
    Ok(())
}

/// The policy document. Strings go out as JSON strings, which YAML reads as double-quoted
/// scalars, so no host or reason can break the document.
fn render(name: &str, reason: &str, sources: &[String], learned: &[Learned]) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let mut out = format!(
        "# Suggested by `sandgate policy suggest` from {}.\n\
         # Every entry is an exact host with the ports it was asked on. Review each one, then\n\
         # check it: sandgate check-config FILE\n\
         apiVersion: sandgate.dev/v1\n\
         kind: EgressPolicy\n\
         metadata: {{ name: {} }}\n\
         spec:\n  network:\n",
        sources.join(", "),
        quote(name)
    );
    let allowed: Vec<&Learned> = learned.iter().filter(|l| !l.denylisted).collect();
    if allowed.is_empty() {
        out.push_str("    allowlist: []\n");
    } else {
        out.push_str("    allowlist:\n");
    }
    for l in allowed {
        let ports: Vec<String> = l.ports.iter().map(u16::to_string).collect();
        let tasks = match l.tasks.as_slice() {
            [] => String::new(),
            [one] => format!(", task {one}"),
            many => format!(", tasks {}", many.join(", ")),
        };
        out.push_str(&format!(
            "      - host: {}\n        ports: [{}]\n        reason: {}\n",
            quote(&l.host),
            ports.join(", "),
            quote(&format!(
                "{reason} ({}{tasks})",
                counted(l.count, "request", "requests")
            ))
        ));
    }
    for l in learned.iter().filter(|l| l.denylisted) {
        out.push_str(&format!(
            "    # {} was refused by a deny entry; an allow entry would not change that\n",
            l.host
        ));
    }
    out
}

/// `1 request`, `2 requests`.
fn counted(n: impl std::fmt::Display, one: &str, many: &str) -> String {
    let n = n.to_string();
    match n.as_str() {
        "1" => format!("1 {one}"),
        _ => format!("{n} {many}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suggestion_is_a_policy_file_that_parses_with_every_entry() {
        let learned = vec![
            Learned {
                host: "pypi.org".into(),
                ports: vec![443],
                count: 3,
                tasks: vec!["t-1".into()],
                denylisted: false,
            },
            Learned {
                host: "[2001:db8::1]".into(),
                ports: vec![80, 8443],
                count: 1,
                tasks: vec![],
                denylisted: false,
            },
            Learned {
                host: "evil.test".into(),
                ports: vec![443],
                count: 1,
                tasks: vec![],
                denylisted: true,
            },
        ];
        let text = render("learned", "run \"42\": agent", &["a.jsonl".into()], &learned);
        let file = sandgate_policy::parse_policy(&text, "s.yaml", 0).unwrap();
        assert_eq!(file.allow.len(), 2, "{text}");
        assert_eq!(file.allow[0].ports, Some(vec![443]));
        assert_eq!(
            file.allow[0].reason.as_deref(),
            Some("run \"42\": agent (3 requests, task t-1)")
        );
        assert_eq!(
            file.allow[1].reason.as_deref(),
            Some("run \"42\": agent (1 request)"),
            "one request is not \"1 requests\""
        );
        assert_eq!(file.allow[1].pattern.to_string(), "[2001:db8::1]");
        assert!(text.contains("# evil.test was refused by a deny entry"), "{text}");
        assert!(file.warnings.is_empty(), "{:?}", file.warnings);
        let empty = render("learned", "r", &["a.jsonl".into()], &[]);
        assert!(
            sandgate_policy::parse_policy(&empty, "s.yaml", 0).is_ok(),
            "{empty}"
        );
    }
}
