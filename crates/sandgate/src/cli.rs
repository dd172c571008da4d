//! Command-line grammar (clap). Names here are an interface other tooling depends on.

use clap::{Args, Parser, Subcommand};

/// sandgate: run untrusted code so it reaches only the network destinations a policy allows.
#[derive(Debug, Parser)]
#[command(name = "sandgate", version)]
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

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the egress proxy (HTTP forward proxy and CONNECT tunnels, default deny).
    Proxy(Box<ProxyArgs>),
    /// Validate a policy file of any kind (EgressPolicy, SandboxPolicy) without binding
    /// anything: exit 0 (warnings on stderr), or 64 with the errors (file:line: field:
    /// message).
    CheckConfig {
        /// The policy file.
        file: std::path::PathBuf,
        /// Fill ${NAME} in a SandboxPolicy, as `sandgate run --param`.
        #[arg(long, value_name = "NAME=VALUE")]
        param: Vec<String>,
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
    /// Say whether a destination would be allowed, and by which rule. Exit 0 allowed, 1
    /// refused, 2 allowed but not resolvable (--resolve), 64 usage.
    Explain(ExplainArgs),
    /// Work with policies: suggest one from what an audit log saw.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Read the audit log: tail, export, summary.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Run a command in a bubblewrap sandbox whose only way out is the policy.
    Run(RunArgs),
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
    /// (internal) PID 1 inside every sandbox with a PID namespace; holds the bridges where
    /// there are any.
    #[command(hide = true)]
    SandboxInit {
        /// ADDR=SOCKET: listen on ADDR inside, relay to SOCKET.
        #[arg(long = "forward", value_name = "ADDR=SOCKET")]
        forwards: Vec<String>,
        /// The policy lets the command create AF_UNIX sockets.
        #[arg(long)]
        allow_unix_sockets: bool,
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// (internal) Loads the sandbox's seccomp filter, then executes the command.
    #[command(hide = true)]
    SandboxExec {
        /// Let the command create AF_UNIX sockets (platform.seccomp.allow_unix_sockets).
        #[arg(long)]
        allow_unix_sockets: bool,
        /// NAME=VALUE: an rlimit to set first (nproc, data, cpu, nofile).
        #[arg(long = "rlimit", value_name = "NAME=VALUE")]
        rlimits: Vec<String>,
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// (internal) Moves itself into the run's cgroups, then executes bwrap.
    #[command(hide = true)]
    SandboxEnter {
        /// A `cgroup.procs` file to write this process's id into.
        #[arg(long = "cgroup-procs", value_name = "FILE")]
        cgroup_procs: Vec<std::path::PathBuf>,
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
}

/// `sandgate pki ...`
#[derive(Debug, Subcommand)]
pub enum PkiCommand {
    /// Make a CA: DIR/ca.pem (give it to nodes as --upstream-ca and to central listeners as
    /// tls.client_ca) and DIR/ca.key (keep it private).
    Init {
        /// Where the files go (created, mode 0700).
        #[arg(long, value_name = "DIR", default_value = "sandgate-pki")]
        dir: std::path::PathBuf,
        /// Days the CA is valid.
        #[arg(long, value_name = "N", default_value_t = 3650, conflicts_with = "not_after")]
        days: u32,
        /// The last day it is valid instead (YYYY-MM-DD, UTC; a past date makes an expired
        /// CA, for tests of refusal).
        #[arg(long, value_name = "DATE")]
        not_after: Option<String>,
        /// Replace files that exist.
        #[arg(long)]
        force: bool,
    },
    /// Issue a certificate signed by DIR's CA: DIR/node-NAME.pem and .key (a client
    /// certificate; NAME goes in the central's spec.nodes) or DIR/central-NAME.pem and .key
    /// (a server certificate; NAME is the host nodes use in --upstream https://NAME:PORT).
    Issue {
        #[arg(long, value_name = "DIR", default_value = "sandgate-pki")]
        dir: std::path::PathBuf,
        /// A node-local proxy's name.
        #[arg(
            long,
            value_name = "NAME",
            conflicts_with = "central",
            required_unless_present = "central"
        )]
        node: Option<String>,
        /// A central proxy's host name or IP address.
        #[arg(long, value_name = "NAME")]
        central: Option<String>,
        /// More names the certificate carries (repeatable).
        #[arg(long, value_name = "NAME")]
        san: Vec<String>,
        /// Days the certificate is valid.
        #[arg(long, value_name = "N", default_value_t = 365, conflicts_with = "not_after")]
        days: u32,
        /// The last day it is valid instead (YYYY-MM-DD, UTC; a past date makes an expired
        /// certificate, for tests of refusal).
        #[arg(long, value_name = "DATE")]
        not_after: Option<String>,
        /// Replace files that exist.
        #[arg(long)]
        force: bool,
    },
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
    /// (internal) Exits with SIGTERM when the launcher PID dies, then runs the command.
    #[command(hide = true)]
    Guard {
        #[arg(long, value_name = "PID")]
        parent: u32,
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
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

/// `sandgate exceptions` flags.
#[derive(Debug, Args)]
pub struct ExceptionsArgs {
    /// The admin API's base URL [env: SANDGATE_ADMIN; default: http://127.0.0.1:9090]
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,
    /// A file holding the bearer token [default: the SANDGATE_TOKEN environment variable]
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub command: ExceptionsCommand,
}

/// `sandgate exceptions` subcommands.
#[derive(Debug, Subcommand)]
pub enum ExceptionsCommand {
    /// Ask for exact hosts for a task, for a bounded time.
    Request {
        /// The task that needs the destinations.
        #[arg(long)]
        task: String,
        /// The task's project, when the policy gives it one.
        #[arg(long)]
        project: Option<String>,
        /// An exact host name (repeatable).
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// A port (repeatable) [default: 443 and 80]
        #[arg(long = "port")]
        ports: Vec<u16>,
        /// Seconds the exception lasts once approved.
        #[arg(long, value_name = "SECS")]
        ttl: u32,
        /// Why, for the person deciding (recorded in the audit log).
        #[arg(long)]
        reason: String,
    },
    /// List exceptions (a requester sees its tasks').
    List,
    /// Show one exception.
    Show {
        /// The exception's id (ex-...).
        id: String,
    },
    /// Approve a pending request, optionally narrowed.
    Approve {
        /// The exception's id (ex-...).
        id: String,
        /// Approve only these of the requested hosts (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// A shorter lifetime than requested.
        #[arg(long, value_name = "SECS")]
        ttl: Option<u32>,
    },
    /// Deny a pending request.
    Deny {
        /// The exception's id (ex-...).
        id: String,
        /// Why, for the requester and the audit log.
        #[arg(long)]
        note: Option<String>,
    },
    /// Revoke an active exception: its connections are cut.
    Revoke {
        /// The exception's id (ex-...).
        id: String,
        /// Why, for the requester and the audit log.
        #[arg(long)]
        note: Option<String>,
    },
}

/// `sandgate run` flags.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The SandboxPolicy (YAML; see docs/sandbox.md; `sandgate init --kind sandbox` writes
    /// one).
    #[arg(long, value_name = "FILE")]
    pub policy: std::path::PathBuf,
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
    /// Print the bubblewrap command line and exit.
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
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<std::ffi::OsString>,
}

/// `sandgate audit ...`
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Show events from the current and rotated files, oldest first.
    Tail {
        #[command(flatten)]
        filter: AuditFilterArgs,
        /// The audit log (its rotated siblings .1, .2, ... are read too).
        #[arg(
            long,
            value_name = "PATH",
            default_value = "audit.jsonl",
            env = "SANDGATE_AUDIT_LOG"
        )]
        file: std::path::PathBuf,
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
        /// Only these event types (decision, close, aggregate, policy_reload, exception_*);
        /// repeatable.
        #[arg(long = "event-type", value_name = "TYPE")]
        event_types: Vec<String>,
        #[arg(long, value_enum)]
        format: ExportFormat,
        /// Where to write (created or replaced); - for stdout.
        #[arg(long, value_name = "F")]
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

/// `sandgate explain` flags.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Policy file to consult.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<std::path::PathBuf>,
    /// Decide as this task would be (its task-scoped entries apply).
    #[arg(long, value_name = "ID")]
    pub task: Option<String>,
    /// Decide as this project would be.
    #[arg(long, value_name = "ID")]
    pub project: Option<String>,
    /// Extra allowlist pattern, as for `proxy --allow`.
    #[arg(long, value_name = "PATTERN")]
    pub allow: Vec<String>,
    /// Extra denylist pattern, as for `proxy --deny`.
    #[arg(long, value_name = "PATTERN")]
    pub deny: Vec<String>,
    /// Address range exempt from the address guard, as for `proxy --allow-range`.
    #[arg(long, value_name = "CIDR")]
    pub allow_range: Vec<String>,
    /// Also resolve the name (through --dns-server, the file's resolver, or resolv.conf's
    /// nameservers; never getaddrinfo) and classify every address.
    #[arg(long)]
    pub resolve: bool,
    /// DNS server for --resolve, IP or IP:PORT.
    #[arg(long, value_name = "IP:PORT")]
    pub dns_server: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// host, host:port, or a URL (http:// is plain HTTP; https:// and host:port are CONNECT).
    pub target: String,
}

/// `sandgate proxy` flags. Repeatable flags also take comma-separated lists.
#[derive(Debug, Args)]
#[command(name = "proxy")]
pub struct ProxyArgs {
    /// Address to listen on [env: SANDGATE_LISTEN; PROXY_PORT=N means 0.0.0.0:N]
    /// [default: 127.0.0.1:3128]
    #[arg(long, value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Allowlist pattern: host, host:port, *.domain, *, IP literal [env: SANDGATE_ALLOW,
    /// PROXY_ALLOWLIST]
    #[arg(long, value_name = "PATTERN")]
    pub allow: Vec<String>,
    /// Denylist pattern, same grammar; always wins [env: SANDGATE_DENY]
    #[arg(long, value_name = "PATTERN")]
    pub deny: Vec<String>,
    /// DNS server to use, IP or IP:PORT (default: nameservers of /etc/resolv.conf)
    #[arg(long, value_name = "IP:PORT")]
    pub dns_server: Vec<String>,
    /// Address range exempt from the address guard (e.g. an internal service network)
    #[arg(long, value_name = "CIDR")]
    pub allow_range: Vec<String>,
    /// Policy file (YAML EgressPolicy); reloaded on SIGHUP and when it changes
    #[arg(long, value_name = "FILE")]
    pub policy: Option<std::path::PathBuf>,
    /// Audit log file (JSON lines), or - for stdout [default: -]
    #[arg(long, value_name = "PATH|-")]
    pub audit_log: Option<String>,
    /// Rotate the audit log before it grows past this many bytes
    #[arg(long, value_name = "BYTES")]
    pub audit_max_bytes: Option<u64>,
    /// Rotated audit files kept (audit.jsonl.1 .. .N) [default: 5]
    #[arg(long, value_name = "N")]
    pub audit_keep: Option<usize>,
    /// Seconds between fsyncs of the audit log while events flow; 0 = only at shutdown
    /// [default: 1]
    #[arg(long, value_name = "SECS")]
    pub audit_fsync_interval: Option<f64>,
    /// Fold allowed traffic into one `aggregate` audit event per destination and task every
    /// SECS seconds (denies, failures and reloads stay individual)
    #[arg(long, value_name = "SECS")]
    pub audit_aggregate_window: Option<f64>,
    /// Chain allowed traffic through this HTTP proxy (e.g. a central sandgate): IP:PORT,
    /// HOST:PORT or http://HOST:PORT (a name is resolved once, at start); no other local DNS
    #[arg(long, value_name = "URL", conflicts_with = "upstream")]
    pub upstream_proxy: Option<String>,
    /// Forward allowed traffic to a central sandgate over mutual TLS, each request one
    /// HTTP/2 stream on one connection: https://HOST:PORT (repeatable: tried in order, the
    /// next when one is unreachable; never direct). Needs --upstream-ca, --client-cert and
    /// --client-key (docs/central.md)
    #[arg(long, value_name = "URL", requires_all = ["upstream_ca", "client_cert", "client_key"])]
    pub upstream: Vec<String>,
    /// The CA (PEM) the central proxies' certificates chain to
    #[arg(long, value_name = "FILE", requires = "upstream")]
    pub upstream_ca: Option<std::path::PathBuf>,
    /// This node's certificate (PEM) for the central proxies; its name is listed in their
    /// spec.nodes
    #[arg(long, value_name = "FILE", requires = "upstream")]
    pub client_cert: Option<std::path::PathBuf>,
    /// The key (PEM) of --client-cert
    #[arg(long, value_name = "FILE", requires = "upstream")]
    pub client_key: Option<std::path::PathBuf>,
    /// How requests travel to the central proxies: h2 (streams of one connection) or http1
    /// (a TLS connection per tunnel; for comparison) [default: h2]
    #[arg(long, value_name = "h2|http1", value_parser = ["h2", "http1"], requires = "upstream")]
    pub upstream_transport: Option<String>,
    /// Serve Prometheus/OpenMetrics text on http://ADDR/metrics (e.g. 127.0.0.1:9090)
    #[arg(long, value_name = "ADDR", conflicts_with = "admin_listen")]
    pub metrics_listen: Option<String>,
    /// Also serve SOCKS5 (RFC 1928, CONNECT only) on ADDR, under the same policy (repeatable)
    #[arg(long, value_name = "ADDR")]
    pub socks_listen: Vec<String>,
    /// The admin listener: /metrics and, with admin tokens in the policy, the exceptions API
    /// (/v1) [default: spec.admin.listen]
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Where the exceptions database lives [default: $STATE_DIRECTORY]
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<std::path::PathBuf>,
    /// Keep exceptions in a PostgreSQL database shared with other proxies instead of SQLite
    /// under the state directory: postgres://USER@HOST/DB, or postgresql:///DB?host=/SOCKET/DIR
    /// (prefer the environment variable for a URL with a password)
    #[arg(
        long,
        value_name = "URL",
        env = "SANDGATE_STATE",
        conflicts_with = "state_dir"
    )]
    pub state: Option<String>,
    /// With --state postgres://: seconds between full re-reads of the shared store, beside
    /// its change notifications [default: 5]
    #[arg(long, value_name = "SECS", requires = "state")]
    pub state_resync: Option<f64>,
    /// With --state postgres:// over the network: the CA certificate(s) (PEM) that signed
    /// the database's certificate. Connections are then TLS and verified (the certificate
    /// must name the host); without it they are plain, and sslmode=require is refused
    #[arg(long, value_name = "FILE", requires = "state")]
    pub state_ca: Option<std::path::PathBuf>,
    /// Most concurrent client connections; beyond it, 503 [default: 16384, or what the
    /// open-file limit allows at two descriptors each]
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Most connections one listener may hold [default: the cap with one listener, else an
    /// equal share but at least a quarter of it]
    #[arg(long, value_name = "N")]
    pub max_connections_per_listener: Option<usize>,
    /// Most connections one client address may hold on each listener (counted per listener)
    /// [default: a quarter of the cap]
    #[arg(long, value_name = "N")]
    pub max_connections_per_client: Option<usize>,
    /// Largest request head in bytes [default: 16384]
    #[arg(long, value_name = "BYTES")]
    pub max_head_bytes: Option<usize>,
    /// Seconds for a request head to arrive [default: 10]
    #[arg(long, value_name = "SECS")]
    pub head_timeout: Option<f64>,
    /// Seconds to connect upstream [default: 10]
    #[arg(long, value_name = "SECS")]
    pub connect_timeout: Option<f64>,
    /// Seconds for DNS answers [default: 5]
    #[arg(long, value_name = "SECS")]
    pub dns_timeout: Option<f64>,
    /// Seconds for the upstream response head [default: 60]
    #[arg(long, value_name = "SECS")]
    pub response_timeout: Option<f64>,
    /// Seconds a body relay may stall [default: 60]
    #[arg(long, value_name = "SECS")]
    pub body_idle_timeout: Option<f64>,
    /// Seconds a tunnel may stay idle [default: 900]
    #[arg(long, value_name = "SECS")]
    pub tunnel_idle_timeout: Option<f64>,
    /// Seconds in-flight work may take after SIGTERM/SIGINT [default: 10]
    #[arg(long, value_name = "SECS")]
    pub shutdown_grace: Option<f64>,
    /// Learn mode: requests the policy denies pass and are recorded as report_only with what
    /// the policy would have said (sandgate policy suggest turns them into entries); the
    /// address guard, address deny entries and tunnel checks still refuse
    #[arg(long)]
    pub report_only: bool,
}
