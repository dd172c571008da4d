//! `sandgate proxy`, `sandgate explain` and `sandgate health`: the proxy's flags; explain's,
//! which decide as the proxy would, with the same pattern and range grammar; and the health
//! check's, which asks a running proxy's admin listener.

use clap::Args;

/// `sandgate proxy` flags. Repeatable flags also take comma-separated lists.
#[derive(Debug, Args)]
#[command(name = "proxy")]
pub struct ProxyArgs {
    /// Address to listen on (repeatable); opened beside the policy file's spec.listeners,
    /// never instead of them [env: SANDGATE_LISTEN; PROXY_PORT=N means 0.0.0.0:N]
    /// [default: 127.0.0.1:3128, when neither this nor spec.listeners names one]
    #[arg(long, value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Allowlist pattern: host, host:port, *.domain, *, IP literal; without a port, 443 for
    /// CONNECT and 80 for HTTP (`*` too) [env: SANDGATE_ALLOW; aliases PROXY_ALLOWLIST,
    /// AA_PROXY_NETWORK_ALLOWLIST]
    #[arg(long, value_name = "PATTERN")]
    pub allow: Vec<String>,
    /// Denylist pattern, same grammar; always wins [env: SANDGATE_DENY]
    #[arg(long, value_name = "PATTERN")]
    pub deny: Vec<String>,
    /// DNS server to use, IP or IP:PORT (default: spec.resolver, else the nameservers of
    /// /etc/resolv.conf) [env: SANDGATE_DNS_SERVER]
    #[arg(long, value_name = "IP:PORT")]
    pub dns_server: Vec<String>,
    /// Address range exempt from the address guard (e.g. an internal service network)
    /// [env: SANDGATE_ALLOW_RANGE]
    #[arg(long, value_name = "CIDR")]
    pub allow_range: Vec<String>,
    /// Policy file (YAML EgressPolicy); reloaded on SIGHUP and when it changes
    /// [env: SANDGATE_POLICY]
    #[arg(long, value_name = "FILE")]
    pub policy: Option<std::path::PathBuf>,
    /// Audit log file (JSON lines), or - for stdout [env: SANDGATE_AUDIT_LOG] [default: -]
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
    /// (/v1) [default: spec.admin.listen, else env SANDGATE_ADMIN_LISTEN (the image sets
    /// 127.0.0.1:9090 for its health check)]
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// The proxy's memory allocator: mimalloc, or system (glibc's: for a heap profiler, or
    /// GLIBC_TUNABLES). Chosen before the first allocation from the command line as written,
    /// or the environment (docs/deploy.md, "The allocator")
    #[arg(
        long,
        value_name = "mimalloc|system",
        env = "SANDGATE_ALLOCATOR",
        value_parser = allocator,
        default_value = "mimalloc"
    )]
    pub allocator: String,
    /// What keeps others off an admin listener that is not on loopback (a firewall, a
    /// Kubernetes NetworkPolicy); given, the proxy does not warn at start that the listener
    /// is off loopback
    #[arg(long, value_name = "WHAT", env = "SANDGATE_ADMIN_GUARDED_BY")]
    pub admin_guarded_by: Option<String>,
    /// Serve the admin listener over TLS with this certificate (PEM chain), so proxies on
    /// other hosts can follow its exceptions (https://); needs --admin-tls-key. Read again
    /// when the files change (a renewal needs no restart)
    #[arg(
        long,
        value_name = "FILE",
        env = "SANDGATE_ADMIN_TLS_CERT",
        requires = "admin_tls_key"
    )]
    pub admin_tls_cert: Option<std::path::PathBuf>,
    /// The admin listener certificate's private key (PEM)
    #[arg(
        long,
        value_name = "FILE",
        env = "SANDGATE_ADMIN_TLS_KEY",
        requires = "admin_tls_cert"
    )]
    pub admin_tls_key: Option<std::path::PathBuf>,
    /// Intercept the TLS of a CONNECT to a host that only allow entries with methods or
    /// paths allow, and decide each request inside: a CA is made at start, its certificate
    /// written to FILE for clients to trust (its key never leaves memory). Upstreams are
    /// verified against the system's roots (SSL_CERT_FILE, SSL_CERT_DIR, or the store).
    /// Without it, such a CONNECT is refused (inspection_required)
    #[arg(long, value_name = "FILE", env = "SANDGATE_INTERCEPT_CA_CERT")]
    pub intercept_ca_cert: Option<std::path::PathBuf>,
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
    /// Follow the exceptions approved on a control plane this proxy does not host: its admin
    /// URL, http://127.0.0.1:PORT (loopback only; another host through a tunnel to it).
    /// Applied within this policy's spec.exceptions bounds, never beyond them
    #[arg(
        long,
        value_name = "URL",
        env = "SANDGATE_EXCEPTIONS_FROM",
        requires = "exceptions_token_file"
    )]
    pub exceptions_from: Option<String>,
    /// With --exceptions-from: a file holding the token it reads with (a follower token of
    /// that control plane: it reads exceptions and nothing else)
    #[arg(
        long,
        value_name = "FILE",
        env = "SANDGATE_EXCEPTIONS_TOKEN_FILE",
        requires = "exceptions_from"
    )]
    pub exceptions_token_file: Option<std::path::PathBuf>,
    /// With --exceptions-from https://...: the CA certificate(s) (PEM) that signed the control
    /// plane's admin listener certificate; nothing else is trusted
    #[arg(
        long,
        value_name = "FILE",
        env = "SANDGATE_EXCEPTIONS_CA",
        requires = "exceptions_from"
    )]
    pub exceptions_ca: Option<std::path::PathBuf>,
    /// With --exceptions-from: seconds between full re-reads, beside the live events
    /// [default: 10]
    #[arg(long, value_name = "SECS", requires = "exceptions_from")]
    pub exceptions_resync: Option<f64>,
    /// Most concurrent client connections; beyond it, 503 [default: 16384, or what the
    /// open-file limit allows at two descriptors each]
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Most connections one listener may hold (an HTTP/1 and a SOCKS5 listener of one
    /// tenant count as one) [default: the cap with one listener, else an equal share but
    /// at least a quarter of it]
    #[arg(long, value_name = "N")]
    pub max_connections_per_listener: Option<usize>,
    /// Most connections one client address may hold on each listener (counted per listener,
    /// an HTTP/1 and a SOCKS5 listener of one tenant counting as one),
    /// a hard cap [default: a quarter of the cap, and past it while a quarter of the
    /// listener's and of the proxy's slots stays free for other clients]
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
    /// Record each plain-HTTP and intercepted request's path with its query string (left
    /// out by default: a query may carry tokens)
    #[arg(long)]
    pub audit_query: bool,
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
    /// The method of a plain-HTTP request (an http:// TARGET), for allow entries that name
    /// methods and paths; its path is the URL's [default: GET]
    #[arg(long, value_name = "METHOD", conflicts_with = "request_id")]
    pub method: Option<String>,
    /// Explain a request the proxy answered, by the id its refusal printed (`request id:` in
    /// the body, `Sandgate-Request-Id` in the head): the rule or reason, and what would allow
    /// it. Exit 0 allowed, 1 refused, 2 failed upstream, 64 not found
    #[arg(long, value_name = "ID", conflicts_with = "target")]
    pub request_id: Option<String>,
    /// With --request-id: the audit log to search (its rotated files too) [default:
    /// $SANDGATE_AUDIT_LOG, else ./audit.jsonl, then the kept logs of sandgate run, newest first]
    #[arg(long, value_name = "FILE", requires = "request_id")]
    pub audit_log: Option<std::path::PathBuf>,
    /// host, host:port, or a URL (http:// is plain HTTP; https:// and host:port are CONNECT).
    #[arg(required_unless_present = "request_id")]
    pub target: Option<String>,
}

/// `sandgate health` flags.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The proxy's admin listener, http://IP:PORT (or https:// with --admin-ca) [env:
    /// SANDGATE_ADMIN; else http://$SANDGATE_ADMIN_LISTEN (0.0.0.0 asked on 127.0.0.1);
    /// default: http://127.0.0.1:9090]
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,
    /// With an https:// admin URL: the CA (PEM) its certificate chains to
    #[arg(long, value_name = "FILE")]
    pub admin_ca: Option<std::path::PathBuf>,
    /// Seconds to wait for the answer before calling the proxy unhealthy
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    pub timeout: u64,
}

/// `--allocator`'s value: `mimalloc` or `system`; empty (a variable set but empty) is the
/// default, as crates/alloc's constructor reads it.
fn allocator(value: &str) -> Result<String, String> {
    match value {
        "" | "mimalloc" => Ok("mimalloc".to_owned()),
        "system" => Ok("system".to_owned()),
        other => Err(format!("`{other}` is not an allocator: mimalloc or system")),
    }
}
