//! Enforcing a run's [`Limits`]: a cgroup of its own where one can be had, rlimits where not.
//!
//! - **cgroup**: for each of the `pids` and `memory` controllers, a directory
//!   `sandgate-RUN` under this process's own cgroup in a hierarchy that has the controller
//!   (cgroup v1: the controller's own mount; v2: the unified mount, where this cgroup
//!   delegates the controller to its children) and that this process may write. Its limit
//!   files are written, and the child that becomes bwrap moves itself into it before its
//!   execve ([`crate::exec::CgroupJoin`]), so every process of the sandbox is counted from
//!   its first fork. Removed after
//!   the run. Usually root has one; an ordinary user has one under a delegated systemd unit.
//! - **rlimits** (always, inside the sandbox, just before the command: by the init in the
//!   child it forks for it, or by `sandbox-exec` where there is no init):
//!   `RLIMIT_NPROC` (processes of the user inside the sandbox's user namespace; the kernel
//!   does not apply it to root, so a root run without a `pids` cgroup has no process limit,
//!   and the run says so), `RLIMIT_DATA` for memory when no memory cgroup holds it (each
//!   process's private writable memory: heap, anonymous mappings, thread stacks; unlike
//!   `RLIMIT_AS` it does not count reservations such as V8's or Go's), `RLIMIT_CPU`,
//!   `RLIMIT_NOFILE`.
//! - **tmpfs**: bubblewrap's `--size` before every `--tmpfs` ([`crate::argv`]).
//!
//! What held is reported by [`Enforcement::describe`] (debug log, and a warning when a limit
//! could not be enforced at all).

use std::path::{Path, PathBuf};

use crate::policy::Limits;

/// A run's cgroup directories (one per hierarchy used), removed on drop.
#[derive(Debug, Default)]
pub struct RunCgroup {
    dirs: Vec<PathBuf>,
    /// Controllers whose limit is held here: `pids`, `memory`.
    held: Vec<&'static str>,
}

/// How each limit is enforced in one run.
#[derive(Debug)]
pub struct Enforcement {
    pub cgroup: RunCgroup,
    /// `name=value` pairs for `sandbox-init --rlimit` (or `sandbox-exec --rlimit`).
    pub rlimits: Vec<String>,
    /// Limits asked for that nothing enforces here.
    pub unenforced: Vec<String>,
}

impl RunCgroup {
    /// The `cgroup.procs` file of each of the run's cgroups ([`crate::exec::CgroupJoin`]
    /// joins them).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    pub fn holds(&self, controller: &str) -> bool {
        self.held.contains(&controller)
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            // Emptied when the sandbox's last process is reaped, which may trail bwrap's
            // exit by a moment: tried again in short steps for 10 ms at most (the run's exit
            // waits on it); one still busy then is removed by the next run's sweep.
            for _ in 0..5 {
                match std::fs::remove_dir(dir) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    _ => break,
                }
            }
        }
    }
}

impl Enforcement {
    /// One line saying what holds each limit, for the debug log.
    pub fn describe(&self) -> String {
        let cg = if self.cgroup.held.is_empty() {
            "no cgroup".to_owned()
        } else {
            format!("cgroup ({})", self.cgroup.held.join(", "))
        };
        format!("limits: {cg}; rlimits {}", self.rlimits.join(" "))
    }
}

/// Plans the run's limits: a cgroup where possible (created here), rlimits for the rest.
pub fn enforce(run: &str, limits: &Limits) -> Enforcement {
    let mut cgroup = RunCgroup::default();
    if limits.processes.is_some() || limits.memory.is_some() {
        make_cgroup(run, limits, &mut cgroup);
    }
    let rlimits = rlimits(limits, &cgroup);
    let mut unenforced = Vec::new();
    if let Some(n) = limits.processes
        && !cgroup.holds("pids")
        && rustix::process::getuid().is_root()
    {
        unenforced.push(format!(
            "processes={n} (root is exempt from RLIMIT_NPROC and no pids cgroup could be made)"
        ));
    }
    Enforcement {
        cgroup,
        rlimits,
        unenforced,
    }
}

/// The rlimits set just before the command: all asked for, but memory where a cgroup holds it.
pub fn rlimits(limits: &Limits, cgroup: &RunCgroup) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(n) = limits.processes {
        out.push(format!("nproc={n}"));
    }
    if let (Some(bytes), false) = (limits.memory, cgroup.holds("memory")) {
        out.push(format!("data={bytes}"));
    }
    if let Some(s) = limits.cpu_seconds {
        out.push(format!("cpu={s}"));
    }
    if let Some(n) = limits.open_files {
        out.push(format!("nofile={n}"));
    }
    out
}

/// A cgroup hierarchy this process is in: where it is mounted, and this process's
/// directory in it.
#[derive(Debug, PartialEq, Eq)]
struct Hierarchy {
    own: PathBuf,
    /// Controllers it can limit for a child: v1 the mount's, v2 this cgroup's
    /// `cgroup.subtree_control`.
    controllers: Vec<String>,
}

fn make_cgroup(run: &str, limits: &Limits, cgroup: &mut RunCgroup) {
    let (Ok(mountinfo), Ok(own)) = (
        std::fs::read_to_string("/proc/self/mountinfo"),
        std::fs::read_to_string("/proc/self/cgroup"),
    ) else {
        return;
    };
    let wanted: [(&'static str, Option<u64>); 2] = [("pids", limits.processes), ("memory", limits.memory)];
    // Only where a run's cgroup can be (a hierarchy with one of the two controllers): on
    // cgroup v1 the others are eight more directories to list on every run.
    for hierarchy in hierarchies(&mountinfo, &own) {
        if hierarchy
            .controllers
            .iter()
            .any(|h| wanted.iter().any(|(c, _)| h == c))
        {
            sweep(&hierarchy.own);
        }
    }
    for hierarchy in hierarchies(&mountinfo, &own) {
        let here: Vec<(&'static str, u64)> = wanted
            .iter()
            .filter(|(c, v)| v.is_some() && !cgroup.holds(c) && hierarchy.controllers.iter().any(|h| h == c))
            .filter_map(|(c, v)| Some((*c, (*v)?)))
            .collect();
        if here.is_empty() {
            continue;
        }
        let dir = hierarchy.own.join(format!("sandgate-{run}"));
        if std::fs::create_dir(&dir).is_err() {
            continue;
        }
        let mut held = Vec::new();
        for (controller, value) in here {
            let files: &[&str] = match controller {
                "pids" => &["pids.max"],
                _ => &["memory.max", "memory.limit_in_bytes"],
            };
            if files
                .iter()
                .any(|f| std::fs::write(dir.join(f), value.to_string()).is_ok())
            {
                held.push(controller);
                if controller == "memory" {
                    // No swap beyond the limit where the host has swap (v2: none at all;
                    // v1: memory and swap together at the same figure). Absent files (no
                    // swap accounting) leave the limit as RAM alone.
                    let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                    let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), value.to_string());
                }
            }
        }
        if held.is_empty() {
            let _ = std::fs::remove_dir(&dir);
            continue;
        }
        cgroup.held.extend(held);
        cgroup.dirs.push(dir);
    }
}

/// Removes the cgroups of runs whose sandgate is gone (killed with SIGKILL, so its own
/// removal never ran): `sandgate-run-PID-...` (or `sandgate-NODE:run-PID-...`) whose PID no
/// longer exists. `rmdir` removes only an empty cgroup, so a live sandbox is never touched.
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(run_pid) else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

/// The sandgate pid a run cgroup's name carries.
fn run_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("sandgate-")?;
    let id = rest.rsplit_once(':').map_or(rest, |(_, run)| run);
    id.strip_prefix("run-")?.split('-').next()?.parse().ok()
}

/// The cgroup hierarchies of `/proc/self/mountinfo` joined with `/proc/self/cgroup`.
fn hierarchies(mountinfo: &str, own: &str) -> Vec<Hierarchy> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = before.split(' ').collect();
        let after: Vec<&str> = after.split(' ').collect();
        let (Some(root), Some(mount), Some(fstype), Some(options)) =
            (fields.get(3), fields.get(4), after.first(), after.get(2))
        else {
            continue;
        };
        let path = match *fstype {
            "cgroup2" => own_path(own, |c| c.is_empty()),
            "cgroup" => own_path(own, |c| c.split(',').any(|c| options.split(',').any(|o| o == c))),
            _ => continue,
        };
        let Some(path) = path else { continue };
        // Inside a container the mount's root may be this cgroup's ancestor.
        let Ok(relative) = Path::new(&path).strip_prefix(root) else {
            continue;
        };
        let dir = Path::new(mount).join(relative);
        let controllers = match *fstype {
            "cgroup2" => std::fs::read_to_string(dir.join("cgroup.subtree_control"))
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            _ => options.split(',').map(str::to_owned).collect(),
        };
        out.push(Hierarchy {
            own: dir,
            controllers,
        });
    }
    out
}

/// This process's path in the hierarchy whose controller list matches.
fn own_path(own: &str, matches: impl Fn(&str) -> bool) -> Option<String> {
    own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        matches(controllers).then(|| path.to_owned())
    })
}

/// An rlimit read from `--rlimit NAME=VALUE`, to be set by [`set_rlimits`].
pub type Rlimit = (nix::sys::resource::Resource, u64);

/// `--rlimit NAME=VALUE` (of `sandbox-exec` and `sandbox-init`), read before anything is set.
pub fn parse_rlimits(specs: &[String]) -> Result<Vec<Rlimit>, String> {
    use nix::sys::resource::Resource;
    specs
        .iter()
        .map(|spec| {
            let (name, value) = spec
                .split_once('=')
                .ok_or_else(|| format!("invalid --rlimit {spec:?}"))?;
            let value: u64 = value.parse().map_err(|_| format!("invalid --rlimit {spec:?}"))?;
            let resource = match name {
                #[cfg(target_os = "linux")]
                "nproc" => Resource::RLIMIT_NPROC,
                // Set inside the Linux sandbox only (seatbelt runs set none).
                #[cfg(not(target_os = "linux"))]
                "nproc" => return Err("the limit nproc is set inside the Linux sandbox only".to_owned()),
                "data" => Resource::RLIMIT_DATA,
                "cpu" => Resource::RLIMIT_CPU,
                "nofile" => Resource::RLIMIT_NOFILE,
                _ => return Err(format!("invalid --rlimit {spec:?}")),
            };
            Ok((resource, value))
        })
        .collect()
}

/// Sets each limit, soft and hard, before the command runs. Allocates nothing (it may run in
/// the child of a fork, [`crate::exec::Confinement`]).
pub fn set_rlimits(limits: &[Rlimit]) -> Result<(), nix::errno::Errno> {
    use nix::sys::resource::{getrlimit, setrlimit};
    for &(resource, value) in limits {
        // Only ever lowered: above the hard limit in force, that limit stays (an ordinary user
        // cannot raise it, and the run is no less limited for it).
        let (_, hard) = getrlimit(resource)?;
        let value = value.min(hard);
        setrlimit(resource, value, value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw
31 30 0:27 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
32 30 0:28 /process_api /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
33 30 0:29 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";
    const CGROUP: &str = "8:pids:/\n4:memory:/process_api/abc\n0::/user.slice/u.service\n";

    #[test]
    fn swept_cgroups_are_named_after_their_sandgate() {
        assert_eq!(run_pid("sandgate-run-4242-188b6f0e1c2d3a4b"), Some(4242));
        assert_eq!(run_pid("sandgate-node-a:run-17-188b6f0e1c2d3a4b"), Some(17));
        for other in [
            "sandgate-",
            "run-1-2",
            "sandgate-run-x-1",
            "system.slice",
            "sandgate-runner",
        ] {
            assert_eq!(run_pid(other), None, "{other}");
        }
    }

    #[test]
    fn hierarchies_join_mounts_and_own_paths() {
        let h = hierarchies(MOUNTINFO, CGROUP);
        assert_eq!(h.len(), 3, "{h:?}");
        assert_eq!(h[0].own, Path::new("/sys/fs/cgroup/pids/"));
        assert!(h[0].controllers.iter().any(|c| c == "pids"));
        assert_eq!(h[1].own, Path::new("/sys/fs/cgroup/memory/abc"));
        assert_eq!(h[2].own, Path::new("/sys/fs/cgroup/unified/user.slice/u.service"));
    }
}
