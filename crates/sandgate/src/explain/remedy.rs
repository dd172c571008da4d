//! What a request on record means, and what would let it through: from its decision line and
//! its close line (either may be absent), the verdict in words and the command or setting
//! to change. Pure: no I/O; `request.rs` finds the lines and prints what this says.
//!
//! The reasons are docs/audit.md's `reason_code` values (a deny) and `outcome` values (an
//! allowed request's close). Each fix names the setting of both policy kinds where they
//! differ (an EgressPolicy's `spec.network...`, a SandboxPolicy's `net...`) and the flag of
//! both commands (`sandgate proxy`, `sandgate run`), since a log does not say which wrote it.

use sandgate_policy::Access;
use sandgate_policy::Verdict;
use sandgate_policy::addr::classify;
use sandgate_proxy::audit::record::{CloseRecord, DecisionRecord, Destination, Requester};
use sandgate_proxy::audit::{Outcome, UpstreamFailure};

/// Exit status: the request was allowed (and not refused further up).
pub(super) const EXIT_ALLOWED: u8 = 0;
/// Exit status: the request was refused, here or by an upstream proxy.
pub(super) const EXIT_REFUSED: u8 = 1;
/// Exit status: allowed, then failed upstream (DNS, connect, response).
pub(super) const EXIT_FAILED: u8 = 2;

/// A request as its lines record it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Request<'a> {
    pub decision: Option<&'a DecisionRecord>,
    pub close: Option<&'a CloseRecord>,
}

/// What a request on record means and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Remedy {
    /// The answer in a few words, after `denied CONNECT HOST:PORT: ` or `allowed ...: `
    /// (`not in allowlist`, `refused by the upstream proxy`, `ended ok`).
    pub summary: String,
    /// What happened, in a sentence.
    pub meaning: String,
    /// What would let it through (or why nothing here would), one item each; an item may
    /// hold several lines (a policy entry).
    pub fixes: Vec<String>,
    /// [`EXIT_ALLOWED`], [`EXIT_REFUSED`] or [`EXIT_FAILED`].
    pub exit: u8,
}

impl Request<'_> {
    pub(super) fn dest(&self) -> Option<&Destination> {
        self.decision
            .and_then(|d| d.dest.as_ref())
            .or_else(|| self.close.and_then(|c| c.dest.as_ref()))
    }

    pub(super) fn task(&self) -> Option<&str> {
        self.decision
            .and_then(|d| d.requester.task_id.as_deref())
            .or_else(|| self.close.and_then(|c| c.requester.task_id.as_deref()))
    }

    /// `--task T` (and ` --project P`) for `sandgate exceptions request` on behalf of the
    /// request's requester; `None` when it had no task.
    pub(super) fn task_flags(&self) -> Option<String> {
        let task = self.task()?;
        Some(match self.project() {
            Some(project) => format!("--task {task} --project {project}"),
            None => format!("--task {task}"),
        })
    }

    pub(super) fn project(&self) -> Option<&str> {
        self.decision
            .and_then(|d| d.requester.project_id.as_deref())
            .or_else(|| self.close.and_then(|c| c.requester.project_id.as_deref()))
    }

    /// Who made it and, for a request the proxy read, its method and path.
    pub(super) fn requester(&self) -> Option<&Requester> {
        self.decision
            .map(|d| &d.requester)
            .or_else(|| self.close.map(|c| &c.requester))
    }
}

/// What `request` means and what would let it through.
pub(super) fn remedy(request: Request<'_>) -> Remedy {
    match (request.decision, request.close) {
        (Some(d), _) if d.verdict == Verdict::Deny => denied(request, d),
        (_, Some(c)) => closed(request, c),
        (Some(d), None) => Remedy {
            summary: allowed_summary(d, "no close on record yet"),
            meaning: format!(
                "{}; no close is on record (still open, or the proxy stopped before it wrote one)",
                allowed(d)
            ),
            fixes: learned(request, d),
            exit: EXIT_ALLOWED,
        },
        (None, None) => Remedy {
            summary: "no decision on record".into(),
            meaning: "the log holds no decision or close for this id".into(),
            fixes: Vec::new(),
            exit: EXIT_REFUSED,
        },
    }
}

fn by_rule(rule: Option<&str>) -> String {
    rule.map(|r| format!(" by {r}")).unwrap_or_default()
}

/// The summary of an allow: `ended`, unless the policy was not enforced.
fn allowed_summary(d: &DecisionRecord, ended: &str) -> String {
    match d.would_deny {
        Some(_) => "only in report-only mode".to_owned(),
        None => ended.to_owned(),
    }
}

/// How an allow came about: by a rule, or only because the policy was not enforced.
fn allowed(d: &DecisionRecord) -> String {
    match d.would_deny {
        Some(would) => format!(
            "let through only because the proxy did not enforce its policy (--report-only, run --learn); the policy would deny it: {}",
            would.code()
        ),
        None => format!("allowed{}", by_rule(d.rule.as_deref())),
    }
}

/// A report-only pass (`--report-only`, `run --learn`): what would allow it for real.
fn learned(request: Request<'_>, d: &DecisionRecord) -> Vec<String> {
    match d.would_deny {
        Some(sandgate_policy::PolicyReason::NotAllowlisted) => allow_entry(request),
        Some(_) => vec![format!(
            "it passed only in report-only mode (--report-only, run --learn): a deny rule{} matches, and deny rules always win",
            d.rule.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
        )],
        None => Vec::new(),
    }
}

/// A deny decision.
fn denied(request: Request<'_>, d: &DecisionRecord) -> Remedy {
    let code = d.reason_code.as_deref().unwrap_or("denied");
    let refused = |summary: &str, meaning: String, fixes: Vec<String>| Remedy {
        summary: summary.to_owned(),
        meaning,
        fixes,
        exit: EXIT_REFUSED,
    };
    let dest = request
        .dest()
        .map_or_else(|| "the destination".to_owned(), ToString::to_string);
    match code {
        "not_allowlisted" => refused(
            "not in allowlist",
            "no allow rule matched: the allowlist denies whatever it does not name".into(),
            allow_entry(request),
        ),
        "denylisted" => denylisted(d, &dest),
        "destination_ip_prohibited" => refused(
            "resolves to a prohibited address",
            guarded(d, &dest),
            vec![allow_range(d, &dest)],
        ),
        "proxy_loop" => refused(
            "is this proxy",
            format!("{dest} is one of the proxy's own ports: a proxy is never its own destination"),
            vec![
                "nothing here allows it; reach the service at its own address, not through the proxy".into(),
            ],
        ),
        "sni_mismatch" | "sni_missing" | "not_tls" => tunnel(code, d, &dest),
        // Below the host: the entry's methods and paths, interception, credentials.
        other => super::below_host::remedy(other, request, d)
            .unwrap_or_else(|| refused(other, refusal_meaning(other, d), refusal_fixes(other))),
    }
}

fn denylisted(d: &DecisionRecord, dest: &str) -> Remedy {
    let rule = d.rule.as_deref().unwrap_or("a deny rule");
    let meaning = match d.resolved_ip {
        Some(ip) => format!("{dest} resolved to {ip}, which {rule} names; deny rules always win"),
        None => format!("{rule} matches {dest}; deny rules always win"),
    };
    Remedy {
        summary: "matches a deny rule".into(),
        meaning,
        fixes: vec![format!(
            "remove or narrow {rule} (the file and line it names, or --deny); no allow entry or exception overrides it"
        )],
        exit: EXIT_REFUSED,
    }
}

fn guarded(d: &DecisionRecord, dest: &str) -> String {
    match d.resolved_ip {
        Some(ip) => format!(
            "{dest} resolved to {ip}, a {} address: the address guard refuses private, loopback, link-local, metadata and reserved addresses, and the host's own",
            classify(ip).as_str()
        ),
        None => format!("an address {dest} resolved to is one the address guard refuses"),
    }
}

/// The allow range that exempts the refused address: the address alone.
fn allow_range(d: &DecisionRecord, dest: &str) -> String {
    let cidr = match d.resolved_ip {
        Some(std::net::IpAddr::V4(ip)) => format!("{ip}/32"),
        Some(std::net::IpAddr::V6(ip)) => format!("{ip}/128"),
        None => "CIDR".to_owned(),
    };
    format!(
        "if {dest} is an internal service you mean to reach, exempt its address: allow_ranges: [ {cidr} ] \
         (EgressPolicy spec.network.allow_ranges, SandboxPolicy net.allow_ranges), or --allow-range {cidr} \
         (a cloud metadata address should stay refused)"
    )
}

fn tunnel(code: &str, d: &DecisionRecord, dest: &str) -> Remedy {
    let port = d.dest.as_ref().map_or(443, |t| t.port);
    let (summary, meaning, fix) = match code {
        "sni_mismatch" => {
            let seen = d.tls_server_name.as_deref().unwrap_or("another server");
            (
                "TLS server name mismatch",
                format!(
                    "the tunnel to {dest} began with a TLS ClientHello for {seen}: a client may not ask for one host and talk to another"
                ),
                format!(
                    "if the client means {seen}, allow {seen} and let it connect there; the check itself is spec.network.tunnels.sni (must_match; off turns it off)"
                ),
            )
        }
        "sni_missing" => (
            "no TLS server name",
            format!("the tunnel to {dest} began with a TLS ClientHello that names no server"),
            "spec.network.tunnels.missing_sni: allow lets such tunnels through".to_owned(),
        ),
        _ => (
            "not TLS",
            format!(
                "the tunnel to {dest} did not begin with a TLS ClientHello, and port {port} is tls_only (plain bytes, a server that spoke first, or silence)"
            ),
            format!(
                "if the protocol on port {port} is not TLS, leave {port} out of spec.network.tunnels.tls_only"
            ),
        ),
    };
    Remedy {
        summary: summary.into(),
        meaning,
        fixes: vec![format!(
            "{fix} (in an EgressPolicy, or the one a SandboxPolicy names in net.egress_policy)"
        )],
        exit: EXIT_REFUSED,
    }
}

/// The meaning of a deny that is not the policy's: the client's request, the proxy's
/// limits and health.
fn refusal_meaning(code: &str, d: &DecisionRecord) -> String {
    let detail = d.detail.as_deref().map(|x| format!(": {x}")).unwrap_or_default();
    match code {
        "audit_unavailable" => {
            "the proxy's audit log could not be written, so nothing new passed (fail closed)".into()
        }
        c if c.starts_with("connection_limit:") => format!(
            "the {} connection limit was full",
            c.trim_start_matches("connection_limit:")
        ),
        "proxy_auth_missing" | "proxy_auth_malformed" | "proxy_auth_wrong" => {
            "the listener requires task credentials (auth: basic), and they were missing, malformed or wrong"
                .into()
        }
        "abandoned" => format!("the request ended before it was decided{detail}"),
        c if c.starts_with("node_") => format!("a central proxy refused the node or its stream{detail}"),
        _ => format!("the request was not one this proxy serves ({code}){detail}"),
    }
}

fn refusal_fixes(code: &str) -> Vec<String> {
    let fix = match code {
        "audit_unavailable" => {
            "make the audit log writable again (free space, fix the file); the proxy recovers by itself, then retry"
        }
        c if c.starts_with("connection_limit:") => {
            "retry later, or raise the limit (--max-connections, a listener's share)"
        }
        "proxy_auth_missing" | "proxy_auth_malformed" | "proxy_auth_wrong" => {
            "put the task's credentials in the proxy URL: http://TASK:TOKEN@HOST:PORT (the task's token from the policy's spec.auth)"
        }
        "abandoned" => "nothing to allow: retry",
        c if c.starts_with("node_") => {
            "see the central's spec.nodes and the node's certificate (docs/central.md)"
        }
        "origin_form" => {
            "send it to the proxy as a proxy (HTTP_PROXY, curl -x): GET http://HOST/PATH, not GET /PATH"
        }
        "https_absolute_form" => {
            "ask for https:// with CONNECT (what curl and most clients do through a proxy)"
        }
        "unsupported_scheme" => "only http:// requests and CONNECT (or SOCKS5) tunnels go through",
        "head_too_large" => "a smaller request head, or a larger --max-head-bytes",
        "head_timeout" => "the client must send its whole request head within --head-timeout",
        _ => {
            "the client's request must change; no policy setting lets it through (docs/audit.md lists the codes)"
        }
    };
    vec![fix.to_owned()]
}

/// The entry, flags and temporary exception that would allow the request's destination.
fn allow_entry(request: Request<'_>) -> Vec<String> {
    let Some(dest) = request.dest() else {
        return Vec::new();
    };
    let access = dest.access.unwrap_or(Access::Connect);
    // A bare host covers the usual ports of its kind of access (443 for tunnels, 80 for
    // plain HTTP), as the proxy's own 403 hint and `run`'s live line say.
    let pattern = if access.default_ports().contains(&dest.port) {
        dest.host.clone()
    } else {
        dest.to_string()
    };
    let mut fixes = vec![
        format!(
            "add to the policy's allowlist (EgressPolicy spec.network.allowlist, SandboxPolicy net.allowlist):\n    - host: {}\n      ports: [{}]",
            dest.host, dest.port
        ),
        format!("or a flag: sandgate proxy --allow {pattern}; sandgate run --allow-domain {pattern}"),
    ];
    if let Some(flags) = request.task_flags() {
        fixes.push(format!(
            "or for a while, where approvals apply (a proxy with the exceptions API, or one that follows it): \
             sandgate exceptions request {flags} --host {} --port {} --ttl 3600 --reason \"...\"",
            dest.host, dest.port
        ));
    }
    fixes
}

/// An allowed request, by how it ended.
fn closed(request: Request<'_>, c: &CloseRecord) -> Remedy {
    let rule = by_rule(request.decision.and_then(|d| d.rule.as_deref()));
    let status = c.status.map(|s| format!(" ({s})")).unwrap_or_default();
    let dest = request
        .dest()
        .map_or_else(|| "the destination".to_owned(), ToString::to_string);
    let remedy = |summary: &str, meaning: String, fixes: Vec<String>, exit| Remedy {
        summary: summary.to_owned(),
        meaning,
        fixes,
        exit,
    };
    match c.outcome {
        Outcome::Upstream(UpstreamFailure::UpstreamDenied) => remedy(
            "refused by the upstream proxy",
            format!("allowed here{rule}, then refused by the upstream proxy it was chained through{status}"),
            vec![upstream_fix(
                c.status,
                request.dest().map_or("HOST", |d| d.host.as_str()),
            )],
            EXIT_REFUSED,
        ),
        Outcome::Upstream(failure) => remedy(
            &format!("then failed upstream ({})", failure.kind()),
            format!("allowed{rule}, then failed upstream: {}", failed(failure, &dest)),
            vec![failure_fix(failure)],
            EXIT_FAILED,
        ),
        Outcome::Revoked => remedy(
            "cut: exception revoked",
            format!("allowed{rule}, then cut when the exception that allowed it was revoked"),
            allow_entry(request),
            EXIT_ALLOWED,
        ),
        Outcome::Expired => remedy(
            "cut: rule expired",
            format!("allowed{rule}, then cut at the second that rule expired"),
            std::iter::once("renew the entry's expires_at or ttl_seconds, or:".to_owned())
                .chain(allow_entry(request))
                .collect(),
            EXIT_ALLOWED,
        ),
        Outcome::RetryRefused | Outcome::LateHelloRefused => remedy(
            "cut: TLS server name",
            format!(
                "allowed{rule}, then cut: a later TLS ClientHello in the tunnel named another server ({})",
                c.outcome.as_str()
            ),
            vec!["the check is spec.network.tunnels.sni (docs/policy.md)".into()],
            EXIT_REFUSED,
        ),
        other => match request.decision {
            Some(d) => remedy(
                &allowed_summary(d, &format!("ended {}", other.as_str())),
                format!("{}; ended {}{status}", allowed(d), other.as_str()),
                learned(request, d),
                EXIT_ALLOWED,
            ),
            None => remedy(
                &format!("ended {}", other.as_str()),
                format!(
                    "allowed; ended {}{status} (its decision is not in the log)",
                    other.as_str()
                ),
                Vec::new(),
                EXIT_ALLOWED,
            ),
        },
    }
}

fn upstream_fix(status: Option<u16>, host: &str) -> String {
    match status {
        Some(407) => "the upstream proxy asks for credentials (407), which this proxy does not send: chain to a listener of it without auth".into(),
        Some(503) => "the upstream proxy could not take it then (503: its connection limits, or its audit log); retry".into(),
        _ => format!(
            "the upstream proxy's own policy refused it, and its audit log says why: where it runs, \
             sandgate audit tail --decision deny --host {host} names the request id to explain \
             (a plain request's 403 body names it too)"
        ),
    }
}

fn failed(failure: UpstreamFailure, dest: &str) -> String {
    use UpstreamFailure as F;
    match failure {
        F::Dns => format!("{dest} did not resolve"),
        F::DnsTimeout => format!("resolving {dest} timed out"),
        F::ConnectionRefused => format!("{dest} refused the connection"),
        F::ConnectionTimeout => format!("connecting to {dest} timed out"),
        F::Connect => format!("the connection to {dest} failed"),
        F::UpstreamProxy => "the upstream proxy gave no usable answer".into(),
        other => format!("{dest} did not answer in full ({})", other.kind()),
    }
}

fn failure_fix(failure: UpstreamFailure) -> String {
    use UpstreamFailure as F;
    match failure {
        F::Dns | F::DnsTimeout => {
            "the proxy resolves through its own nameservers (--dns-server, spec.resolver; a run's net.resolver), never /etc/hosts: check the name there".into()
        }
        F::ConnectionRefused | F::ConnectionTimeout | F::Connect => {
            "the policy allowed it; the destination did not take the connection: check that it is up and reachable from the proxy".into()
        }
        F::UpstreamProxy => "check the upstream proxy (--upstream-proxy, net.proxy.upstream)".into(),
        _ => "the policy allowed it; the destination failed mid-way: retry, or check the destination".into(),
    }
}

#[cfg(test)]
#[path = "remedy_tests.rs"]
mod tests;
