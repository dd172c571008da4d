//! `sandgate explain`: two questions about the proxy's answers.
//!
//! - `explain TARGET` ([`target`]): how the policy would decide one destination, by which
//!   rule (file and line, scope, expiry), what the address guard will still check, and which
//!   expired rules would have matched. No network access, except with `--resolve`: then the
//!   name is resolved through the proxy's own dialer (the same nameservers and parsing as
//!   `sandgate proxy`) and every answer is classified, and checked against address deny
//!   entries, as the proxy would.
//! - `explain --request-id ID` ([`request`]): why a request went as it did, from its lines in
//!   the audit log, and the command or setting that would let it through ([`remedy`]),
//!   printed by [`report`].
//!
//! The exit status is the proxy's answer, for scripts: 0 allowed, 1 refused (by the policy,
//! the address guard, an address deny entry, a tunnel rule; for a recorded request also by an
//! upstream proxy), 2 allowed but unreachable (`--resolve` found no address: the proxy would
//! answer 502; a recorded request that failed upstream), 64 a usage error (an unknown or
//! malformed request id among them).

use std::process::ExitCode;

use crate::EX_USAGE;
use crate::cli::ExplainArgs;

mod below_host;
mod remedy;
mod report;
mod request;
mod target;

pub fn run(args: &ExplainArgs) -> ExitCode {
    let answer = match (&args.request_id, &args.target) {
        (Some(id), _) => request::explain(args, id),
        (None, Some(text)) => target::explain(args, text),
        // clap requires one of the two.
        (None, None) => Err("name a TARGET or --request-id ID".to_owned()),
    };
    match answer {
        Ok(code) => code,
        Err(message) => {
            eprintln!("sandgate: {message}");
            ExitCode::from(EX_USAGE)
        }
    }
}
