//! Who a run is. Its own id, `run-PID-T`, names its kept audit log and its cgroup. The
//! identity its proxy records and decides under is the task (`--task` as the orchestrator
//! names it, else the run's own id; under central proxies prefixed by the node's name, so a
//! node cannot claim another node's runs), the project (`--project`), the job (`--job`) and
//! the subject (`--subject`, else the user) and the agent acting for it (`--agent`), both
//! as stated. Every id follows the policy's id rule. The command inside is told them
//! (`SANDGATE_RUN_ID`, `SANDGATE_TASK`, `SANDGATE_PROJECT`, `SANDGATE_JOB`,
//! `SANDGATE_AGENT`), and the run prints them at start unless `--quiet`. It is also told its
//! workspace, the `WORKSPACE` parameter when one is given (`SANDGATE_WORKSPACE`; `sandgate
//! mcp` gives every run one), so a command can find where it may write.

use sandgate_policy::ids;

use super::{RunError, RunOptions};
use crate::policy::CentralSpec;

/// The run's ids.
#[derive(Debug, Clone)]
pub(super) struct RunIdentity {
    /// `run-PID-T`: the run's own id.
    pub run: String,
    /// The task its requests are recorded and decided under.
    pub task: String,
    pub project: Option<String>,
    pub job: Option<String>,
    /// Who started it.
    pub subject: String,
    /// The agent acting for the subject (`--agent`).
    pub agent: Option<String>,
    /// The `WORKSPACE` parameter (`--param`, `--path-param`), when given.
    pub workspace: Option<String>,
}

impl RunIdentity {
    /// Checks the ids given and names the run. `central`: the run's proxy is a node of
    /// central proxies, whose node name its task carries.
    pub(super) fn of(opts: &RunOptions, central: Option<&CentralSpec>) -> Result<RunIdentity, RunError> {
        let given = |flag: &str, value: &Option<String>| -> Result<Option<String>, RunError> {
            match value {
                Some(v) if !ids::valid(v) => Err(RunError::Usage(format!("{flag} {v:?}: {}", ids::ID_RULE))),
                other => Ok(other.clone()),
            }
        };
        let task = given("--task", &opts.task)?;
        let project = given("--project", &opts.project)?;
        let job = given("--job", &opts.job)?;
        let agent = given("--agent", &opts.agent)?;
        let subject = run_subject(opts.subject.as_deref())?;
        let run = run_id();
        let task = task.unwrap_or_else(|| run.clone());
        let task = match central {
            // The node's name first, whatever the task says: a task named `node-b:t-1` on
            // node-a is `node-a:node-b:t-1`, still node-a's.
            Some(spec) => format!("{}:{task}", node_name(spec)?),
            None => task,
        };
        if !ids::valid(&task) {
            return Err(RunError::Usage(format!(
                "--task: {task:?} (under the node's name) is longer than an id may be: {}",
                ids::ID_RULE
            )));
        }
        Ok(RunIdentity {
            run,
            task,
            project,
            job,
            subject,
            agent,
            workspace: opts.params.get(super::WORKSPACE_PARAM).cloned(),
        })
    }

    /// What the command inside is told of its identity.
    /// The ids the run's summary names.
    pub(super) fn ids(&self) -> crate::summary::RunIds {
        crate::summary::RunIds {
            run: self.run.clone(),
            task: self.task.clone(),
            project: self.project.clone(),
            job: self.job.clone(),
            subject: self.subject.clone(),
            agent: self.agent.clone(),
        }
    }

    pub(super) fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("SANDGATE_RUN_ID".to_owned(), self.run.clone()),
            ("SANDGATE_TASK".to_owned(), self.task.clone()),
        ];
        env.extend(self.project.clone().map(|p| ("SANDGATE_PROJECT".to_owned(), p)));
        env.extend(self.job.clone().map(|j| ("SANDGATE_JOB".to_owned(), j)));
        env.extend(self.agent.clone().map(|a| ("SANDGATE_AGENT".to_owned(), a)));
        env.extend(
            self.workspace
                .clone()
                .map(|w| ("SANDGATE_WORKSPACE".to_owned(), w)),
        );
        env
    }

    /// One line for the start of the run: `run run-1-…: task t-1, project p, job j, agent
    /// a`.
    pub(super) fn describe(&self) -> String {
        let mut line = format!("run {}: task {}", self.run, self.task);
        if let Some(p) = &self.project {
            line.push_str(&format!(", project {p}"));
        }
        if let Some(j) = &self.job {
            line.push_str(&format!(", job {j}"));
        }
        if let Some(a) = &self.agent {
            line.push_str(&format!(", agent {a}"));
        }
        line
    }
}

/// Who starts the run: `--subject`, else the user ($USER when it is an id, else uid-N).
fn run_subject(given: Option<&str>) -> Result<String, RunError> {
    if let Some(s) = given {
        return match ids::valid(s) {
            true => Ok(s.to_owned()),
            false => Err(RunError::Usage(format!("--subject {s:?}: {}", ids::ID_RULE))),
        };
    }
    Ok(user_subject())
}

/// The user as a subject: $USER (else $LOGNAME) when it is an id, else `uid-N`. What a run
/// records without `--subject`, and what `sandgate mcp` gives its runs.
pub fn user_subject() -> String {
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME"));
    match user {
        Ok(u) if ids::valid(&u) => u,
        _ => format!("uid-{}", rustix::process::getuid().as_raw()),
    }
}

/// `run-PID-T`: T the start time in nanoseconds since the epoch, 16 hex digits, so run ids
/// (and the kept logs named after them) sort by start time ([`crate::runlog::prune`]).
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("run-{}-{nanos:016x}", std::process::id())
}

/// The node's name, from its certificate: a run that is a node of central proxies is
/// named under it (`node-a:run-PID-X`, `node-a:t-1`), so a central can let each node vouch
/// only for its own runs (`tasks: ["node-a:*"]`).
fn node_name(spec: &CentralSpec) -> Result<String, RunError> {
    sandgate_proxy::transport::tls::node_name(&spec.cert)
        .map_err(|e| RunError::Usage(format!("net.proxy.tls.cert: {e}")))?
        .ok_or_else(|| {
            RunError::Usage(format!(
                "net.proxy.tls.cert: {} names no node (no DNS or IP subject alternative name)",
                spec.cert.display()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orchestrators_ids_name_the_run_and_bad_ones_are_usage_errors() {
        let opts = RunOptions {
            task: Some("t-1".into()),
            job: Some("j-1".into()),
            subject: Some("alice".into()),
            agent: Some("mcp:claude-code".into()),
            ..RunOptions::default()
        };
        let id = RunIdentity::of(&opts, None).unwrap();
        assert_eq!(
            (id.task.as_str(), id.job.as_deref(), id.project.as_deref()),
            ("t-1", Some("j-1"), None)
        );
        assert!(id.run.starts_with("run-"), "{}", id.run);
        let env = id.env();
        assert!(env.contains(&("SANDGATE_TASK".into(), "t-1".into())), "{env:?}");
        assert!(env.contains(&("SANDGATE_JOB".into(), "j-1".into())), "{env:?}");
        assert!(
            env.contains(&("SANDGATE_AGENT".into(), "mcp:claude-code".into())),
            "{env:?}"
        );
        assert!(!env.iter().any(|(k, _)| k == "SANDGATE_PROJECT"), "{env:?}");
        assert!(!env.iter().any(|(k, _)| k == "SANDGATE_WORKSPACE"), "{env:?}");
        assert_eq!(
            id.describe(),
            format!("run {}: task t-1, job j-1, agent mcp:claude-code", id.run)
        );

        let unnamed = RunIdentity::of(&RunOptions::default(), None).unwrap();
        assert_eq!(unnamed.task, unnamed.run);

        let with_workspace = RunOptions {
            params: [("WORKSPACE".to_owned(), "/srv/work/a".to_owned())].into(),
            ..RunOptions::default()
        };
        let env = RunIdentity::of(&with_workspace, None).unwrap().env();
        assert!(
            env.contains(&("SANDGATE_WORKSPACE".into(), "/srv/work/a".into())),
            "{env:?}"
        );

        for (flag, opts) in [
            (
                "--task",
                RunOptions {
                    task: Some("a b".into()),
                    ..RunOptions::default()
                },
            ),
            (
                "--project",
                RunOptions {
                    project: Some("x\ny".into()),
                    ..RunOptions::default()
                },
            ),
            (
                "--job",
                RunOptions {
                    job: Some(String::new()),
                    ..RunOptions::default()
                },
            ),
            (
                "--agent",
                RunOptions {
                    agent: Some("a/b".into()),
                    ..RunOptions::default()
                },
            ),
            (
                "--task",
                RunOptions {
                    task: Some("t".repeat(129)),
                    ..RunOptions::default()
                },
            ),
        ] {
            match RunIdentity::of(&opts, None) {
                Err(RunError::Usage(m)) => assert!(m.starts_with(flag), "{m}"),
                other => panic!("{flag}: {other:?}"),
            }
        }
    }
}
