//! `--help` of every command is complete (issue 11): the binary's own summary (not the
//! package description), and a line of help for every flag and argument of every command
//! and subcommand, found by walking `Commands:` from the top.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and the shared harness connects to its own loopback fixtures"
)]

mod common;

use std::process::Command;

/// `sandgate PATH... --help`.
fn help(path: &[String]) -> String {
    let (code, out, err) = common::outcome(Command::new(common::sandgate_bin()).args(path).arg("--help"));
    assert_eq!(code, 0, "{path:?}: {err}");
    out
}

/// The subcommands a help text lists.
fn subcommands(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// The flags and arguments of a help text that have no help of their own.
fn undocumented(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let item = l.trim_start();
        let indent = l.len() - item.len();
        if !(2..=6).contains(&indent)
            || !(item.starts_with('-') || item.starts_with('<') || item.starts_with('['))
        {
            continue;
        }
        // Help on the same line, after two spaces; or on the next line, indented deeper.
        let same_line = item.split_once("  ").is_some_and(|(_, h)| !h.trim().is_empty());
        let next_line = lines.get(i + 1).is_some_and(|n| {
            let t = n.trim_start();
            n.len() - t.len() >= 10 && !t.is_empty() && !t.starts_with('-')
        });
        if !same_line && !next_line {
            out.push(item.to_owned());
        }
    }
    out
}

#[test]
fn every_command_and_flag_has_help() {
    let top = help(&[]);
    assert!(top.starts_with("sandgate: run untrusted code"), "{top}");
    let mut queue: Vec<Vec<String>> = subcommands(&top).into_iter().map(|c| vec![c]).collect();
    let mut seen = 0;
    let mut missing = Vec::new();
    while let Some(path) = queue.pop() {
        let text = help(&path);
        seen += 1;
        for item in undocumented(&text) {
            missing.push(format!("{}: {item}", path.join(" ")));
        }
        for sub in subcommands(&text) {
            let mut p = path.clone();
            p.push(sub);
            queue.push(p);
        }
    }
    assert!(seen >= 20, "only {seen} commands");
    assert!(missing.is_empty(), "without help:\n{}", missing.join("\n"));
}

#[test]
fn the_help_checker_finds_a_flag_without_help() {
    let text = "Options:\n      --a <X>  Has help\n      --b\n      --c <Y>\n          Help below\n  -h, --help  Print help\n";
    assert_eq!(undocumented(text), ["--b"]);
}
