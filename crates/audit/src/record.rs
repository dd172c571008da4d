//! An audit line read back: one typed [`Record`] per line, by kind, for every reader of the
//! trail (`sandgate audit`, `policy suggest`, the run summary, the MCP runner).
//!
//! The written types ([`crate::event`]) hold what the proxy knows while it runs (a shared
//! identity, an exception's whole history); a line carries less, and lines written by hand
//! or by older versions may carry less still. So the read side has types of its own, each
//! field as a line can hold it: what every line of a kind must have is required (a
//! decision's verdict, a close's outcome), everything else may be absent. Fields this
//! version does not know are ignored; a value no writer writes (an unknown `outcome`) is an
//! [`Invalid`] line, never a guess. Turning a line of text into a record is
//! [`Record::parse`]; splitting a file into bounded lines is [`crate::read`].

use std::net::{IpAddr, SocketAddr};

use sandgate_policy::{Access, PolicyReason, Verdict};
use serde::Deserialize;

use crate::event::{Change, EventKind, Outcome, SCHEMA_VERSION};

/// One line of the audit trail, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub created_at: jiff::Timestamp,
    /// Shared by a request's decision and close (`reload-N`, `aggregate-N`, an exception's
    /// id for the other kinds).
    pub request_id: String,
    pub event: Recorded,
}

/// What a line records, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    Decision(DecisionRecord),
    Close(CloseRecord),
    PolicyReload(ReloadRecord),
    Aggregate(AggregateRecord),
    Exception(Box<ExceptionRecord>),
    AdminRefused(AdminRefusalRecord),
}

/// Who made a request (decision and close lines).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requester {
    pub client_addr: Option<SocketAddr>,
    pub task_id: Option<String>,
    pub project_id: Option<String>,
    pub job_id: Option<String>,
    pub subject: Option<String>,
    /// The agent acting for the subject, as stated (`agent`).
    pub agent: Option<String>,
    pub method: Option<String>,
    /// A plain-HTTP request's path, without the query string (`path`).
    pub path: Option<String>,
    /// On a central proxy: the node-local proxy that forwarded the request.
    pub node: Option<String>,
}

/// Where a request asked to go: present when a line names both a host and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// How it was asked for (`scheme`), when the line says.
    pub access: Option<Access>,
    /// As written: a name, a dotted quad or `[v6]`.
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionRecord {
    pub requester: Requester,
    /// `None` when the request named no valid destination.
    pub dest: Option<Destination>,
    pub verdict: Verdict,
    pub reason_code: Option<String>,
    /// A request let through in report-only mode: why the policy would have denied it.
    pub would_deny: Option<PolicyReason>,
    pub resolved_ip: Option<IpAddr>,
    pub rule: Option<String>,
    pub status: Option<u16>,
    pub tls_server_name: Option<String>,
    pub detail: Option<String>,
}

impl DecisionRecord {
    /// The policy's own reason, when `reason_code` is one (`allowlisted`, `denylisted`,
    /// `not_allowlisted`); `None` for the guard's, the parser's and every other code.
    pub fn policy_reason(&self) -> Option<PolicyReason> {
        self.reason_code.as_deref().and_then(policy_reason)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseRecord {
    pub requester: Requester,
    pub dest: Option<Destination>,
    pub resolved_ip: Option<IpAddr>,
    pub status: Option<u16>,
    /// Absent from a line: 0.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub duration_ms: u64,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadRecord {
    pub applied: bool,
    /// The file's rule counts, or every error of a rejected file.
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregateRecord {
    pub dest: Option<Destination>,
    pub task_id: Option<String>,
    pub project_id: Option<String>,
    /// Allowed requests folded into the line (absent: 0, as are the byte counts).
    pub count: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub window_start: Option<String>,
}

/// An exception's terms after a change, as its line states them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionRecord {
    pub change: Change,
    pub exception_id: Option<String>,
    pub task_id: Option<String>,
    pub project_id: Option<String>,
    pub hosts: Vec<String>,
    pub ports: Vec<u16>,
    pub ttl_seconds: Option<u32>,
    pub reason: Option<String>,
    pub requested_by: Option<String>,
    pub decided_by: Option<String>,
    /// RFC 3339, as written.
    pub expires_at: Option<String>,
    /// The decider's note (`detail`).
    pub note: Option<String>,
    /// Who made the change (`subject`); `None` for expiry.
    pub by: Option<String>,
    /// What it allows below its hosts (`methods`, `paths`); `None`: every request.
    pub methods: Option<Vec<String>>,
    pub paths: Option<Vec<String>>,
    /// A tweak's terms, on one line as written (`tweak`); `None` for hosts.
    pub tweak: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminRefusalRecord {
    /// The token's name, when the token was valid (`subject`).
    pub who: Option<String>,
    /// `METHOD /path` (`method`).
    pub action: Option<String>,
    pub status: Option<u16>,
    /// Why (`detail`).
    pub reason: Option<String>,
    pub client_addr: Option<SocketAddr>,
}

/// Why a line is not a record.
#[derive(Debug)]
pub enum Invalid {
    /// Not a JSON object, a field of the wrong type, or a field given twice.
    Json(serde_json::Error),
    /// Written by a newer, incompatible writer.
    NewerSchema(u32),
    /// A field every line of its kind has.
    Missing(&'static str),
    /// A value no writer of this schema writes (kept to 64 characters).
    Value { field: &'static str, value: String },
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Invalid::Json(e) => write!(f, "not a line of audit fields: {e}"),
            Invalid::NewerSchema(v) => {
                write!(
                    f,
                    "schema_version {v}; this sandgate reads up to {SCHEMA_VERSION}"
                )
            }
            Invalid::Missing(field) => write!(f, "no {field}"),
            // Debug quoting: a value from the file cannot put control characters on a terminal.
            Invalid::Value { field, value } => write!(f, "{field}: unknown value {value:?}"),
        }
    }
}

impl std::error::Error for Invalid {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Invalid::Json(e) => Some(e),
            _ => None,
        }
    }
}

impl From<serde_json::Error> for Invalid {
    fn from(e: serde_json::Error) -> Invalid {
        Invalid::Json(e)
    }
}

impl Invalid {
    fn value(field: &'static str, value: &str) -> Invalid {
        Invalid::Value {
            field,
            value: value.chars().take(64).collect(),
        }
    }
}

impl Record {
    /// Reads one line (without its newline).
    pub fn parse(text: &str) -> Result<Record, Invalid> {
        Record::try_from(serde_json::from_str::<Raw>(text)?)
    }

    pub fn kind(&self) -> EventKind {
        match &self.event {
            Recorded::Decision(_) => EventKind::Decision,
            Recorded::Close(_) => EventKind::Close,
            Recorded::PolicyReload(_) => EventKind::PolicyReload,
            Recorded::Aggregate(_) => EventKind::Aggregate,
            Recorded::Exception(x) => x.change.kind(),
            Recorded::AdminRefused(_) => EventKind::AdminRefused,
        }
    }

    /// The `decision` a line carries: a decision's verdict; `allow` for an aggregate.
    pub fn verdict(&self) -> Option<Verdict> {
        match &self.event {
            Recorded::Decision(d) => Some(d.verdict),
            Recorded::Aggregate(_) => Some(Verdict::Allow),
            _ => None,
        }
    }

    /// The task the line is about (traffic, aggregates, exceptions).
    pub fn task_id(&self) -> Option<&str> {
        match &self.event {
            Recorded::Decision(d) => d.requester.task_id.as_deref(),
            Recorded::Close(c) => c.requester.task_id.as_deref(),
            Recorded::Aggregate(a) => a.task_id.as_deref(),
            Recorded::Exception(x) => x.task_id.as_deref(),
            Recorded::PolicyReload(_) | Recorded::AdminRefused(_) => None,
        }
    }

    /// Where the traffic the line records went.
    pub fn dest(&self) -> Option<&Destination> {
        match &self.event {
            Recorded::Decision(d) => d.dest.as_ref(),
            Recorded::Close(c) => c.dest.as_ref(),
            Recorded::Aggregate(a) => a.dest.as_ref(),
            _ => None,
        }
    }
}

/// A policy reason by its code.
fn policy_reason(code: &str) -> Option<PolicyReason> {
    PolicyReason::ALL.into_iter().find(|r| r.code() == code)
}

/// The line as JSON: every field of every kind, each optional. Unknown fields are ignored
/// (a newer writer's additions); a field given twice is an error.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Raw {
    schema_version: Option<u32>,
    event: Option<String>,
    created_at: Option<String>,
    request_id: Option<String>,
    client_addr: Option<SocketAddr>,
    task_id: Option<String>,
    project_id: Option<String>,
    job_id: Option<String>,
    decision: Option<String>,
    reason_code: Option<String>,
    scheme: Option<String>,
    method: Option<String>,
    path: Option<String>,
    destination_host: Option<String>,
    destination_port: Option<u16>,
    resolved_ip: Option<IpAddr>,
    rule: Option<String>,
    status: Option<u16>,
    bytes_sent: Option<u64>,
    bytes_received: Option<u64>,
    duration_ms: Option<u64>,
    outcome: Option<String>,
    detail: Option<String>,
    count: Option<u64>,
    window_start: Option<String>,
    exception_id: Option<String>,
    hosts: Option<Vec<String>>,
    ports: Option<Vec<u16>>,
    methods: Option<Vec<String>>,
    paths: Option<Vec<String>>,
    tweak: Option<String>,
    ttl_seconds: Option<u32>,
    reason: Option<String>,
    requested_by: Option<String>,
    decided_by: Option<String>,
    expires_at: Option<String>,
    subject: Option<String>,
    tls_server_name: Option<String>,
    node: Option<String>,
    would_deny: Option<String>,
    agent: Option<String>,
}

impl TryFrom<Raw> for Record {
    type Error = Invalid;

    fn try_from(mut raw: Raw) -> Result<Record, Invalid> {
        // Schema 1 is the first; a line without the field is read as one.
        let version = raw.schema_version.unwrap_or(1);
        if version > SCHEMA_VERSION {
            return Err(Invalid::NewerSchema(version));
        }
        let event = raw.event.take().ok_or(Invalid::Missing("event"))?;
        let kind = EventKind::parse(&event).ok_or_else(|| Invalid::value("event", &event))?;
        let created = raw.created_at.take().ok_or(Invalid::Missing("created_at"))?;
        let created_at = created
            .parse()
            .map_err(|_| Invalid::value("created_at", &created))?;
        let request_id = raw.request_id.take().ok_or(Invalid::Missing("request_id"))?;
        let event = match (kind, kind.change()) {
            (_, Some(change)) => Recorded::Exception(Box::new(raw.exception(change))),
            (EventKind::Decision, None) => Recorded::Decision(raw.decision()?),
            (EventKind::Close, None) => Recorded::Close(raw.close()?),
            (EventKind::PolicyReload, None) => Recorded::PolicyReload(raw.reload()?),
            (EventKind::Aggregate, None) => Recorded::Aggregate(raw.aggregate()?),
            (EventKind::AdminRefused, None) => Recorded::AdminRefused(raw.admin_refusal()),
            // Every exception kind has its change (`EventKind::change`).
            (_, None) => return Err(Invalid::value("event", &event)),
        };
        Ok(Record {
            created_at,
            request_id,
            event,
        })
    }
}

impl Raw {
    fn requester(&mut self) -> Requester {
        Requester {
            client_addr: self.client_addr,
            task_id: self.task_id.take(),
            project_id: self.project_id.take(),
            job_id: self.job_id.take(),
            subject: self.subject.take(),
            agent: self.agent.take(),
            method: self.method.take(),
            path: self.path.take(),
            node: self.node.take(),
        }
    }

    fn dest(&mut self) -> Result<Option<Destination>, Invalid> {
        let access = match self.scheme.take() {
            None => None,
            Some(s) => Some(
                [Access::Connect, Access::Http, Access::Socks5, Access::Https]
                    .into_iter()
                    .find(|a| a.scheme() == s)
                    .ok_or_else(|| Invalid::value("scheme", &s))?,
            ),
        };
        Ok(match (self.destination_host.take(), self.destination_port) {
            (Some(host), Some(port)) => Some(Destination { access, host, port }),
            _ => None,
        })
    }

    fn decision(mut self) -> Result<DecisionRecord, Invalid> {
        let verdict = match self.decision.as_deref() {
            Some("allow") => Verdict::Allow,
            Some("deny") => Verdict::Deny,
            Some(other) => return Err(Invalid::value("decision", other)),
            None => return Err(Invalid::Missing("decision")),
        };
        let would_deny = match self.would_deny.as_deref() {
            Some(code) => Some(policy_reason(code).ok_or_else(|| Invalid::value("would_deny", code))?),
            // Lines written before `would_deny` existed said it only in words, always as
            // `would deny: CODE`: this is the one place those words are read.
            None if self.reason_code.as_deref() == Some("report_only") => {
                let words = self.detail.as_deref().unwrap_or("");
                let code = words.strip_prefix("would deny: ").unwrap_or(words);
                Some(policy_reason(code).ok_or(Invalid::Missing("would_deny"))?)
            }
            None => None,
        };
        Ok(DecisionRecord {
            requester: self.requester(),
            dest: self.dest()?,
            verdict,
            reason_code: self.reason_code,
            would_deny,
            resolved_ip: self.resolved_ip,
            rule: self.rule,
            status: self.status,
            tls_server_name: self.tls_server_name,
            detail: self.detail,
        })
    }

    fn close(mut self) -> Result<CloseRecord, Invalid> {
        let text = self.outcome.take().ok_or(Invalid::Missing("outcome"))?;
        let outcome = Outcome::parse(&text).ok_or_else(|| Invalid::value("outcome", &text))?;
        Ok(CloseRecord {
            requester: self.requester(),
            dest: self.dest()?,
            resolved_ip: self.resolved_ip,
            status: self.status,
            bytes_sent: self.bytes_sent.unwrap_or(0),
            bytes_received: self.bytes_received.unwrap_or(0),
            duration_ms: self.duration_ms.unwrap_or(0),
            outcome,
        })
    }

    fn reload(self) -> Result<ReloadRecord, Invalid> {
        let applied = match self.outcome.as_deref() {
            Some("applied") => true,
            Some("rejected") => false,
            Some(other) => return Err(Invalid::value("outcome", other)),
            None => return Err(Invalid::Missing("outcome")),
        };
        Ok(ReloadRecord {
            applied,
            detail: self.detail,
        })
    }

    fn aggregate(mut self) -> Result<AggregateRecord, Invalid> {
        Ok(AggregateRecord {
            dest: self.dest()?,
            task_id: self.task_id,
            project_id: self.project_id,
            count: self.count.unwrap_or(0),
            bytes_sent: self.bytes_sent.unwrap_or(0),
            bytes_received: self.bytes_received.unwrap_or(0),
            window_start: self.window_start,
        })
    }

    fn exception(self, change: Change) -> ExceptionRecord {
        ExceptionRecord {
            change,
            exception_id: self.exception_id,
            task_id: self.task_id,
            project_id: self.project_id,
            hosts: self.hosts.unwrap_or_default(),
            ports: self.ports.unwrap_or_default(),
            ttl_seconds: self.ttl_seconds,
            reason: self.reason,
            requested_by: self.requested_by,
            decided_by: self.decided_by,
            expires_at: self.expires_at,
            note: self.detail,
            by: self.subject,
            methods: self.methods,
            paths: self.paths,
            tweak: self.tweak,
        }
    }

    fn admin_refusal(self) -> AdminRefusalRecord {
        AdminRefusalRecord {
            who: self.subject,
            action: self.method,
            status: self.status,
            reason: self.detail,
            client_addr: self.client_addr,
        }
    }
}
