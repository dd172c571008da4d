//! `sandgate jupyter compose | launch | guard`: parse, call sandgate-jupyter, map errors to
//! exit codes (64 usage, 69 unavailable, 70 the server failed).

use std::process::ExitCode;

use sandgate_jupyter::{ComposeOptions, JupyterError, LaunchOptions};

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
        } => sandgate_jupyter::compose(&ComposeOptions {
            out,
            profiles,
            python,
            sandgate,
        })
        .map(|c| {
            let names: Vec<&str> = c.settings.profiles.iter().map(|p| p.as_str()).collect();
            println!(
                "{}: profiles {} (default {}), kernels run {}",
                c.root.display(),
                names.join(", "),
                c.settings.default_profile,
                c.settings.python.display()
            );
            println!(
                "launch: {} jupyter launch --bundle {}",
                c.root.join("bin/sandgate").display(),
                c.root.display()
            );
            if !c.missing_for_launch.is_empty() {
                eprintln!(
                    "sandgate: warning: {}",
                    sandgate_jupyter::python::missing_message(&c.settings.python, &c.missing_for_launch)
                );
            }
            0
        }),
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
