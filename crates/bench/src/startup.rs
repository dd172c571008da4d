//! Sandbox start-up (issue 32): `sandgate run --quiet --no-audit-log -- /bin/true` in
//! `net.mode: none` and `allowlist`, each paired with bare bwrap running `/bin/true` under
//! the same namespaces and mounts (but for `--disable-userns`, which sandgate passes where
//! bwrap has it: one more user namespace on sandgate's side). Every round runs the three once, in an order rotated
//! round by round; a variant's figure is the median over the rounds of its time minus bare
//! bwrap's in the same round, so what the machine does meanwhile (another build, a slower
//! hour) weighs on both sides of each difference. Wall time from spawn to exit, process exit
//! included.
//!
//! Run before the harness pins itself to one core (the sandbox and the run's proxy get the
//! machine as a user's command would), and with the runs' state (`XDG_STATE_HOME`, the
//! temporary directory) in a directory of its own, removed after.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::client::BoxError;

/// The targets: ms over bare bwrap, `none` and `allowlist`.
pub const TARGETS_MS: [f64; 2] = [5.0, 8.0];

/// Medians over the rounds, in ms: bare bwrap's time, and each variant's gap to it.
#[derive(Debug)]
pub struct Startup {
    pub rounds: usize,
    pub bare_ms: f64,
    /// `none`, then `allowlist`.
    pub gaps_ms: [f64; 2],
}

/// Runs the paired loop, `rounds` rounds after one warm-up run of each.
pub fn measure(sandgate: &Path, rounds: usize) -> Result<Startup, BoxError> {
    let bwrap = crate::proxies::which("bwrap").ok_or("no bwrap on PATH")?;
    let dir = tempfile::tempdir()?;
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp)?;
    let reads = read_paths();
    let mut variants = vec![bare_argv(&bwrap)];
    for (name, net) in [
        ("none", "  mode: none\n"),
        (
            "allowlist",
            "  mode: allowlist\n  allow_domains: [ example.com ]\n",
        ),
    ] {
        let policy = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &policy,
            format!(
                "apiVersion: sandgate.dev/v1\nkind: SandboxPolicy\nfs:\n  read_paths: [ {} ]\n  cwd: /\nnet:\n{net}",
                reads.join(", ")
            ),
        )?;
        let mut argv: Vec<PathBuf> = vec![sandgate.into()];
        argv.extend(["run", "--quiet", "--no-audit-log", "--policy"].map(PathBuf::from));
        argv.push(policy);
        argv.extend(["--", "/bin/true"].map(PathBuf::from));
        variants.push(argv);
    }
    let time = |argv: &[PathBuf]| -> Result<f64, BoxError> {
        let (program, args) = argv.split_first().ok_or("an empty command line")?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("XDG_STATE_HOME", dir.path())
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let started = Instant::now();
        let status = cmd
            .status()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        if status.success() {
            return Ok(ms);
        }
        // Once more with its output, to say why.
        let out = cmd.stderr(Stdio::piped()).output()?;
        Err(format!(
            "{} exited {status}: {}",
            argv.iter()
                .map(|a| a.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into())
    };
    for argv in &variants {
        time(argv)?;
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); variants.len()];
    for round in 0..rounds {
        for i in 0..variants.len() {
            let v = (i + round) % variants.len();
            if let (Some(argv), Some(t)) = (variants.get(v), times.get_mut(v)) {
                t.push(time(argv)?);
            }
        }
    }
    let [bare, none, allowlist] = times.as_slice() else {
        return Err("three variants expected".into());
    };
    let gap = |v: &[f64]| median(v.iter().zip(bare).map(|(a, b)| a - b).collect());
    Ok(Startup {
        rounds,
        bare_ms: median(bare.clone()),
        gaps_ms: [gap(none), gap(allowlist)],
    })
}

/// The policy's read paths, the usual userland: `/usr`, and `/lib`, `/lib64`, `/bin` where
/// the host has them (on a merged-/usr host they are links, which both sandgate and bare
/// bwrap make as links inside).
fn read_paths() -> Vec<String> {
    let mut paths = vec!["/usr".to_owned()];
    for p in ["/lib", "/lib64", "/bin"] {
        if std::fs::symlink_metadata(p).is_ok() {
            paths.push(p.to_owned());
        }
    }
    paths
}

/// Bare bwrap: the namespaces and mounts `sandgate run` gives in `none` (its
/// `--print-argv`), with `/bin/true` as bwrap's own PID 1, no init, no filter.
fn bare_argv(bwrap: &Path) -> Vec<PathBuf> {
    let mut argv: Vec<String> = vec![bwrap.display().to_string()];
    let words = "--die-with-parent --unshare-user --unshare-uts --unshare-cgroup-try --cap-drop ALL \
                 --unshare-pid --unshare-ipc --unshare-net --proc /proc --dev /dev \
                 --size 1073741824 --tmpfs /dev/shm --size 1073741824 --tmpfs /tmp --ro-bind /usr /usr";
    argv.extend(words.split_whitespace().map(str::to_owned));
    for p in ["/lib", "/lib64", "/bin"] {
        match std::fs::read_link(p) {
            Ok(target) => {
                let target = Path::new("/").join(target);
                argv.extend(["--symlink".to_owned(), target.display().to_string(), p.to_owned()]);
            }
            Err(_) if Path::new(p).is_dir() => {
                argv.extend(["--ro-bind".to_owned(), p.to_owned(), p.to_owned()]);
            }
            Err(_) => {}
        }
    }
    let rest = "--remount-ro /dev --remount-ro / --chdir / --as-pid-1 -- /bin/true";
    argv.extend(rest.split_whitespace().map(str::to_owned));
    argv.into_iter().map(PathBuf::from).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v.get(n / 2).copied().unwrap_or(f64::NAN),
        n => {
            (v.get(n / 2 - 1).copied().unwrap_or(f64::NAN) + v.get(n / 2).copied().unwrap_or(f64::NAN)) / 2.0
        }
    }
}

/// The table: bare bwrap's median, each variant's median gap, and the targets.
pub fn print(s: &Startup) {
    println!();
    println!(
        "| sandbox start-up, `sandgate run -- /bin/true` (ms; medians of {} paired rounds) | bare bwrap | `none` over bare | `allowlist` over bare |",
        s.rounds
    );
    println!("|---|---:|---:|---:|");
    let [none, allowlist] = s.gaps_ms;
    println!("| measured | {:.2} | {none:+.2} | {allowlist:+.2} |", s.bare_ms);
    let [t_none, t_allow] = TARGETS_MS;
    println!("| target (issue 32) | - | +{t_none:.0} | +{t_allow:.0} |");
}
