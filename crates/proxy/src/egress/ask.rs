//! The egress core's part in exceptions: asking the person at the terminal (`sandgate run
//! --ask`) before the allowlist refuses, recording the answer as an exception, and telling a
//! refused task how to ask for one.

use std::sync::Arc;

use sandgate_policy::{Access, Target};

use super::{Egress, Pending, unix_now};
use crate::audit::event::{Change, Event, ExceptionChange};
use crate::refusal::Refusal;

impl Egress {
    /// Asks the person at the terminal about a task's request that only the allowlist
    /// refused; the answer is recorded as an exception. When allowed, its rule label and the
    /// second it expires (none for "this request only": the exception is never applied, so
    /// the connection it let through is not cut a second later).
    pub(super) async fn ask(
        &self,
        pending: &Pending,
        target: &Target,
        access: Access,
    ) -> Option<(Arc<str>, Option<i64>)> {
        let asker = self.asker.get()?;
        let task = pending.party.identity.task.as_deref()?;
        target.host.name()?;
        let answer = asker.ask(task, target, access).await;
        let ex = crate::ask::exception_for(task, target, answer, &asker.decider(), unix_now())?;
        let mut asked = ex.clone();
        asked.state = sandgate_policy::ExceptionState::Pending;
        (asked.decided_by, asked.decided_at, asked.expires_at, asked.note) = (None, None, None, None);
        self.record_change(Change::Requested, asked, Some(task.to_owned()))
            .await;
        let approved = ex.state == sandgate_policy::ExceptionState::Approved;
        let change = if approved {
            Change::Approved
        } else {
            Change::Denied
        };
        self.record_change(change, ex.clone(), ex.decided_by.clone())
            .await;
        if !approved {
            return None;
        }
        if answer == crate::ask::Answer::Once {
            return Some((Arc::from(ex.rule_label()), None));
        }
        crate::rules::change(&self.layers, &self.rules, |l| l.add_exceptions(ex.entries()));
        Some((Arc::from(ex.rule_label()), ex.expires_at))
    }

    async fn record_change(&self, change: Change, exception: sandgate_policy::Exception, by: Option<String>) {
        let e = Event::Exception(Box::new(ExceptionChange {
            change,
            exception,
            by,
        }));
        self.audit.record(e).await;
    }

    /// For a task's request that only the allowlist refused (never the deny list or the
    /// guard), while the control plane takes requests: how to ask for an exception.
    pub(super) fn how_to_ask(&self, pending: &Pending, refusal: &Refusal) -> Option<String> {
        let Refusal::Policy {
            target,
            reason: sandgate_policy::PolicyReason::NotAllowlisted,
            ..
        } = refusal
        else {
            return None;
        };
        let task = pending.party.identity.task.as_deref()?;
        let name = target.host.name()?;
        if !self.layers.lock().is_ok_and(|l| l.exceptions_enabled()) {
            return None;
        }
        Some(format!(
            "to ask for an exception: sandgate exceptions request --task {task} --host {name} --port {} --ttl SECONDS --reason TEXT",
            target.port
        ))
    }
}
