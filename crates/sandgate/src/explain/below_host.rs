//! What a refusal below the host name means and what would let it through: a request an
//! entry's methods, paths or `read_only` do not allow (`request_not_allowed`), a tunnel that
//! only such entries allow refused for want of an interception CA (`inspection_required`),
//! and a credential's placeholder sent where it is not bound (`credential_leak`). Pure, as
//! `remedy.rs` is, whose deny branch hands these three codes here (docs/policy.md, Methods
//! and paths; Credentials the sandbox never holds).

use sandgate_proxy::audit::record::DecisionRecord;

use super::remedy::{EXIT_REFUSED, Remedy, Request};

/// The remedy for `code` when it is one of the three refusals below the host; `None` for
/// every other code.
pub(super) fn remedy(code: &str, request: Request<'_>, d: &DecisionRecord) -> Option<Remedy> {
    let (summary, meaning, fixes) = match code {
        "request_not_allowed" => not_allowed(request, d),
        "inspection_required" => inspection(request),
        "credential_leak" => leak(request, d),
        _ => return None,
    };
    Some(Remedy {
        summary: summary.to_owned(),
        meaning,
        fixes,
        exit: EXIT_REFUSED,
    })
}

/// The request's destination as `host` and `port`, with placeholders when the line has none.
fn host_port(request: Request<'_>) -> (String, String) {
    request.dest().map_or_else(
        || ("HOST".to_owned(), "PORT".to_owned()),
        |d| (d.host.clone(), d.port.to_string()),
    )
}

/// The request's method and path as the line records them (`GET`, `/`).
fn line(request: Request<'_>) -> (String, String) {
    let requester = request.requester();
    let method = requester.and_then(|r| r.method.clone());
    let path = requester.and_then(|r| r.path.clone());
    (
        method.unwrap_or_else(|| "METHOD".to_owned()),
        path.unwrap_or_else(|| "/PATH".to_owned()),
    )
}

fn not_allowed(request: Request<'_>, d: &DecisionRecord) -> (&'static str, String, Vec<String>) {
    let (host, port) = host_port(request);
    let (method, path) = line(request);
    let rule = d.rule.as_deref().unwrap_or("the entries for the host");
    let meaning = format!(
        "{rule} allows {host} only for some methods and paths (its methods, paths or read_only), \
         and none of the entries for {host}:{port} allows {method} {path}"
    );
    let mut fixes = vec![
        format!(
            "widen {rule} (the file and line it names): add {method} to its methods, or a pattern that matches {path} to its paths \
             (read_only allows GET, HEAD and OPTIONS only; docs/policy.md, Methods and paths)"
        ),
        format!(
            "or an entry of its own for just this request:\n    - host: {host}\n      ports: [{port}]\n      methods: [{method}]\n      paths: [\"{path}\"]"
        ),
    ];
    if let Some(flags) = request.task_flags() {
        fixes.push(format!(
            "or for a while, below the host, where approvals apply: sandgate exceptions request {flags} \
             --host {host} --port {port} --method {method} --path \"{path}\" --ttl 900 --reason \"...\""
        ));
    }
    ("method or path not allowed", meaning, fixes)
}

fn inspection(request: Request<'_>) -> (&'static str, String, Vec<String>) {
    let (host, port) = host_port(request);
    let meaning = format!(
        "only entries with methods, paths or read_only (or a credential bound to it) allow {host}:{port}, so each request \
         in the tunnel must be seen, and the proxy could not intercept it: it has no interception CA, or the tunnel came \
         over SOCKS5 or a central's node stream, which are never intercepted; it was refused rather than let through blind"
    );
    let fixes = vec![
        "give the proxy an interception CA: sandgate proxy --intercept-ca-cert FILE (it makes a CA at start and writes its \
         certificate to FILE for clients to trust; its key stays in memory); sandgate run makes one for each run by itself"
            .to_owned(),
        "a SOCKS5 client: reach the host through the HTTP proxy (CONNECT) instead".to_owned(),
        format!(
            "or, to let every request to it through undecrypted, an entry without methods or paths:\n    - host: {host}\n      ports: [{port}]"
        ),
    ];
    ("tunnel needs interception", meaning, fixes)
}

fn leak(request: Request<'_>, d: &DecisionRecord) -> (&'static str, String, Vec<String>) {
    let (host, _) = host_port(request);
    let credential = d.rule.as_deref().unwrap_or("a credential");
    let meaning = format!(
        "the request to {host} carried the placeholder of {credential}, which is bound to another host or header: \
         sent here it would leak (to another host, in another header, in the path or query, or over plain HTTP)"
    );
    let fixes = vec![
        format!(
            "send the placeholder only in the header its credential names, to the host it is bound to (docs/policy.md, \
             Credentials the sandbox never holds); if {host} is meant to get the secret, bind it there: a credential of its own \
             in the policy's credentials with host: {host}"
        ),
        "no allow entry or exception lets a placeholder through where it is not bound".to_owned(),
    ];
    (
        "credential placeholder sent where it is not bound",
        meaning,
        fixes,
    )
}
