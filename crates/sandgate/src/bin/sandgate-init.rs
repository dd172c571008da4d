//! `sandgate-init`: the sandbox's first program, installed beside `sandgate`. It reads only
//! the two internal steps (`sandbox-init`, `sandbox-exec`; `sandgate_sandbox::steps`) and
//! runs them, exactly as `sandgate` does; being a few megabytes rather than the whole
//! command line tool, it starts about 0.8 ms sooner on every `sandgate run`
//! (`sandgate_sandbox::run::init_binary` chooses it; docs/benchmarks.md, "Sandbox
//! start-up").

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(step) = args.get(1..).and_then(sandgate_sandbox::steps::parse) {
        return ExitCode::from(sandgate_sandbox::steps::run(step).clamp(0, 255) as u8);
    }
    // `sandgate run` writes these command lines, its build first (`--build`): one of another
    // build means this file was left from another install or build; anything else came from
    // a person. Either way nothing runs.
    let theirs = args
        .iter()
        .skip_while(|a| *a != "--build")
        .nth(1)
        .map(|b| b.to_string_lossy().into_owned());
    match theirs.and_then(|b| sandgate_sandbox::steps::other_build(Some(&b))) {
        Some(why) => {
            eprintln!("sandgate-init: {why}");
            ExitCode::from(70)
        }
        None => {
            eprintln!(
                "sandgate-init: not a command line this build reads (its build is {}); it is started by `sandgate run`, and must come from the same build as the sandgate beside it",
                sandgate_sandbox::steps::BUILD
            );
            ExitCode::from(sandgate_sandbox::steps::EXIT_USAGE as u8)
        }
    }
}
