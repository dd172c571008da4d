//! The processes of a run, seen from the host: signals forwarded to the command, and what
//! is left behind killed when the run ends.
//!
//! Signals go through pidfds: each process is found in /proc together with its start time,
//! a pidfd is opened, and the start time is read again; only when it is unchanged does the
//! pidfd name the process that was found, and only then is it signalled. A pid recycled in
//! between is never hit.
//!
//! With a PID namespace (the default, and the only choice outside `net.mode: all`), the
//! kernel kills everything inside when the sandbox's PID 1 exits. Without one, sandgate is a
//! child subreaper: whatever the command left running (double-forked daemons, `setsid`)
//! becomes sandgate's child when its parent exits, and is killed and reaped at the end.
//! (Only then: with a PID namespace, being the subreaper would only hand sandgate bwrap's
//! exiting processes to reap, which costs start-up time for nothing.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rustix::process::Signal;

/// A process as /proc showed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    pid: i32,
    start_time: u64,
}

/// `(state, ppid, start time)` from /proc/PID/stat (fields 3, 4 and 22; the command name in
/// field 2 may hold spaces and parentheses, so fields are counted after its last `)`).
fn stat_of(pid: i32) -> Option<(char, i32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = text.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let start = fields.nth(17)?.parse().ok()?;
    Some((state, ppid, start))
}

/// Every process below `root`, parents before their children. A zombie (state `Z`) and
/// what lies below it are left out unless `with_zombies`: a zombie is dead already and only
/// waits to be reaped, except that a process whose first thread exited shows `Z` while its
/// other threads run on.
fn tree(root: i32, with_zombies: bool) -> Vec<Seen> {
    let mut children: BTreeMap<i32, Vec<Seen>> = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            match stat_of(pid) {
                Some(('Z', _, _)) if !with_zombies => {}
                Some((_, ppid, start_time)) => {
                    children.entry(ppid).or_default().push(Seen { pid, start_time })
                }
                None => {}
            }
        }
    }
    let mut out = Vec::new();
    let mut queue = std::collections::VecDeque::from([root]);
    while let Some(p) = queue.pop_front() {
        for seen in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            queue.push_back(seen.pid);
            out.push(*seen);
        }
    }
    out
}

/// Every live descendant of `root`, with its start time, skipping processes named `skip`
/// (bwrap's own, whose death would SIGKILL the sandbox).
fn descendants(root: i32, skip: Option<&str>) -> Vec<Seen> {
    tree(root, false)
        .into_iter()
        .filter(|seen| {
            let comm = std::fs::read_to_string(format!("/proc/{}/comm", seen.pid)).unwrap_or_default();
            skip.is_none_or(|s| comm.trim() != s)
        })
        .collect()
}

/// Signals `seen` if, and only if, it is still the process that was seen.
#[cfg(target_os = "linux")]
fn signal(seen: Seen, sig: Signal) {
    use rustix::process::{Pid, PidfdFlags, pidfd_open, pidfd_send_signal};
    let Some(pid) = Pid::from_raw(seen.pid) else {
        return;
    };
    let Ok(pidfd) = pidfd_open(pid, PidfdFlags::empty()) else {
        return;
    };
    // A zombie leader whose other threads run on is signalled too (the signal goes to the
    // whole process).
    if stat_of(seen.pid).is_some_and(|(_, _, start)| start == seen.start_time) {
        let _ = pidfd_send_signal(&pidfd, sig);
    }
}

/// Without pidfds a process cannot be held while its start time is checked, so nothing is
/// signalled; and without /proc, no process is ever seen ([`tree`] is empty). The bwrap
/// runner that needs this is refused before it starts elsewhere (`run::preflight`).
#[cfg(not(target_os = "linux"))]
fn signal(_seen: Seen, _sig: Signal) {}

/// Forwards SIGINT, SIGTERM and SIGHUP to the processes inside the sandbox (never to bwrap
/// itself). Runs until the caller stops polling it.
pub async fn forward_signals(bwrap_pid: Option<u32>) {
    use tokio::signal::unix::{SignalKind, signal as listen};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        listen(SignalKind::interrupt()),
        listen(SignalKind::terminate()),
        listen(SignalKind::hangup()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    loop {
        let sig = tokio::select! {
            _ = int.recv() => Signal::INT,
            _ = term.recv() => Signal::TERM,
            _ = hup.recv() => Signal::HUP,
        };
        let Some(root) = bwrap_pid.and_then(|p| i32::try_from(p).ok()) else {
            continue;
        };
        for seen in descendants(root, Some("bwrap")) {
            signal(seen, sig);
        }
    }
}

/// Can no thread of `pid` run user code any more? Each is stopped (`T`, `t`), dead (`Z`,
/// `X`), or in an uninterruptible wait with SIGSTOP pending (it stops before it returns to
/// user space: a parent waiting in vfork for a child that is stopped already). A process
/// that is gone holds still too.
fn held(pid: i32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    threads.flatten().all(|thread| {
        let dir = thread.path();
        let Ok(text) = std::fs::read_to_string(dir.join("stat")) else {
            return true;
        };
        let state = text
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        match state {
            Some("T" | "t" | "Z" | "X") | None => true,
            Some("D") => stop_pending(&dir),
            Some(_) => false,
        }
    })
}

/// Is SIGSTOP pending for the thread (its own or its process's pending set)?
fn stop_pending(thread_dir: &std::path::Path) -> bool {
    let bit = 1u64 << (libc::SIGSTOP - 1);
    let status = std::fs::read_to_string(thread_dir.join("status")).unwrap_or_default();
    status.lines().any(|line| {
        let mask = line
            .strip_prefix("SigPnd:")
            .or_else(|| line.strip_prefix("ShdPnd:"));
        mask.and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & bit != 0)
    })
}

/// The sandbox's processes, stopped; they continue when this is dropped, children before
/// their parents (a parent that saw its child stop would otherwise be told of it: a job
/// control shell inside takes its job off the terminal).
#[derive(Debug)]
pub struct Frozen {
    root: i32,
    stopped: Vec<Seen>,
}

impl Frozen {
    /// Does the freeze still hold: every process below the root stopped, none continued
    /// (a SIGCONT from outside, a shell's `fg`) and none new? Blocking (it reads /proc).
    pub fn holds(&self) -> bool {
        tree(self.root, true).into_iter().all(|seen| held(seen.pid))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        while let Some(seen) = self.stopped.pop() {
            signal(seen, Signal::CONT);
        }
    }
}

/// Rounds of [`freeze`]: a process that forks as fast as it can is stopped in a few; one
/// that outruns this many scans is a storm, and the caller gives up.
const FREEZE_ROUNDS: u32 = 200;

/// Stops every process below `root` (SIGSTOP through pidfds; nothing can ignore it), parents
/// before children, scanning again until a scan finds every thread of every one of them
/// held ([`held`]): a child forked while its parent was being stopped is found by the next
/// scan, and a process not yet stopped that continues another (SIGCONT) is caught the same
/// way. `None` when they would not all hold still within [`FREEZE_ROUNDS`]; those stopped
/// continue. Blocking (it reads /proc).
pub fn freeze(root: i32) -> Option<Frozen> {
    let mut frozen = Frozen {
        root,
        stopped: Vec::new(),
    };
    for _ in 0..FREEZE_ROUNDS {
        let running: Vec<Seen> = tree(root, true)
            .into_iter()
            .filter(|seen| !held(seen.pid))
            .collect();
        if running.is_empty() {
            return Some(frozen);
        }
        for seen in running {
            signal(seen, Signal::STOP);
            if !frozen.stopped.contains(&seen) {
                frozen.stopped.push(seen);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// Makes sandgate the reaper of whatever the sandbox orphans (see the module docs).
pub fn become_subreaper() {
    #[cfg(target_os = "linux")]
    let made = nix::sys::prctl::set_child_subreaper(true).map_err(|e| e.to_string());
    #[cfg(not(target_os = "linux"))]
    let made: Result<(), String> = Err("child subreapers exist on Linux only".to_owned());
    if let Err(e) = made {
        tracing::warn!(error = %e, "cannot become a child subreaper; without a PID namespace, leftover processes may survive the run");
    }
}

/// Kills and reaps every process still below sandgate (call after bwrap has been waited
/// for). Bounded: a process that keeps forking is chased for at most a few seconds.
pub fn kill_leftovers() {
    let Ok(me) = i32::try_from(std::process::id()) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        reap();
        let left = descendants(me, None);
        if left.is_empty() || Instant::now() > deadline {
            if !left.is_empty() {
                tracing::warn!(count = left.len(), "processes of the run could not be killed");
            }
            return;
        }
        for seen in left {
            signal(seen, Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Collects exited children (zombies), without waiting for live ones.
fn reap() {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    while let Ok(status) = waitpid(nix::unistd::Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_stat_parses_and_a_child_is_found_and_signalled() {
        let me = std::process::id() as i32;
        let (state, ppid, start) = stat_of(me).unwrap();
        assert!(ppid > 0 && start > 0 && state != 'Z');
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let found = descendants(me, None);
        let seen = *found.iter().find(|s| s.pid == child.id() as i32).unwrap();
        // A stale start time names another process: nothing is sent.
        signal(
            Seen {
                start_time: seen.start_time + 1,
                ..seen
            },
            Signal::KILL,
        );
        assert!(child.try_wait().unwrap().is_none());
        signal(seen, Signal::KILL);
        let status = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9));
    }
}
