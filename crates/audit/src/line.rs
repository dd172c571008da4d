//! The one flat JSON line every kind of event is written as (`docs/audit.md`): every line
//! carries every field, absent ones as `null`, so readers and CSV exports see one schema.
//!
//! A line is made from an event as the proxy records it ([`Line::of`]) or from a line read
//! back ([`Line::of_record`], for exports): both go through the same fields here, so what
//! a reader gets back is what the writer wrote. The writer encodes it with
//! [`Line::write_json`] (`json.rs`), the bytes `serde_json` would write, without serde.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use sandgate_policy::{PolicyReason, Verdict};
use serde::Serialize;

use crate::event::{Dest, Event, EventKind, ExceptionChange, Outcome, Party, SCHEMA_VERSION, Stamped};
use crate::record::{Destination, ExceptionRecord, Record, Recorded, Requester};

mod json;

/// One written line: every field of every kind, absent ones `null` (the schema readers and
/// exports rely on; field order as in `docs/audit.md`, new fields last).
#[derive(Debug, Serialize)]
pub struct Line<'a> {
    pub schema_version: u32,
    pub event: EventKind,
    pub created_at: Cow<'a, str>,
    pub request_id: Cow<'a, str>,
    pub client_addr: Option<SocketAddr>,
    pub task_id: Option<&'a str>,
    pub project_id: Option<&'a str>,
    pub job_id: Option<&'a str>,
    pub decision: Option<Verdict>,
    pub reason_code: Option<&'a str>,
    pub scheme: Option<&'static str>,
    pub method: Option<&'a str>,
    pub destination_host: Option<&'a str>,
    pub destination_port: Option<u16>,
    pub resolved_ip: Option<IpAddr>,
    pub rule: Option<&'a str>,
    pub status: Option<u16>,
    pub bytes_sent: Option<u64>,
    pub bytes_received: Option<u64>,
    pub duration_ms: Option<u64>,
    pub outcome: Option<&'a str>,
    pub detail: Option<&'a str>,
    pub count: Option<u64>,
    pub window_start: Option<&'a str>,
    /// Exception events: the exception and its terms.
    pub exception_id: Option<&'a str>,
    pub hosts: Option<&'a [String]>,
    pub ports: Option<&'a [u16]>,
    pub ttl_seconds: Option<u32>,
    pub reason: Option<&'a str>,
    pub requested_by: Option<&'a str>,
    pub decided_by: Option<&'a str>,
    pub expires_at: Option<String>,
    /// Who acted: the requester or decider of an exception change; on traffic, who started
    /// what made the request (a listener's or a sandboxed run's `subject`), as stated.
    pub subject: Option<&'a str>,
    /// Decisions on tunnels: the server name of the TLS ClientHello, when it was read.
    pub tls_server_name: Option<&'a str>,
    /// On a central proxy: the node-local proxy that forwarded the request.
    pub node: Option<&'a str>,
    /// A report-only decision: the policy's reason to deny (`not_allowlisted`, `denylisted`).
    pub would_deny: Option<&'static str>,
    /// On traffic: the agent acting for the subject (`sandgate run --agent`, an MCP
    /// client's name), as stated.
    pub agent: Option<&'a str>,
    /// On a plain-HTTP request: its path, without the query string, as the client wrote it.
    pub path: Option<&'a str>,
    /// Exception events: the methods and paths it allows below its hosts (`GET`, `HEAD`
    /// and `OPTIONS` for read-only); `None` for every request.
    pub methods: Option<Cow<'a, [String]>>,
    pub paths: Option<&'a [String]>,
    /// Exception events of a tweak (more than egress for one sandbox of `sandgate mcp`):
    /// what it asks, on one line (`sandbox=web max_seconds=600 network`); `None` otherwise.
    pub tweak: Option<Cow<'a, str>>,
}

impl<'a> Line<'a> {
    fn empty(event: EventKind, created_at: Cow<'a, str>, request_id: Cow<'a, str>) -> Line<'a> {
        Line {
            schema_version: SCHEMA_VERSION,
            event,
            created_at,
            request_id,
            client_addr: None,
            task_id: None,
            project_id: None,
            job_id: None,
            decision: None,
            reason_code: None,
            scheme: None,
            method: None,
            destination_host: None,
            destination_port: None,
            resolved_ip: None,
            rule: None,
            status: None,
            bytes_sent: None,
            bytes_received: None,
            duration_ms: None,
            outcome: None,
            detail: None,
            count: None,
            window_start: None,
            exception_id: None,
            hosts: None,
            ports: None,
            ttl_seconds: None,
            reason: None,
            requested_by: None,
            decided_by: None,
            expires_at: None,
            subject: None,
            tls_server_name: None,
            node: None,
            would_deny: None,
            agent: None,
            path: None,
            methods: None,
            paths: None,
            tweak: None,
        }
    }

    /// The line for `s`.
    pub fn of(s: &'a Stamped) -> Line<'a> {
        let mut line = Line::empty(
            EventKind::Decision,
            Cow::Borrowed(&s.created_at),
            s.event.request_id(),
        );
        match &s.event {
            Event::Decision(d) => {
                line.party(&d.party);
                line.dest(d.dest.as_ref());
                line.decision = Some(d.verdict);
                line.reason_code = Some(&d.reason_code);
                line.resolved_ip = d.resolved_ip;
                line.rule = d.rule.as_deref();
                line.status = d.status;
                line.tls_server_name = d.tls_server_name.as_deref();
                line.detail = d.detail.as_deref();
                line.would_deny = d.would_deny.map(PolicyReason::code);
            }
            Event::Close(c) => {
                line.event = EventKind::Close;
                line.party(&c.party);
                line.dest(Some(&c.dest));
                line.close(c.resolved_ip, c.status, c.outcome);
                line.bytes_sent = Some(c.bytes_sent);
                line.bytes_received = Some(c.bytes_received);
                line.duration_ms = Some(c.duration_ms);
            }
            Event::PolicyReload(r) => line.reload(r.applied, Some(&r.detail)),
            Event::Aggregate(a) => {
                line.event = EventKind::Aggregate;
                line.dest(a.dest.as_ref());
                line.task_id = a.task_id.as_deref();
                line.project_id = a.project_id.as_deref();
                line.aggregate(a.count, a.bytes_sent, a.bytes_received, Some(&a.window_start));
            }
            Event::Exception(x) => line.exception(x),
            Event::AdminRefused(r) => {
                line.event = EventKind::AdminRefused;
                line.client_addr = r.client_addr;
                line.subject = r.who.as_deref();
                line.method = Some(&r.action);
                line.status = Some(r.status);
                line.detail = Some(&r.reason);
            }
        }
        line
    }

    /// The line for a record read back: for a line the writer wrote, the same line again
    /// (fields not of the record's kind are not kept).
    pub fn of_record(r: &'a Record) -> Line<'a> {
        let mut line = Line::empty(
            r.kind(),
            Cow::Owned(r.created_at.to_string()),
            Cow::Borrowed(&r.request_id),
        );
        match &r.event {
            Recorded::Decision(d) => {
                line.requester(&d.requester);
                line.destination(d.dest.as_ref());
                line.decision = Some(d.verdict);
                line.reason_code = d.reason_code.as_deref();
                line.resolved_ip = d.resolved_ip;
                line.rule = d.rule.as_deref();
                line.status = d.status;
                line.tls_server_name = d.tls_server_name.as_deref();
                line.detail = d.detail.as_deref();
                line.would_deny = d.would_deny.map(PolicyReason::code);
            }
            Recorded::Close(c) => {
                line.requester(&c.requester);
                line.destination(c.dest.as_ref());
                line.close(c.resolved_ip, c.status, c.outcome);
                line.bytes_sent = Some(c.bytes_sent);
                line.bytes_received = Some(c.bytes_received);
                line.duration_ms = Some(c.duration_ms);
            }
            Recorded::PolicyReload(reload) => line.reload(reload.applied, reload.detail.as_deref()),
            Recorded::Aggregate(a) => {
                line.destination(a.dest.as_ref());
                line.task_id = a.task_id.as_deref();
                line.project_id = a.project_id.as_deref();
                line.aggregate(a.count, a.bytes_sent, a.bytes_received, a.window_start.as_deref());
            }
            Recorded::Exception(x) => line.exception_record(x),
            Recorded::AdminRefused(refusal) => {
                line.client_addr = refusal.client_addr;
                line.subject = refusal.who.as_deref();
                line.method = refusal.action.as_deref();
                line.status = refusal.status;
                line.detail = refusal.reason.as_deref();
            }
        }
        line
    }

    fn close(&mut self, resolved_ip: Option<IpAddr>, status: Option<u16>, outcome: Outcome) {
        self.resolved_ip = resolved_ip;
        self.status = status;
        self.outcome = Some(outcome.as_str());
        // A failed upstream's close says why in reason_code too.
        if let Outcome::Upstream(_) = outcome {
            self.reason_code = Some(outcome.as_str());
        }
    }

    fn reload(&mut self, applied: bool, detail: Option<&'a str>) {
        self.event = EventKind::PolicyReload;
        self.outcome = Some(if applied { "applied" } else { "rejected" });
        self.detail = detail;
    }

    fn aggregate(&mut self, count: u64, sent: u64, received: u64, window_start: Option<&'a str>) {
        self.decision = Some(Verdict::Allow);
        self.count = Some(count);
        self.bytes_sent = Some(sent);
        self.bytes_received = Some(received);
        self.window_start = window_start;
    }

    fn exception(&mut self, x: &'a ExceptionChange) {
        let e = &x.exception;
        self.event = x.change.kind();
        self.task_id = Some(&e.task_id);
        self.project_id = e.project_id.as_deref();
        self.exception_id = Some(&e.id);
        self.hosts = Some(&e.hosts);
        self.ports = Some(&e.ports);
        self.ttl_seconds = Some(e.ttl_seconds);
        self.reason = Some(&e.reason);
        self.requested_by = Some(&e.requested_by);
        self.decided_by = e.decided_by.as_deref();
        self.expires_at = e
            .expires_at
            .and_then(|at| jiff::Timestamp::from_second(at).ok())
            .map(|t| t.to_string());
        self.detail = e.note.as_deref();
        self.subject = x.by.as_deref();
        self.methods = match (&e.below.methods, e.below.read_only) {
            (Some(m), _) => Some(Cow::Borrowed(m.as_slice())),
            (None, true) => Some(Cow::Owned(
                sandgate_policy::request::READ_ONLY_METHODS
                    .iter()
                    .map(|m| (*m).to_owned())
                    .collect(),
            )),
            (None, false) => None,
        };
        self.paths = e.below.paths.as_deref();
        self.tweak = e.tweak.as_ref().map(|t| Cow::Owned(t.to_string()));
    }

    fn exception_record(&mut self, x: &'a ExceptionRecord) {
        self.task_id = x.task_id.as_deref();
        self.project_id = x.project_id.as_deref();
        self.exception_id = x.exception_id.as_deref();
        self.hosts = Some(&x.hosts);
        self.ports = Some(&x.ports);
        self.ttl_seconds = x.ttl_seconds;
        self.reason = x.reason.as_deref();
        self.requested_by = x.requested_by.as_deref();
        self.decided_by = x.decided_by.as_deref();
        self.expires_at = x.expires_at.clone();
        self.detail = x.note.as_deref();
        self.subject = x.by.as_deref();
        self.methods = x.methods.as_deref().map(Cow::Borrowed);
        self.paths = x.paths.as_deref();
        self.tweak = x.tweak.as_deref().map(Cow::Borrowed);
    }

    fn party(&mut self, p: &'a Party) {
        self.client_addr = Some(p.client_addr);
        self.task_id = p.identity.task.as_deref();
        self.project_id = p.identity.project.as_deref();
        self.job_id = p.identity.job.as_deref();
        self.subject = p.identity.subject.as_deref();
        self.agent = p.identity.agent.as_deref();
        self.method = p.method.as_deref();
        self.path = p.path.as_deref();
        self.node = p.node.as_deref();
    }

    fn requester(&mut self, r: &'a Requester) {
        self.client_addr = r.client_addr;
        self.task_id = r.task_id.as_deref();
        self.project_id = r.project_id.as_deref();
        self.job_id = r.job_id.as_deref();
        self.subject = r.subject.as_deref();
        self.agent = r.agent.as_deref();
        self.method = r.method.as_deref();
        self.path = r.path.as_deref();
        self.node = r.node.as_deref();
    }

    fn dest(&mut self, d: Option<&'a Dest>) {
        if let Some(d) = d {
            self.scheme = Some(d.scheme);
            self.destination_host = Some(&d.host);
            self.destination_port = Some(d.port);
        }
    }

    fn destination(&mut self, d: Option<&'a Destination>) {
        if let Some(d) = d {
            self.scheme = d.access.map(sandgate_policy::Access::scheme);
            self.destination_host = Some(&d.host);
            self.destination_port = Some(d.port);
        }
    }
}
