//! `sandgate run`, `sandgate init` and `sandgate jupyter`: a command in a sandbox, the
//! starter policies, and Jupyter kernels under `sandgate run`.

use clap::{Args, Subcommand};

/// `sandgate run` flags.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The SandboxPolicy (YAML; see docs/sandbox.md; `sandgate init --for COMMAND` writes
    /// one) [default: ./sandbox.yaml, when there]
    #[arg(long, value_name = "FILE")]
    pub policy: Option<std::path::PathBuf>,
    /// Fill ${NAME} in the policy.
    #[arg(long, value_name = "NAME=VALUE")]
    pub param: Vec<String>,
    /// Fill ${NAME} with PATH in its canonical form (it must exist).
    #[arg(long, value_name = "NAME=PATH")]
    pub path_param: Vec<String>,
    /// Override net.mode: none, loopback, all, allowlist, proxy.
    #[arg(long, value_name = "MODE")]
    pub net: Option<String>,
    /// Extra allowed destination (allowlist mode), same grammar as `proxy --allow`.
    #[arg(long, value_name = "D")]
    pub allow_domain: Vec<String>,
    /// Keep the run's audit log here (JSON lines) [default:
    /// $XDG_STATE_HOME/sandgate/runs/RUN.jsonl, or ~/.local/state/...; the newest 100 kept]
    #[arg(long, value_name = "PATH")]
    pub audit_log: Option<std::path::PathBuf>,
    /// Keep no audit log after the run (the run's proxy still writes one while it runs).
    #[arg(long, conflicts_with = "audit_log")]
    pub no_audit_log: bool,
    /// Learn mode: requests the policy denies pass and are recorded as report_only (the
    /// address guard still refuses); `sandgate policy suggest --from` the run's audit log
    /// turns them into an EgressPolicy for net.egress_policy
    #[arg(long, conflicts_with_all = ["ask", "no_audit_log"])]
    pub learn: bool,
    /// Record each plain-HTTP and intercepted request's path with its query string in the
    /// run's audit log (left out by default: a query may carry tokens)
    #[arg(long)]
    pub audit_query: bool,
    /// Print the sandbox's command line and exit: bwrap's, or sandbox-exec's where the
    /// seatbelt backend runs (macOS).
    #[arg(long)]
    pub print_argv: bool,
    /// Print the policy as a profile for another platform and exit (`seatbelt`: macOS
    /// sandbox-exec).
    #[arg(long, value_name = "KIND")]
    pub print_profile: Option<String>,
    /// Nothing on stderr from sandgate itself: no line per refused request as it happens,
    /// no blocked-destinations summary and no totals line on exit.
    #[arg(long)]
    pub quiet: bool,
    /// On exit, write the summary as JSON to FILE (replaced whole): the run's ids, its exit
    /// status, requests allowed and denied, bytes, the destinations not reached with reasons
    /// and counts, and the audit log's path (docs/sandbox.md). --quiet does not stop it.
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<std::path::PathBuf>,
    /// When only the allowlist refuses a destination, ask at the terminal: allow once, for
    /// this run, for 15 minutes, or deny (no terminal or no answer: deny)
    #[arg(long)]
    pub ask: bool,
    /// Seconds to wait for an answer to --ask [default: 60]
    #[arg(long, value_name = "SECS", requires = "ask")]
    pub ask_timeout: Option<u64>,
    /// Who starts this run (a person, an agent), recorded as `subject` on each of its
    /// requests, and forwarded to central proxies [default: the user, $USER or uid-N]
    #[arg(long, value_name = "ID")]
    pub subject: Option<String>,
    /// The agent acting for the subject (an MCP client, a coding agent), as it names
    /// itself: recorded as `agent` on each of its requests, and forwarded to central
    /// proxies; the command sees it as SANDGATE_AGENT
    #[arg(long, value_name = "ID")]
    pub agent: Option<String>,
    /// The run's task id, as its orchestrator names it: recorded as `task_id` on each of its
    /// requests, and task-scoped policy entries and exceptions apply to it; the command
    /// sees it as SANDGATE_TASK [default: the run's own id, run-PID-T]
    #[arg(long, value_name = "ID")]
    pub task: Option<String>,
    /// The run's project id (`project_id`; SANDGATE_PROJECT inside)
    #[arg(long, value_name = "ID")]
    pub project: Option<String>,
    /// The run's job id (`job_id`; SANDGATE_JOB inside)
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,
    /// No terminal: the run starts in a session of its own (it can neither read, write nor
    /// take the caller's terminal), stdin is /dev/null unless redirected; refuses --ask
    #[arg(long, conflicts_with = "ask")]
    pub no_terminal: bool,
    /// A host file or directory the command may not change, bound read-only over itself
    /// wherever a write path covers it (repeatable; `sandgate mcp` protects its own files)
    #[arg(long, value_name = "PATH")]
    pub protect: Vec<std::path::PathBuf>,
    /// Override one of the policy's `limits:` (processes=N, memory=SIZE, tmpfs=SIZE,
    /// cpu=SECONDS, open_files=N; SIZE as 512MiB, 4GiB; `off` for no limit), repeatable
    #[arg(long, value_name = "NAME=VALUE")]
    pub limit: Vec<String>,
    /// Start the command in DIR (it must be in the sandbox: under a read or write path)
    /// [default: fs.cwd, else this directory when the sandbox has it, else HOME, with a
    /// line saying so]
    #[arg(long, value_name = "DIR")]
    pub chdir: Option<std::path::PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<std::ffi::OsString>,
}

/// `sandgate init` flags.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// What to write: egress (an EgressPolicy for `sandgate proxy --policy`) or sandbox (a
    /// SandboxPolicy for `sandgate run --policy`) [default: sandbox with --for, else egress]
    #[arg(long, value_enum)]
    pub kind: Option<InitKind>,
    /// A preset to allow (repeatable; `sandgate presets` lists them). In a sandbox policy it
    /// makes the network mode allowlist.
    #[arg(long, value_name = "NAME")]
    pub preset: Vec<String>,
    /// The command the sandbox is for, as one string ('python3 agent.py'; quotes keep
    /// blanks): its program is found on PATH and its interpreter, libraries and Python paths
    /// become read_paths.
    #[arg(long = "for", value_name = "COMMAND")]
    pub for_command: Option<String>,
    /// metadata.name of the policy.
    #[arg(long, default_value = "starter")]
    pub name: String,
    /// Where to write; - for stdout [default: policy.yaml (egress) or sandbox.yaml]
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
    /// Replace the file if it exists (without it, an existing file is an error).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InitKind {
    Egress,
    Sandbox,
}

/// `sandgate jupyter ...`
#[derive(Debug, Subcommand)]
pub enum JupyterCommand {
    /// Write a relocatable control bundle: kernelspecs wrapped by `sandgate run`, their
    /// policies, Jupyter Server's configuration and the launcher's.
    Compose {
        /// The bundle's directory (new, or empty).
        #[arg(long, value_name = "DIR")]
        out: std::path::PathBuf,
        /// A profile: its kernel is python3-NAME under the sandbox policy FILE (repeatable)
        /// [default: low (no network) and high (the python-packages preset)]
        #[arg(long = "profile", value_name = "NAME=FILE")]
        profiles: Vec<String>,
        /// The Python that runs the kernels (and Jupyter Server) [default: python3 on PATH]
        #[arg(long, value_name = "PATH")]
        python: Option<std::path::PathBuf>,
        /// external: the bundle names that Python by its absolute path; copy: it carries a
        /// copy of the Python's venv in env/, so it runs wherever it moves (the base
        /// Python must be there)
        #[arg(long, value_name = "HOW", default_value = "external", value_parser = ["external", "copy"])]
        python_env: String,
    },
    /// Start Jupyter Server from a bundle on loopback, then jupyter-mcp-server on stdio;
    /// stop everything when it ends or on a signal.
    Launch {
        /// The bundle written by `jupyter compose`.
        #[arg(long, value_name = "DIR")]
        bundle: std::path::PathBuf,
        /// Jupyter Server's port on 127.0.0.1 [default: a free one]
        #[arg(long, value_name = "P")]
        port: Option<u16>,
        /// Also write the server's random token here (mode 0600); it is never printed.
        #[arg(long, value_name = "F")]
        token_file: Option<std::path::PathBuf>,
        /// Only Jupyter Server (needs --token-file); stop on SIGINT or SIGTERM.
        #[arg(long)]
        no_mcp: bool,
    },
    /// (internal) A carried-environment kernelspec's kernel: its `sandgate run` line with
    /// the bundle's own Python.
    #[command(hide = true)]
    Kernel {
        #[arg(long, value_name = "DIR")]
        bundle: std::path::PathBuf,
        #[arg(long, value_name = "NAME")]
        profile: String,
        #[arg(long, value_name = "F")]
        connection_file: std::path::PathBuf,
    },
    /// (internal) Exits with SIGTERM when the launcher PID dies, then runs the command.
    #[command(hide = true)]
    Guard {
        #[arg(long, value_name = "PID")]
        parent: u32,
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
}
