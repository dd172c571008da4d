//! `sandgate audit tail|export|summary`: thin wrappers over `sandgate_proxy::audit_query`,
//! which reads every line through the audit trail's one typed reader. Skipped (torn,
//! malformed or overlong) lines are reported on stderr, never silently dropped.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use sandgate_policy::Verdict;
use sandgate_proxy::EventKind;
use sandgate_proxy::audit::Entry;
use sandgate_proxy::audit_query::{self as q, Filter};

use crate::EX_USAGE;
use crate::cli::{AuditCommand, AuditFilterArgs, ExportFormat};

fn filter(args: &AuditFilterArgs, events: &[String]) -> Result<Filter, String> {
    let since = match &args.since {
        Some(s) => Some(q::parse_since(s, jiff::Timestamp::now())?),
        None => None,
    };
    let decision = match args.decision.as_deref() {
        None => None,
        Some("allow") => Some(Verdict::Allow),
        Some("deny") => Some(Verdict::Deny),
        Some(d) => return Err(format!("invalid --decision {d:?}: use allow or deny")),
    };
    let events = events
        .iter()
        .map(|e| {
            EventKind::parse(e).ok_or_else(|| {
                let kinds: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("invalid --event-type {e:?}: use {}", kinds.join(", "))
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Filter {
        since,
        decision,
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
        // The reader went away (`| head`): not an error of ours.
        Err(Failure::Closed) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("sandgate: {message}");
            ExitCode::from(EX_USAGE)
        }
    }
}

/// Why a command stopped.
enum Failure {
    /// A bad flag, a missing or unreadable file.
    Usage(String),
    /// Whoever reads the output closed it.
    Closed,
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::Usage(message)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Failure::Closed
        } else {
            Failure::Usage(e.to_string())
        }
    }
}

/// What to say when the log is not where `--file` points.
fn no_log(file: &std::path::Path) -> String {
    let latest_run = sandgate_sandbox::runlog::latest()
        .map(|p| format!("; the latest sandgate run's log is {}", p.display()))
        .unwrap_or_default();
    format!(
        "no audit log at {}: pass --file PATH (the proxy's --audit-log) or set SANDGATE_AUDIT_LOG; \
         sandgate proxy writes to stdout unless --audit-log names a file{latest_run}",
        file.display()
    )
}

/// `--last-run`: the newest log `sandgate run` kept, said on stderr, or why there is none.
fn newest_run_log() -> Result<std::path::PathBuf, String> {
    let Some(dir) = sandgate_sandbox::runlog::dir() else {
        return Err(
            "--last-run: neither XDG_STATE_HOME nor HOME names a directory, so no run log is kept".to_owned(),
        );
    };
    let Some(path) = sandgate_sandbox::runlog::latest() else {
        return Err(format!(
            "--last-run: no run log in {}: `sandgate run` keeps each run's there (unless --audit-log or --no-audit-log)",
            dir.display()
        ));
    };
    eprintln!("sandgate: audit log: {} (the newest run's)", path.display());
    Ok(path)
}

fn run_inner(cmd: AuditCommand) -> Result<(), Failure> {
    match cmd {
        AuditCommand::Tail {
            filter: f,
            file,
            last_run,
            follow,
            json,
        } => {
            let filter = filter(&f, &[])?;
            // Read here, not by clap, so that the variable does not conflict with --last-run.
            let file = match file {
                _ if last_run => newest_run_log()?,
                Some(file) => file,
                None => std::env::var_os("SANDGATE_AUDIT_LOG")
                    .filter(|v| !v.is_empty())
                    .map_or_else(|| "audit.jsonl".into(), std::path::PathBuf::from),
            };
            let files = q::log_files(&file);
            if files.is_empty() && !follow {
                return Err(no_log(&file).into());
            }
            let (events, skipped) = q::read_events(&files)?;
            report(&skipped);
            // --json passes each line through exactly as the proxy wrote it.
            let show = |e: &Entry| if json { e.text.clone() } else { q::human(&e.record) };
            let mut out = std::io::stdout().lock();
            for e in events.iter().filter(|e| filter.matches(e)) {
                writeln!(out, "{}", show(e))?;
            }
            out.flush()?;
            if follow {
                let mut offset = std::fs::metadata(&file).map_or(0, |m| m.len());
                // Runs until interrupted, as `tail -f` does.
                loop {
                    std::thread::sleep(Duration::from_millis(250));
                    let Ok((new, skipped, next)) = q::read_appended(&file, offset) else {
                        continue;
                    };
                    offset = next;
                    report(&skipped);
                    for e in new.iter().filter(|e| filter.matches(e)) {
                        writeln!(out, "{}", show(e))?;
                    }
                    out.flush()?;
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
            let filter = filter(&f, &event_types)?;
            let (events, skipped) = q::read_events(&inputs)?;
            report(&skipped);
            // `-` is stdout.
            let to_stdout = output_file.as_os_str() == "-";
            let sink: Box<dyn Write> = if to_stdout {
                Box::new(std::io::stdout().lock())
            } else {
                Box::new(
                    std::fs::File::create(&output_file)
                        .map_err(|e| format!("cannot create {}: {e}", output_file.display()))?,
                )
            };
            let mut out = std::io::BufWriter::new(sink);
            let mut n = 0usize;
            if format == ExportFormat::Csv {
                writeln!(out, "{}", q::CSV_COLUMNS.join(","))?;
            }
            for e in events.iter().filter(|e| filter.matches(e)) {
                match format {
                    ExportFormat::Jsonl => writeln!(out, "{}", e.text)?,
                    ExportFormat::Csv => writeln!(out, "{}", q::csv_row(&e.record))?,
                }
                n += 1;
            }
            out.flush()?;
            eprintln!(
                "sandgate: exported {n} events to {} ({} lines skipped)",
                if to_stdout {
                    "stdout".to_owned()
                } else {
                    output_file.display().to_string()
                },
                skipped.len()
            );
            Ok(())
        }
        AuditCommand::Summary { filter: f, file, top } => {
            let filter = filter(&f, &[])?;
            let files = q::log_files(&file);
            if files.is_empty() {
                return Err(no_log(&file).into());
            }
            let (events, skipped) = q::read_events(&files)?;
            report(&skipped);
            let s = q::summarize(events.iter().filter(|e| filter.matches(e)).map(|e| &e.record));
            let mut out = std::io::stdout().lock();
            writeln!(out, "top denied destinations:")?;
            for (dest, n) in s.denied.iter().take(top) {
                writeln!(out, "  {n:>8}  {dest}")?;
            }
            writeln!(out, "top allowed destinations (requests):")?;
            for (dest, n) in s.allowed.iter().take(top) {
                writeln!(out, "  {n:>8}  {dest}")?;
            }
            writeln!(out, "bytes by destination (sent / received):")?;
            for (dest, sent, recv) in s.bytes_by_destination.iter().take(top) {
                writeln!(out, "  {sent:>12} / {recv:<12} {dest}")?;
            }
            writeln!(out, "bytes by task (sent / received):")?;
            for (task, sent, recv) in s.bytes_by_task.iter().take(top) {
                writeln!(out, "  {sent:>12} / {recv:<12} {task}")?;
            }
            Ok(())
        }
    }
}
