//! What the issue-30 `sandgate run` tests share (`sandbox_design_e2e.rs`,
//! `sandbox_design_first_use_e2e.rs`): the binary run in a directory of the test's choosing
//! with its state in a private `TMPDIR`, and a loopback origin under two names with its own
//! DNS server.

#![allow(dead_code, reason = "each test file uses a different part")]

use std::path::Path;
use std::process::{Command, Output, Stdio};

use sandgate_testkit::dns::{DnsServer, Zone};
use sandgate_testkit::origin::Origin;

use crate::common::{self, runtime};
use crate::sandbox_support::state_home;

/// `sandgate ARGS` in `cwd`, with `TMPDIR` set to `tmp` (where the run keeps its state),
/// a host `HTTP_PROXY` the policy passes through, and no input.
pub fn sandgate_in(cwd: &Path, tmp: &Path, args: &[&str]) -> Output {
    Command::new(common::sandgate_bin())
        .args(args)
        .current_dir(cwd)
        .env("TMPDIR", tmp)
        .env("XDG_STATE_HOME", state_home())
        .env("HTTP_PROXY", "http://host-proxy.invalid:1")
        .env_remove("ALL_PROXY")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `sandgate run --policy P ARGS -- COMMAND` in `cwd`.
pub fn run_in(cwd: &Path, policy: &Path, args: &[&str], command: &[&str]) -> Output {
    let tmp = tempfile::tempdir().unwrap();
    let mut all = vec!["run", "--policy", policy.to_str().unwrap()];
    all.extend_from_slice(args);
    all.push("--");
    all.extend_from_slice(command);
    sandgate_in(cwd, tmp.path(), &all)
}

/// A loopback origin under two names, `allowed.test` and `denied.test`.
pub struct Fixture {
    _rt: tokio::runtime::Runtime,
    pub origin: Origin,
    pub dns: DnsServer,
}

impl Fixture {
    pub fn new(extra: &[(&str, &str)]) -> Fixture {
        let rt = runtime();
        let origin = rt.block_on(Origin::http());
        let mut zone = Zone::new()
            .with("allowed.test", &["127.0.0.1"])
            .with("denied.test", &["127.0.0.1"]);
        for (name, ip) in extra {
            zone = zone.with(name, &[ip]);
        }
        let dns = rt.block_on(DnsServer::start(zone));
        Fixture { _rt: rt, origin, dns }
    }

    pub fn allowed(&self) -> String {
        format!("allowed.test:{}", self.origin.port())
    }

    /// The lines a policy needs to reach the origin: its DNS server, loopback exempt.
    pub fn reach(&self) -> String {
        format!(
            "  allow_ranges: [ 127.0.0.1/32 ]\n  resolver: {{ servers: [ \"{}\" ] }}\n",
            self.dns.addr()
        )
    }

    /// A shell line printing `NAME=<HTTP status>` for `http://HOST:PORT/NAME` through the
    /// environment's proxy (curl exit status after `NAME=` when it fails).
    pub fn curl(&self, name: &str, host: &str) -> String {
        format!(
            "curl -sS -m 10 -o /dev/null -w '{name}=%{{http_code}}\\n' http://{host}:{}/{name} || echo {name}=exit$?\n",
            self.origin.port()
        )
    }
}

pub fn lib64() -> &'static str {
    if Path::new("/lib64").exists() {
        ", /lib64"
    } else {
        ""
    }
}
