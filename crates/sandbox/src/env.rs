//! The command's environment: built from the policy alone (`env.set`, `env.passthrough`),
//! never inherited. Pure: the host's variables come in as a list.
//!
//! What counts as a secret (withheld when only a prefix such as `APP_*` matches it, passed
//! when listed by its exact name):
//! - a name containing `TOKEN`, `SECRET`, `KEY`, `PASSWORD` or `CREDENTIAL` anywhere;
//! - a name with a `_`-separated word `PWD`, `PAT`, `PASS`, `PASSWD`, `PASSPHRASE`, `AUTH`,
//!   `CRED` or `CREDS` (`MYSQL_PWD`, `GITHUB_PAT`, `NPM_CONFIG__AUTH`), except the name
//!   `PWD` itself, which is the working directory; words, not substrings, so `PATH`,
//!   `PYTHONPATH`, `OLDPWD` and `PASSTHROUGH_MODE` are not secrets;
//! - a value carrying URL userinfo, `scheme://user:pass@host` or `scheme://token@host`
//!   (`DATABASE_URL`, `PIP_INDEX_URL`).
//!
//! The values never appear on a command line: bubblewrap gets them as its own environment,
//! which only the same user can read (`/proc/PID/environ`), and passes them on.

use std::collections::BTreeMap;

use crate::policy::SandboxPolicy;

/// `PATH` when the policy neither sets nor passes one: without it, `execvp`, Python's
/// `venv` and most shells find nothing.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Substrings that mark a name as a secret wherever they appear.
const SECRET_SUBSTRINGS: [&str; 5] = ["TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL"];
/// Words (between `_`) that mark a name as a secret; too short to match as substrings.
const SECRET_WORDS: [&str; 8] = [
    "PWD",
    "PAT",
    "PASS",
    "PASSWD",
    "PASSPHRASE",
    "AUTH",
    "CRED",
    "CREDS",
];

/// Does an environment variable name look like it holds a secret?
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if SECRET_SUBSTRINGS.iter().any(|w| upper.contains(w)) {
        return true;
    }
    // The shell's working-directory variable is not a password.
    if upper == "PWD" {
        return false;
    }
    upper
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| SECRET_WORDS.contains(&word))
}

/// Does a value carry credentials in a URL (`scheme://userinfo@host`)?
pub fn value_looks_secret(value: &str) -> bool {
    value.match_indices("://").any(|(at, sep)| {
        let scheme = value.get(..at).unwrap_or_default();
        let scheme_ok = scheme
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric());
        let authority = value
            .get(at + sep.len()..)
            .unwrap_or_default()
            .split(['/', '?', '#', ' ', '\t', '\n', ',', ';'])
            .next()
            .unwrap_or_default();
        scheme_ok && authority.rfind('@').is_some_and(|i| i > 0)
    })
}

/// A host variable a prefix matched but that was not passed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withheld {
    pub name: String,
    pub reason: &'static str,
}

/// The command's complete environment: `passthrough` from `host`, then `set`, then the
/// default `PATH` if none, then (proxied modes) the proxy variables, which win. Entries
/// ending in `*` are prefixes; a secret (see the module docs) passes only when listed
/// exactly.
pub fn environment(
    policy: &SandboxPolicy,
    host: &[(String, String)],
) -> (Vec<(String, String)>, Vec<Withheld>) {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut withheld = Vec::new();
    for (name, value) in host {
        let exact = policy.env_passthrough.iter().any(|p| p == name);
        let by_prefix = policy
            .env_passthrough
            .iter()
            .any(|p| p.strip_suffix('*').is_some_and(|prefix| name.starts_with(prefix)));
        if exact {
            out.insert(name.clone(), value.clone());
        } else if by_prefix {
            let reason = if looks_secret(name) {
                Some("its name looks like a secret")
            } else if value_looks_secret(value) {
                Some("its value carries URL credentials")
            } else {
                None
            };
            match reason {
                None => {
                    out.insert(name.clone(), value.clone());
                }
                Some(reason) => withheld.push(Withheld {
                    name: name.clone(),
                    reason,
                }),
            }
        }
    }
    for (k, v) in &policy.env_set {
        out.insert(k.clone(), v.clone());
    }
    out.entry("PATH".to_owned())
        .or_insert_with(|| DEFAULT_PATH.to_owned());
    if policy.net.proxied() {
        let proxy = format!("http://127.0.0.1:{}", policy.proxy_port);
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            out.insert(k.to_owned(), proxy.clone());
        }
        // The HTTP proxy by default: httpx builds a transport for every proxy variable when
        // a client is made, and without `socksio` a SOCKS5 URL here fails every client (the
        // OpenAI and Anthropic Python SDKs among them), https included. `net.proxy.all_proxy:
        // socks5` names the SOCKS5 port instead, as `socks5h` (the name goes to the proxy
        // unresolved: there is no DNS inside); clients read it only for schemes without a
        // variable of their own (curl: not http/https while the two above are set).
        let all = match policy.socks_port {
            Some(port) if !policy.all_proxy_http => format!("socks5h://127.0.0.1:{port}"),
            _ => proxy,
        };
        for k in ["ALL_PROXY", "all_proxy"] {
            out.insert(k.to_owned(), all.clone());
        }
        for k in ["NO_PROXY", "no_proxy"] {
            out.insert(k.to_owned(), "localhost,127.0.0.1,::1".to_owned());
        }
    }
    // A bound secret's variable never enters the sandbox, whatever passes through; the
    // command gets its placeholder, under the name the credential gives.
    for spec in policy.all_credentials() {
        out.remove(&spec.template.env);
        if let Some(name) = &spec.env {
            out.insert(name.clone(), spec.placeholder.clone());
        }
    }
    // The run's interception CA (handed to bwrap as data by the run's proxy; under
    // Seatbelt the runner points these at its state directory instead): the
    // bundle of the system's roots and it for clients that take one file, the CA alone
    // for Node, which adds it to its own roots.
    if policy.intercepts() {
        let bundle = format!("{}/{}", crate::argv::BRIDGE_DIR, crate::argv::CA_BUNDLE);
        for k in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
        ] {
            out.insert(k.to_owned(), bundle.clone());
        }
        out.insert(
            "NODE_EXTRA_CA_CERTS".to_owned(),
            format!("{}/{}", crate::argv::BRIDGE_DIR, crate::argv::CA_CERT),
        );
    }
    (out.into_iter().collect(), withheld)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn secret_names_by_substring_and_by_word() {
        let cases = [
            ("GITHUB_TOKEN", true),
            ("OPENAI_API_KEY", true),
            ("AWS_SECRET_ACCESS_KEY", true),
            ("DB_PASSWORD", true),
            ("GOOGLE_APPLICATION_CREDENTIALS", true),
            ("MYSQL_PWD", true),
            ("GITHUB_PAT", true),
            ("NPM_CONFIG__AUTH", true),
            ("BASIC_AUTH_USER", true),
            ("SMTP_PASS", true),
            ("PGPASSWORD", true),
            ("MY_PASSWD", true),
            ("GPG_PASSPHRASE", true),
            ("REGISTRY_CREDS", true),
            ("pip_pat", true),
            ("PATH", false),
            ("PYTHONPATH", false),
            ("LD_LIBRARY_PATH", false),
            ("PWD", false),
            ("OLDPWD", false),
            ("PATTERN", false),
            ("GIT_AUTHOR_NAME", false),
            ("PASSTHROUGH_MODE", false),
            ("LANG", false),
            ("LC_ALL", false),
            ("HOME", false),
        ];
        for (name, want) in cases {
            assert_eq!(looks_secret(name), want, "{name}");
        }
    }

    #[test]
    fn url_userinfo_in_a_value_is_a_secret() {
        let cases = [
            ("postgres://app:hunter2@db.internal:5432/app", true),
            ("https://ghp_abc@github.com/org/repo.git", true),
            ("https://pypi.org/simple https://u:p@mirror.example/simple", true),
            ("https://pypi.org/simple", false),
            ("https://example.com/a@b", false),
            ("mailto:someone@example.com", false),
            ("someone@example.com", false),
            ("://@", false),
            ("/usr/bin:/bin", false),
            ("", false),
        ];
        for (value, want) in cases {
            assert_eq!(value_looks_secret(value), want, "{value}");
        }
    }

    fn policy(passthrough: &[&str], set: &[(&str, &str)], proxied: bool) -> SandboxPolicy {
        let text = format!(
            "env:\n  passthrough: [ {} ]\n  set: {{ {} }}\nnet:\n  mode: {}\n",
            passthrough.join(", "),
            set.iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", "),
            if proxied { "allowlist" } else { "none" }
        );
        crate::policy::parse(&text, &BTreeMap::new(), &|p| Ok(PathBuf::from(p)), None).unwrap()
    }

    fn host(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn environment_is_explicit_and_guards_secrets() {
        let p = policy(&["LANG", "OPENAI_API_KEY", "APP_*"], &[("HOME", "/work")], false);
        let (env, withheld) = environment(
            &p,
            &host(&[
                ("LANG", "C"),
                ("OPENAI_API_KEY", "k"),
                ("APP_MODE", "x"),
                ("APP_TOKEN", "t"),
                ("APP_PAT", "t"),
                ("APP_DATABASE_URL", "postgres://u:p@db/x"),
                ("APP_PATH", "/opt/app"),
                ("PATH", "/host/bin"),
                ("HOME", "/root"),
            ]),
        );
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["APP_MODE", "APP_PATH", "HOME", "LANG", "OPENAI_API_KEY", "PATH"]
        );
        assert!(env.contains(&("HOME".to_owned(), "/work".to_owned())));
        assert!(
            env.contains(&("PATH".to_owned(), DEFAULT_PATH.to_owned())),
            "the host PATH does not leak"
        );
        let names: Vec<&str> = withheld.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["APP_TOKEN", "APP_PAT", "APP_DATABASE_URL"]);
        assert_eq!(withheld[2].reason, "its value carries URL credentials");
    }

    #[test]
    fn exact_names_pass_secrets_and_path_and_proxy_variables_are_set() {
        let p = policy(&["DATABASE_URL", "PATH"], &[], true);
        let (env, withheld) = environment(
            &p,
            &host(&[("DATABASE_URL", "postgres://u:p@db/x"), ("PATH", "/opt/bin")]),
        );
        assert!(withheld.is_empty());
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("DATABASE_URL"), Some("postgres://u:p@db/x"));
        assert_eq!(get("PATH"), Some("/opt/bin"));
        assert_eq!(get("HTTPS_PROXY"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("http_proxy"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("ALL_PROXY"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("all_proxy"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("no_proxy"), Some("localhost,127.0.0.1,::1"));
    }

    /// Each proxied policy's variables: (policy text, `HTTP_PROXY` and the others, `ALL_PROXY`).
    #[test]
    fn all_proxy_is_the_http_proxy_unless_the_policy_asks_for_socks5() {
        let cases = [
            (
                "net:\n  mode: allowlist\n",
                "http://127.0.0.1:3128",
                "http://127.0.0.1:3128",
            ),
            (
                "net:\n  mode: allowlist\n  proxy: { all_proxy: http }\n",
                "http://127.0.0.1:3128",
                "http://127.0.0.1:3128",
            ),
            (
                "net:\n  mode: allowlist\n  proxy: { listen: \"127.0.0.1:8080\", socks_listen: \"127.0.0.1:9050\", all_proxy: socks5 }\n",
                "http://127.0.0.1:8080",
                "socks5h://127.0.0.1:9050",
            ),
            (
                "net:\n  mode: proxy\n  proxy: { listen: \"127.0.0.1:0\", upstream: null }\n",
                "http://127.0.0.1:3128",
                "http://127.0.0.1:3128",
            ),
            (
                "net:\n  mode: proxy\n  proxy: { upstream: \"10.0.0.1:3128\", all_proxy: socks5 }\n",
                "http://127.0.0.1:3128",
                "socks5h://127.0.0.1:1080",
            ),
        ];
        for (text, http, all) in cases {
            let p = crate::policy::parse(text, &BTreeMap::new(), &|p| Ok(PathBuf::from(p)), None).unwrap();
            assert!(p.socks_port.is_some(), "the SOCKS5 port stays: {text}");
            let (env, _) = environment(&p, &[]);
            let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
            for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                assert_eq!(get(k), Some(http), "{k}: {text}");
            }
            for k in ["ALL_PROXY", "all_proxy"] {
                assert_eq!(get(k), Some(all), "{k}: {text}");
            }
        }
        let bad = "net:\n  mode: allowlist\n  proxy: { all_proxy: socks4 }\n";
        let err = crate::policy::parse(bad, &BTreeMap::new(), &|p| Ok(PathBuf::from(p)), None).unwrap_err();
        assert!(err.0.contains("net.proxy.all_proxy: \"socks4\""), "{}", err.0);
        let (env, _) = environment(&policy(&[], &[], false), &[]);
        assert!(
            env.iter()
                .all(|(k, _)| !k.to_ascii_uppercase().ends_with("_PROXY")),
            "no proxy variables without the proxy: {env:?}"
        );
    }
}
