//! The standard `process_*` metrics every Prometheus client library exports, with the names,
//! types and units those use (prometheus/client_golang `prometheus/process_collector.go`):
//! CPU seconds, resident and virtual memory, open descriptors and their limit, start time.
//! Read at each scrape from /proc/self (stat, statm, fd), /proc/stat's boot time and
//! getrlimit(RLIMIT_NOFILE), so nothing runs between scrapes. Linux only: elsewhere, and for
//! any file that cannot be read, the metric is left out rather than reported as 0.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// Registered once on the root registry (no `sandgate_` prefix).
#[derive(Debug)]
pub(crate) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = Sample::read();
        if let Some(v) = s.cpu_seconds {
            let m = ConstCounter::new(v);
            let help = "Total user and system CPU time spent in seconds";
            m.encode(encoder.encode_descriptor(
                "process_cpu",
                help,
                Some(&Unit::Seconds),
                m.metric_type(),
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory",
                "Resident memory size in bytes",
                Some(Unit::Bytes),
                s.resident_bytes,
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes",
                Some(Unit::Bytes),
                s.virtual_bytes,
            ),
            (
                "process_start_time",
                "Start time of the process since unix epoch in seconds",
                Some(Unit::Seconds),
                s.start_time,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                None,
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit)",
                None,
                s.max_fds,
            ),
        ];
        for (name, help, unit, value) in gauges {
            if let Some(v) = value {
                let m = ConstGauge::new(v);
                m.encode(encoder.encode_descriptor(name, help, unit.as_ref(), m.metric_type())?)?;
            }
        }
        Ok(())
    }
}

/// One reading; None where it could not be made.
#[derive(Debug, Default, PartialEq)]
struct Sample {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<f64>,
    virtual_bytes: Option<f64>,
    start_time: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
}

impl Sample {
    #[cfg(target_os = "linux")]
    fn read() -> Sample {
        use nix::sys::resource::{Resource, getrlimit};
        use nix::unistd::{SysconfVar, sysconf};
        let proc = |p: &str| std::fs::read_to_string(p).ok();
        let conf = |v| sysconf(v).ok().flatten().filter(|n| *n > 0).map(|n| n as f64);
        let (ticks, page) = (conf(SysconfVar::CLK_TCK), conf(SysconfVar::PAGE_SIZE));
        let stat = proc("/proc/self/stat").and_then(|t| Stat::parse(&t));
        let statm = proc("/proc/self/statm").and_then(|t| Statm::parse(&t));
        let boot = proc("/proc/stat").and_then(|t| boot_time(&t));
        Sample {
            cpu_seconds: stat
                .as_ref()
                .zip(ticks)
                .map(|(s, t)| (s.utime + s.stime) as f64 / t),
            resident_bytes: statm.as_ref().zip(page).map(|(m, p)| m.resident as f64 * p),
            virtual_bytes: statm.as_ref().zip(page).map(|(m, p)| m.size as f64 * p),
            start_time: stat
                .as_ref()
                .zip(ticks)
                .zip(boot)
                .map(|((s, t), b)| b as f64 + s.starttime as f64 / t),
            // The count includes the descriptor read_dir itself holds open, as every client
            // library's does.
            open_fds: std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as f64),
            max_fds: getrlimit(Resource::RLIMIT_NOFILE)
                .ok()
                .map(|(soft, _)| soft as f64),
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn read() -> Sample {
        Sample::default()
    }
}

/// The fields of /proc/self/stat used here (proc_pid_stat(5)), in clock ticks.
#[derive(Debug, PartialEq)]
struct Stat {
    utime: u64,
    stime: u64,
    /// Since boot.
    starttime: u64,
}

impl Stat {
    /// The command name (field 2) is in parentheses and may hold spaces and `)`: the fields
    /// are counted from the last `)`. After it, field 3 (state) is index 0, so field N is
    /// index N - 3.
    fn parse(text: &str) -> Option<Stat> {
        let (_, rest) = text.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Stat {
            utime: field(14)?,
            stime: field(15)?,
            starttime: field(22)?,
        })
    }
}

/// /proc/self/statm's first two fields, in pages.
#[derive(Debug, PartialEq)]
struct Statm {
    size: u64,
    resident: u64,
}

impl Statm {
    fn parse(text: &str) -> Option<Statm> {
        let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
        Some(Statm {
            size: fields.next()??,
            resident: fields.next()??,
        })
    }
}

/// The boot time (Unix seconds) from /proc/stat's `btime` line.
fn boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
#[path = "process_tests.rs"]
mod tests;
