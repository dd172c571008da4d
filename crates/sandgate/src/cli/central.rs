//! `sandgate exceptions` and `sandgate pki`: the admin API's client for temporary egress
//! exceptions, and the certificates of the central mode.

use clap::{Args, Subcommand};

/// `sandgate exceptions` flags. They are global: before or after the subcommand
/// (`sandgate exceptions list --json`), as kubectl and gh take theirs.
#[derive(Debug, Args)]
pub struct ExceptionsArgs {
    /// The admin API's base URL, http://IP:PORT or http://localhost:PORT (never a looked-up
    /// name) [env: SANDGATE_ADMIN; default: http://127.0.0.1:9090]
    #[arg(long, global = true, value_name = "URL")]
    pub admin: Option<String>,
    /// A file holding the bearer token [default: the SANDGATE_TOKEN environment variable]
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: ExceptionsCommand,
}

/// `sandgate exceptions` subcommands.
#[derive(Debug, Subcommand)]
pub enum ExceptionsCommand {
    /// Ask for exact hosts for a task, for a bounded time (or, with --tweak-sandbox, more
    /// time, output, network or a workspace for one sandbox of `sandgate mcp`).
    Request {
        /// The task that needs the destinations.
        #[arg(long)]
        task: String,
        /// The task's project, when the policy gives it one.
        #[arg(long)]
        project: Option<String>,
        /// An exact host name (repeatable).
        #[arg(
            long = "host",
            required_unless_present = "tweak_sandbox",
            conflicts_with = "tweak_sandbox"
        )]
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
        #[command(flatten)]
        below: BelowArgs,
        #[command(flatten)]
        tweak: TweakArgs,
    },
    /// List exceptions (a requester sees its tasks'): one line each, the reason cut to fit
    /// (to $COLUMNS when set); `show` prints it whole.
    List,
    /// Show one exception: every field, one per line.
    Show {
        /// The exception's id (ex-...).
        id: String,
    },
    /// Approve a pending request, optionally narrowed (never widened: a narrowing beyond
    /// what was asked is refused, naming the field).
    Approve {
        /// The exception's id (ex-...).
        id: String,
        /// Approve only these of the requested hosts (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// A shorter lifetime than requested.
        #[arg(long, value_name = "SECS")]
        ttl: Option<u32>,
        /// Given, these replace the methods and paths asked for, and must lie within them.
        #[command(flatten)]
        below: BelowArgs,
        /// Given, the tweak granted instead of the one asked.
        #[command(flatten)]
        tweak: TweakGrantArgs,
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

/// Methods and paths below the hosts, as an allow entry names them (docs/policy.md).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BelowArgs {
    /// Only this method (repeatable; uppercase, as clients send it: GET, POST).
    #[arg(long = "method", value_name = "METHOD")]
    pub methods: Vec<String>,
    /// Only paths matching this pattern (repeatable; `/org/**`, `/org/*/info/refs`).
    #[arg(long = "path", value_name = "PATTERN")]
    pub paths: Vec<String>,
    /// Only GET, HEAD and OPTIONS.
    #[arg(long)]
    pub read_only: bool,
}

impl BelowArgs {
    /// The fields of a request or an approval's body (none when nothing was given).
    pub fn fields(&self) -> serde_json::Map<String, serde_json::Value> {
        let some = |l: &Vec<String>| (!l.is_empty()).then(|| l.clone());
        let below = sandgate_policy::exception::BelowHost::new(
            some(&self.methods),
            some(&self.paths),
            self.read_only,
        );
        match serde_json::to_value(below) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        }
    }
}

/// A tweak instead of hosts: what one sandbox of `sandgate mcp` may get beyond its gates,
/// within the bounds its operator set (`gates.tweaks`; docs/mcp.md).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TweakArgs {
    /// Ask for the sandbox NAME (of the MCP server whose runs carry --task), not for hosts.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["ports", "methods", "paths", "read_only"])]
    pub tweak_sandbox: Option<String>,
    /// A run's time limit, in seconds.
    #[arg(long, value_name = "SECS", requires = "tweak_sandbox")]
    pub max_seconds: Option<u64>,
    /// Bytes kept of each of a run's output streams.
    #[arg(long, value_name = "BYTES", requires = "tweak_sandbox")]
    pub max_output_bytes: Option<u64>,
    /// The sandbox's network.
    #[arg(long, requires = "tweak_sandbox")]
    pub network: bool,
    /// A workspace directory (absolute) a run may name, or one under it.
    #[arg(long, value_name = "PATH", requires = "tweak_sandbox")]
    pub workspace: Option<String>,
}

impl TweakArgs {
    /// The `tweak` of a request's body, when a sandbox is named.
    pub fn tweak(&self) -> Option<sandgate_policy::exception::Tweak> {
        tweak_of(
            self.tweak_sandbox.as_ref(),
            (self.max_seconds, self.max_output_bytes),
            self.network,
            self.workspace.as_ref(),
        )
    }
}

/// What an approval grants of a tweak, instead of what was asked: the whole tweak, each
/// field within the one asked (`show ID` prints it). A field left out is not granted.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TweakGrantArgs {
    /// Grant the tweak for sandbox NAME (the one asked) with only what --max-seconds,
    /// --max-output-bytes, --network and --workspace give, each within what was asked; what
    /// they leave out is not granted.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["hosts", "methods", "paths", "read_only"])]
    pub tweak_sandbox: Option<String>,
    /// A run's time limit, in seconds, at most the one asked.
    #[arg(long, value_name = "SECS", requires = "tweak_sandbox")]
    pub max_seconds: Option<u64>,
    /// Bytes kept of each of a run's output streams, at most the number asked.
    #[arg(long, value_name = "BYTES", requires = "tweak_sandbox")]
    pub max_output_bytes: Option<u64>,
    /// The sandbox's network, if it was asked.
    #[arg(long, requires = "tweak_sandbox")]
    pub network: bool,
    /// A workspace directory: the one asked, or one under it.
    #[arg(long, value_name = "PATH", requires = "tweak_sandbox")]
    pub workspace: Option<String>,
}

impl TweakGrantArgs {
    /// The `tweak` of an approval's body, when a sandbox is named.
    pub fn tweak(&self) -> Option<sandgate_policy::exception::Tweak> {
        tweak_of(
            self.tweak_sandbox.as_ref(),
            (self.max_seconds, self.max_output_bytes),
            self.network,
            self.workspace.as_ref(),
        )
    }
}

/// A tweak for `sandbox`, when one is named: `(max_seconds, max_output_bytes)`, the
/// network, the workspace.
fn tweak_of(
    sandbox: Option<&String>,
    (max_seconds, max_output_bytes): (Option<u64>, Option<u64>),
    network: bool,
    workspace: Option<&String>,
) -> Option<sandgate_policy::exception::Tweak> {
    sandbox.map(|sandbox| sandgate_policy::exception::Tweak {
        sandbox: sandbox.clone(),
        max_seconds,
        max_output_bytes,
        network,
        workspace: workspace.cloned(),
    })
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
