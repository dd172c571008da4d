//! The proxy's limits from flags (the largest request head; head, connect, DNS, response,
//! body and tunnel timeouts; connection caps; the shutdown grace), each checked and over its
//! default; and the connection cap fitted to the open-file limit.

use std::time::Duration;

use sandgate_proxy::Limits;

use super::{SettingsError, invalid};
use crate::cli::ProxyArgs;

/// The proxy's limits from flags, each over its default.
pub(super) fn limits(args: &ProxyArgs) -> Result<Limits, SettingsError> {
    let d = Limits::default();
    Ok(Limits {
        max_head_bytes: match args.max_head_bytes {
            Some(n) if (1024..=1024 * 1024).contains(&n) => n,
            Some(n) => {
                return Err(invalid(
                    "--max-head-bytes",
                    &n.to_string(),
                    "expected 1024 to 1048576",
                ));
            }
            None => d.max_head_bytes,
        },
        head_timeout: seconds("--head-timeout", args.head_timeout, d.head_timeout)?,
        connect_timeout: seconds("--connect-timeout", args.connect_timeout, d.connect_timeout)?,
        dns_timeout: seconds("--dns-timeout", args.dns_timeout, d.dns_timeout)?,
        response_timeout: seconds("--response-timeout", args.response_timeout, d.response_timeout)?,
        body_idle_timeout: seconds("--body-idle-timeout", args.body_idle_timeout, d.body_idle_timeout)?,
        tunnel_idle_timeout: seconds(
            "--tunnel-idle-timeout",
            args.tunnel_idle_timeout,
            d.tunnel_idle_timeout,
        )?,
        max_connections: match args.max_connections {
            Some(0) => return Err(invalid("--max-connections", "0", "expected at least 1")),
            Some(n) => n,
            None => d.max_connections,
        },
        max_connections_per_listener: match args.max_connections_per_listener {
            Some(0) => {
                return Err(invalid(
                    "--max-connections-per-listener",
                    "0",
                    "expected at least 1",
                ));
            }
            other => other,
        },
        max_connections_per_client: match args.max_connections_per_client {
            Some(0) => {
                return Err(invalid(
                    "--max-connections-per-client",
                    "0",
                    "expected at least 1",
                ));
            }
            other => other,
        },
        shutdown_grace: match args.shutdown_grace {
            Some(s) if s >= 0.0 && s.is_finite() && s < 1e9 => Duration::from_secs_f64(s),
            Some(s) => {
                return Err(invalid(
                    "--shutdown-grace",
                    &s.to_string(),
                    "expected seconds >= 0",
                ));
            }
            None => d.shutdown_grace,
        },
    })
}

/// A duration flag: positive, finite seconds, or `default` when the flag is absent.
pub(super) fn seconds(flag: &str, value: Option<f64>, default: Duration) -> Result<Duration, SettingsError> {
    match value {
        None => Ok(default),
        Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err(invalid(
            flag,
            &s.to_string(),
            "expected a positive number of seconds",
        )),
    }
}

/// Fits the connection cap to the open-file limit `nofile` (two descriptors a connection,
/// plus a reserve): a default cap shrinks to fit, an explicit one that cannot fit is an
/// error that says what to raise.
pub fn fit_to_fd_limit(limits: &mut Limits, explicit: bool, nofile: u64) -> Result<(), SettingsError> {
    use sandgate_proxy::admission::{FDS_PER_CONNECTION, RESERVED_FDS, connections_for_fd_limit};
    let fits = connections_for_fd_limit(nofile);
    if limits.max_connections <= fits {
        return Ok(());
    }
    if explicit || fits == 0 {
        let n = limits.max_connections;
        return Err(invalid(
            "--max-connections",
            &n.to_string(),
            format!(
                "needs {} open files ({FDS_PER_CONNECTION} per connection + {RESERVED_FDS}) but the limit is {nofile}; raise it (ulimit -n, LimitNOFILE=) or lower --max-connections to {fits}",
                n as u64 * FDS_PER_CONNECTION + RESERVED_FDS
            ),
        ));
    }
    // A routine fact of the host, not news: debug (SANDGATE_LOG=debug shows it).
    tracing::debug!(
        max_connections = fits,
        open_file_limit = nofile,
        "connection cap lowered to fit the open-file limit"
    );
    limits.max_connections = fits;
    Ok(())
}
