//! Asking a person when only the allowlist refuses: `sandgate run --ask`. The egress core
//! calls an [`Asker`] for a task's request that no allow rule matched (never for the deny
//! list or the address guard, which decide before and after it), holding the request until
//! the answer. An allowing answer is an exception like any other, decided by the local user:
//! it is recorded as `exception_requested` and `exception_approved` (or `_denied`), its
//! decision carries `rule: exception:ID`, and for the run or for 15 minutes it joins the
//! exceptions layer of the rules, so the same destination is not asked again.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

use sandgate_policy::exception::Narrowing;
use sandgate_policy::{Access, Exception, ExceptionState, Target};

/// What the person said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// This request only.
    Once,
    /// Until the run ends.
    ForRun,
    /// For this many seconds.
    ForSeconds(u32),
    /// No (also: no terminal, or no answer in time).
    Deny,
}

/// Asks a person about one destination.
pub trait Asker: Send + Sync + std::fmt::Debug {
    /// `task` asked for `target`; the answer may take a while (the request waits).
    fn ask<'a>(
        &'a self,
        task: &'a str,
        target: &'a Target,
        access: Access,
    ) -> Pin<Box<dyn Future<Output = Answer> + Send + 'a>>;

    /// Who decides, for the record (the local user's name).
    fn decider(&self) -> String;
}

/// A run lasts at most this long for the purposes of an exception "for this run" (it ends
/// with the run's proxy anyway).
const RUN_TTL: u32 = 7 * 24 * 3600;

static NEXT: AtomicU64 = AtomicU64::new(1);

/// The exception an answer makes, already decided (approved or denied) at `now`.
pub(crate) fn exception_for(
    task: &str,
    target: &Target,
    answer: Answer,
    decider: &str,
    now: i64,
) -> Option<Exception> {
    let host = target.host.name()?.as_str().to_owned();
    let ttl = match answer {
        Answer::Once => 1,
        Answer::ForRun => RUN_TTL,
        Answer::ForSeconds(s) => s.max(1),
        Answer::Deny => 0,
    };
    let mut ex = Exception {
        id: format!(
            "ask-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ),
        task_id: task.to_owned(),
        project_id: None,
        hosts: vec![host],
        ports: vec![target.port],
        ttl_seconds: ttl.max(1),
        reason: "asked at the terminal (sandgate run --ask)".to_owned(),
        requested_by: task.to_owned(),
        requested_at: now,
        state: ExceptionState::Pending,
        decided_by: None,
        decided_at: None,
        note: None,
        expires_at: None,
        below: Default::default(),
        tweak: None,
    };
    let decided = match answer {
        Answer::Deny => ex.deny(decider, now, Some("denied at the terminal".to_owned())),
        _ => ex.approve(decider, now, &Narrowing::default()),
    };
    decided.ok().map(|()| ex)
}
