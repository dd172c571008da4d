//! `sandgate audit` and `sandgate policy`: reading the audit log (tail, export, summary)
//! and suggesting a policy from it. The grammar only; `audit_cmd.rs` and `policy_cmd.rs`
//! read the log.

use clap::{Args, Subcommand};

/// `sandgate audit ...`
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Show events from the current and rotated files, oldest first.
    Tail {
        #[command(flatten)]
        filter: AuditFilterArgs,
        /// The audit log (its rotated siblings .1, .2, ... are read too) [env:
        /// SANDGATE_AUDIT_LOG] [default: audit.jsonl]
        #[arg(long, value_name = "PATH")]
        file: Option<std::path::PathBuf>,
        /// Read the newest run log of `sandgate run` instead (kept under
        /// $XDG_STATE_HOME/sandgate/runs, or ~/.local/state/...), whatever SANDGATE_AUDIT_LOG
        /// says; its path goes to stderr.
        #[arg(long, conflicts_with = "file")]
        last_run: bool,
        /// Keep printing events as they are appended (Ctrl-C to stop).
        #[arg(long)]
        follow: bool,
        /// Print raw JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Export events for compliance, as JSON lines or CSV.
    Export {
        #[command(flatten)]
        filter: AuditFilterArgs,
        /// Input files, read in the order given.
        #[arg(long = "input", value_name = "FILE", required = true, num_args = 1..)]
        inputs: Vec<std::path::PathBuf>,
        /// Only these event types (decision, close, policy_reload, aggregate,
        /// exception_requested, exception_approved, exception_denied, exception_revoked,
        /// exception_expired, admin_refused); repeatable.
        #[arg(long = "event-type", value_name = "TYPE")]
        event_types: Vec<String>,
        /// JSON lines (each line as the proxy wrote it) or CSV (a header row, then one row
        /// an event).
        #[arg(long, value_enum, default_value = "jsonl")]
        format: ExportFormat,
        /// Where to write (created or replaced); - for stdout.
        #[arg(long, value_name = "F", default_value = "-")]
        output_file: std::path::PathBuf,
    },
    /// Top denied and allowed destinations, bytes by destination and by task (aggregates
    /// included).
    Summary {
        #[command(flatten)]
        filter: AuditFilterArgs,
        #[arg(
            long,
            value_name = "PATH",
            default_value = "audit.jsonl",
            env = "SANDGATE_AUDIT_LOG"
        )]
        file: std::path::PathBuf,
        /// Rows per table.
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    Jsonl,
    Csv,
}

/// Filters shared by the audit commands.
#[derive(Debug, Args)]
pub struct AuditFilterArgs {
    /// Only lines containing this text.
    #[arg(long, value_name = "PATTERN")]
    pub grep: Option<String>,
    /// Only events since: 90s, 30m, 1h, 2d, a date (2026-11-22, UTC), or an RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Only allow or deny decisions.
    #[arg(long, value_name = "allow|deny")]
    pub decision: Option<String>,
    /// Only events of this task.
    #[arg(long, value_name = "ID")]
    pub task: Option<String>,
    /// Only events for this destination host (exact, or *.suffix).
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,
}

/// `sandgate policy ...`
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Turn what the allowlist kept out (report_only decisions of `proxy --report-only`;
    /// with --include-denied, not_allowlisted denies too) into an EgressPolicy: an exact
    /// host entry with the ports seen and a reason naming the log, ready to review.
    Suggest {
        /// Audit logs to read (each with its rotated siblings), in order.
        #[arg(long = "from", value_name = "AUDIT", required = true, num_args = 1..)]
        from: Vec<std::path::PathBuf>,
        /// Also suggest entries for plain not_allowlisted denies.
        #[arg(long)]
        include_denied: bool,
        /// metadata.name of the policy written.
        #[arg(long, default_value = "learned")]
        name: String,
        /// The entries' reason [default: learned from AUDIT]
        #[arg(long)]
        reason: Option<String>,
        /// Write the policy here (created or replaced) instead of stdout.
        #[arg(long, value_name = "FILE")]
        output: Option<std::path::PathBuf>,
    },
}
