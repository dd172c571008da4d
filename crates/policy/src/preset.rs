//! Curated presets: named lists of the exact hosts a common package ecosystem needs, each
//! allowed on 443 only. Kept short on purpose: a preset should never pull in a CDN wildcard.

/// Every preset name, for messages and docs.
pub const NAMES: &[&str] = &["python-packages", "go-modules", "npm", "crates-io"];

/// The hosts of preset `name`, or `None` if there is no such preset.
pub fn hosts(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        // pip: the index and the file host it redirects to.
        "python-packages" => &["pypi.org", "files.pythonhosted.org"],
        // The Go module proxy and checksum database (GOPROXY / GOSUMDB defaults).
        "go-modules" => &["proxy.golang.org", "sum.golang.org"],
        // npm's registry (tarballs are served from the same host).
        "npm" => &["registry.npmjs.org"],
        // cargo: the sparse index, the API, and the crate download host.
        "crates-io" => &["index.crates.io", "crates.io", "static.crates.io"],
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_host_is_a_valid_exact_pattern() {
        for name in NAMES {
            for host in hosts(name).unwrap() {
                let p = crate::Pattern::parse(host).unwrap();
                assert!(
                    matches!(p.host, crate::HostPattern::Exact(_)) && p.port.is_none(),
                    "{host}"
                );
            }
        }
        assert!(hosts("nope").is_none());
    }
}
