//! The command lines of the sandbox's internal steps, `sandgate sandbox-init` ([`crate::init`])
//! and `sandgate sandbox-exec` ([`crate::exec`]), read by hand and run. One of them starts
//! inside every sandbox, on every `sandgate run`, so the binary reads them before clap builds
//! its whole command tree (half a millisecond; docs/benchmarks.md, "Sandbox start-up").
//!
//! [`parse`] accepts exactly what the hidden clap commands accept in the forms the runner
//! writes (`--build ID` first, this build's [`BUILD`]; then `--forward ADDR=SOCKET`,
//! `--allow-unix-sockets`, `--rlimit NAME=VALUE`, each value also as `--flag=VALUE`; then
//! `--` and a command of at least one word). Anything else (no `--`, another build, an
//! unknown or repeated flag, `--help`, a value that is not UTF-8) is not recognised, and the
//! binary hands the command line to clap, which reports it as before.

use std::ffi::{OsStr, OsString};

/// Exit status for a command line that does not parse (sysexits' EX_USAGE, as the binary's).
pub const EXIT_USAGE: i32 = 64;

/// This build's identity (a hash of the sources the init is built from: `build.rs`). The
/// runner writes it as `--build ID`, first after the step's name, and a step runs only
/// under its own: a `sandgate-init` left from another build (an upgrade that replaced only
/// `sandgate`) refuses to run anything rather than hold the sandbox with another filter.
pub const BUILD: &str = env!("SANDGATE_STEPS_BUILD");

/// Why a step started with `build` (its `--build`, if any) must not run; `None` when it is
/// this build's.
pub fn other_build(build: Option<&str>) -> Option<String> {
    match build {
        Some(b) if b == BUILD => None,
        said => Some(format!(
            "this is build {BUILD}, the sandgate that started it is build {}: install or build both from one build (`cargo build -p sandgate` builds both; `cargo run` only sandgate), or remove sandgate-init and sandgate is its own init; nothing was run",
            said.unwrap_or("none")
        )),
    }
}

/// One internal step, as its command line asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `sandbox-init`: PID 1 inside the sandbox, holding the bridges ([`crate::init::run`]).
    Init {
        /// `--forward ADDR=SOCKET`, unparsed (checked when the step runs).
        forwards: Vec<String>,
        allow_unix_sockets: bool,
        /// `--rlimit NAME=VALUE`.
        rlimits: Vec<String>,
        command: Vec<OsString>,
    },
    /// `sandbox-exec`: the filter, then the command, where there is no init
    /// ([`crate::exec::run`]).
    Exec {
        allow_unix_sockets: bool,
        rlimits: Vec<String>,
        command: Vec<OsString>,
    },
}

/// Reads `args` (the command line without the program's name) as one internal step; `None`
/// for anything else, which clap then reads.
pub fn parse(args: &[OsString]) -> Option<Step> {
    let (name, rest) = args.split_first()?;
    let init = match name.to_str()? {
        "sandbox-init" => true,
        "sandbox-exec" => false,
        _ => return None,
    };
    let mut forwards = Vec::new();
    let mut rlimits = Vec::new();
    let mut allow_unix_sockets = false;
    let mut words = rest.iter();
    // `--build ID`, first, and this build's: anything else goes to clap, which refuses it.
    if words.next()?.to_str()? != "--build" || value_of(words.next()?)? != BUILD {
        return None;
    }
    while let Some(word) = words.next() {
        let word = word.to_str()?;
        if word == "--" {
            let command: Vec<OsString> = words.cloned().collect();
            if command.is_empty() {
                return None;
            }
            return Some(if init {
                Step::Init {
                    forwards,
                    allow_unix_sockets,
                    rlimits,
                    command,
                }
            } else {
                Step::Exec {
                    allow_unix_sockets,
                    rlimits,
                    command,
                }
            });
        }
        if word == "--allow-unix-sockets" {
            if allow_unix_sockets {
                return None;
            }
            allow_unix_sockets = true;
            continue;
        }
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) => (flag, Some(value)),
            None => (word, None),
        };
        let list = match flag {
            "--rlimit" => &mut rlimits,
            "--forward" if init => &mut forwards,
            _ => return None,
        };
        let value = match inline {
            Some(value) => value,
            None => value_of(words.next()?)?,
        };
        list.push(value.to_owned());
    }
    None
}

/// A flag's value in its own word: UTF-8, and not something clap would read as a flag.
fn value_of(word: &OsStr) -> Option<&str> {
    word.to_str().filter(|v| !v.starts_with('-'))
}

/// Runs `step`; returns the process exit status.
pub fn run(step: Step) -> i32 {
    match step {
        Step::Init {
            forwards,
            allow_unix_sockets,
            rlimits,
            command,
        } => {
            let parsed: Result<Vec<_>, String> =
                forwards.iter().map(|f| crate::init::parse_forward(f)).collect();
            match parsed {
                Ok(forwards) => crate::init::run(&forwards, allow_unix_sockets, &rlimits, &command),
                Err(e) => {
                    eprintln!("sandgate: {e}");
                    EXIT_USAGE
                }
            }
        }
        Step::Exec {
            allow_unix_sockets,
            rlimits,
            command,
        } => {
            let options = crate::seccomp::FilterOptions { allow_unix_sockets };
            crate::exec::run(options, &rlimits, &command)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words of `line`, `BUILD` standing for this build's identity.
    fn words(line: &str) -> Vec<OsString> {
        line.split(' ')
            .map(|w| OsString::from(if w == "BUILD" { super::BUILD } else { w }))
            .collect()
    }

    #[test]
    fn the_runners_command_lines_are_read() {
        let line = "sandbox-init --build BUILD --allow-unix-sockets --rlimit nproc=512 --rlimit=nofile=64 \
                    --forward 127.0.0.1:3128=/run/sandgate/proxy.sock -- sh -c true";
        assert_eq!(
            parse(&words(line)),
            Some(Step::Init {
                forwards: vec!["127.0.0.1:3128=/run/sandgate/proxy.sock".into()],
                allow_unix_sockets: true,
                rlimits: vec!["nproc=512".into(), "nofile=64".into()],
                command: words("sh -c true"),
            })
        );
        assert_eq!(
            parse(&words(
                "sandbox-exec --build BUILD --rlimit cpu=5 -- /bin/true --rlimit x"
            )),
            Some(Step::Exec {
                allow_unix_sockets: false,
                rlimits: vec!["cpu=5".into()],
                command: words("/bin/true --rlimit x"),
            })
        );
    }

    /// What the fast path does not read is left to clap, which reports it as it always did.
    #[test]
    fn anything_else_is_left_to_clap() {
        for line in [
            "sandbox-init",
            "sandbox-init --",
            "sandbox-init /bin/true",
            "sandbox-init -- true",
            "sandbox-init --rlimit nproc=1 -- true",
            "sandbox-init --build -- true",
            "sandbox-init --build 0123456789abcdef -- true",
            "sandbox-init --rlimit nproc=1 --build BUILD -- true",
            "sandbox-init --build BUILD --build BUILD -- true",
            "sandbox-exec --build BUILD",
            "sandbox-init --help",
            "sandbox-init --allow-unix-sockets --allow-unix-sockets -- true",
            "sandbox-init --rlimit",
            "sandbox-init --rlimit -- true",
            "sandbox-init --bogus -- true",
            "sandbox-exec --forward 127.0.0.1:1=/x -- true",
            "sandbox-enter -- true",
            "run -- true",
            "--log-format json sandbox-init -- true",
        ] {
            assert_eq!(parse(&words(line)), None, "{line}");
        }
        assert_eq!(parse(&[]), None);
    }

    #[cfg(unix)]
    #[test]
    fn a_value_that_is_not_utf8_is_left_to_clap() {
        use std::os::unix::ffi::OsStringExt;
        let mut args = words("sandbox-init --build BUILD --rlimit");
        args.push(OsString::from_vec(vec![0xff]));
        args.extend(words("-- true"));
        assert_eq!(parse(&args), None);
        // The command's own words may be anything.
        let mut args = words("sandbox-init --build BUILD --");
        args.push(OsString::from_vec(vec![0xff]));
        assert!(parse(&args).is_some());
    }

    #[test]
    fn a_bad_forward_is_a_usage_error_and_runs_nothing() {
        let step = parse(&words(
            "sandbox-init --build BUILD --forward nonsense -- /bin/true",
        ))
        .unwrap();
        assert_eq!(run(step), EXIT_USAGE);
    }
}
