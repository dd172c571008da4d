//! The /proc parsers, and the exposition the collector and the build info add.

use super::*;

#[test]
fn stat_fields_are_counted_from_the_last_parenthesis() {
    // A command name with a space and a `)` of its own (proc_pid_stat(5): field 2).
    let text = "4242 (tokio ) rt) S 1 4242 4242 0 -1 4194560 1523 0 0 0 250 75 0 0 20 0 9 0 \
                123456 987654321 2048 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n";
    assert_eq!(
        Stat::parse(text),
        Some(Stat {
            utime: 250,
            stime: 75,
            starttime: 123456
        })
    );
    assert_eq!(Stat::parse("4242 (x) S 1 2"), None, "truncated");
    assert_eq!(Stat::parse("no parenthesis"), None);
}

#[test]
fn statm_and_boot_time() {
    assert_eq!(
        Statm::parse("5120 1024 300 200 0 900 0\n"),
        Some(Statm {
            size: 5120,
            resident: 1024
        })
    );
    assert_eq!(Statm::parse("5120\n"), None);
    let stat = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1764200000\nprocesses 7\n";
    assert_eq!(boot_time(stat), Some(1_764_200_000));
    assert_eq!(boot_time("cpu 1\n"), None);
}

#[cfg(target_os = "linux")]
#[test]
fn this_process_reads_as_plausible() {
    let s = Sample::read();
    let get = |v: Option<f64>, what: &str| v.unwrap_or_else(|| panic!("no {what}: {s:?}"));
    assert!(get(s.resident_bytes, "rss") > 0.0);
    assert!(get(s.virtual_bytes, "vsz") >= get(s.resident_bytes, "rss"));
    assert!(get(s.open_fds, "fds") >= 3.0);
    assert!(get(s.open_fds, "fds") <= get(s.max_fds, "limit"));
    assert!(get(s.cpu_seconds, "cpu") >= 0.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let start = get(s.start_time, "start");
    // btime is whole seconds, so a start can read up to a second late.
    assert!(start <= now + 1.0 && start > now - 3600.0, "{start} vs {now}");
}

#[test]
fn the_exposition_has_the_standard_names_and_the_build() {
    let m = crate::metrics::Metrics::new();
    m.set_build_info("9.9.9", "abc1234");
    let text = m.encode();
    assert!(
        text.contains("sandgate_build_info{version=\"9.9.9\",commit=\"abc1234\"} 1\n"),
        "{text}"
    );
    assert_eq!(
        text.matches("sandgate_build_info{").count(),
        1,
        "one series: {text}"
    );
    assert!(text.contains("sandgate_policy_generation 1\n"), "{text}");
    #[cfg(target_os = "linux")]
    for name in [
        "# TYPE process_cpu_seconds counter",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_virtual_memory_bytes ",
        "process_start_time_seconds ",
        "process_open_fds ",
        "process_max_fds ",
    ] {
        assert!(text.contains(name), "no {name:?} in\n{text}");
    }
    assert!(!text.contains("sandgate_process_"), "{text}");
}
