//! `sandgate completions SHELL` and `sandgate man DIR`: shell completion scripts (bash, zsh,
//! fish; clap_complete) and one man page per command (clap_mangen), both made from the clap
//! definition in `cli`, so they cannot disagree with `--help`. Hidden from `--help`: they
//! are for packaging (scripts/build-image installs their output in the image) and for the
//! one-time set-up the README describes. Internal commands stay out of both, as they stay
//! out of `--help`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::CommandFactory;

use crate::cli::{BUILD_DATE, Cli, CompletionShell, VERSION};

/// Prints the completion script for `shell` on stdout.
pub fn completions(shell: CompletionShell) -> ExitCode {
    let shell = match shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut public(&Cli::command()), "sandgate", &mut script);
    match std::io::stdout().lock().write_all(&script) {
        // `| head` is not a failure.
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandgate: cannot write the completion script: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `cmd` without its hidden commands and arguments, at every depth: clap_complete offers
/// those too, and `sandgate sandbox-init` is nothing a person types. Rebuilt from the parts
/// completion reads (names, help, arguments, version), as clap cannot remove a subcommand.
fn public(cmd: &clap::Command) -> clap::Command {
    let mut copy = clap::Command::new(cmd.get_name().to_owned())
        .args(cmd.get_arguments().filter(|a| !a.is_hide_set()).cloned())
        .groups(cmd.get_groups().cloned())
        .subcommands(cmd.get_subcommands().filter(|c| !c.is_hide_set()).map(public));
    if let Some(about) = cmd.get_about() {
        copy = copy.about(about.clone());
    }
    if let Some(about) = cmd.get_long_about() {
        copy = copy.long_about(about.clone());
    }
    if let Some(version) = cmd.get_version() {
        copy = copy.version(version.to_owned());
    }
    copy
}

/// Writes `sandgate.1` and a `sandgate-COMMAND.1` for every command below it (e.g.
/// `sandgate-audit-tail.1`) into `dir`, made when missing; lists them on stdout.
pub fn man(dir: &Path) -> ExitCode {
    match write_pages(dir) {
        Ok(pages) => {
            let mut out = std::io::stdout().lock();
            for p in pages {
                let _ = writeln!(out, "{}", p.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandgate: cannot write man pages into {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

fn write_pages(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut root = Cli::command().disable_help_subcommand(true);
    // Gives every subcommand its display name (`sandgate-audit-tail`): the page's title and
    // file name.
    root.build();
    let mut pages = Vec::new();
    let mut queue = vec![root];
    while let Some(cmd) = queue.pop() {
        queue.extend(cmd.get_subcommands().filter(|c| !c.is_hide_set()).cloned());
        let mut page = clap_mangen::Man::new(cmd)
            .source(format!("sandgate {VERSION}"))
            .manual("sandgate manual");
        // The build's date (the commit's or SOURCE_DATE_EPOCH's), never today's.
        if BUILD_DATE != "unknown" {
            page = page.date(BUILD_DATE);
        }
        pages.push(page.generate_to(dir)?);
    }
    pages.sort();
    Ok(pages)
}
