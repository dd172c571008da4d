//! `limits:` of a sandbox policy: how many processes, how much memory, how large each tmpfs,
//! how much CPU time and how many open files the command may take, with defaults that hold
//! when the policy says nothing, and `sandgate run --limit NAME=VALUE` overrides.
//!
//! Pure: sizes and counts parsed and checked here; the run enforces them (a cgroup where one
//! can be had, rlimits where not, bubblewrap's `--size` for every tmpfs; [`crate::limits`]).

use serde::Deserialize;

use super::PolicyError;

/// Processes (and threads) the sandbox may hold at once when the policy says nothing.
pub const DEFAULT_PROCESSES: u64 = 512;
/// Memory when the policy says nothing: 8 GiB.
pub const DEFAULT_MEMORY: u64 = 8 << 30;
/// Size of `/tmp` and of every other tmpfs when the policy says nothing: 1 GiB.
pub const DEFAULT_TMPFS: u64 = 1 << 30;

/// The limits of one run; `None` is "no limit" (`off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Processes and threads in the sandbox at once.
    pub processes: Option<u64>,
    /// Bytes of memory: the sandbox's total in a cgroup, each process's private writable
    /// memory (`RLIMIT_DATA`) without one.
    pub memory: Option<u64>,
    /// Bytes each tmpfs (`/tmp` and `platform.bwrap.tmpfs`) may hold.
    pub tmpfs: Option<u64>,
    /// Seconds of CPU time each process may use (`RLIMIT_CPU`).
    pub cpu_seconds: Option<u64>,
    /// Open files per process (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            processes: Some(DEFAULT_PROCESSES),
            memory: Some(DEFAULT_MEMORY),
            tmpfs: Some(DEFAULT_TMPFS),
            cpu_seconds: None,
            open_files: None,
        }
    }
}

/// The section as written: each value a number, a size (`512MiB`), or `off` (also read by
/// `sandgate mcp` for its gates' ceilings).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    #[serde(default)]
    processes: Option<serde_json::Value>,
    #[serde(default)]
    memory: Option<serde_json::Value>,
    #[serde(default)]
    tmpfs: Option<serde_json::Value>,
    #[serde(default)]
    cpu_seconds: Option<serde_json::Value>,
    #[serde(default)]
    open_files: Option<serde_json::Value>,
}

/// What a value is: a count or a size.
#[derive(Clone, Copy)]
enum Unit {
    Count,
    Bytes,
}

/// The limits a policy sets, over the defaults.
pub(super) fn limits(raw: &RawLimits) -> Result<Limits, PolicyError> {
    raw.over(Limits::default())
        .map_err(|(name, e)| PolicyError(format!("limits.{name}: {e}")))
}

impl RawLimits {
    /// The values written, over `base`; `Err`: the key and what is wrong with its value.
    pub fn over(&self, base: Limits) -> Result<Limits, (&'static str, String)> {
        let mut out = base;
        let fields = [
            ("processes", &self.processes),
            ("memory", &self.memory),
            ("tmpfs", &self.tmpfs),
            ("cpu_seconds", &self.cpu_seconds),
            ("open_files", &self.open_files),
        ];
        for (name, value) in fields {
            let Some(value) = value else { continue };
            let text = match value {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(false) => "off".to_owned(),
                other => {
                    return Err((
                        name,
                        format!("{other}: expected a number, a size such as 512MiB, or off"),
                    ));
                }
            };
            out.set(name, &text).map_err(|e| (name, e))?;
        }
        Ok(out)
    }

    /// Does the section set `cpu_seconds`?
    pub fn sets_cpu(&self) -> bool {
        self.cpu_seconds.is_some()
    }
}

impl Limits {
    /// Sets one limit by its policy name (`cpu` also names `cpu_seconds`).
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        // The least that lets a command start, and the most the kernel takes (pid_max's
        // ceiling, nr_open's default, a petabyte, about 34,000 years).
        let (slot, unit, least, most) = match name {
            "processes" => (&mut self.processes, Unit::Count, 8, 1 << 22),
            "memory" => (&mut self.memory, Unit::Bytes, 16 << 20, 1 << 50),
            "tmpfs" => (&mut self.tmpfs, Unit::Bytes, 1 << 20, 1 << 50),
            "cpu_seconds" | "cpu" => (&mut self.cpu_seconds, Unit::Count, 1, 1 << 40),
            "open_files" => (&mut self.open_files, Unit::Count, 16, 1 << 20),
            other => {
                return Err(format!(
                    "{other:?} is not a limit: use processes, memory, tmpfs, cpu_seconds (cpu) or open_files"
                ));
            }
        };
        *slot = parse(value, unit, least)?;
        if slot.is_some_and(|v| v > most) {
            return Err(format!("{value:?}: at most {most} (or off)"));
        }
        Ok(())
    }

    /// Applies `--limit NAME=VALUE`.
    pub fn apply_override(&mut self, spec: &str) -> Result<(), String> {
        let (name, value) = spec
            .split_once('=')
            .ok_or_else(|| format!("invalid --limit {spec:?}: expected NAME=VALUE"))?;
        self.set(name, value)
            .map_err(|e| format!("invalid --limit {spec:?}: {e}"))
    }
}

/// `off`, a count, or a size with a binary (KiB, MiB, GiB, TiB; K, M, G, T) or no suffix.
fn parse(text: &str, unit: Unit, least: u64) -> Result<Option<u64>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: expected a number, a size such as 512MiB, or off"))?;
    let shift = match (unit, suffix.trim()) {
        (_, "") => 0,
        (Unit::Bytes, "K" | "KiB") => 10,
        (Unit::Bytes, "M" | "MiB") => 20,
        (Unit::Bytes, "G" | "GiB") => 30,
        (Unit::Bytes, "T" | "TiB") => 40,
        (Unit::Bytes, other) => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use KiB, MiB, GiB or TiB)"
            ));
        }
        (Unit::Count, _) => return Err(format!("{text:?}: expected a whole number, or off")),
    };
    let value = number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?}: too large"))?;
    if value < least {
        return Err(format!("{text:?}: at least {least} (or off)"));
    }
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_counts_and_off() {
        assert_eq!(parse("512MiB", Unit::Bytes, 1), Ok(Some(512 << 20)));
        assert_eq!(parse("4G", Unit::Bytes, 1), Ok(Some(4 << 30)));
        assert_eq!(parse("1048576", Unit::Bytes, 1), Ok(Some(1 << 20)));
        assert_eq!(parse("off", Unit::Bytes, 1), Ok(None));
        assert_eq!(parse("64", Unit::Count, 8), Ok(Some(64)));
        for bad in ["", "MiB", "-1", "1.5GiB", "4 PB", "99999999999999999999"] {
            assert!(parse(bad, Unit::Bytes, 1).is_err(), "{bad:?}");
        }
        assert!(parse("64k", Unit::Count, 8).is_err());
        assert!(parse("4", Unit::Count, 8).unwrap_err().contains("at least 8"));
        assert!(
            parse("16777216T", Unit::Bytes, 1)
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn overrides_name_the_limit() {
        let mut l = Limits::default();
        l.apply_override("cpu=30").unwrap();
        l.apply_override("memory=off").unwrap();
        assert_eq!((l.cpu_seconds, l.memory), (Some(30), None));
        assert!(
            l.apply_override("swap=1G")
                .unwrap_err()
                .contains("is not a limit")
        );
        assert!(l.apply_override("processes").unwrap_err().contains("NAME=VALUE"));
        assert!(
            l.apply_override("processes=2147483648")
                .unwrap_err()
                .contains("at most 4194304")
        );
        assert!(
            l.apply_override("open_files=1048577")
                .unwrap_err()
                .contains("at most")
        );
        assert!(
            l.apply_override("tmpfs=18446744073709551615")
                .unwrap_err()
                .contains("at most")
        );
    }
}
