//! Fixtures of the credential tests (issue 33, "Credentials the sandbox never holds"): a
//! secret made for each test, the policy text that binds it to a host and a header, a proxy
//! that holds it in its environment and writes its stdout and a trace-level log where the
//! test can search them, and the search itself over every file a proxy or a run wrote. The
//! tests are in [`leaks`] (a placeholder where it does not belong), [`sandboxed`] (inside
//! `sandgate run`), [`start`] (the secret's variable unset), [`tunnels`] (report-only
//! interception, SOCKS5 and a central's node streams) and [`unread`] (where the search did
//! not look: a request's chunk extensions and trailers, a header's name, the method).

mod hostile;
mod leaks;
mod sandboxed;
mod start;
mod tunnels;
mod unread;
mod upstreams;

use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

use sandgate_testkit::dns::DnsServer;

use crate::common::sandgate_bin;
use crate::l7::egress_policy;
use crate::l7_tls::{Intercepting, intercepting_with};

/// The variable of the proxy's environment (or `sandgate run`'s) that holds the secret.
pub const SECRET_VAR: &str = "L7_API_KEY";

/// The environment in which the tests' Python scripts find `h2_through.py`, the HTTP/2 client
/// through a CONNECT they share (on their `PYTHONPATH`, with no bytecode written beside it).
pub const H2_THROUGH: [(&str, &str); 2] = [
    (
        "PYTHONPATH",
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/l7_secrets"),
    ),
    ("PYTHONDONTWRITEBYTECODE", "1"),
];
/// What sandboxed code sends where the secret would go.
pub const PLACEHOLDER: &str = "SANDGATE_L7_PLACEHOLDER";

/// A secret no other test uses and no fixture could print by chance.
pub fn secret() -> String {
    let random = |n: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        h.finish()
    };
    format!("sk-l7-{:016x}{:016x}", random(1), random(2))
}

/// One entry of `credentials` (YAML list items, `indent` spaces in): `header` of requests to
/// `host` gets `Bearer ${env:VAR}` in place of `placeholder`; `env`, in a SandboxPolicy, is
/// the variable the command gets holding the placeholder.
pub fn credential_at(indent: usize, host: &str, var: &str, placeholder: &str, env: Option<&str>) -> String {
    let pad = " ".repeat(indent);
    let mut c = format!(
        "{pad}- host: {host}\n{pad}  header: Authorization\n{pad}  value: \"Bearer ${{env:{var}}}\"\n{pad}  placeholder: {placeholder}\n"
    );
    if let Some(env) = env {
        c.push_str(&format!("{pad}  env: {env}\n"));
    }
    c
}

/// As [`credential_at`], in an EgressPolicy (`spec.network.credentials`, six spaces in).
pub fn credential(host: &str, var: &str, placeholder: &str) -> String {
    credential_at(6, host, var, placeholder, None)
}

/// Writes an EgressPolicy with `entries` as its allowlist and `credentials` beside it to
/// `dir/policy.yaml`; returns its path and text. (`credentials` is the allowlist's sibling
/// under `network`, so it follows the entries four spaces in.)
pub fn secrets_policy(dir: &Path, entries: &str, credentials: &str) -> (PathBuf, String) {
    egress_policy(dir, &format!("{entries}    credentials:\n{credentials}"))
}

/// The 1-based lines of `text` where a credential begins (`- host:` after `credentials:`).
pub fn credential_lines(text: &str) -> Vec<usize> {
    let start = text
        .lines()
        .position(|l| l.trim_start() == "credentials:")
        .unwrap_or(usize::MAX);
    text.lines()
        .enumerate()
        .filter(|(i, l)| *i > start && l.trim_start().starts_with("- host:"))
        .map(|(i, _)| i + 1)
        .collect()
}

/// A proxy holding the secrets of `vars` (`(NAME, value)`) in its environment, with
/// `--intercept-ca-cert` and `extra` arguments, logging at trace level (the most it would
/// ever write) on stderr, its stdout written to `stdout`.
pub fn holding(
    vars: &[(&str, &str)],
    dns: &DnsServer,
    policy: &Path,
    roots: &Path,
    stdout: &Path,
    extra: &[&str],
) -> Intercepting {
    // The harness sets SANDGATE_LOG and discards stdout; the shell raises the one and keeps
    // the other, then becomes sandgate.
    let mut command = Command::new("sh");
    command
        .args([
            "-c",
            "export SANDGATE_LOG=trace; exec \"$0\" \"$@\" >\"$L7_STDOUT\"",
        ])
        .arg(sandgate_bin())
        .env("L7_STDOUT", stdout);
    for (name, value) in vars {
        command.env(name, value);
    }
    intercepting_with(command, dns, policy, roots, extra)
}

/// The files among `files` whose bytes contain `needle`.
pub fn containing(files: &[PathBuf], needle: &str) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|f| std::fs::read(f).is_ok_and(|b| contains(&b, needle)))
        .cloned()
        .collect()
}

/// Whether `haystack` contains `needle`'s bytes.
pub fn contains(haystack: &[u8], needle: &str) -> bool {
    let needle = needle.as_bytes();
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A Python origin a test writes (`script`, run with `args`), running; killed when dropped.
/// Its first line on stdout is the port it listens on; the rest is the script's to say
/// (`lines`).
pub struct ScriptOrigin {
    child: Child,
    pub lines: BufReader<ChildStdout>,
    pub port: u16,
}

impl ScriptOrigin {
    pub fn start(script: &str, args: &[&std::ffi::OsStr]) -> ScriptOrigin {
        let mut child = Command::new(crate::common::python())
            .args(["-c", script])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        lines.read_line(&mut line).unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| panic!("origin: {line:?}"));
        ScriptOrigin { child, lines, port }
    }

    /// The same over TLS: the script is given the test CA's leaf for 127.0.0.1 and its key
    /// (written into `dir`), then `dir`.
    pub fn tls(script: &str, ca: &sandgate_testkit::tls::TestCa, dir: &Path) -> ScriptOrigin {
        let cert = crate::l7_tls::pem_file(dir, "leaf.pem", &ca.leaf_pem);
        let key = crate::l7_tls::pem_file(dir, "leaf-key.pem", &ca.leaf_key_pem);
        ScriptOrigin::start(script, &[cert.as_os_str(), key.as_os_str(), dir.as_os_str()])
    }
}

impl Drop for ScriptOrigin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
