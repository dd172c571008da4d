//! `sandgate-bench`: the in-repo load benchmark. Runs one suite against a direct connection
//! (the harness's physical limit), sandgate, Squid and tinyproxy, interleaved round by round,
//! and prints medians with ratios to direct and to sandgate as a Markdown table.
//!
//! The proxy under test is pinned to core 0 and the load generator (with its loopback
//! servers) to core 1 with `taskset`. Not a test: figures go to docs/benchmarks.md. `--smoke`
//! runs tiny sizes so the test suite keeps the harness from rotting.

mod client;
mod proxies;
mod scenarios;
mod servers;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use client::{BoxError, Via};
use servers::Servers;

#[derive(Debug, Parser)]
#[command(name = "sandgate-bench", about = "Side-by-side proxy benchmark on loopback")]
struct Args {
    /// Rounds; each runs every target once, in rotating order.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Bytes moved each way through one tunnel.
    #[arg(long, default_value_t = 1 << 30)]
    bytes: u64,
    /// Seconds of keep-alive GETs.
    #[arg(long, default_value_t = 10.0)]
    http_secs: f64,
    /// Keep-alive connections for the GET test.
    #[arg(long, default_value_t = 32)]
    http_conns: usize,
    /// Seconds of new-tunnel churn.
    #[arg(long, default_value_t = 10.0)]
    tunnel_secs: f64,
    /// Concurrent clients opening new tunnels.
    #[arg(long, default_value_t = 16)]
    tunnel_conns: usize,
    /// Idle tunnels held open for the memory figure.
    #[arg(long, default_value_t = 5000)]
    idle: usize,
    /// Targets, comma-separated: direct, sandgate, sandgate-nopeek (no first-bytes check
    /// on tunnels), sandgate-central (a node-local proxy and a central one, both on the
    /// proxies' core; sandgate-central-http1: a TLS connection per tunnel instead of HTTP/2
    /// streams), squid, tinyproxy.
    #[arg(
        long,
        default_value = "direct,sandgate,squid,tinyproxy",
        value_delimiter = ','
    )]
    targets: Vec<String>,
    /// The sandgate binary (default: next to this one).
    #[arg(long)]
    sandgate: Option<PathBuf>,
    /// Tiny sizes, for the test suite.
    #[arg(long)]
    smoke: bool,
    /// Do not pin the proxy and the load to separate cores.
    #[arg(long)]
    no_pin: bool,
}

const PINNED_ENV: &str = "SANDGATE_BENCH_PINNED";

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.smoke {
        args.rounds = 1;
        args.bytes = 4 << 20;
        args.http_secs = 0.3;
        args.http_conns = 4;
        args.tunnel_secs = 0.3;
        args.tunnel_conns = 4;
        args.idle = 50;
    }
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let already_pinned = std::env::var_os(PINNED_ENV).is_some();
    let pin = already_pinned || (!args.no_pin && cores >= 2 && proxies::which("taskset").is_some());
    if pin && !already_pinned {
        // Re-run this process on core 1; proxies will get core 0.
        let status = std::env::current_exe().and_then(|exe| {
            std::process::Command::new("taskset")
                .args(["-c", "1"])
                .arg(exe)
                .args(std::env::args_os().skip(1))
                .env(PINNED_ENV, "1")
                .status()
        });
        return match status {
            Ok(s) if s.success() => ExitCode::SUCCESS,
            Ok(_) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("sandgate-bench: cannot pin with taskset: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandgate-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args, pin.then_some(0))) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("sandgate-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Median figures: metric name to target name to samples.
type Results = BTreeMap<&'static str, BTreeMap<String, Vec<f64>>>;

const METRICS: &[(&str, &str, bool)] = &[
    // (key, label, higher is better)
    ("a_up", "tunnel throughput up (MB/s)", true),
    ("b_down", "tunnel throughput down (MB/s)", true),
    ("c_rps", "keep-alive GETs (req/s)", true),
    ("d_p50", "GET p50 (µs)", false),
    ("e_p99", "GET p99 (µs)", false),
    ("f_p999", "GET p99.9 (µs)", false),
    ("g_tps", "new tunnels (/s)", true),
    ("h_idle", "RSS per idle tunnel (bytes)", false),
];

async fn run(args: &Args, proxy_core: Option<usize>) -> Result<bool, BoxError> {
    let servers = servers::start().await?;
    let sandgate_bin = match &args.sandgate {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("sandgate"),
    };
    let mut results: Results = BTreeMap::new();
    let mut ok = true;
    // New tunnels open with a real TLS ClientHello, as HTTPS clients' do.
    let hello: std::sync::Arc<[u8]> = scenarios::client_hello()?.into();
    for round in 0..args.rounds {
        let n = args.targets.len();
        for i in 0..n {
            let Some(name) = args.targets.get((i + round) % n.max(1)) else {
                continue;
            };
            eprintln!("round {}/{}: {name}", round + 1, args.rounds);
            let hello = hello.clone();
            if let Err(e) = run_target(
                name,
                args,
                &servers,
                hello,
                &sandgate_bin,
                proxy_core,
                &mut results,
            )
            .await
            {
                eprintln!("  {name}: {e}");
                if name == "direct" || name == "sandgate" {
                    ok = false;
                }
            }
        }
    }
    print_report(args, &results, proxy_core.is_some());
    Ok(ok)
}

async fn run_target(
    name: &str,
    args: &Args,
    s: &Servers,
    hello: std::sync::Arc<[u8]>,
    sandgate_bin: &std::path::Path,
    core: Option<usize>,
    results: &mut Results,
) -> Result<(), BoxError> {
    let proxy = match name {
        "direct" => None,
        "sandgate" => Some(proxies::sandgate(sandgate_bin, s, core, true)?),
        // The same, reading no tunnel's first bytes: the cost of the ClientHello check.
        "sandgate-nopeek" => Some(proxies::sandgate(sandgate_bin, s, core, false)?),
        // A node-local proxy forwarding to a central one (mutual TLS, HTTP/2 streams).
        "sandgate-central" => Some(proxies::sandgate_central(sandgate_bin, s, core, false)?),
        // The same with a TLS connection per tunnel (HTTP/1.1 CONNECT), for comparison.
        "sandgate-central-http1" => Some(proxies::sandgate_central(sandgate_bin, s, core, true)?),
        "squid" => Some(proxies::squid(s, core)?),
        "tinyproxy" => Some(proxies::tinyproxy(s, core)?),
        other => return Err(format!("unknown target {other}").into()),
    };
    let via = proxy.as_ref().map_or(Via::Direct, |p| Via::Proxy(p.addr));
    let mut record = |metric: &'static str, value: f64| {
        results
            .entry(metric)
            .or_default()
            .entry(name.to_owned())
            .or_default()
            .push(value);
    };
    record("a_up", scenarios::upload(via, s, args.bytes).await?);
    record("b_down", scenarios::download(via, s, args.bytes).await?);
    let http = scenarios::http_gets(via, s, args.http_conns, Duration::from_secs_f64(args.http_secs)).await?;
    record("c_rps", http.rps);
    record("d_p50", http.p50_us);
    record("e_p99", http.p99_us);
    record("f_p999", http.p999_us);
    let tps = scenarios::new_tunnels(
        via,
        s,
        hello.clone(),
        args.tunnel_conns,
        Duration::from_secs_f64(args.tunnel_secs),
    )
    .await?;
    record("g_tps", tps);
    if let Some(p) = &proxy {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = scenarios::rss_bytes(p.pid());
        let held = scenarios::hold_tunnels(via, s.echo, args.idle).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = scenarios::rss_bytes(p.pid());
        drop(held);
        record(
            "h_idle",
            after.saturating_sub(before) as f64 / args.idle.max(1) as f64,
        );
    }
    Ok(())
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

fn print_report(args: &Args, results: &Results, pinned: bool) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    println!(
        "\nsandgate-bench: {} round(s), {} bytes each way, {} s GETs x{}, {} s new tunnels x{}, {} idle tunnels; {}; {cpu}\n",
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
    let targets: Vec<&String> = args.targets.iter().collect();
    let mut header = String::from("| metric |");
    let mut rule = String::from("|---|");
    for t in &targets {
        header.push_str(&format!(" {t} |"));
        rule.push_str("---:|");
    }
    header.push_str(" sandgate / direct | best other / sandgate |");
    rule.push_str("---:|---:|");
    println!("{header}\n{rule}");
    for (key, label, higher_better) in METRICS {
        let Some(by_target) = results.get(key) else {
            continue;
        };
        let med = |t: &str| by_target.get(t).and_then(|v| median(v));
        let mut line = format!("| {label} |");
        for t in &targets {
            match med(t) {
                Some(v) => line.push_str(&format!(" {} |", fmt(v))),
                None => line.push_str(" - |"),
            }
        }
        let sg = med("sandgate");
        match (sg, med("direct")) {
            (Some(s), Some(d)) if d > 0.0 => line.push_str(&format!(" {:.2} |", s / d)),
            _ => line.push_str(" - |"),
        }
        let others: Vec<f64> = ["squid", "tinyproxy"].iter().filter_map(|t| med(t)).collect();
        let best = if *higher_better {
            others.iter().copied().reduce(f64::max)
        } else {
            others.iter().copied().reduce(f64::min)
        };
        match (best, sg) {
            (Some(b), Some(s)) if s > 0.0 => line.push_str(&format!(" {:.2} |", b / s)),
            _ => line.push_str(" - |"),
        }
        println!("{line}");
    }
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}
