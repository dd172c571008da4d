//! What a process costs, read from /proc (proc(5)): resident memory and CPU time of a
//! process and its direct children. Linux only, like the harness's pinning.

use std::time::Duration;

/// The fields of `/proc/PID/stat` after the parenthesised command (which may itself hold
/// spaces and parentheses): index 0 is field 3, `state`.
fn stat_fields(pid: u32) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()
        .map(|rest| rest.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// `pid` and the processes whose parent it is.
fn with_children(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            // Field 4 is the parent pid.
            if stat_fields(child).get(1).and_then(|p| p.parse::<u32>().ok()) == Some(pid) {
                pids.push(child);
            }
        }
    }
    pids
}

/// Resident memory of `pid` and its direct children, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    with_children(pid)
        .iter()
        .map(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status"))
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        })
        .sum()
}

/// Clock ticks per second of the times in `/proc/PID/stat` (`getconf CLK_TCK`; 100, the
/// value Linux exports on every architecture it runs on, when getconf is missing).
pub fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok()?.trim().parse().ok())
        .filter(|&hz| hz > 0)
        .unwrap_or(100)
}

/// CPU time used, user and system (the kernel's work on the process's behalf) apart.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    pub user: Duration,
    pub system: Duration,
}

impl Cpu {
    /// User and system together.
    pub fn total(self) -> Duration {
        self.user + self.system
    }

    fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }

    fn of_ticks((user, system): (u64, u64), ticks_per_sec: u64) -> Cpu {
        Cpu {
            user: ticks_to_time(user, ticks_per_sec),
            system: ticks_to_time(system, ticks_per_sec),
        }
    }
}

/// CPU time (every thread) `pids` and their direct children have used, to a resolution of
/// one clock tick (10 ms at 100 ticks a second).
pub fn cpu_time(pids: &[u32], ticks_per_sec: u64) -> Cpu {
    let ticks = pids
        .iter()
        .flat_map(|&p| with_children(p))
        .map(cpu_ticks)
        .fold((0, 0), |(u, s), (du, ds)| (u + du, s + ds));
    Cpu::of_ticks(ticks, ticks_per_sec)
}

/// The same for this process alone (the load generator and its servers; its children are
/// the proxies under test).
pub fn own_cpu_time(ticks_per_sec: u64) -> Cpu {
    Cpu::of_ticks(cpu_ticks(std::process::id()), ticks_per_sec)
}

/// The CPU the proxy under test (`pids` and their children) and the load generator (this
/// process: client and servers) use over one scenario, read at its start and its end.
#[derive(Debug)]
pub struct Meter {
    pids: Vec<u32>,
    ticks_per_sec: u64,
    proxy: Cpu,
    load: Cpu,
}

/// What a [`Meter`] read: the proxy's CPU and the load side's.
#[derive(Debug, Clone, Copy)]
pub struct Used {
    pub proxy: Cpu,
    pub load: Cpu,
}

impl Meter {
    /// Starts reading: what both have used so far.
    pub fn start(pids: Vec<u32>, ticks_per_sec: u64) -> Meter {
        let proxy = cpu_time(&pids, ticks_per_sec);
        Meter {
            pids,
            ticks_per_sec,
            proxy,
            load: own_cpu_time(ticks_per_sec),
        }
    }

    /// What the proxy and the load used since [`Meter::start`].
    pub fn stop(&self) -> Used {
        Used {
            proxy: cpu_time(&self.pids, self.ticks_per_sec).since(self.proxy),
            load: own_cpu_time(self.ticks_per_sec).since(self.load),
        }
    }
}

/// utime and stime (fields 14 and 15), in clock ticks.
fn cpu_ticks(pid: u32) -> (u64, u64) {
    let f = stat_fields(pid);
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (field(11), field(12))
}

fn ticks_to_time(ticks: u64, ticks_per_sec: u64) -> Duration {
    Duration::from_secs_f64(ticks as f64 / ticks_per_sec.max(1) as f64)
}
