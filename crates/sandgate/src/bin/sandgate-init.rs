//! `sandgate-init`: the sandbox's first program, installed beside `sandgate`. It reads only
//! the two internal steps (`sandbox-init`, `sandbox-exec`; `sandgate_sandbox::steps`) and
//! runs them, exactly as `sandgate` does; being a few megabytes rather than the whole
//! command line tool, it starts about 0.8 ms sooner on every `sandgate run`
//! (`sandgate_sandbox::run::init_binary` chooses it; docs/benchmarks.md, "Sandbox
//! start-up").

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match args.get(1..).and_then(sandgate_sandbox::steps::parse) {
        Some(step) => ExitCode::from(sandgate_sandbox::steps::run(step).clamp(0, 255) as u8),
        None => {
            // `sandgate run` writes these command lines, with its build first (`--build`);
            // one this build does not read came from a `sandgate` of another build, or from
            // a person.
            eprintln!(
                "sandgate-init: not a command line this build reads (its build is {}); it is started by `sandgate run`, and must come from the same build as the sandgate beside it",
                sandgate_sandbox::steps::BUILD
            );
            ExitCode::from(sandgate_sandbox::steps::EXIT_USAGE as u8)
        }
    }
}
