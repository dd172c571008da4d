//! `sandgate exceptions`: a thin client of the admin API (`/v1/exceptions`). The address
//! comes from `--admin` or `SANDGATE_ADMIN`, the bearer token from `--token-file` or
//! `SANDGATE_TOKEN` (never from the command line, where other users could read it). Tables
//! for people, `--json` for scripts. Exit 0 on success, 1 when the API refuses (its reason
//! on stderr), 64 for bad input, 69 when the API cannot be reached.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Value, json};

use crate::EX_USAGE;
use crate::cli::{ExceptionsArgs, ExceptionsCommand};

const DEFAULT_ADMIN: &str = "http://127.0.0.1:9090";

pub fn run(args: &ExceptionsArgs) -> ExitCode {
    let base = args
        .admin
        .clone()
        .or_else(|| std::env::var("SANDGATE_ADMIN").ok())
        .unwrap_or_else(|| DEFAULT_ADMIN.to_owned());
    let base = base.trim_end_matches('/').to_owned();
    if !base.starts_with("http://") {
        eprintln!("sandgate: --admin {base:?}: expected http://HOST:PORT");
        return ExitCode::from(EX_USAGE);
    }
    let token = match &args.token_file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) => t.trim().to_owned(),
            Err(e) => {
                eprintln!("sandgate: cannot read {}: {e}", path.display());
                return ExitCode::from(EX_USAGE);
            }
        },
        None => std::env::var("SANDGATE_TOKEN").unwrap_or_default(),
    };
    let (method, path, body) = request_of(&args.command);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let url = format!("{base}{path}");
    let auth = format!("Bearer {token}");
    let sent = match (method, body) {
        ("GET", _) => agent.get(&url).header("Authorization", &auth).call(),
        (_, body) => agent
            .post(&url)
            .header("Authorization", &auth)
            .header("Content-Type", "application/json")
            .send(body.map(|b| b.to_string()).unwrap_or_default()),
    };
    let mut response = match sent {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sandgate: cannot reach the admin API at {base}: {e}");
            return ExitCode::from(69);
        }
    };
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if !(200..300).contains(&status) {
        let reason = value.get("error").and_then(Value::as_str).unwrap_or(text.trim());
        eprintln!("sandgate: {status}: {reason}");
        return ExitCode::FAILURE;
    }
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

/// The API call for a subcommand: method, path, JSON body.
fn request_of(cmd: &ExceptionsCommand) -> (&'static str, String, Option<Value>) {
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
            ("POST", "/v1/exceptions".to_owned(), Some(Value::Object(body)))
        }
        ExceptionsCommand::List => ("GET", "/v1/exceptions".to_owned(), None),
        ExceptionsCommand::Show { id } => ("GET", format!("/v1/exceptions/{}", encode(id)), None),
        ExceptionsCommand::Approve { id, hosts, ttl } => {
            let mut body = serde_json::Map::new();
            if !hosts.is_empty() {
                body.insert("hosts".into(), json!(hosts));
            }
            if let Some(t) = ttl {
                body.insert("ttl_seconds".into(), json!(t));
            }
            (
                "POST",
                format!("/v1/exceptions/{}/approve", encode(id)),
                Some(Value::Object(body)),
            )
        }
        ExceptionsCommand::Deny { id, note } => (
            "POST",
            format!("/v1/exceptions/{}/deny", encode(id)),
            Some(json!({ "note": note })),
        ),
        ExceptionsCommand::Revoke { id, note } => (
            "POST",
            format!("/v1/exceptions/{}/revoke", encode(id)),
            Some(json!({ "note": note })),
        ),
    }
}

/// Ids are `ex-` and hex; anything else is percent-encoded so it stays one path segment.
fn encode(id: &str) -> String {
    id.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
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
