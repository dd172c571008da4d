//! `sandgate exceptions`: a thin client of the admin API (`/v1/exceptions`) through the
//! shared admin client (`sandgate_control::client`). The address comes from `--admin` or
//! `SANDGATE_ADMIN` (`http://HOST:PORT`, HOST an IP address or localhost: no name is looked
//! up), the bearer token from `--token-file` or `SANDGATE_TOKEN` (never from the command
//! line, where other users could read it). Tables for people, `--json` for scripts. Exit 0
//! on success, 1 when the API refuses (its reason on stderr), 64 for bad input, 69 when the
//! API cannot be reached.

use std::process::ExitCode;

use sandgate_control::client::{AdminClient, AdminError, AdminUrl, path_segment};
use serde_json::{Value, json};

use crate::EX_USAGE;
use crate::cli::{ExceptionsArgs, ExceptionsCommand};

const DEFAULT_ADMIN: &str = "http://127.0.0.1:9090";

/// EX_UNAVAILABLE (sysexits.h): the admin API could not be reached.
const EX_UNAVAILABLE: u8 = 69;

pub fn run(args: &ExceptionsArgs) -> ExitCode {
    let (source, base) = match (&args.admin, std::env::var("SANDGATE_ADMIN")) {
        (Some(flag), _) => ("--admin", flag.clone()),
        (None, Ok(env)) => ("SANDGATE_ADMIN", env),
        (None, Err(_)) => ("the default", DEFAULT_ADMIN.to_owned()),
    };
    let url = match AdminUrl::parse(&base) {
        Ok(url) => url,
        Err(e) => {
            eprintln!("sandgate: {source}: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let token = match &args.token_file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("sandgate: cannot read {}: {e}", path.display());
                return ExitCode::from(EX_USAGE);
            }
        },
        None => std::env::var("SANDGATE_TOKEN").unwrap_or_default(),
    };
    let client = AdminClient::new(url, &token);
    let answer = match call_of(&args.command) {
        Call::Get(path) => client.get(&path),
        Call::Post(path, body) => client.post(&path, &body),
    };
    let value = match answer {
        Ok(value) => value,
        Err(e) => {
            eprintln!("sandgate: {e}");
            return ExitCode::from(exit_code(&e));
        }
    };
    if args.json {
        println!("{value}");
    } else {
        match &value {
            Value::Array(list) => print_table(list),
            one => print_table(std::slice::from_ref(one)),
        }
    }
    ExitCode::SUCCESS
}

/// 64 for what the user gave (the URL, the token), 69 when the API cannot be reached or
/// does not answer in time, 1 when it answered with a refusal or an answer we cannot read.
fn exit_code(error: &AdminError) -> u8 {
    match error {
        AdminError::Url(_) | AdminError::Token => EX_USAGE,
        AdminError::Unreachable { .. } | AdminError::Timeout { .. } => EX_UNAVAILABLE,
        AdminError::Refused { .. } | AdminError::TooLarge { .. } | AdminError::NotJson { .. } => 1,
    }
}

/// One call of the admin API: GET a path, or POST a JSON body to it.
#[derive(Debug)]
enum Call {
    Get(String),
    Post(String, Value),
}

/// The API call for a subcommand.
fn call_of(cmd: &ExceptionsCommand) -> Call {
    match cmd {
        ExceptionsCommand::Request {
            task,
            project,
            hosts,
            ports,
            ttl,
            reason,
        } => {
            let mut body = serde_json::Map::new();
            body.insert("task_id".into(), json!(task));
            body.insert("requested_hosts".into(), json!(hosts));
            body.insert("ttl_seconds".into(), json!(ttl));
            body.insert("reason".into(), json!(reason));
            if let Some(p) = project {
                body.insert("project_id".into(), json!(p));
            }
            if !ports.is_empty() {
                body.insert("requested_ports".into(), json!(ports));
            }
            Call::Post("/v1/exceptions".to_owned(), Value::Object(body))
        }
        ExceptionsCommand::List => Call::Get("/v1/exceptions".to_owned()),
        ExceptionsCommand::Show { id } => Call::Get(format!("/v1/exceptions/{}", path_segment(id))),
        ExceptionsCommand::Approve { id, hosts, ttl } => {
            let mut body = serde_json::Map::new();
            if !hosts.is_empty() {
                body.insert("hosts".into(), json!(hosts));
            }
            if let Some(t) = ttl {
                body.insert("ttl_seconds".into(), json!(t));
            }
            Call::Post(
                format!("/v1/exceptions/{}/approve", path_segment(id)),
                Value::Object(body),
            )
        }
        ExceptionsCommand::Deny { id, note } => Call::Post(
            format!("/v1/exceptions/{}/deny", path_segment(id)),
            json!({ "note": note }),
        ),
        ExceptionsCommand::Revoke { id, note } => Call::Post(
            format!("/v1/exceptions/{}/revoke", path_segment(id)),
            json!({ "note": note }),
        ),
    }
}

fn print_table(list: &[Value]) {
    println!(
        "{:<20} {:<9} {:<12} {:<34} {:<12} {:<21} REQUESTED BY",
        "ID", "STATE", "TASK", "HOSTS", "PORTS", "EXPIRES"
    );
    let field = |e: &Value, k: &str| e.get(k).cloned().unwrap_or(Value::Null);
    for e in list {
        let join = |v: &Value| {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default()
        };
        let expires = field(e, "expires_at")
            .as_i64()
            .and_then(|s| jiff::Timestamp::from_second(s).ok())
            .map_or_else(
                || "-".to_owned(),
                |t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            );
        println!(
            "{:<20} {:<9} {:<12} {:<34} {:<12} {:<21} {}",
            field(e, "id").as_str().unwrap_or("-"),
            field(e, "state").as_str().unwrap_or("-"),
            field(e, "task_id").as_str().unwrap_or("-"),
            join(&field(e, "hosts")),
            join(&field(e, "ports")),
            expires,
            field(e, "requested_by").as_str().unwrap_or("-"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_admin_error_has_its_exit_code() {
        let api = || "http://127.0.0.1:9090".to_owned();
        let url = AdminUrl::parse("http://evil.example:1/").unwrap_err();
        let cases = [
            (AdminError::Url(url), EX_USAGE),
            (AdminError::Token, EX_USAGE),
            (
                AdminError::Unreachable {
                    api: api(),
                    cause: "refused".into(),
                },
                EX_UNAVAILABLE,
            ),
            (
                AdminError::Timeout {
                    api: api(),
                    after: std::time::Duration::from_secs(30),
                },
                EX_UNAVAILABLE,
            ),
            (
                AdminError::Refused {
                    api: api(),
                    status: 409,
                    message: "not approved".into(),
                },
                1,
            ),
            (AdminError::TooLarge { api: api(), limit: 1 }, 1),
            (
                AdminError::NotJson {
                    api: api(),
                    status: 200,
                },
                1,
            ),
        ];
        for (error, code) in cases {
            assert_eq!(exit_code(&error), code, "{error}");
        }
    }

    #[test]
    fn an_id_stays_one_path_segment() {
        let show = ExceptionsCommand::Show {
            id: "../ex-1?x".into(),
        };
        assert!(matches!(call_of(&show), Call::Get(p) if p == "/v1/exceptions/%2E%2E%2Fex-1%3Fx"));
    }
}
