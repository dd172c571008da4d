//! `sandgate-bench`: the in-repo load benchmark. Runs one suite against a direct connection
//! (the harness's physical limit), a bare relay (the floor for any proxy), sandgate, Squid and
//! tinyproxy, interleaved round by round,
//! and prints medians with ratios to direct and to sandgate as a Markdown table; and keep-alive
//! HTTPS GETs through a blind tunnel and through an intercepting sandgate, with the proxy's CPU
//! per request.
//!
//! The proxy under test is pinned to core 0 and the load generator (with its loopback
//! servers) to core 1 with `taskset`. The sandbox's start-up is measured first, unpinned
//! (`startup.rs`). Not a test: figures go to docs/benchmarks.md. `--smoke` runs tiny sizes so
//! the test suite keeps the harness from rotting.

mod client;
mod process;
mod proxies;
mod relay;
mod report;
mod scenarios;
mod servers;
mod startup;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use client::{BoxError, Via};
use proxies::{RunningProxy, SandgateMode};
use report::Results;
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
    /// on tunnels), sandgate-intercept (the HTTPS origin allowed read-only, so its tunnels
    /// are intercepted), sandgate-central (a node-local proxy and a central one, both on the
    /// proxies' core; sandgate-central-http1: a TLS connection per tunnel instead of HTTP/2
    /// streams), relay (a bare relay: one thread, no policy, no audit, the floor), squid,
    /// tinyproxy.
    #[arg(
        long,
        default_value = "direct,relay,sandgate,squid,tinyproxy",
        value_delimiter = ','
    )]
    targets: Vec<String>,
    /// Scenarios, comma-separated (default: all).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tunnel,http,new-tunnels,idle,https,startup"
    )]
    scenarios: Vec<Scenario>,
    /// Paired rounds of the start-up scenario.
    #[arg(long, default_value_t = 42)]
    startup_rounds: usize,
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

/// The scenarios `--scenarios` selects from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// One tunnel's throughput, up then down.
    Tunnel,
    /// Keep-alive plain-HTTP GETs through the proxy (absolute form).
    Http,
    /// New tunnels, each opened with a TLS ClientHello echoed back.
    NewTunnels,
    /// RSS per idle tunnel.
    Idle,
    /// Keep-alive HTTPS GETs, a tunnel and a TLS handshake per connection.
    Https,
    /// `sandgate run -- /bin/true` in `none` and `allowlist` against bare bwrap, paired
    /// (sandgate's alone, whatever the targets).
    Startup,
}

const PINNED_ENV: &str = "SANDGATE_BENCH_PINNED";

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == relay::FLAG) {
        return relay::serve();
    }
    let mut args = Args::parse();
    if args.smoke {
        args.rounds = 1;
        args.bytes = 4 << 20;
        args.http_secs = 0.3;
        args.http_conns = 4;
        args.tunnel_secs = 0.3;
        args.tunnel_conns = 4;
        args.idle = 50;
        args.startup_rounds = 3;
    }
    let already_pinned = std::env::var_os(PINNED_ENV).is_some();
    // The start-up first, in this unpinned process (the pinned one below skips it).
    let started_ok = !args.scenarios.contains(&Scenario::Startup) || already_pinned || startup(&args);
    // A start-up that could not be measured fails the run now, not after the long rest.
    if !started_ok || args.scenarios.iter().all(|s| *s == Scenario::Startup) {
        return if started_ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
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

/// Measures and prints the sandbox's start-up; false if it could not be measured where it
/// can be (a host without bwrap only says so).
fn startup(args: &Args) -> bool {
    let sandgate = match &args.sandgate {
        Some(p) => p.clone(),
        None => match std::env::current_exe() {
            Ok(exe) => exe.with_file_name("sandgate"),
            Err(e) => {
                eprintln!("sandgate-bench: start-up: {e}");
                return false;
            }
        },
    };
    if proxies::which("bwrap").is_none() {
        eprintln!("sandgate-bench: start-up: skipped, no bwrap on PATH");
        return true;
    }
    eprintln!("start-up: {} paired rounds", args.startup_rounds);
    match startup::measure(&sandgate, args.startup_rounds.max(1)) {
        Ok(figures) => {
            startup::print(&figures);
            true
        }
        Err(e) => {
            eprintln!("sandgate-bench: start-up: {e}");
            false
        }
    }
}

/// What every target's run shares.
#[derive(Debug)]
struct Bench<'a> {
    args: &'a Args,
    servers: Servers,
    /// A TLS ClientHello, to open every new tunnel with as HTTPS clients do.
    hello: Arc<[u8]>,
    sandgate_bin: PathBuf,
    /// The proxies' core, when pinned.
    core: Option<usize>,
    /// Clock ticks a second of /proc's CPU times.
    ticks: u64,
}

async fn run(args: &Args, proxy_core: Option<usize>) -> Result<bool, BoxError> {
    let bench = Bench {
        args,
        servers: servers::start().await?,
        hello: scenarios::client_hello()?.into(),
        sandgate_bin: match &args.sandgate {
            Some(p) => p.clone(),
            None => std::env::current_exe()?.with_file_name("sandgate"),
        },
        core: proxy_core,
        ticks: process::clock_ticks(),
    };
    let mut results: Results = BTreeMap::new();
    let mut ok = true;
    for round in 0..args.rounds {
        let n = args.targets.len();
        for i in 0..n {
            let Some(name) = args.targets.get((i + round) % n.max(1)) else {
                continue;
            };
            eprintln!("round {}/{}: {name}", round + 1, args.rounds);
            if let Err(e) = run_target(name, &bench, &mut results).await {
                eprintln!("  {name}: {e}");
                if name == "direct" || name == "sandgate" {
                    ok = false;
                }
            }
        }
    }
    report::print_report(args, &results, proxy_core.is_some());
    Ok(ok)
}

fn start_target(name: &str, b: &Bench<'_>) -> Result<Option<RunningProxy>, BoxError> {
    let (bin, s, core) = (b.sandgate_bin.as_path(), &b.servers, b.core);
    Ok(Some(match name {
        "direct" => return Ok(None),
        "sandgate" => proxies::sandgate(bin, s, core, SandgateMode::Plain)?,
        // The same, reading no tunnel's first bytes: the cost of the ClientHello check.
        "sandgate-nopeek" => proxies::sandgate(bin, s, core, SandgateMode::NoPeek)?,
        // The HTTPS origin's tunnels intercepted, every request inside decided and recorded.
        "sandgate-intercept" => proxies::sandgate(bin, s, core, SandgateMode::Intercept)?,
        // A node-local proxy forwarding to a central one (mutual TLS, HTTP/2 streams).
        "sandgate-central" => proxies::sandgate_central(bin, s, core, false)?,
        // The same with a TLS connection per tunnel (HTTP/1.1 CONNECT), for comparison.
        "sandgate-central-http1" => proxies::sandgate_central(bin, s, core, true)?,
        "squid" => proxies::squid(s, core)?,
        "tinyproxy" => proxies::tinyproxy(s, core)?,
        // The floor: a bare relay, one thread, no policy, no audit.
        "relay" => proxies::bare_relay(core)?,
        other => return Err(format!("unknown target {other}").into()),
    }))
}

async fn run_target(name: &str, b: &Bench<'_>, results: &mut Results) -> Result<(), BoxError> {
    let (args, s) = (b.args, &b.servers);
    let proxy = start_target(name, b)?;
    let via = proxy.as_ref().map_or(Via::Direct, |p| Via::Proxy(p.addr));
    let mut record = |metric: &'static str, value: f64| {
        results
            .entry(metric)
            .or_default()
            .entry(name.to_owned())
            .or_default()
            .push(value);
    };
    let wants = |scenario: Scenario| args.scenarios.contains(&scenario);
    let pids = proxy.as_ref().map(RunningProxy::pids).unwrap_or_default();
    let proxied = proxy.is_some();
    if wants(Scenario::Tunnel) {
        let meter = process::Meter::start(pids.clone(), b.ticks);
        let up = scenarios::upload(via, s, args.bytes).await?;
        let down = scenarios::download(via, s, args.bytes).await?;
        let gib = 2.0 * args.bytes as f64 / f64::from(1u32 << 30);
        per_unit(&mut record, proxied, &report::GIB_CPU, meter.stop(), gib, 1.0);
        record("a_up", up);
        record("b_down", down);
    }
    if wants(Scenario::Http) {
        let secs = Duration::from_secs_f64(args.http_secs);
        let meter = process::Meter::start(pids.clone(), b.ticks);
        let http = scenarios::http_gets(via, s, args.http_conns, secs).await?;
        per_unit(
            &mut record,
            proxied,
            &report::GET_CPU,
            meter.stop(),
            http.requests as f64,
            1e6,
        );
        record("c_rps", http.rps);
        record("d_p50", http.p50_us);
        record("e_p99", http.p99_us);
        record("f_p999", http.p999_us);
    }
    if wants(Scenario::NewTunnels) {
        let secs = Duration::from_secs_f64(args.tunnel_secs);
        let hello = b.hello.clone();
        // After a pause for the previous scenario's closes, which would land in the reading.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let meter = process::Meter::start(pids.clone(), b.ticks);
        let t = scenarios::new_tunnels(via, s, hello, args.tunnel_conns, secs).await?;
        // The last tunnels' closes and records, still being written when the load stops.
        tokio::time::sleep(Duration::from_millis(300)).await;
        per_unit(
            &mut record,
            proxied,
            &report::TUNNEL_CPU,
            meter.stop(),
            t.tunnels as f64,
            1e6,
        );
        record("g_tps", t.tps);
    }
    if wants(Scenario::Https) {
        // Before the idle tunnels, whose closes would land in its CPU reading; after a pause
        // for the previous scenario's closes.
        tokio::time::sleep(Duration::from_millis(300)).await;
        https(b, via, proxy.as_ref(), &mut record).await?;
    }
    drop(proxy);
    if wants(Scenario::Idle) && name != "direct" {
        // Each on a proxy of its own, started for it: a proxy that carried the scenarios
        // above (or the other idle set) would reuse heap it already holds, and show less.
        for (key, echoed) in [("h_idle", true), ("h_idle_silent", false)] {
            let Some(p) = start_target(name, b)? else {
                continue;
            };
            let via = Via::Proxy(p.addr);
            tokio::time::sleep(Duration::from_millis(300)).await;
            let before = process::rss_bytes(p.pid());
            let held = scenarios::hold_tunnels(via, s.echo, args.idle, echoed).await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let after = process::rss_bytes(p.pid());
            drop(held);
            record(key, after.saturating_sub(before) as f64 / args.idle.max(1) as f64);
        }
    }
    Ok(())
}

/// Records what one scenario's units of work cost, each in seconds times `scale` over
/// `units`: the proxy's CPU (when there is a proxy) and of it the kernel's, and the load
/// side's (client and servers; for `direct`, the limit a proxy is compared with) and of it
/// the kernel's, under `metric`'s keys.
fn per_unit(
    record: &mut impl FnMut(&'static str, f64),
    proxied: bool,
    metric: &report::CpuMetric,
    used: process::Used,
    units: f64,
    scale: f64,
) {
    let per = |d: Duration| d.as_secs_f64() * scale / units.max(1e-9);
    if proxied {
        record(metric.proxy, per(used.proxy.total()));
        record(metric.proxy_sys, per(used.proxy.system));
    }
    record(metric.load, per(used.load.total()));
    record(metric.load_sys, per(used.load.system));
}

/// Keep-alive HTTPS GETs, and the CPU the proxy (every process of the target) and the load
/// generator (client and origin, TLS on both ends) spent on them, per request.
async fn https(
    b: &Bench<'_>,
    via: Via,
    proxy: Option<&RunningProxy>,
    record: &mut impl FnMut(&'static str, f64),
) -> Result<(), BoxError> {
    // Through an intercepting proxy the client trusts only the interception CA, so a tunnel
    // left blind by mistake fails the handshake instead of being measured as intercepted.
    let trust = proxy
        .and_then(|p| p.intercept_ca_pem.as_deref())
        .unwrap_or(&b.servers.tls.ca_pem);
    let tls = client::tls_config(&[trust])?;
    let meter = process::Meter::start(proxy.map(RunningProxy::pids).unwrap_or_default(), b.ticks);
    let started = Instant::now();
    let secs = Duration::from_secs_f64(b.args.http_secs);
    let f = scenarios::https_gets(via, b.servers.tls.addr, tls, b.args.http_conns, secs).await?;
    let wall = started.elapsed().as_secs_f64();
    let used = meter.stop();
    record("i_https_rps", f.rps);
    record("j_https_p50", f.p50_us);
    record("k_https_p99", f.p99_us);
    if proxy.is_some() {
        record("m_https_busy", used.proxy.total().as_secs_f64() / wall * 100.0);
    }
    per_unit(
        record,
        proxy.is_some(),
        &report::HTTPS_CPU,
        used,
        f.requests as f64,
        1e6,
    );
    Ok(())
}
