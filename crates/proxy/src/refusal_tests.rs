//! Refusals an upstream proxy made: how they are classified and recorded.

use super::*;
use sandgate_policy::parse_connect_target;

fn upstream(status: u16) -> Classified {
    Refusal::Dial {
        target: parse_connect_target("a.test:443").unwrap(),
        error: DialError::UpstreamRefused(status),
    }
    .classify("CONNECT", &Remedies::default())
}

#[test]
fn an_upstream_refusal_is_recorded_as_such_with_the_upstreams_status() {
    for (status, client) in [(403, 403), (407, 403), (503, 503)] {
        let c = upstream(status);
        assert_eq!(c.status, client, "{status}");
        assert_eq!(
            c.outcome,
            Some(Outcome::Upstream(UpstreamFailure::UpstreamDenied)),
            "{status}"
        );
        assert_eq!(c.reason_code, "upstream_failure:upstream_denied");
        assert_eq!(c.upstream_status, Some(status));
    }
    assert!(upstream(407).text.contains("it asks for credentials, 407"));
    // A broken hop is a failure, not a refusal.
    let c = upstream(502);
    assert_eq!(c.outcome, Some(Outcome::Upstream(UpstreamFailure::UpstreamProxy)));
    assert_eq!((c.status, c.upstream_status), (502, None));
}

#[test]
fn a_plain_response_is_the_upstreams_refusal_only_when_a_proxy_made_it() {
    let denied: &[u8] = b"sandgate; error=http_request_denied; details=\"x\"";
    let full: &[u8] = b"sandgate; error=connection_limit_reached";
    let relayed: &[u8] = b"cdn; received-status=403";
    assert!(refused_upstream(403, [denied]));
    assert!(refused_upstream(503, [relayed, full]));
    assert!(refused_upstream(407, []));
    // An origin's own 403 or 503, and a proxy's report of a broken next hop, are not.
    assert!(!refused_upstream(403, []));
    assert!(!refused_upstream(403, [relayed]));
    assert!(!refused_upstream(
        503,
        [b"p; error=destination_unavailable".as_slice()]
    ));
    assert!(!refused_upstream(200, [denied]));
}
