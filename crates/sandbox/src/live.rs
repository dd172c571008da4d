//! What `sandgate run` says on stderr while the command runs: one line per request its
//! proxy refuses, as it is refused, and per request an upstream proxy refused after the
//! run's allowed it (and, under `--learn`, per request let through that the policy would
//! have refused), so a person sees why a tool failed before it has finished.
//!
//! Lines are rate-limited (at most [`BURST`] per [`WINDOW`]); what is held back is counted
//! and said once the window has passed, or at the end. The events come from the proxy's
//! live broadcast, which copies an event only while someone listens; a printer that falls
//! behind skips ahead and counts what it skipped the same way. The audit log stays the
//! record: these lines are a view.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandgate_policy::Verdict;
use sandgate_proxy::Event;
use sandgate_proxy::audit::event::{Close, Dest};
use sandgate_proxy::audit::{Outcome, Stamped, UpstreamFailure};
use tokio::sync::broadcast::{self, error::RecvError};

/// Lines printed per window at most.
pub const BURST: usize = 5;
/// The rate limit's window.
pub const WINDOW: Duration = Duration::from_secs(1);

/// The stderr line for one event, when it is a refusal (or a learned pass).
pub fn line(event: &Event) -> Option<String> {
    let d = match event {
        Event::Decision(d) => d,
        Event::Close(c) => return refused_upstream(c),
        _ => return None,
    };
    let dest = d.dest.as_ref().map_or_else(
        || "(malformed request)".to_owned(),
        |t| format!("{}:{}", t.host, t.port),
    );
    match (d.verdict, d.would_deny) {
        (Verdict::Deny, _) => {
            let reason = d.reason_code.replace('_', " ");
            let hint = match (d.reason_code.as_ref(), &d.dest) {
                ("not_allowlisted", Some(t)) => format!("; --allow-domain {} would allow it", pattern(t)),
                _ => String::new(),
            };
            Some(format!("sandgate: blocked {dest} ({reason}{hint})"))
        }
        (Verdict::Allow, Some(would)) => {
            let reason = would.code().replace('_', " ");
            Some(format!("sandgate: learn: let {dest} through ({reason})"))
        }
        _ => None,
    }
}

/// The line for an allowed request an upstream proxy refused (its close says so, with the
/// upstream's status): said as the run's own refusals are, since the command was refused.
fn refused_upstream(c: &Close) -> Option<String> {
    if c.outcome != Outcome::Upstream(UpstreamFailure::UpstreamDenied) {
        return None;
    }
    let why = match c.status {
        Some(407) => "the upstream proxy answered 407; it asks for credentials the run's proxy does not send"
            .to_owned(),
        Some(503) => "the upstream proxy answered 503; it cannot take the request now".to_owned(),
        Some(status) => format!("the upstream proxy answered {status}; its own policy refused it"),
        None => "refused by the upstream proxy".to_owned(),
    };
    Some(format!(
        "sandgate: blocked {}:{} (upstream denied: {why})",
        c.dest.host, c.dest.port
    ))
}

/// The pattern that allows `dest`: a bare host covers its kind of access's default ports
/// (443 for CONNECT and SOCKS5, 80 for plain HTTP).
fn pattern(dest: &Dest) -> String {
    let access = match dest.scheme {
        "http" => sandgate_policy::Access::Http,
        "socks5" => sandgate_policy::Access::Socks5,
        "https" => sandgate_policy::Access::Https,
        _ => sandgate_policy::Access::Connect,
    };
    if access.default_ports().contains(&dest.port) {
        dest.host.clone()
    } else {
        format!("{}:{}", dest.host, dest.port)
    }
}

/// A token bucket of [`BURST`] lines per [`WINDOW`], counting what it holds back.
#[derive(Debug)]
pub struct Limiter {
    window_start: Instant,
    shown: usize,
    held: usize,
    /// Events the broadcast dropped before this printer read them (of any kind).
    skipped: u64,
}

impl Limiter {
    pub fn new(now: Instant) -> Limiter {
        Limiter {
            window_start: now,
            shown: 0,
            held: 0,
            skipped: 0,
        }
    }

    /// What to print for one more line at `now`: the held-back count of the window that
    /// ended, if any, then the line itself unless this window is full.
    pub fn admit(&mut self, now: Instant, line: String) -> Vec<String> {
        let mut out = Vec::new();
        if now.duration_since(self.window_start) >= WINDOW {
            out.extend(self.flush());
            self.window_start = now;
            self.shown = 0;
        }
        if self.shown < BURST {
            self.shown += 1;
            out.push(line);
        } else {
            self.held += 1;
        }
        out
    }

    /// The count of lines held back (and of events skipped) not yet said.
    pub fn flush(&mut self) -> Option<String> {
        let held = std::mem::take(&mut self.held);
        let skipped = std::mem::take(&mut self.skipped);
        match (held, skipped) {
            (0, 0) => None,
            (held, 0) => Some(format!(
                "sandgate: ... and {held} more (not shown; the audit log has each)"
            )),
            (held, skipped) => Some(format!(
                "sandgate: ... and {held} more, and {skipped} events not read in time (the audit log has each)"
            )),
        }
    }
}

/// The printer task; [`Printer::finish`] prints what it was sent and ends it.
#[derive(Debug)]
pub struct Printer {
    done: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Printer {
    /// Prints the lines of the events `rx` receives, as they come.
    pub fn start(mut rx: broadcast::Receiver<Arc<Stamped>>) -> Printer {
        let (done, mut finished) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut limiter = Limiter::new(Instant::now());
            loop {
                let event = tokio::select! {
                    biased;
                    e = rx.recv() => e,
                    _ = &mut finished => {
                        // Drain what was sent before the end, then stop.
                        while let Ok(e) = rx.try_recv() {
                            show(&mut limiter, &e.event);
                        }
                        break;
                    }
                };
                match event {
                    Ok(e) => show(&mut limiter, &e.event),
                    Err(RecvError::Lagged(n)) => limiter.skipped += n,
                    Err(RecvError::Closed) => break,
                }
            }
            if let Some(held) = limiter.flush() {
                eprintln!("{held}");
            }
        });
        Printer { done, task }
    }

    /// Prints what was sent so far and stops.
    pub async fn finish(self) {
        let _ = self.done.send(());
        let _ = self.task.await;
    }
}

fn show(limiter: &mut Limiter, event: &Event) {
    if let Some(l) = line(event) {
        for out in limiter.admit(Instant::now(), l) {
            eprintln!("{out}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limiter_holds_back_past_the_burst_and_says_how_many() {
        let t0 = Instant::now();
        let mut l = Limiter::new(t0);
        let shown: Vec<String> = (0..8).flat_map(|i| l.admit(t0, format!("l{i}"))).collect();
        assert_eq!(shown, ["l0", "l1", "l2", "l3", "l4"]);
        let next = l.admit(t0 + WINDOW, "l8".to_owned());
        assert_eq!(
            next,
            [
                "sandgate: ... and 3 more (not shown; the audit log has each)",
                "l8"
            ]
        );
        assert_eq!(l.flush(), None);
    }

    #[test]
    fn an_upstream_refusal_is_said_and_other_closes_are_not() {
        use sandgate_proxy::audit::event::Party;
        let close = |outcome, status| {
            Event::Close(Close {
                party: Party {
                    request_id: "r".into(),
                    client_addr: ([127, 0, 0, 1], 1).into(),
                    identity: Default::default(),
                    method: None,
                    path: None,
                    node: None,
                },
                dest: Dest {
                    scheme: "connect",
                    host: "a.example".to_owned(),
                    port: 443,
                },
                resolved_ip: None,
                status,
                bytes_sent: 0,
                bytes_received: 0,
                duration_ms: 1,
                outcome,
            })
        };
        let denied = Outcome::Upstream(UpstreamFailure::UpstreamDenied);
        assert_eq!(
            line(&close(denied, Some(403))).as_deref(),
            Some(
                "sandgate: blocked a.example:443 (upstream denied: the upstream proxy answered 403; its own policy refused it)"
            )
        );
        assert!(
            line(&close(denied, Some(407)))
                .unwrap()
                .contains("answered 407; it asks for credentials")
        );
        assert_eq!(line(&close(Outcome::Ok, Some(200))), None);
        assert_eq!(
            line(&close(Outcome::Upstream(UpstreamFailure::Dns), Some(502))),
            None
        );
    }

    #[test]
    fn the_hint_names_a_port_the_bare_host_does_not_cover() {
        let dest = |scheme, port| Dest {
            scheme,
            host: "a.example".to_owned(),
            port,
        };
        assert_eq!(pattern(&dest("connect", 443)), "a.example");
        assert_eq!(pattern(&dest("http", 80)), "a.example");
        assert_eq!(pattern(&dest("socks5", 443)), "a.example");
        assert_eq!(pattern(&dest("socks5", 80)), "a.example:80");
        assert_eq!(pattern(&dest("connect", 80)), "a.example:80");
        assert_eq!(pattern(&dest("http", 443)), "a.example:443");
    }
}
