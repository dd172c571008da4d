//! Curated presets: named lists of the exact hosts a common package ecosystem or service
//! needs, each allowed on 443 only. Kept short on purpose: a preset should never pull in a
//! CDN wildcard. A preset may also say what its hosts allow below the name (read-only
//! access, or methods and paths: docs/policy.md, Methods and paths); the proxy then
//! intercepts their tunnels to check each request.

use std::sync::Arc;

use crate::entry::{Entry, Scope};
use crate::pattern::Pattern;
use crate::request::RequestRules;

/// Every preset name, for messages and docs.
pub const NAMES: &[&str] = &[
    "python-packages",
    "go-modules",
    "npm",
    "crates-io",
    "github-read-only",
];

/// What a preset allows of one host, below the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Below {
    /// Every request.
    Everything,
    /// GET, HEAD and OPTIONS.
    ReadOnly,
    /// These methods on these paths.
    Only {
        methods: &'static [&'static str],
        paths: &'static [&'static str],
    },
}

/// The hosts of preset `name`, with what each allows below the name (a host may appear
/// twice, its entries adding up), or `None` if there is no such preset.
pub fn rules(name: &str) -> Option<&'static [(&'static str, Below)]> {
    use Below::{Everything as All, ReadOnly};
    Some(match name {
        // pip: the index and the file host it redirects to.
        "python-packages" => &[("pypi.org", All), ("files.pythonhosted.org", All)],
        // The Go module proxy and checksum database (GOPROXY / GOSUMDB defaults).
        "go-modules" => &[("proxy.golang.org", All), ("sum.golang.org", All)],
        // npm's registry (tarballs are served from the same host).
        "npm" => &[("registry.npmjs.org", All)],
        // cargo: the sparse index, the API, and the crate download host.
        "crates-io" => &[
            ("index.crates.io", All),
            ("crates.io", All),
            ("static.crates.io", All),
        ],
        // Clone, fetch and read GitHub, never write: git's smart-HTTP fetch (a GET of
        // info/refs, a POST to git-upload-pack; a push is a POST to git-receive-pack, which
        // no entry allows), the REST API read-only (GraphQL is a POST, so not), archives,
        // raw files and release assets.
        "github-read-only" => &[
            ("github.com", ReadOnly),
            (
                "github.com",
                Below::Only {
                    methods: &["POST"],
                    paths: &["/*/*/git-upload-pack"],
                },
            ),
            ("api.github.com", ReadOnly),
            ("codeload.github.com", ReadOnly),
            ("raw.githubusercontent.com", ReadOnly),
            ("objects.githubusercontent.com", ReadOnly),
            ("release-assets.githubusercontent.com", ReadOnly),
        ],
        _ => return None,
    })
}

/// The hosts of preset `name`, each once, or `None` if there is no such preset.
pub fn hosts(name: &str) -> Option<Vec<&'static str>> {
    let mut hosts: Vec<&'static str> = Vec::new();
    for (host, _) in rules(name)? {
        if !hosts.contains(host) {
            hosts.push(host);
        }
    }
    Some(hosts)
}

/// Preset `name` as system entries on port 443, from `origin` (`preset:NAME`), or `None` if
/// there is no such preset.
pub fn entries(name: &str) -> Option<Vec<Entry>> {
    let origin: Arc<str> = Arc::from(format!("preset:{name}"));
    let entries = rules(name)?
        .iter()
        .filter_map(|(host, below)| {
            let request = match below {
                Below::Everything => None,
                Below::ReadOnly => RequestRules::new(None, None, true).ok().flatten(),
                Below::Only { methods, paths } => {
                    let own = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
                    RequestRules::new(Some(&own(methods)), Some(&own(paths)), false)
                        .ok()
                        .flatten()
                }
            };
            Some(Entry {
                pattern: Pattern::parse(host).ok()?,
                ports: Some(vec![443]),
                scope: Scope::System,
                expires_at: None,
                created_by: None,
                reason: Some(format!("preset {name}")),
                origin: origin.clone(),
                request: request.map(Arc::new),
            })
        })
        .collect();
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_host_is_a_valid_exact_pattern_and_every_rule_parses() {
        for name in NAMES {
            let rules = rules(name).unwrap();
            for (host, _) in rules {
                let p = crate::Pattern::parse(host).unwrap();
                assert!(
                    matches!(p.host, crate::HostPattern::Exact(_)) && p.port.is_none(),
                    "{host}"
                );
            }
            // Nothing is dropped on the way to entries.
            let entries = entries(name).unwrap();
            assert_eq!(entries.len(), rules.len(), "{name}");
            for (entry, (_, below)) in entries.iter().zip(rules.iter()) {
                assert_eq!(entry.request.is_none(), *below == Below::Everything, "{name}");
            }
        }
        assert!(hosts("nope").is_none() && entries("nope").is_none());
        assert_eq!(hosts("github-read-only").unwrap().first(), Some(&"github.com"));
    }

    #[test]
    fn github_read_only_clones_and_never_pushes() {
        use crate::{Access, Context, RequestLine, Ruleset, Verdict, parse_connect_target};
        let mut rules = Ruleset::new();
        entries("github-read-only")
            .unwrap()
            .into_iter()
            .for_each(|e| rules.allow_entry(e));
        let github = parse_connect_target("github.com:443").unwrap();
        let decide = |method, target| {
            rules
                .decide_request(
                    &github,
                    Access::Https,
                    &Context::system(0),
                    Some(RequestLine { method, target }),
                )
                .verdict
        };
        assert_eq!(
            decide("GET", "/o/r.git/info/refs?service=git-upload-pack"),
            Verdict::Allow
        );
        assert_eq!(decide("POST", "/o/r.git/git-upload-pack"), Verdict::Allow);
        assert_eq!(decide("POST", "/o/r.git/git-receive-pack"), Verdict::Deny);
        assert_eq!(decide("DELETE", "/o/r"), Verdict::Deny);
        // A blind tunnel is no read: it would carry a push.
        assert_eq!(
            rules
                .decide(&github, Access::Connect, &Context::system(0))
                .verdict,
            Verdict::Deny
        );
    }
}
