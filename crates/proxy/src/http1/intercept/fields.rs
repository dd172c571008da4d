//! What an intercepted request says about itself, read before it goes upstream: whether
//! every place it names a host names the tunnel's, whether the rules can judge it, and the
//! header fields that must not go on.

use hyper::Request as HttpRequest;
use hyper::body::Incoming;
use hyper::header::{HOST, HeaderMap};
use sandgate_policy::{Target, TargetError};

/// Whether the request names the tunnel's host and port in every place it names one: its
/// absolute URI or HTTP/2 `:authority` (if any) and its `Host` (at most one), at least one of
/// them present; an `https` scheme if any. Each must agree with the tunnel's.
pub(super) fn same_authority(uri: &hyper::Uri, headers: &HeaderMap, target: &Target) -> bool {
    let ours = |text: &str| {
        sandgate_policy::parse_host_field(text)
            .is_ok_and(|(host, port)| host == target.host && port.unwrap_or(443) == target.port)
    };
    if uri
        .scheme()
        .is_some_and(|s| s != &hyper::http::uri::Scheme::HTTPS)
    {
        return false;
    }
    let named = uri.authority().map(|a| ours(a.as_str()));
    let mut hosts = headers.get_all(HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(h), None) => Some(h.to_str().is_ok_and(ours)),
        (None, None) => None,
        (Some(_), Some(_)) | (None, Some(_)) => Some(false),
    };
    match (named, host) {
        (None, None) => false,
        (a, b) => a.unwrap_or(true) && b.unwrap_or(true),
    }
}

/// Why a request inside an intercepted tunnel cannot be judged by its method and path, if
/// it cannot ([`sandgate_policy::judgeable`]).
pub(super) fn unjudgeable(req: &HttpRequest<Incoming>) -> Option<TargetError> {
    use hyper::body::Body as _;
    let has_body = !req.body().is_end_stream();
    (!sandgate_policy::judgeable(req.method().as_str(), has_body)).then_some(TargetError::NotJudgeable)
}

/// `host` or `host:port`, as the upstream's `Host`.
pub(super) fn authority(target: &Target) -> String {
    match target.port {
        443 => target.host.to_string(),
        port => format!("{}:{port}", target.host),
    }
}

/// Drops the hop-by-hop fields (RFC 9110 section 7.6.1), those `Connection` names, the proxy
/// credentials and sandgate's own attribution fields.
pub(super) fn end_to_end(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !crate::h1::head::FRAMING.contains(&t.as_str()))
        .collect();
    // And what would change the request the rules judged: a method override (Rails,
    // Google APIs) and `Expect` (hyper answered the 100-continue itself).
    for name in crate::h1::head::HOP_BY_HOP
        .iter()
        .chain(crate::h1::head::METHOD_OVERRIDES)
        .chain(&["expect"])
        .map(|s| (*s).to_owned())
        .chain(named)
    {
        headers.remove(name.as_str());
    }
    let ours: Vec<_> = headers
        .keys()
        .filter(|k| crate::h1::head::is_attribution(k.as_str()))
        .cloned()
        .collect();
    for k in ours {
        headers.remove(k);
    }
}

#[cfg(test)]
mod tests {
    use hyper::header::HeaderValue;

    use super::*;

    fn agrees(uri: &str, hosts: &[&str]) -> bool {
        let target = sandgate_policy::parse_connect_target("git.example:443").unwrap();
        let mut headers = HeaderMap::new();
        for h in hosts {
            headers.append(HOST, HeaderValue::from_str(h).unwrap());
        }
        same_authority(&uri.parse().unwrap(), &headers, &target)
    }

    /// Every place a request names its host must name the tunnel's: HTTP/1.1's Host and
    /// absolute URI, HTTP/2's :authority (hyper's URI) and Host.
    #[test]
    fn a_request_names_the_tunnels_host_wherever_it_names_one() {
        assert!(agrees("/x", &["git.example"]));
        assert!(agrees("/x", &["GIT.example:443"]));
        assert!(agrees("https://git.example/x", &[]));
        assert!(agrees("https://git.example:443/x", &["git.example"]));
        assert!(!agrees("/x", &[]), "nothing names a host");
        assert!(!agrees("/x", &["other.example"]));
        assert!(!agrees("/x", &["git.example:8443"]));
        assert!(!agrees("/x", &["git.example", "git.example"]), "two Host fields");
        assert!(
            !agrees("https://other.example/x", &["git.example"]),
            ":authority disagrees with Host"
        );
        assert!(
            !agrees("https://git.example/x", &["other.example"]),
            "Host disagrees with :authority"
        );
        assert!(!agrees("http://git.example/x", &["git.example"]), "not https");
        assert!(!agrees("/x", &["git.example@other.example"]));
    }

    #[test]
    fn hop_by_hop_and_attribution_fields_are_dropped() {
        let mut headers = HeaderMap::new();
        for (n, v) in [
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "5"),
            ("proxy-authorization", "Basic x"),
            ("sandgate-task", "t-other"),
            ("content-length", "3"),
            ("accept", "*/*"),
        ] {
            headers.append(
                hyper::header::HeaderName::from_static(n),
                HeaderValue::from_static(v),
            );
        }
        end_to_end(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "content-length"]);
    }
}
