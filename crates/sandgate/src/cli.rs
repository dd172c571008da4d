//! Command-line grammar (clap). Names here are an interface other tooling depends on.
//!
//! The root command and the hidden internal steps are here; each group of subcommands has
//! its flags in a module of its own: [`proxy`] (`proxy`, `explain`, `health`), [`sandbox`] (`run`,
//! `init`, `jupyter`), [`audit`] (`audit`, `policy`) and [`central`] (`exceptions`, `pki`).

use clap::{Parser, Subcommand};

mod audit;
pub(crate) mod central;
mod proxy;
mod sandbox;

pub use audit::{AuditCommand, AuditFilterArgs, ExportFormat, PolicyCommand};
pub use central::{ExceptionsArgs, ExceptionsCommand, PkiCommand};
pub use proxy::{ExplainArgs, HealthArgs, ProxyArgs};
pub use sandbox::{InitArgs, InitKind, JupyterCommand, RunArgs};

/// The commit this binary was built from (`git rev-parse --short HEAD`; "unknown" outside a
/// git checkout), from build.rs.
pub const COMMIT: &str = env!("SANDGATE_COMMIT");
/// The build's date, UTC `YYYY-MM-DD`: SOURCE_DATE_EPOCH's, else the commit's, else "unknown".
pub const BUILD_DATE: &str = env!("SANDGATE_BUILD_DATE");
/// What `--version` prints after the name: `0.1.0 (53ef163 2026-11-27)`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("SANDGATE_COMMIT"),
    " ",
    env!("SANDGATE_BUILD_DATE"),
    ")"
);

/// sandgate: run untrusted code so it reaches only the network destinations a policy allows.
#[derive(Debug, Parser)]
#[command(name = "sandgate", version = VERSION)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The shells `sandgate completions` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the egress proxy (HTTP forward proxy and CONNECT tunnels, default deny).
    Proxy(Box<ProxyArgs>),
    /// Validate a policy file of any kind (EgressPolicy, SandboxPolicy, McpServer) without
    /// binding anything: exit 0 (warnings on stderr), or 64 with the errors (file:line:
    /// field: message).
    CheckConfig {
        /// The policy file.
        file: std::path::PathBuf,
        /// Fill ${NAME} in a SandboxPolicy, as `sandgate run --param`.
        #[arg(long, value_name = "NAME=VALUE")]
        param: Vec<String>,
        /// Print one JSON object on stdout: every error and warning with its file, line,
        /// field and message (docs/policy.md). The exit status is the same.
        #[arg(long)]
        json: bool,
    },
    /// Write a commented starter policy that check-config passes: an EgressPolicy for
    /// `sandgate proxy`, or a SandboxPolicy for `sandgate run` (with --for, the read paths
    /// that command needs on this machine).
    Init(InitArgs),
    /// List the presets a policy can name and the hosts each allows.
    Presets {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Ask a running proxy's admin listener whether it is ready (/readyz): exit 0 ready, 1
    /// not (the reason on stderr). For HEALTHCHECK, compose and supervisors.
    Health(HealthArgs),
    /// Say whether a destination would be allowed, and by which rule; or, with --request-id,
    /// why a request was answered as it was and what would allow it. Exit 0 allowed, 1
    /// refused, 2 allowed but not resolvable (--resolve) or failed upstream, 64 usage.
    Explain(ExplainArgs),
    /// Work with policies: suggest one from what an audit log saw.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Read the audit log: tail, export, summary.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Run a command in a bubblewrap sandbox whose only way out is the policy.
    Run(RunArgs),
    /// Check this host for what `sandgate run` and the proxy need (bwrap, user namespaces,
    /// seccomp, cgroups, Landlock, kernel TLS, open files): what was found and what its
    /// absence costs. Exit 0 when `sandgate run` can work here, 1 when it cannot.
    Doctor {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Request, list and decide temporary egress exceptions through the admin API.
    Exceptions(ExceptionsArgs),
    /// Serve the Model Context Protocol on stdio: an agent runs commands in the named
    /// sandboxes of FILE and asks for egress that a person approves (docs/mcp.md).
    Mcp {
        /// The server's configuration (`kind: McpServer`).
        #[arg(long, value_name = "FILE")]
        config: std::path::PathBuf,
    },
    /// (internal) `sandgate mcp`'s step before each run: a session of its own (no terminal),
    /// then the command in place.
    #[command(hide = true)]
    McpSession {
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Jupyter kernels in sandboxes: compose a control bundle, launch Jupyter Server and
    /// jupyter-mcp-server from it (docs/jupyter.md).
    #[command(subcommand)]
    Jupyter(JupyterCommand),
    /// Make a CA and certificates for node-local and central proxies (for trying the central
    /// mode out and for tests; production brings its own PKI). docs/central.md
    #[command(subcommand)]
    Pki(PkiCommand),
    /// Print the shell completion script for SHELL on stdout (README: "Shell completions and
    /// man pages").
    #[command(hide = true)]
    Completions {
        /// The shell: bash, zsh or fish.
        #[arg(value_enum)]
        shell: CompletionShell,
    },
    /// Write one man page per command into DIR (made when missing): sandgate.1,
    /// sandgate-proxy.1, sandgate-audit-tail.1, ...; prints each file's path.
    #[command(hide = true)]
    Man {
        /// Where the pages go, e.g. ~/.local/share/man/man1.
        dir: std::path::PathBuf,
    },
    /// (internal) PID 1 inside every sandbox with a PID namespace; holds the bridges where
    /// there are any.
    #[command(hide = true)]
    SandboxInit {
        /// The build of the sandgate that wrote this command line: it must be this one's.
        #[arg(long)]
        build: Option<String>,
        /// ADDR=SOCKET: listen on ADDR inside, relay to SOCKET.
        #[arg(long = "forward", value_name = "ADDR=SOCKET")]
        forwards: Vec<String>,
        /// The policy lets the command create AF_UNIX sockets.
        #[arg(long)]
        allow_unix_sockets: bool,
        /// NAME=VALUE: an rlimit the command starts under (nproc, data, cpu, nofile).
        #[arg(long = "rlimit", value_name = "NAME=VALUE")]
        rlimits: Vec<String>,
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// (internal) Loads the sandbox's seccomp filter, then executes the command (where
    /// there is no init, which does the same for the command it starts).
    #[command(hide = true)]
    SandboxExec {
        /// The build of the sandgate that wrote this command line: it must be this one's.
        #[arg(long)]
        build: Option<String>,
        /// Let the command create AF_UNIX sockets (platform.seccomp.allow_unix_sockets).
        #[arg(long)]
        allow_unix_sockets: bool,
        /// NAME=VALUE: an rlimit to set first (nproc, data, cpu, nofile).
        #[arg(long = "rlimit", value_name = "NAME=VALUE")]
        rlimits: Vec<String>,
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
}

/// `sandgate run ...` read with only the `run` command built: clap otherwise builds every
/// command's flags first, half a millisecond of every run. `None` where that does not parse
/// (`--help`, a mistake, a global flag before `run`): the whole grammar then reads it, and
/// reports as it always did.
pub fn parse_run(args: &[std::ffi::OsString]) -> Option<Cli> {
    use clap::{Args, FromArgMatches};
    if args.get(1).is_none_or(|a| a != "run") {
        return None;
    }
    let root = clap::Command::new("sandgate")
        .arg(
            clap::Arg::new("log_format")
                .long("log-format")
                .global(true)
                .value_parser(clap::value_parser!(LogFormat))
                .default_value("text"),
        )
        .subcommand(RunArgs::augment_args(clap::Command::new("run")));
    let matches = root.try_get_matches_from(args).ok()?;
    Cli::from_arg_matches(&matches).ok()
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::Parser;

    /// The `run` fast path reads every command line it accepts as the whole grammar does.
    #[test]
    fn run_is_read_as_the_whole_grammar_reads_it() {
        for line in [
            "sandgate run -- true",
            "sandgate run --quiet --no-audit-log --policy p.yaml -- /bin/true -x",
            "sandgate run --log-format json --net none --allow-domain a.example --limit memory=1G -- sh",
            "sandgate run --ask --ask-timeout 5 --param A=1 --param B=2 --task t --chdir /tmp -- sh -c x",
        ] {
            let args: Vec<std::ffi::OsString> = line.split(' ').map(Into::into).collect();
            let fast = super::parse_run(&args).unwrap_or_else(|| panic!("not read: {line}"));
            let full = Cli::try_parse_from(&args).unwrap();
            assert_eq!(format!("{fast:?}"), format!("{full:?}"), "{line}");
        }
        for line in [
            "sandgate run --help",
            "sandgate run --bogus -- true",
            "sandgate run",
            "sandgate --log-format json run -- true",
            "sandgate proxy",
        ] {
            let args: Vec<std::ffi::OsString> = line.split(' ').map(Into::into).collect();
            assert!(super::parse_run(&args).is_none(), "{line}");
        }
    }
}
