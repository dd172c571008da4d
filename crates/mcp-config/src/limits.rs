//! A run's limits: the ceilings a sandbox's `gates.limits` sets (the keys of a policy's
//! `limits:`, each read with the sandbox crate's grammar), the limits an admitted run gets
//! (for each, the lower of the ceiling and the policy's own: the gates never loosen a
//! policy), and those as `sandgate run --limit` values. Pure.

use sandgate_sandbox::policy::{Limits, RawLimits};

/// Default ceilings of a run's limits (`gates.limits`).
pub const DEFAULT_PROCESSES: u64 = 256;
pub const DEFAULT_MEMORY: u64 = 4 << 30;
pub const DEFAULT_TMPFS: u64 = 512 << 20;

/// Ceilings on a run's limits (`gates.limits`, the keys of a policy's `limits:`): a run gets
/// the lower of each and its policy's own; `None` (`off`) sets no ceiling, so the policy's
/// value holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    pub processes: Option<u64>,
    /// Bytes.
    pub memory: Option<u64>,
    /// Bytes of each tmpfs (`/tmp` among them).
    pub tmpfs: Option<u64>,
    pub cpu_seconds: CpuCeiling,
    pub open_files: Option<u64>,
}

/// The CPU-time ceiling of each process of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuCeiling {
    /// The run's own time limit, in CPU seconds (the default).
    RunTime,
    Seconds(u64),
    Off,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            processes: Some(DEFAULT_PROCESSES),
            memory: Some(DEFAULT_MEMORY),
            tmpfs: Some(DEFAULT_TMPFS),
            cpu_seconds: CpuCeiling::RunTime,
            open_files: None,
        }
    }
}

impl RunLimits {
    /// `gates.limits`, over the defaults, each value read as a policy's `limits:` reads it
    /// (the sandbox crate's grammar, least and most values). `Err`: the key and what is
    /// wrong.
    pub(crate) fn parse(raw: &RawLimits) -> Result<RunLimits, (&'static str, String)> {
        let defaults = RunLimits::default();
        let base = Limits {
            processes: defaults.processes,
            memory: defaults.memory,
            tmpfs: defaults.tmpfs,
            cpu_seconds: None,
            open_files: defaults.open_files,
        };
        let read = raw.over(base)?;
        Ok(RunLimits {
            processes: read.processes,
            memory: read.memory,
            tmpfs: read.tmpfs,
            cpu_seconds: match (raw.sets_cpu(), read.cpu_seconds) {
                (false, _) => CpuCeiling::RunTime,
                (true, Some(s)) => CpuCeiling::Seconds(s),
                (true, None) => CpuCeiling::Off,
            },
            open_files: read.open_files,
        })
    }
}

/// The limits a run of `run_seconds` gets: each the lower of the gate's ceiling and the
/// policy's own value (`None`: no limit).
pub fn for_run(ceilings: &RunLimits, policy: &Limits, run_seconds: u64) -> Limits {
    let lower = |ceiling: Option<u64>, own: Option<u64>| match (ceiling, own) {
        (Some(c), Some(o)) => Some(c.min(o)),
        (c, o) => c.or(o),
    };
    let cpu = match ceilings.cpu_seconds {
        CpuCeiling::RunTime => Some(run_seconds),
        CpuCeiling::Seconds(s) => Some(s),
        CpuCeiling::Off => None,
    };
    Limits {
        processes: lower(ceilings.processes, policy.processes),
        memory: lower(ceilings.memory, policy.memory),
        tmpfs: lower(ceilings.tmpfs, policy.tmpfs),
        cpu_seconds: lower(cpu, policy.cpu_seconds),
        open_files: lower(ceilings.open_files, policy.open_files),
    }
}

/// `sandgate run --limit NAME=VALUE` values for each of `limits` that differs from the
/// policy's own (`policy`, as read at start): the rest the run reads from its policy.
pub fn flags(limits: &Limits, policy: &Limits) -> Vec<String> {
    let fields = [
        ("processes", limits.processes, policy.processes, false),
        ("memory", limits.memory, policy.memory, true),
        ("tmpfs", limits.tmpfs, policy.tmpfs, true),
        ("cpu", limits.cpu_seconds, policy.cpu_seconds, false),
        ("open_files", limits.open_files, policy.open_files, false),
    ];
    fields
        .into_iter()
        .filter(|(_, mine, own, _)| mine != own)
        .map(|(name, mine, _, bytes)| match mine {
            None => format!("{name}=off"),
            Some(v) if bytes => format!("{name}={}", size_text(v)),
            Some(v) => format!("{name}={v}"),
        })
        .collect()
}

/// `limits` as `NAME=VALUE` text, every one (`off`: none), for `list_sandboxes`.
pub fn text(limits: &Limits) -> Vec<String> {
    let count = |v: Option<u64>| v.map_or_else(|| "off".to_owned(), |n| n.to_string());
    let size = |v: Option<u64>| v.map_or_else(|| "off".to_owned(), size_text);
    vec![
        format!("processes={}", count(limits.processes)),
        format!("memory={}", size(limits.memory)),
        format!("tmpfs={}", size(limits.tmpfs)),
        format!("cpu_seconds={}", count(limits.cpu_seconds)),
        format!("open_files={}", count(limits.open_files)),
    ]
}

/// Bytes in the largest binary unit that holds them whole (`4GiB`, `512MiB`, `1000`).
fn size_text(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_gets_the_lower_of_each_ceiling_and_its_policy() {
        let policy = Limits {
            processes: Some(64),
            memory: Some(8 << 30),
            tmpfs: None,
            cpu_seconds: Some(10),
            open_files: None,
        };
        let got = for_run(&RunLimits::default(), &policy, 60);
        assert_eq!(
            got,
            Limits {
                processes: Some(64),
                memory: Some(4 << 30),
                tmpfs: Some(512 << 20),
                cpu_seconds: Some(10),
                open_files: None,
            }
        );
        // Only what differs from the policy goes on the command line.
        assert_eq!(flags(&got, &policy), ["memory=4GiB", "tmpfs=512MiB"]);
        assert_eq!(
            text(&got),
            [
                "processes=64",
                "memory=4GiB",
                "tmpfs=512MiB",
                "cpu_seconds=10",
                "open_files=off"
            ]
        );
        // Without a policy value, the run's time limit bounds its CPU time; `off` ceilings
        // leave the policy's values.
        let none = Limits {
            cpu_seconds: None,
            ..policy
        };
        let with_cpu = for_run(&RunLimits::default(), &none, 60);
        assert_eq!(with_cpu.cpu_seconds, Some(60));
        assert!(flags(&with_cpu, &none).contains(&"cpu=60".to_owned()));
        let open = RunLimits {
            processes: None,
            memory: None,
            tmpfs: None,
            cpu_seconds: CpuCeiling::Off,
            open_files: None,
        };
        assert_eq!(for_run(&open, &policy, 60), policy);
    }

    #[test]
    fn sizes_are_written_in_whole_units() {
        assert_eq!(size_text(4 << 30), "4GiB");
        assert_eq!(size_text(1536 << 20), "1536MiB");
        assert_eq!(size_text(3 << 40), "3TiB");
        assert_eq!(size_text(1000), "1000");
        assert_eq!(size_text(0), "0");
    }
}
