//! `sandgate jupyter compose | launch | kernel | guard`: parse, call sandgate-jupyter, map
//! errors to exit codes (64 usage, 69 unavailable, 70 the server failed).

use std::process::ExitCode;

use sandgate_jupyter::compose::Composed;
use sandgate_jupyter::{ComposeOptions, JupyterError, KernelOptions, LaunchOptions, PythonEnv};

use crate::cli::JupyterCommand;

pub fn run(cmd: JupyterCommand) -> ExitCode {
    let sandgate = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sandgate: cannot find this program's path: {e}");
            return ExitCode::from(69);
        }
    };
    let result = match cmd {
        JupyterCommand::Compose {
            out,
            profiles,
            python,
            python_env,
        } => PythonEnv::parse(&python_env)
            .and_then(|python_env| {
                sandgate_jupyter::compose(&ComposeOptions {
                    out,
                    profiles,
                    python,
                    python_env,
                    sandgate,
                })
            })
            .map(|c| composed(&c)),
        JupyterCommand::Launch {
            bundle,
            port,
            token_file,
            no_mcp,
        } => sandgate_jupyter::launch(&LaunchOptions {
            bundle,
            port,
            token_file,
            no_mcp,
            sandgate,
        }),
        JupyterCommand::Kernel {
            bundle,
            profile,
            connection_file,
        } => sandgate_jupyter::kernel::run(&KernelOptions {
            bundle,
            profile,
            connection_file,
        }),
        JupyterCommand::Guard { parent, command } => Ok(sandgate_jupyter::guard::run(parent, &command)),
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("sandgate: {e}");
            ExitCode::from(JupyterError::exit_code(&e))
        }
    }
}

/// What compose says about the bundle it wrote; exit 0.
fn composed(c: &Composed) -> i32 {
    let names: Vec<&str> = c.settings.profiles.iter().map(|p| p.as_str()).collect();
    println!(
        "{}: profiles {} (default {}), kernels run {}",
        c.root.display(),
        names.join(", "),
        c.settings.default_profile,
        c.python.display()
    );
    println!(
        "launch: {} jupyter launch --bundle {}",
        c.root.join("bin/sandgate").display(),
        c.root.display()
    );
    if !c.outside.is_empty() {
        let dirs: Vec<String> = c.outside.iter().map(|d| d.display().to_string()).collect();
        eprintln!(
            "sandgate: warning: the carried environment also reads {} (outside the bundle and its base Python: an editable install or a .pth file); wherever the bundle runs, they must be there",
            dirs.join(", ")
        );
    }
    if !c.missing_for_launch.is_empty() {
        eprintln!(
            "sandgate: warning: {}",
            sandgate_jupyter::python::missing_message(&c.python, &c.missing_for_launch)
        );
    }
    0
}
