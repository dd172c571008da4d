//! `sandgate audit tail|export|summary`: thin wrappers over `sandgate_proxy::audit_query`.
//! Skipped (torn or malformed) lines are reported on stderr, never silently dropped.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use sandgate_proxy::audit_query::{self as q, Filter};

use crate::EX_USAGE;
use crate::cli::{AuditCommand, AuditFilterArgs, ExportFormat};

fn filter(args: &AuditFilterArgs, events: Vec<String>) -> Result<Filter, String> {
    let since = match &args.since {
        Some(s) => Some(q::parse_since(s, jiff::Timestamp::now())?),
        None => None,
    };
    if let Some(d) = &args.decision
        && d != "allow"
        && d != "deny"
    {
        return Err(format!("invalid --decision {d:?}: use allow or deny"));
    }
    Ok(Filter {
        since,
        decision: args.decision.clone(),
        task: args.task.clone(),
        host: args.host.clone(),
        grep: args.grep.clone(),
        events,
    })
}

fn report(skipped: &[q::Skipped]) {
    for s in skipped {
        eprintln!("sandgate: {s}");
    }
}

pub fn run(cmd: AuditCommand) -> ExitCode {
    match run_inner(cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("sandgate: {message}");
            ExitCode::from(EX_USAGE)
        }
    }
}

fn run_inner(cmd: AuditCommand) -> Result<(), String> {
    match cmd {
        AuditCommand::Tail {
            filter: f,
            file,
            follow,
            json,
        } => {
            let filter = filter(&f, Vec::new())?;
            let files = q::log_files(&file);
            if files.is_empty() && !follow {
                return Err(format!("no audit log at {}", file.display()));
            }
            let (events, skipped) = q::read_events(&files).map_err(|e| e.to_string())?;
            report(&skipped);
            let show = |e: &serde_json::Value| if json { e.to_string() } else { q::human(e) };
            let mut out = std::io::stdout().lock();
            for e in events.iter().filter(|e| filter.matches(e)) {
                writeln!(out, "{}", show(e)).map_err(|e| e.to_string())?;
            }
            drop(out);
            if follow {
                let mut offset = std::fs::metadata(&file).map_or(0, |m| m.len());
                // Runs until interrupted, as `tail -f` does.
                loop {
                    std::thread::sleep(Duration::from_millis(250));
                    let Ok((new, next)) = q::read_appended(&file, offset) else {
                        continue;
                    };
                    offset = next;
                    for e in new.iter().filter(|e| filter.matches(e)) {
                        println!("{}", show(e));
                    }
                }
            }
            Ok(())
        }
        AuditCommand::Export {
            filter: f,
            inputs,
            event_types,
            format,
            output_file,
        } => {
            let filter = filter(&f, event_types)?;
            let (events, skipped) = q::read_events(&inputs).map_err(|e| e.to_string())?;
            report(&skipped);
            let mut out = std::io::BufWriter::new(
                std::fs::File::create(&output_file)
                    .map_err(|e| format!("cannot create {}: {e}", output_file.display()))?,
            );
            let mut n = 0usize;
            if format == ExportFormat::Csv {
                writeln!(out, "{}", q::CSV_COLUMNS.join(",")).map_err(|e| e.to_string())?;
            }
            for e in events.iter().filter(|e| filter.matches(e)) {
                let line = match format {
                    ExportFormat::Jsonl => e.to_string(),
                    ExportFormat::Csv => q::csv_row(e),
                };
                writeln!(out, "{line}").map_err(|e| e.to_string())?;
                n += 1;
            }
            out.flush().map_err(|e| e.to_string())?;
            eprintln!(
                "sandgate: exported {n} events to {} ({} lines skipped)",
                output_file.display(),
                skipped.len()
            );
            Ok(())
        }
        AuditCommand::Summary { filter: f, file, top } => {
            let filter = filter(&f, Vec::new())?;
            let files = q::log_files(&file);
            if files.is_empty() {
                return Err(format!("no audit log at {}", file.display()));
            }
            let (events, skipped) = q::read_events(&files).map_err(|e| e.to_string())?;
            report(&skipped);
            let chosen: Vec<_> = events.into_iter().filter(|e| filter.matches(e)).collect();
            let s = q::summarize(&chosen);
            println!("top denied destinations:");
            for (dest, n) in s.denied.iter().take(top) {
                println!("  {n:>8}  {dest}");
            }
            println!("top allowed destinations (requests):");
            for (dest, n) in s.allowed.iter().take(top) {
                println!("  {n:>8}  {dest}");
            }
            println!("bytes by destination (sent / received):");
            for (dest, sent, recv) in s.bytes_by_destination.iter().take(top) {
                println!("  {sent:>12} / {recv:<12} {dest}");
            }
            println!("bytes by task (sent / received):");
            for (task, sent, recv) in s.bytes_by_task.iter().take(top) {
                println!("  {sent:>12} / {recv:<12} {task}");
            }
            Ok(())
        }
    }
}
