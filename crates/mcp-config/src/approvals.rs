//! Whether, and how, an approved exception reaches a sandbox's runs, read from its policy at
//! start. An exception applies where the run's traffic is decided:
//!
//! - **followed control plane**: the run has its own proxy (`net.mode: allowlist`, or
//!   `proxy` without an upstream) and its policy's `net.exceptions` follows a control
//!   plane. The proxy reads that control plane before the command starts and follows it
//!   while it runs, applying the approved exceptions of the run's task within the
//!   policy's own bounds (`net.exceptions.ports`, `max_ttl_seconds`). Approvals filed by
//!   this server apply only when `from` is the same admin URL as `spec.egress.admin`
//!   ([`same_control_plane`]).
//! - **upstream proxy**: `net.mode: proxy` with `net.proxy.upstream`: the upstream
//!   decides, and applies an approval only if it hosts or follows this control plane,
//!   which nothing here can see.
//! - **none**: a run's own proxy that follows nothing (the issue 31 case: approved, yet the
//!   next run is refused again), a control plane other than this server's, no network at
//!   all (`none`, `loopback`), or no filter to open (`all`).
//!
//! Also which exceptions answer a request ([`covers`]) and whether one applies to a
//! sandbox's runs ([`Approvals::admits`]). Pure: no I/O, time an argument.

use sandgate_control::client::AdminUrl;
use sandgate_policy::exception::BelowHost;
use sandgate_policy::{Exception, ExceptionState};
use sandgate_sandbox::policy::{NetMode, SandboxPolicy};

/// How approved exceptions reach one sandbox's runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approvals {
    /// `net.exceptions`: the run's own proxy follows the control plane at `from` and
    /// applies the task's exceptions on `ports` for at most `max_ttl_seconds`.
    Followed {
        from: String,
        ports: Vec<u16>,
        max_ttl_seconds: u32,
    },
    /// `net.mode: proxy` through `via`, which decides.
    Upstream { via: String },
    /// The run's own proxy decides alone (`allowlist`, or `proxy` without an upstream).
    OwnProxy { mode: NetMode },
    /// No network to open (`none`, `loopback`).
    NoNetwork { mode: NetMode },
    /// `all`: the host's network, unfiltered: nothing to approve.
    Unfiltered,
}

/// What `list_sandboxes` says of a sandbox's approvals.
pub const FOLLOWED: &str = "followed control plane";
pub const UPSTREAM: &str = "upstream proxy";
pub const NONE: &str = "none";

impl Approvals {
    /// The path a policy gives approvals (as parsed; `net.exceptions.token_file` need not be
    /// resolved).
    pub fn of(policy: &SandboxPolicy) -> Approvals {
        let mode = policy.net;
        match mode {
            NetMode::None | NetMode::Loopback => return Approvals::NoNetwork { mode },
            NetMode::All => return Approvals::Unfiltered,
            NetMode::Allowlist | NetMode::Proxy => {}
        }
        if let Some(feed) = &policy.exceptions {
            return Approvals::Followed {
                from: feed.from.clone(),
                ports: feed.ports.clone(),
                max_ttl_seconds: feed.max_ttl_seconds,
            };
        }
        let via = match (
            &policy.central,
            &policy.upstream_proxy_name,
            policy.upstream_proxy,
        ) {
            (Some(central), _, _) => Some(central.upstreams.join(", ")),
            (None, Some(name), _) => Some(name.to_string()),
            (None, None, Some(addr)) => Some(addr.to_string()),
            (None, None, None) => None,
        };
        match via {
            Some(via) => Approvals::Upstream { via },
            None => Approvals::OwnProxy { mode },
        }
    }

    /// `followed control plane`, `upstream proxy` or `none`, for approvals filed with the
    /// control plane at `admin` (`spec.egress.admin`; `None`: the server files none, and an
    /// approval made at a followed control plane counts).
    pub fn kind(&self, admin: Option<&str>) -> &'static str {
        match self {
            Approvals::Followed { from, .. } if admin.is_none_or(|a| same_control_plane(from, a)) => FOLLOWED,
            Approvals::Upstream { .. } => UPSTREAM,
            _ => NONE,
        }
    }

    /// One sentence for the agent and the operator: how approvals reach the runs, or what
    /// would make them.
    pub fn detail(&self, admin: Option<&str>, task: &str) -> String {
        let plane = admin.unwrap_or("the control plane");
        match self {
            Approvals::Followed {
                from,
                ports,
                max_ttl_seconds,
            } => match admin {
                Some(a) if !same_control_plane(from, a) => format!(
                    "the run's proxy follows the control plane at {from}, not {a} where this server files requests: set net.exceptions.from to \"{a}\""
                ),
                _ => format!(
                    "the run's proxy reads the control plane at {from} before the command starts and follows it: exceptions approved there for task {task} apply on ports {} for up to {max_ttl_seconds} s{}",
                    list(ports),
                    if admin.is_none() {
                        " (this server files no requests: no spec.egress)"
                    } else {
                        ""
                    }
                ),
            },
            Approvals::Upstream { via } => format!(
                "the upstream proxy {via} decides: approvals apply only if that proxy hosts or follows the control plane at {plane}"
            ),
            Approvals::OwnProxy { mode } => format!(
                "net.mode {}: the run's own proxy follows no control plane, so no approval reaches its runs; add to the policy net.exceptions: {{ from: \"{}\", token_file: FILE }} (FILE: a token of role follower there)",
                mode.name(),
                admin.unwrap_or("http://127.0.0.1:PORT")
            ),
            Approvals::NoNetwork { mode } => format!(
                "net.mode {}: the sandbox has no network; no approval opens one",
                mode.name()
            ),
            Approvals::Unfiltered => {
                "net.mode all: the host's network, unfiltered; there is nothing to approve".to_owned()
            }
        }
    }

    /// Why a server that files requests with `admin` must not start with this sandbox: its
    /// runs could be told "approved" and still be refused. `None` where approvals apply
    /// (followed here, an upstream) or there is nothing to approve.
    pub fn start_problem(&self, admin: &str) -> Option<String> {
        match self {
            Approvals::OwnProxy { mode } => Some(format!(
                "net.mode {}: the run's own proxy decides and follows no control plane, so an approval at {admin} would never reach this sandbox's runs; add to the policy net.exceptions: {{ from: \"{admin}\", token_file: FILE }} (FILE: a token of role follower on that control plane), or use a policy with net.mode none",
                mode.name()
            )),
            Approvals::Followed { from, .. } if !same_control_plane(from, admin) => Some(format!(
                "net.exceptions.from is {from:?}, not {admin:?} (spec.egress.admin, where this server files requests): an approval would never reach this sandbox's runs; set net.exceptions: {{ from: \"{admin}\", token_file: FILE }} (FILE: a token of role follower there)"
            )),
            _ => None,
        }
    }

    /// Whether an exception on `ports` for `ttl_seconds` reaches this sandbox's runs when it
    /// is approved at `admin`; `Err` says why not. An upstream proxy is taken at its word
    /// (the operator chose it; [`Approvals::detail`] says on what it depends).
    pub fn admits(&self, ports: &[u16], ttl_seconds: u32, admin: &str) -> Result<(), String> {
        match self {
            Approvals::Followed {
                from,
                ports: bounds,
                max_ttl_seconds,
            } if same_control_plane(from, admin) => {
                if let Some(port) = ports.iter().find(|p| !bounds.contains(p)) {
                    return Err(format!(
                        "port {port}: this sandbox's runs apply exceptions on ports {} only (net.exceptions.ports)",
                        list(bounds)
                    ));
                }
                if ttl_seconds > *max_ttl_seconds {
                    return Err(format!(
                        "{ttl_seconds} s: this sandbox's runs apply exceptions of at most {max_ttl_seconds} s (net.exceptions.max_ttl_seconds)"
                    ));
                }
                Ok(())
            }
            Approvals::Upstream { .. } => Ok(()),
            other => Err(other.detail(Some(admin), "")),
        }
    }

    /// Whether an approval can reach this sandbox's runs at all (before ports and TTL).
    pub fn can_apply(&self, admin: &str) -> bool {
        matches!(self.kind(Some(admin)), FOLLOWED | UPSTREAM)
    }
}

/// Whether two admin URLs name the same control plane: compared in their canonical forms,
/// by the address a client tries first (`localhost` is 127.0.0.1, as the admin client tries
/// it), so `http://localhost:9090/` and `http://127.0.0.1:9090` are one. A URL that does not
/// parse is the same as nothing.
pub fn same_control_plane(a: &str, b: &str) -> bool {
    let first = |u: &str| AdminUrl::parse(u).ok().and_then(|u| u.addrs().first().copied());
    matches!((first(a), first(b)), (Some(x), Some(y)) if x == y)
}

/// Whether `ex` answers a request of `task` for every one of `hosts` on every one of
/// `ports`, with the methods and paths of `below`: approved, not expired at `now` (Unix
/// seconds), for that task, holding them all and allowing every request `below` does.
/// Hosts are compared as the control plane writes them (lower case, no final dot).
pub fn covers(
    ex: &Exception,
    task: &str,
    hosts: &[String],
    ports: &[u16],
    below: &BelowHost,
    now: i64,
) -> bool {
    let host = |h: &String| h.trim_end_matches('.').to_ascii_lowercase();
    ex.state == ExceptionState::Approved
        && ex.is_active(now)
        && ex.task_id == task
        && hosts.iter().all(|h| ex.hosts.contains(&host(h)))
        && ports.iter().all(|p| ex.ports.contains(p))
        && below.within(&ex.below)
}

fn list(ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    format!("[{}]", ports.join(", "))
}

#[cfg(test)]
#[path = "approvals_tests.rs"]
mod tests;
