//! `sandgate health`: asks a running proxy's admin listener whether it is ready (`GET
//! /readyz`) and answers with the exit status a container engine's HEALTHCHECK, compose's
//! `healthcheck` and a supervisor read: 0 ready, 1 not ready or not answering (the reason on
//! stderr), 64 for a URL that cannot be asked. The image is `FROM scratch`, with no curl or
//! shell to probe with; this is the program its health check runs.
//!
//! Where to ask: `--admin`, else `SANDGATE_ADMIN` (as `sandgate exceptions`), else the
//! listener `SANDGATE_ADMIN_LISTEN` opens (the image sets it, so the proxy and its health
//! check agree by the one variable; `0.0.0.0` is asked on 127.0.0.1), else
//! `http://127.0.0.1:9090`. The call goes through the control crate's admin client: IP
//! literals and `localhost` only, no proxy, bounded in time and size.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use sandgate_control::client::{AdminClient, AdminError, AdminUrl, Limits};

use crate::EX_USAGE;
use crate::cli::HealthArgs;
use crate::settings::{ADMIN_LISTEN_VAR, Env, ProcessEnv};

/// Where `sandgate health` asks when nothing names a listener: the systemd unit's and the
/// image's admin address.
const DEFAULT_ADMIN: &str = "http://127.0.0.1:9090";

pub fn run(args: &HealthArgs) -> ExitCode {
    let client = match client(args, &ProcessEnv) {
        Ok(c) => c,
        Err(message) => {
            eprintln!("sandgate: {message}");
            return ExitCode::from(EX_USAGE);
        }
    };
    match verdict(client.get("/readyz")) {
        Ok(()) => {
            println!("ready: {}", client.url());
            ExitCode::SUCCESS
        }
        Err(reason) => {
            eprintln!("sandgate: not ready: {reason}");
            ExitCode::FAILURE
        }
    }
}

/// Ready when `/readyz` answered 2xx; its body is text (`ready`), which the client, made
/// for the JSON API, reports as not JSON. Anything else is the reason it is not.
fn verdict(answer: Result<serde_json::Value, AdminError>) -> Result<(), AdminError> {
    match answer {
        Ok(_) => Ok(()),
        Err(AdminError::NotJson { status, .. }) if (200..300).contains(&status) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The client for the admin URL the flags and environment name, bounded by `--timeout`.
fn client(args: &HealthArgs, env: &dyn Env) -> Result<AdminClient, String> {
    let (source, text) = target(args.admin.as_deref(), env)?;
    let url = AdminUrl::parse(&text).map_err(|e| format!("{source}: {e}"))?;
    let timeout = Duration::from_secs(args.timeout.max(1));
    let limits = Limits {
        timeout,
        connect_timeout: timeout.min(Duration::from_secs(2)),
        max_body: 64 << 10,
    };
    match (&args.admin_ca, url.is_tls()) {
        (Some(ca), _) => AdminClient::with_ca(url, "", limits, ca).map_err(|e| format!("--admin-ca: {e}")),
        (None, true) => Err(format!(
            "{source}: {url} is https://: --admin-ca FILE names the CA its certificate chains to"
        )),
        (None, false) => Ok(AdminClient::with_limits(url, "", limits)),
    }
}

/// The admin URL to ask, with the name to blame for it.
fn target(flag: Option<&str>, env: &dyn Env) -> Result<(&'static str, String), String> {
    let set = |var: &str| env.get(var).filter(|v| !v.trim().is_empty());
    if let Some(url) = flag {
        return Ok(("--admin", url.to_owned()));
    }
    if let Some(url) = set("SANDGATE_ADMIN") {
        return Ok(("SANDGATE_ADMIN", url.trim().to_owned()));
    }
    if let Some(listen) = set(ADMIN_LISTEN_VAR) {
        let addr: SocketAddr = listen
            .trim()
            .parse()
            .map_err(|_| format!("{ADMIN_LISTEN_VAR}: {listen:?} is not IP:PORT"))?;
        return Ok((ADMIN_LISTEN_VAR, format!("http://{}", reachable(addr))));
    }
    Ok(("default", DEFAULT_ADMIN.to_owned()))
}

/// A listener on every address is asked on loopback, in its own family.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port()),
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> HashMap<String, String> {
        vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_flag_then_the_api_variable_then_the_listener_variable_then_the_default() {
        let all = env(&[
            ("SANDGATE_ADMIN", "http://127.0.0.1:1"),
            ("SANDGATE_ADMIN_LISTEN", "0.0.0.0:2"),
        ]);
        assert_eq!(
            target(Some("http://[::1]:3"), &all).unwrap(),
            ("--admin", "http://[::1]:3".to_owned())
        );
        assert_eq!(
            target(None, &all).unwrap(),
            ("SANDGATE_ADMIN", "http://127.0.0.1:1".to_owned())
        );
        let listen = env(&[("SANDGATE_ADMIN", ""), ("SANDGATE_ADMIN_LISTEN", "0.0.0.0:2")]);
        assert_eq!(
            target(None, &listen).unwrap(),
            ("SANDGATE_ADMIN_LISTEN", "http://127.0.0.1:2".to_owned())
        );
        let v6 = env(&[("SANDGATE_ADMIN_LISTEN", "[::]:9")]);
        assert_eq!(target(None, &v6).unwrap().1, "http://[::1]:9");
        let there = env(&[("SANDGATE_ADMIN_LISTEN", "10.0.0.5:9090")]);
        assert_eq!(target(None, &there).unwrap().1, "http://10.0.0.5:9090");
        assert_eq!(
            target(None, &env(&[])).unwrap(),
            ("default", "http://127.0.0.1:9090".to_owned())
        );
        let bad = target(None, &env(&[("SANDGATE_ADMIN_LISTEN", "nine")])).unwrap_err();
        assert!(bad.contains("SANDGATE_ADMIN_LISTEN"), "{bad}");
    }

    #[test]
    fn a_text_answer_of_2xx_is_ready_and_anything_else_is_not() {
        let api = || "http://127.0.0.1:9090".to_owned();
        assert!(verdict(Ok(serde_json::Value::Null)).is_ok());
        assert!(
            verdict(Err(AdminError::NotJson {
                api: api(),
                status: 200
            }))
            .is_ok()
        );
        assert!(
            verdict(Err(AdminError::NotJson {
                api: api(),
                status: 503
            }))
            .is_err()
        );
        let refused = AdminError::Refused {
            api: api(),
            status: 503,
            message: "the audit log cannot be written".into(),
        };
        let reason = verdict(Err(refused)).unwrap_err().to_string();
        assert!(reason.contains("503") && reason.contains("audit log"), "{reason}");
    }

    #[test]
    fn an_https_url_without_its_ca_is_a_usage_error() {
        let args = HealthArgs {
            admin: Some("https://127.0.0.1:9443".into()),
            admin_ca: None,
            timeout: 5,
        };
        let err = client(&args, &env(&[])).unwrap_err();
        assert!(err.contains("--admin-ca"), "{err}");
    }
}
