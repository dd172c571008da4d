//! The diagnostics on stderr (tracing): the level from `SANDGATE_LOG` or the command's
//! default, text or JSON, and colour only for a person at a terminal who has not asked for
//! none (<https://no-color.org>: `NO_COLOR` set to any non-empty value). Not the audit log,
//! which is its own stream (crates/audit).

use std::ffi::OsStr;
use std::io::IsTerminal;

use crate::cli::LogFormat;

/// Installs the global subscriber; `default` is the filter when `SANDGATE_LOG` is unset or
/// does not parse.
pub fn init(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = colour(
        std::env::var_os("NO_COLOR").as_deref(),
        std::io::stderr().is_terminal(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Whether the text log is coloured: stderr is a terminal and `NO_COLOR` is unset or empty
/// (an empty value means unset, as no-color.org says). `with_ansi` overrides
/// tracing-subscriber's own reading of `NO_COLOR`, so both are decided here.
fn colour(no_color: Option<&OsStr>, terminal: bool) -> bool {
    terminal && no_color.is_none_or(OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use super::colour;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_at_a_terminal_without_no_color() {
        assert!(colour(None, true));
        assert!(colour(Some(OsStr::new("")), true), "an empty NO_COLOR is unset");
        assert!(!colour(Some(OsStr::new("1")), true));
        assert!(!colour(Some(OsStr::new("false")), true), "any non-empty value");
        assert!(!colour(None, false), "a pipe or a file gets no escapes");
        assert!(!colour(Some(OsStr::new("1")), false));
    }
}
