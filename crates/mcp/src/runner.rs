//! One `run`: `sandgate run --no-terminal --policy P` as a child process in a session of its
//! own (through `sandgate mcp-session`, [`crate::session`]: no terminal to read, write or
//! take), with pipes for stdin, stdout and stderr (never the server's own stdout, which
//! carries the protocol), the server's own files protected and the run's limits given, the
//! output kept up to the gate's size and the rest counted, the whole process group (the
//! session's) killed at the time limit, and the destinations the run's proxy refused read
//! back from the run's own audit log. The command line is a pure function ([`argv`]).
//!
//! A run can also be stopped from outside, before its end: the caller hands [`run`] a
//! future that completes when the run must stop ([`Stopping`]: the server's watch over the
//! tweaks the run holds, `crate::watch`). Then the group gets SIGTERM at once, and SIGKILL
//! [`STOP_GRACE`] later, so a command that ignores SIGTERM is gone within about a second
//! too, while why is found out ([`Stopped`]); the report says why, and keeps no more output
//! than the plain gates allow (`plain_output_bytes`: what a revoked output tweak gave is
//! not handed over). The whole group is killed when the run's future is dropped too (the
//! client gone, the server stopping): nothing it started outlives it.
//!
//! The command is told its workspace: `SANDGATE_WORKSPACE` (`sandgate run` sets it from the
//! `WORKSPACE` parameter), and it starts there (`--chdir`) when its policy binds
//! `${WORKSPACE}` and sets no `fs.cwd` of its own. The workspace is passed as the canonical
//! path the gates checked (a fresh one canonical too): `sandgate run` refuses a workspace
//! that no longer names itself, and binds what it opened and checked, so a component of the
//! path swapped for a symlink after the check (by a concurrent run that can write a parent
//! directory) makes the run refused rather than bind somewhere else.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::Serialize;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// How long a timed-out run gets between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// How long a stopped run gets between SIGTERM and SIGKILL: what it was let do has ended.
pub const STOP_GRACE: Duration = Duration::from_millis(500);

/// What to run. The policy sees `${WORKSPACE}`: the workspace named (canonical, as the
/// gates checked it), or a fresh empty directory of the run's own.
#[derive(Debug, Clone)]
pub struct RunSpec<'a> {
    pub sandgate: &'a Path,
    pub policy: &'a Path,
    pub command: &'a [String],
    pub stdin: &'a [u8],
    pub workspace: Option<&'a Path>,
    pub limit: Duration,
    pub max_output_bytes: usize,
    /// Bytes kept of each stream when the run is stopped: the plain gates' cap, without
    /// the tweaks.
    pub plain_output_bytes: usize,
    /// The person the server runs as (its OS user): the run's `--subject`.
    pub subject: &'a str,
    /// The client that asked for the run (`mcp:CLIENT`, its stated name): the run's
    /// `--agent`.
    pub agent: &'a str,
    /// The server's task: the run's `--task`, so the task's scoped entries and exceptions
    /// apply to its runs.
    pub task: &'a str,
    /// The run's own job id ([`next_job`]): its `--job`, on each of its requests.
    pub job: &'a str,
    /// The server's own files (`--protect`): read-only in the run.
    pub protect: &'a [PathBuf],
    /// `--limit NAME=VALUE` values ([`crate::limits::flags`]).
    pub limits: &'a [String],
    /// Start the command in its workspace (`--chdir`): the policy binds it.
    pub start_in_workspace: bool,
}

/// A destination the run's proxy refused (or its upstream did).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
pub struct Blocked {
    pub host: String,
    pub port: u16,
    /// The audit reason: `not_allowlisted`, `destination_ip_prohibited`, `upstream_denied`, ...
    pub reason: String,
}

/// What a run did.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RunReport {
    /// The command's exit status (sandgate's own failures: 64 usage, 69 unavailable, 70 the
    /// sandbox could not be set up); `null` when it was killed.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Killed at the time limit.
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout: String,
    pub stderr: String,
    /// Bytes each stream wrote in all (more than shown when truncated).
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Destinations refused during the run.
    pub blocked: Vec<Blocked>,
    /// Set when the server stopped the run before its end: a tweak it ran under ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Stopped>,
}

/// Why the server stopped a run before its end (not its own time limit): the tweaks it ran
/// under that were revoked, expired or otherwise ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Stopped {
    /// In words, also the last line of the run's `stderr`.
    pub message: String,
    /// Each tweak whose end stopped the run.
    pub tweaks: Vec<EndedTweak>,
}

/// A tweak that ended while a run held it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct EndedTweak {
    /// The exception's id.
    pub id: String,
    /// `revoked`, `expired`, `denied`, `narrowed` (still approved, for less), or `ended` (no
    /// longer approved, the control plane not saying how).
    pub state: String,
    /// What it gave the run, as `sandbox=web max_seconds=120`.
    pub tweak: String,
}

/// The arguments given to `spec.sandgate`: the session step, then `sandgate run` with the
/// run's audit log `audit` and `workspace` as `${WORKSPACE}`.
pub fn argv(spec: &RunSpec<'_>, audit: &Path, workspace: &Path) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec![crate::session::SUBCOMMAND.into(), "--".into()];
    a.push(spec.sandgate.into());
    for word in ["run", "--quiet", "--no-terminal", "--policy"] {
        a.push(word.into());
    }
    a.push(spec.policy.into());
    a.push("--audit-log".into());
    a.push(audit.into());
    for (flag, value) in [
        ("--subject", spec.subject),
        ("--agent", spec.agent),
        ("--task", spec.task),
        ("--job", spec.job),
    ] {
        a.push(flag.into());
        a.push(value.into());
    }
    a.push("--param".into());
    let param = sandgate_sandbox::run::WORKSPACE_PARAM;
    a.push(format!("{param}={}", workspace.display()).into());
    if spec.start_in_workspace {
        a.push("--chdir".into());
        a.push(workspace.into());
    }
    for path in spec.protect {
        a.push("--protect".into());
        a.push(path.into());
    }
    for limit in spec.limits {
        a.push("--limit".into());
        a.push(limit.into());
    }
    a.push("--".into());
    a.extend(spec.command.iter().map(OsString::from));
    a
}

/// A job id for one run, unique among this server's runs and across its restarts:
/// `mcp-PID-N`.
pub fn next_job() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("mcp-{}-{n}", std::process::id())
}

/// How a run's wait ended.
enum End {
    Exited(Option<std::process::ExitStatus>),
    TimedOut,
    Stopped(Stopping),
}

/// A run that must stop now, and the future that finds out why (it may ask the control
/// plane): the run is stopped first, never after the asking.
pub type Stopping = std::pin::Pin<Box<dyn std::future::Future<Output = Stopped> + Send>>;

/// Kills a run's whole process group when dropped: on every way out of [`run`], its
/// future dropped included.
struct Group(Option<u32>);

impl Drop for Group {
    fn drop(&mut self) {
        kill_group(self.0, rustix::process::Signal::KILL);
    }
}

/// Runs `spec` and reports; `stop` completing stops it ([`std::future::pending`]: never).
/// `Err`: the run could not be started at all.
pub async fn run(
    spec: &RunSpec<'_>,
    stop: impl std::future::Future<Output = Stopping>,
) -> Result<RunReport, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    let audit: PathBuf = dir.path().join("audit.jsonl");
    // Without a workspace named, each run gets a fresh empty one of its own: runs share
    // nothing unless the agent names the same allowed directory.
    let scratch = dir.path().join("workspace");
    // Canonical either way: `sandgate run` refuses a workspace that does not name itself.
    let workspace = match spec.workspace {
        Some(ws) => ws.to_path_buf(),
        None => {
            std::fs::create_dir(&scratch).map_err(|e| format!("cannot create the run's workspace: {e}"))?;
            std::fs::canonicalize(&scratch).map_err(|e| format!("cannot resolve the run's workspace: {e}"))?
        }
    };
    let mut cmd = tokio::process::Command::new(spec.sandgate);
    // Not a process group of its own here: the session step's setsid(2) would fail for a
    // group leader. Its new session is also its process group, with its process id.
    cmd.args(argv(spec, &audit, &workspace))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start sandgate run: {e}"))?;
    let pgid = child.id();
    // Whatever the command left behind in its group goes with it, however this ends.
    let _group = Group(pgid);
    let stdin = child.stdin.take();
    let input = spec.stdin.to_vec();
    let feed = tokio::spawn(async move {
        if let Some(mut s) = stdin {
            // A command that does not read its input is not an error.
            let _ = s.write_all(&input).await;
        }
    });
    let cap = spec.max_output_bytes;
    let out = tokio::spawn(capture(child.stdout.take(), cap));
    let err = tokio::spawn(capture(child.stderr.take(), cap));
    let end = tokio::select! {
        biased;
        status = child.wait() => End::Exited(status.ok()),
        () = tokio::time::sleep(spec.limit) => End::TimedOut,
        why = stop => End::Stopped(why),
    };
    let (status, timed_out, stopped) = match end {
        End::Exited(status) => (status, false, None),
        End::TimedOut => (end_group(&mut child, pgid, KILL_GRACE).await, true, None),
        End::Stopped(naming) => {
            let (status, why) = tokio::join!(end_group(&mut child, pgid, STOP_GRACE), naming);
            (status, false, Some(why))
        }
    };
    kill_group(pgid, rustix::process::Signal::KILL);
    feed.abort();
    let (mut stdout, stdout_bytes) = out.await.unwrap_or_default();
    let (mut stderr, stderr_bytes) = err.await.unwrap_or_default();
    if stopped.is_some() {
        stdout.truncate(spec.plain_output_bytes);
        stderr.truncate(spec.plain_output_bytes);
    }
    let mut stderr = shown(&stderr, stderr_bytes);
    if let Some(why) = &stopped {
        stderr.push_str(&format!("\n[sandgate: {}]", why.message));
    }
    use std::os::unix::process::ExitStatusExt;
    Ok(RunReport {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        timed_out,
        duration_ms: started.elapsed().as_millis() as u64,
        stdout: shown(&stdout, stdout_bytes),
        stderr,
        stdout_bytes,
        stderr_bytes,
        blocked: blocked(&audit),
        stopped,
    })
}

/// Ends a run's process group: SIGTERM, then SIGKILL after `grace`; the child's status.
async fn end_group(
    child: &mut tokio::process::Child,
    pgid: Option<u32>,
    grace: Duration,
) -> Option<std::process::ExitStatus> {
    kill_group(pgid, rustix::process::Signal::TERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            kill_group(pgid, rustix::process::Signal::KILL);
            // Before its setsid the child is in the server's group, not its own.
            let _ = child.start_kill();
            child.wait().await.ok()
        }
    }
}

fn kill_group(pgid: Option<u32>, signal: rustix::process::Signal) {
    if let Some(pid) = pgid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// Reads a stream to its end, keeping the first `cap` bytes; returns them and the total.
async fn capture<R: AsyncRead + Unpin>(stream: Option<R>, cap: usize) -> (Vec<u8>, u64) {
    let Some(mut stream) = stream else {
        return (Vec::new(), 0);
    };
    let mut kept = Vec::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                total += n as u64;
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(buf.get(..n.min(room)).unwrap_or_default());
            }
        }
    }
    (kept, total)
}

/// The text shown for a stream, with a marker where it was cut.
fn shown(kept: &[u8], total: u64) -> String {
    let mut text = String::from_utf8_lossy(kept).into_owned();
    if total > kept.len() as u64 {
        text.push_str(&format!(
            "\n[sandgate: output truncated: {} of {total} bytes shown]",
            kept.len()
        ));
    }
    text
}

/// The destinations refused during a run, from its audit log (through the audit trail's
/// reader, as the run summary reads it): denials, and allowed requests the upstream proxy
/// refused. Requests that named no valid destination are left out.
pub fn blocked(audit: &Path) -> Vec<Blocked> {
    use sandgate_sandbox::summary::{self, Unreached};
    let (records, _) = summary::read(audit);
    let refused = summary::misses(&records).filter(|m| m.unreached == Unreached::Blocked);
    let found: BTreeSet<Blocked> = refused
        .filter_map(|m| {
            let dest = m.dest?;
            Some(Blocked {
                host: dest.host.clone(),
                port: dest.port,
                reason: m.reason.to_owned(),
            })
        })
        .collect();
    found.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_a_session_of_its_own_in_its_workspace_with_the_server_files_protected() {
        let command = ["python3".to_owned(), "-c".to_owned(), "1".to_owned()];
        let protect = [PathBuf::from("/srv/mcp.yaml"), PathBuf::from("/srv/audit.jsonl")];
        let limits = ["processes=256".to_owned(), "cpu=60".to_owned()];
        let spec = RunSpec {
            sandgate: Path::new("/usr/bin/sandgate"),
            policy: Path::new("/srv/p.yaml"),
            command: &command,
            stdin: b"",
            workspace: None,
            limit: Duration::from_secs(60),
            max_output_bytes: 10,
            plain_output_bytes: 10,
            subject: "alice",
            agent: "mcp:client",
            task: "agent-7",
            job: "mcp-1-1",
            protect: &protect,
            limits: &limits,
            start_in_workspace: true,
        };
        let a = argv(
            &spec,
            Path::new("/tmp/r/audit.jsonl"),
            Path::new("/tmp/r/workspace"),
        );
        let words: Vec<&str> = a.iter().map(|w| w.to_str().unwrap_or("?")).collect();
        assert_eq!(
            words,
            [
                "mcp-session",
                "--",
                "/usr/bin/sandgate",
                "run",
                "--quiet",
                "--no-terminal",
                "--policy",
                "/srv/p.yaml",
                "--audit-log",
                "/tmp/r/audit.jsonl",
                "--subject",
                "alice",
                "--agent",
                "mcp:client",
                "--task",
                "agent-7",
                "--job",
                "mcp-1-1",
                "--param",
                "WORKSPACE=/tmp/r/workspace",
                "--chdir",
                "/tmp/r/workspace",
                "--protect",
                "/srv/mcp.yaml",
                "--protect",
                "/srv/audit.jsonl",
                "--limit",
                "processes=256",
                "--limit",
                "cpu=60",
                "--",
                "python3",
                "-c",
                "1"
            ]
        );
    }

    #[test]
    fn output_is_cut_with_a_marker() {
        assert_eq!(shown(b"abc", 3), "abc");
        assert_eq!(
            shown(b"abc", 10),
            "abc\n[sandgate: output truncated: 3 of 10 bytes shown]"
        );
    }

    #[tokio::test]
    async fn capture_keeps_the_cap_and_counts_the_rest() {
        let data = vec![7u8; 100_000];
        let (kept, total) = capture(Some(&data[..]), 10).await;
        assert_eq!((kept.len(), total), (10, 100_000));
    }

    #[test]
    fn blocked_destinations_come_from_denials_and_upstream_refusals() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let audit = dir.path().join("a.jsonl");
        let line = |fields: &str| {
            format!(r#"{{"schema_version":1,"created_at":"2026-11-22T10:00:00Z","request_id":"r",{fields}}}"#)
        };
        let lines = [
            line(
                r#""event":"decision","decision":"deny","reason_code":"not_allowlisted","destination_host":"evil.test","destination_port":443"#,
            ),
            line(
                r#""event":"decision","decision":"deny","reason_code":"not_allowlisted","destination_host":"evil.test","destination_port":443"#,
            ),
            line(
                r#""event":"decision","decision":"allow","reason_code":"allowlisted","destination_host":"ok.test","destination_port":443"#,
            ),
            line(
                r#""event":"close","outcome":"upstream_failure:upstream_denied","destination_host":"up.test","destination_port":80"#,
            ),
            line(
                r#""event":"close","outcome":"upstream_failure:dns","destination_host":"gone.test","destination_port":443"#,
            ),
            line(
                r#""event":"decision","decision":"deny","reason_code":"malformed_head","destination_host":null"#,
            ),
            "not json".to_owned(),
        ];
        std::fs::write(&audit, lines.join("\n")).unwrap_or_else(|e| unreachable!("{e}"));
        let b = blocked(&audit);
        assert_eq!(
            b.iter()
                .map(|b| (b.host.as_str(), b.port, b.reason.as_str()))
                .collect::<Vec<_>>(),
            [
                ("evil.test", 443, "not_allowlisted"),
                ("up.test", 80, "upstream_denied")
            ]
        );
    }
}
