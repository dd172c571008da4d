//! The printed result: medians over the rounds as Markdown tables, one for the suite that
//! compares sandgate with direct and the other proxies, one for keep-alive HTTPS GETs (blind
//! tunnels against intercepted ones, with what each request costs the proxy in CPU).

use std::collections::BTreeMap;

use clap::ValueEnum as _;

use crate::Args;

/// Samples: metric key to target name to one sample a round.
pub type Results = BTreeMap<&'static str, BTreeMap<String, Vec<f64>>>;

/// (key, label, higher is better) of the suite's table.
const METRICS: &[(&str, &str, bool)] = &[
    ("a_up", "tunnel throughput up (MB/s)", true),
    ("b_down", "tunnel throughput down (MB/s)", true),
    ("c_rps", "keep-alive GETs (req/s)", true),
    ("d_p50", "GET p50 (µs)", false),
    ("e_p99", "GET p99 (µs)", false),
    ("f_p999", "GET p99.9 (µs)", false),
    ("g_tps", "new tunnels (/s)", true),
    (
        "h_idle",
        "RSS per idle tunnel past its first bytes (bytes)",
        false,
    ),
    (
        "h_idle_silent",
        "RSS per tunnel waiting for its first bytes (bytes)",
        false,
    ),
];

/// One row pair of the CPU table: what one unit of work costs the proxy, against what the
/// load side alone spends on it without a proxy (`direct`'s load: the limit), each with the
/// kernel's part on a row of its own.
#[derive(Debug)]
pub struct CpuMetric {
    pub proxy: &'static str,
    pub proxy_sys: &'static str,
    pub load: &'static str,
    pub load_sys: &'static str,
    label: &'static str,
}

const fn cpu_metric(keys: [&'static str; 4], label: &'static str) -> CpuMetric {
    let [proxy, proxy_sys, load, load_sys] = keys;
    CpuMetric {
        proxy,
        proxy_sys,
        load,
        load_sys,
        label,
    }
}

/// CPU per keep-alive GET.
pub const GET_CPU: CpuMetric = cpu_metric(
    ["o_get_cpu", "o_get_sys", "o_get_load", "o_get_load_sys"],
    "CPU per keep-alive GET (µs)",
);
/// CPU per new tunnel.
pub const TUNNEL_CPU: CpuMetric = cpu_metric(
    [
        "p_tunnel_cpu",
        "p_tunnel_sys",
        "p_tunnel_load",
        "p_tunnel_load_sys",
    ],
    "CPU per new tunnel (µs)",
);
/// CPU per GiB relayed.
pub const GIB_CPU: CpuMetric = cpu_metric(
    ["q_gib_cpu", "q_gib_sys", "q_gib_load", "q_gib_load_sys"],
    "CPU per GiB relayed (s)",
);
/// CPU per HTTPS GET (its own table shows it).
pub const HTTPS_CPU: CpuMetric = cpu_metric(
    ["l_https_cpu", "l_https_sys", "n_https_load", "n_https_load_sys"],
    "CPU per HTTPS GET (µs)",
);

/// The CPU table's rows.
const CPU_METRICS: &[CpuMetric] = &[GET_CPU, TUNNEL_CPU, GIB_CPU];

/// (key, label) of the HTTPS table.
const HTTPS_METRICS: &[(&str, &str)] = &[
    ("i_https_rps", "keep-alive HTTPS GETs (req/s)"),
    ("j_https_p50", "HTTPS GET p50 (µs)"),
    ("k_https_p99", "HTTPS GET p99 (µs)"),
    ("l_https_cpu", "proxy CPU per HTTPS GET (µs)"),
    ("m_https_busy", "proxy CPU busy (% of a core)"),
    ("n_https_load", "load CPU per HTTPS GET (µs)"),
];

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

pub fn print_report(args: &Args, results: &Results, pinned: bool) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let scenarios: Vec<String> = args
        .scenarios
        .iter()
        .filter_map(|s| Some(s.to_possible_value()?.get_name().to_owned()))
        .collect();
    println!(
        "\nsandgate-bench ({}): {} round(s), {} bytes each way, {} s GETs x{}, {} s new tunnels x{}, {} idle tunnels; {}; {cpu}\n",
        scenarios.join(","),
        args.rounds,
        args.bytes,
        args.http_secs,
        args.http_conns,
        args.tunnel_secs,
        args.tunnel_conns,
        args.idle,
        if pinned {
            "proxy on core 0, load on core 1"
        } else {
            "unpinned"
        }
    );
    let targets: Vec<&str> = args.targets.iter().map(String::as_str).collect();
    let suite = METRICS.iter().any(|(key, _, _)| results.contains_key(key));
    if suite {
        print_suite(&targets, results);
    }
    if CPU_METRICS.iter().any(|m| results.contains_key(m.proxy)) {
        println!();
        print_cpu(&targets, results);
    }
    if HTTPS_METRICS.iter().any(|(key, _)| results.contains_key(key)) {
        if suite {
            println!();
        }
        print_https(&targets, results);
    }
}

/// The CPU table: a column a target with the proxy's CPU per unit of work (for `direct`,
/// the load side's: the limit), then each proxy against that limit, and sandgate against the
/// bare relay when both ran. A `sandgate-nopeek` column is the new tunnel without the
/// ClientHello check.
fn print_cpu(targets: &[&str], results: &Results) {
    let proxies: Vec<&str> = targets.iter().copied().filter(|t| *t != "direct").collect();
    let mut ratios: Vec<String> = proxies.iter().map(|t| format!("{t} / limit")).collect();
    let floor = targets.contains(&"sandgate") && targets.contains(&"relay");
    if floor {
        ratios.push("sandgate / relay".to_owned());
    }
    print_header(
        "proxy's CPU per unit (direct: the load side's, the limit)",
        targets,
        &ratios,
    );
    let rows = CPU_METRICS.iter().flat_map(|m| {
        [
            (m.proxy, m.load, m.label),
            (m.proxy_sys, m.load_sys, "of which in the kernel"),
        ]
    });
    for (proxy_key, load_key, label) in rows {
        let med = |key: &str, t: &str| results.get(key)?.get(t).and_then(|v| median(v));
        let limit = med(load_key, "direct");
        let of = |t: &str| if t == "direct" { limit } else { med(proxy_key, t) };
        let mut line = format!("| {label} |");
        for t in targets {
            line.push_str(&cell(of(t)));
        }
        for t in &proxies {
            line.push_str(&ratio(of(t), limit));
        }
        if floor {
            line.push_str(&ratio(of("sandgate"), of("relay")));
        }
        println!("{line}");
    }
}

/// The suite's table: a column a target, sandgate against direct, the best other proxy
/// against sandgate, and sandgate against the bare relay when both ran.
fn print_suite(targets: &[&str], results: &Results) {
    let mut ratios = vec!["sandgate / direct".to_owned(), "best other / sandgate".to_owned()];
    let floor = targets.contains(&"sandgate") && targets.contains(&"relay");
    if floor {
        ratios.push("sandgate / relay".to_owned());
    }
    print_header("metric", targets, &ratios);
    for (key, label, higher_better) in METRICS {
        let Some(by_target) = results.get(key) else {
            continue;
        };
        let med = |t: &str| by_target.get(t).and_then(|v| median(v));
        let mut line = format!("| {label} |");
        for t in targets {
            line.push_str(&cell(med(t)));
        }
        let sg = med("sandgate");
        line.push_str(&ratio(sg, med("direct")));
        let others: Vec<f64> = ["squid", "tinyproxy"].iter().filter_map(|t| med(t)).collect();
        let best = if *higher_better {
            others.iter().copied().reduce(f64::max)
        } else {
            others.iter().copied().reduce(f64::min)
        };
        line.push_str(&ratio(best, sg));
        if floor {
            line.push_str(&ratio(sg, med("relay")));
        }
        println!("{line}");
    }
}

/// The HTTPS table: a column a target, each proxy against direct, and interception against
/// the blind tunnel when both ran.
fn print_https(targets: &[&str], results: &Results) {
    let proxies: Vec<&str> = targets.iter().copied().filter(|t| *t != "direct").collect();
    let both = targets.contains(&"sandgate") && targets.contains(&"sandgate-intercept");
    let mut ratios: Vec<String> = proxies.iter().map(|t| format!("{t} / direct")).collect();
    if both {
        ratios.push("sandgate-intercept / sandgate".to_owned());
    }
    print_header("metric", targets, &ratios);
    for (key, label) in HTTPS_METRICS {
        let Some(by_target) = results.get(key) else {
            continue;
        };
        let med = |t: &str| by_target.get(t).and_then(|v| median(v));
        let mut line = format!("| {label} |");
        for t in targets {
            line.push_str(&cell(med(t)));
        }
        for t in &proxies {
            line.push_str(&ratio(med(t), med("direct")));
        }
        if both {
            line.push_str(&ratio(med("sandgate-intercept"), med("sandgate")));
        }
        println!("{line}");
    }
}

/// A table's header and rule: `first`, a column a target, then the ratio columns.
fn print_header(first: &str, targets: &[&str], ratios: &[String]) {
    let mut header = format!("| {first} |");
    let mut rule = String::from("|---|");
    for column in targets.iter().copied().chain(ratios.iter().map(String::as_str)) {
        header.push_str(&format!(" {column} |"));
        rule.push_str("---:|");
    }
    println!("{header}\n{rule}");
}

fn cell(v: Option<f64>) -> String {
    match v {
        Some(v) => format!(" {} |", fmt(v)),
        None => " - |".to_owned(),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!(" {:.2} |", a / b),
        _ => " - |".to_owned(),
    }
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
