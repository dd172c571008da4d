//! The gates a `run` must pass before anything starts: the program, the time limit, the
//! workspace. Pure: the caller canonicalizes the workspace path first. A refusal names its
//! gate, so the agent (and the person reading the audit) knows which rule said no.

use std::path::Path;

use crate::config::Gates;

/// A run the gates refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused by gate `{gate}`: {message}")]
pub struct GateRefusal {
    pub gate: &'static str,
    pub message: String,
}

fn refuse(gate: &'static str, message: String) -> GateRefusal {
    GateRefusal { gate, message }
}

/// What the gates let through: the time limit in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    pub seconds: u64,
}

/// Checks a run of `command` (argv) with an optional `timeout` (seconds) and `workspace`
/// (already canonical) against `gates`.
pub fn check(
    gates: &Gates,
    command: &[String],
    timeout: Option<u64>,
    workspace: Option<&Path>,
) -> Result<Admitted, GateRefusal> {
    let Some(program) = command.first() else {
        return Err(refuse("commands", "the command is empty".to_owned()));
    };
    // Exact matches only: `python3` is not `/tmp/x/python3`, and `/usr/bin/python3` is not
    // `/usr/bin/../bin/python3`.
    if !gates.commands.iter().any(|c| c == program) {
        return Err(refuse(
            "commands",
            format!(
                "{program:?} is not one of the programs this sandbox runs ({})",
                gates.commands.join(", ")
            ),
        ));
    }
    let seconds = match timeout {
        None => gates.max_seconds,
        Some(0) => return Err(refuse("max_seconds", "a timeout of 0 seconds".to_owned())),
        Some(s) if s > gates.max_seconds => {
            return Err(refuse(
                "max_seconds",
                format!("{s} s is more than this sandbox allows ({} s)", gates.max_seconds),
            ));
        }
        Some(s) => s,
    };
    if let Some(ws) = workspace
        && !plain_path(ws)
    {
        return Err(refuse(
            "workspaces",
            format!(
                "{:?}: a workspace path may hold only letters, digits and / . _ - + = ~",
                ws.display()
            ),
        ));
    }
    if let Some(ws) = workspace
        && !gates.workspaces.iter().any(|allowed| ws.starts_with(allowed))
    {
        return Err(refuse(
            "workspaces",
            if gates.workspaces.is_empty() {
                "this sandbox takes no workspace".to_owned()
            } else {
                format!(
                    "{} is not under an allowed workspace ({})",
                    ws.display(),
                    gates
                        .workspaces
                        .iter()
                        .map(|w| w.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
        ));
    }
    Ok(Admitted { seconds })
}

/// A path made of the characters a policy parameter may hold (the sandbox refuses others
/// too: the value is pasted into the policy text).
fn plain_path(p: &Path) -> bool {
    p.to_str().is_some_and(|s| {
        s.split('/').all(|c| !c.starts_with('-'))
            && s.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-' | b'+' | b'=' | b'~')
            })
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::limits::RunLimits;

    fn gates() -> Gates {
        Gates {
            commands: vec!["python3".into(), "/usr/bin/env".into()],
            max_seconds: 30,
            max_output_bytes: 1024,
            network: false,
            workspaces: vec![PathBuf::from("/srv/work")],
            limits: RunLimits::default(),
            tweaks: None,
        }
    }

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn programs_match_exactly() {
        let g = gates();
        assert!(check(&g, &argv(&["python3", "-c", "1"]), None, None).is_ok());
        assert!(check(&g, &argv(&["/usr/bin/env"]), None, None).is_ok());
        for bad in [
            &["/tmp/x/python3"][..],
            &["python3.11"],
            &["./python3"],
            &["/usr/bin/../bin/env"],
            &["env"],
            &["sh", "-c", "python3"],
            &[],
        ] {
            let err = check(&g, &argv(bad), None, None).unwrap_err();
            assert_eq!(err.gate, "commands", "{bad:?}");
        }
    }

    #[test]
    fn the_time_limit_is_capped_and_defaults_to_the_cap() {
        let g = gates();
        assert_eq!(
            check(&g, &argv(&["python3"]), None, None),
            Ok(Admitted { seconds: 30 })
        );
        assert_eq!(
            check(&g, &argv(&["python3"]), Some(5), None),
            Ok(Admitted { seconds: 5 })
        );
        for t in [0, 31, u64::MAX] {
            assert_eq!(
                check(&g, &argv(&["python3"]), Some(t), None).unwrap_err().gate,
                "max_seconds"
            );
        }
    }

    #[test]
    fn workspaces_must_lie_under_an_allowed_directory() {
        let g = gates();
        let ok = PathBuf::from("/srv/work/project");
        assert!(check(&g, &argv(&["python3"]), None, Some(&ok)).is_ok());
        for bad in [
            "/srv/workshop",
            "/srv",
            "/etc",
            "/srv/work/x\", \"/etc",
            "/srv/work/a b",
            "/srv/work/-x",
        ] {
            let err = check(&g, &argv(&["python3"]), None, Some(Path::new(bad))).unwrap_err();
            assert_eq!(err.gate, "workspaces", "{bad}");
        }
        let none = Gates {
            workspaces: Vec::new(),
            ..gates()
        };
        assert!(
            check(&none, &argv(&["python3"]), None, Some(&ok))
                .unwrap_err()
                .message
                .contains("no workspace")
        );
    }
}
