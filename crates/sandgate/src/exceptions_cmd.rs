//! `sandgate exceptions`: a thin client of the admin API (`/v1/exceptions`) through the
//! shared admin client (`sandgate_control::client`). The address comes from `--admin` or
//! `SANDGATE_ADMIN` (`http://HOST:PORT`, HOST an IP address or localhost: no name is looked
//! up), the bearer token from `--token-file` or `SANDGATE_TOKEN` (never from the command
//! line, where other users could read it). Tables for people ([`view`]), `--json` for
//! scripts. A missing or unknown token says which of the two to set, and a refusal by role
//! names the role the call needs. Exit 0 on success, 1 when the API refuses (its reason on
//! stderr), 64 for bad input (no token among them), 69 when the API cannot be reached.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sandgate_control::client::{AdminClient, AdminError, AdminUrl, path_segment};
use serde_json::{Value, json};

use crate::EX_USAGE;
use crate::cli::{ExceptionsArgs, ExceptionsCommand};

mod view;

const DEFAULT_ADMIN: &str = "http://127.0.0.1:9090";

/// EX_UNAVAILABLE (sysexits.h): the admin API could not be reached.
const EX_UNAVAILABLE: u8 = 69;

/// A token file larger than this is not a token (and `/dev/zero` is not read forever).
const MAX_TOKEN_FILE: u64 = 4096;

/// The two places the token comes from; named in every message about it.
const SET_TOKEN: &str = "set SANDGATE_TOKEN to the token, or pass --token-file FILE (a file holding it)";

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
    let from = TokenSource::of(args.token_file.as_deref());
    let token = match from.read() {
        Ok(token) => token,
        Err(message) => {
            eprintln!("sandgate: {message}");
            return ExitCode::from(EX_USAGE);
        }
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
            if let Some(hint) = hint(&e, &args.command, &from) {
                eprintln!("sandgate: {hint}");
            }
            return ExitCode::from(exit_code(&e));
        }
    };
    if args.json {
        println!("{value}");
        return ExitCode::SUCCESS;
    }
    let columns = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse().ok());
    match (&args.command, &value) {
        (ExceptionsCommand::Show { .. }, one) => print!("{}", view::fields(one)),
        (_, Value::Array(list)) => print!("{}", view::table(list, columns)),
        (_, one) => print!("{}", view::table(std::slice::from_ref(one), columns)),
    }
    ExitCode::SUCCESS
}

/// Where the bearer token comes from: `--token-file`, else `SANDGATE_TOKEN`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TokenSource {
    File(PathBuf),
    Env,
}

impl TokenSource {
    fn of(file: Option<&Path>) -> TokenSource {
        file.map_or(TokenSource::Env, |f| TokenSource::File(f.to_owned()))
    }

    /// The token, or what to do when there is none.
    fn read(&self) -> Result<String, String> {
        match self {
            TokenSource::File(path) => {
                let token =
                    read_token_file(path).map_err(|e| format!("--token-file {}: {e}", path.display()))?;
                if token.trim().is_empty() {
                    return Err(format!(
                        "--token-file {} is empty: write the admin token into it, or use SANDGATE_TOKEN instead",
                        path.display()
                    ));
                }
                Ok(token)
            }
            TokenSource::Env => match std::env::var("SANDGATE_TOKEN") {
                Ok(t) if !t.trim().is_empty() => Ok(t),
                Ok(_) => Err(format!("SANDGATE_TOKEN is empty: {SET_TOKEN}")),
                Err(std::env::VarError::NotPresent) => Err(format!("no admin token: {SET_TOKEN}")),
                Err(std::env::VarError::NotUnicode(_)) => {
                    Err(format!("SANDGATE_TOKEN is not valid UTF-8: {SET_TOKEN}"))
                }
            },
        }
    }

    /// How a message names it.
    fn name(&self) -> String {
        match self {
            TokenSource::File(path) => format!("the file {} (--token-file)", path.display()),
            TokenSource::Env => "SANDGATE_TOKEN".to_owned(),
        }
    }
}

/// A token file's text, bounded in size.
fn read_token_file(path: &Path) -> Result<String, String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_FILE + 1).read_to_string(&mut text))
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_TOKEN_FILE {
        return Err(format!("over {MAX_TOKEN_FILE} bytes: not a token"));
    }
    Ok(text)
}

/// What to do about a refusal the user can fix: a token the API does not know (401), or a
/// token without the role the call needs (403).
fn hint(error: &AdminError, cmd: &ExceptionsCommand, from: &TokenSource) -> Option<String> {
    let AdminError::Refused { status, .. } = error else {
        return None;
    };
    match status {
        401 => Some(format!(
            "the admin API does not know the token from {}: set SANDGATE_TOKEN, or pass --token-file FILE, with a token of its policy's spec.admin.tokens",
            from.name()
        )),
        403 => role_needed(cmd).map(str::to_owned),
        _ => None,
    }
}

/// The role a call needs, in words; None for reading, which every role may.
fn role_needed(cmd: &ExceptionsCommand) -> Option<&'static str> {
    match cmd {
        ExceptionsCommand::Request { .. } => Some(
            "requesting needs a token (spec.admin.tokens) with the requester role whose tasks include the task, or the approver role; and spec.exceptions must enable the task",
        ),
        ExceptionsCommand::Approve { .. } => Some(
            "approving needs a token (spec.admin.tokens) with the approver role, other than the one that asked",
        ),
        ExceptionsCommand::Deny { .. } => {
            Some("denying needs a token (spec.admin.tokens) with the approver role")
        }
        ExceptionsCommand::Revoke { .. } => {
            Some("revoking needs a token (spec.admin.tokens) with the approver role")
        }
        ExceptionsCommand::List | ExceptionsCommand::Show { .. } => None,
    }
}

/// 64 for what the user gave (the URL, the token), 69 when the API cannot be reached or
/// does not answer in time, 1 when it answered with a refusal or an answer we cannot read.
fn exit_code(error: &AdminError) -> u8 {
    match error {
        AdminError::Url(_) | AdminError::Token | AdminError::Tls(_) => EX_USAGE,
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
            below,
            tweak,
        } => {
            let mut body = below.fields();
            body.insert("task_id".into(), json!(task));
            body.insert("requested_hosts".into(), json!(hosts));
            if let Some(t) = tweak.tweak() {
                body.insert("tweak".into(), json!(t));
            }
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
        ExceptionsCommand::Approve {
            id,
            hosts,
            ttl,
            below,
            tweak,
        } => {
            let mut body = below.fields();
            if !hosts.is_empty() {
                body.insert("hosts".into(), json!(hosts));
            }
            if let Some(t) = ttl {
                body.insert("ttl_seconds".into(), json!(t));
            }
            if let Some(t) = tweak.tweak() {
                body.insert("tweak".into(), json!(t));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::central::BelowArgs;

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

    fn refused(status: u16) -> AdminError {
        AdminError::Refused {
            api: "http://127.0.0.1:9090".into(),
            status,
            message: "refused".into(),
        }
    }

    #[test]
    fn an_unknown_token_says_what_to_set_and_a_403_names_the_role() {
        let approve = ExceptionsCommand::Approve {
            id: "ex-1".into(),
            hosts: vec![],
            ttl: None,
            below: BelowArgs::default(),
            tweak: Default::default(),
        };
        let file = TokenSource::File("/etc/alice.token".into());
        let h = hint(&refused(401), &approve, &TokenSource::Env).unwrap();
        assert!(
            h.contains("token from SANDGATE_TOKEN") && h.contains("--token-file FILE"),
            "{h}"
        );
        let h = hint(&refused(401), &ExceptionsCommand::List, &file).unwrap();
        assert!(
            h.contains("/etc/alice.token (--token-file)") && h.contains("SANDGATE_TOKEN"),
            "{h}"
        );
        let h = hint(&refused(403), &approve, &file).unwrap();
        assert!(h.contains("approver role"), "{h}");
        for cmd in [
            ExceptionsCommand::Deny {
                id: "x".into(),
                note: None,
            },
            ExceptionsCommand::Revoke {
                id: "x".into(),
                note: None,
            },
        ] {
            assert!(
                hint(&refused(403), &cmd, &file)
                    .unwrap()
                    .contains("approver role")
            );
        }
        let request = ExceptionsCommand::Request {
            task: "t-1".into(),
            project: None,
            hosts: vec!["pypi.org".into()],
            ports: vec![],
            ttl: 60,
            reason: "r".into(),
            below: BelowArgs::default(),
            tweak: Default::default(),
        };
        let h = hint(&refused(403), &request, &file).unwrap();
        assert!(h.contains("requester role") && h.contains("approver role"), "{h}");
        // Nothing to add to a refusal the token cannot fix, or to one that is not a refusal.
        assert_eq!(hint(&refused(409), &approve, &file), None);
        assert_eq!(hint(&refused(403), &ExceptionsCommand::List, &file), None);
        assert_eq!(hint(&AdminError::Token, &approve, &file), None);
    }

    #[test]
    fn a_token_file_that_holds_no_token_is_refused_before_any_call() {
        let dir = tempfile::tempdir().unwrap();
        let read = |name: &str, content: Option<&[u8]>| {
            let path = dir.path().join(name);
            if let Some(c) = content {
                std::fs::write(&path, c).unwrap();
            }
            TokenSource::File(path).read()
        };
        assert_eq!(read("ok", Some(b"tok-alice\n")).unwrap(), "tok-alice\n");
        let err = read("empty", Some(b" \n")).unwrap_err();
        assert!(err.contains("empty") && err.contains("SANDGATE_TOKEN"), "{err}");
        let err = read("missing", None).unwrap_err();
        assert!(err.contains("--token-file") && err.contains("missing"), "{err}");
        let err = read("huge", Some(&[b'a'; 10_000])).unwrap_err();
        assert!(err.contains("not a token"), "{err}");
        let err = TokenSource::File("/dev/zero".into()).read().unwrap_err();
        assert!(err.contains("not a token"), "{err}");
    }

    #[test]
    fn methods_and_paths_go_into_the_body_under_the_api_s_names() {
        let below = BelowArgs {
            methods: vec!["GET".into()],
            paths: vec!["/org/**".into()],
            read_only: false,
        };
        let approve = ExceptionsCommand::Approve {
            id: "ex-1".into(),
            hosts: vec![],
            ttl: None,
            below: below.clone(),
            tweak: Default::default(),
        };
        let Call::Post(_, body) = call_of(&approve) else {
            unreachable!("an approval posts")
        };
        assert_eq!(body, json!({"methods": ["GET"], "paths": ["/org/**"]}));
        let read_only = BelowArgs {
            read_only: true,
            ..BelowArgs::default()
        };
        assert_eq!(Value::Object(read_only.fields()), json!({"read_only": true}));
        assert_eq!(Value::Object(BelowArgs::default().fields()), json!({}));
    }

    #[test]
    fn a_tweak_goes_into_the_body_instead_of_hosts() {
        let request = ExceptionsCommand::Request {
            task: "agent-7".into(),
            project: None,
            hosts: vec![],
            ports: vec![],
            ttl: 600,
            reason: "r".into(),
            below: BelowArgs::default(),
            tweak: crate::cli::central::TweakArgs {
                tweak_sandbox: Some("web".into()),
                max_seconds: Some(600),
                network: true,
                ..Default::default()
            },
        };
        let Call::Post(_, body) = call_of(&request) else {
            unreachable!("a request posts")
        };
        assert_eq!(
            body["tweak"],
            json!({"sandbox": "web", "max_seconds": 600, "network": true})
        );
        assert_eq!(body["requested_hosts"], json!([]));
    }

    #[test]
    fn an_approval_grants_a_narrowed_tweak_whole() {
        let approve = ExceptionsCommand::Approve {
            id: "ex-1".into(),
            hosts: vec![],
            ttl: Some(60),
            below: BelowArgs::default(),
            tweak: crate::cli::central::TweakGrantArgs {
                tweak_sandbox: Some("web".into()),
                max_seconds: Some(30),
                workspace: Some("/srv/work/one".into()),
                ..Default::default()
            },
        };
        let Call::Post(path, body) = call_of(&approve) else {
            unreachable!("an approval posts")
        };
        assert_eq!(path, "/v1/exceptions/ex-1/approve");
        assert_eq!(
            body,
            json!({"ttl_seconds": 60, "tweak": {"sandbox": "web", "max_seconds": 30, "workspace": "/srv/work/one"}})
        );
    }

    #[test]
    fn an_id_stays_one_path_segment() {
        let show = ExceptionsCommand::Show {
            id: "../ex-1?x".into(),
        };
        assert!(matches!(call_of(&show), Call::Get(p) if p == "/v1/exceptions/%2E%2E%2Fex-1%3Fx"));
    }
}
