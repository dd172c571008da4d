//! Requests an upstream proxy refused after this proxy allowed them: a chained proxy
//! (`--upstream-proxy`, a run's proxy in `net.mode: proxy`, a node of a central) records its
//! own allow, then a close with `upstream_failure:upstream_denied` when the proxy further up
//! answers 403. The allow is not what happened, so every reader that counts requests
//! (`sandgate audit summary`, a run's exit summary) counts such a request as denied, through
//! this one type. It reads records only and decides nothing: which proxy refused, and why,
//! stays in the close's fields.

use std::collections::HashSet;

use sandgate_policy::Verdict;

use crate::event::{Outcome, UpstreamFailure};
use crate::record::{Record, Recorded};

/// Whether `r` is a close that says an upstream proxy refused its request.
pub fn refused_upstream(r: &Record) -> bool {
    matches!(&r.event, Recorded::Close(c)
        if c.outcome == Outcome::Upstream(UpstreamFailure::UpstreamDenied))
}

/// The upstream refusals among a set of records, matched to their decisions by request id
/// (unique within a log: a per-process prefix and a counter).
#[derive(Debug, Default)]
pub struct UpstreamRefusals<'a> {
    /// Request ids of the refusals whose allow is among the records.
    decided: HashSet<&'a str>,
    /// Refusals whose allow is not among the records as a decision: an aggregate folded it
    /// (`--audit-aggregate-window` folds plain allows, never the close of a refusal), or a
    /// filter left it out.
    folded: Vec<&'a Record>,
}

impl<'a> UpstreamRefusals<'a> {
    /// The refusals among `records`, in one pass.
    pub fn among(records: impl IntoIterator<Item = &'a Record>) -> UpstreamRefusals<'a> {
        let mut allowed: HashSet<&'a str> = HashSet::new();
        let mut refusals: Vec<&'a Record> = Vec::new();
        for r in records {
            match &r.event {
                Recorded::Decision(d) if d.verdict == Verdict::Allow => {
                    allowed.insert(&r.request_id);
                }
                Recorded::Close(_) if refused_upstream(r) => refusals.push(r),
                _ => {}
            }
        }
        let (decided, folded): (Vec<&'a Record>, Vec<&'a Record>) = refusals
            .into_iter()
            .partition(|r| allowed.contains(r.request_id.as_str()));
        UpstreamRefusals {
            decided: decided.into_iter().map(|r| r.request_id.as_str()).collect(),
            folded,
        }
    }

    /// A decision's verdict as it turned out: `Deny` for an allow an upstream proxy then
    /// refused, else the decision's own. `None` for a record that is no decision.
    pub fn verdict(&self, r: &Record) -> Option<Verdict> {
        match &r.event {
            Recorded::Decision(d)
                if d.verdict == Verdict::Allow && self.decided.contains(r.request_id.as_str()) =>
            {
                Some(Verdict::Deny)
            }
            Recorded::Decision(d) => Some(d.verdict),
            _ => None,
        }
    }

    /// The refusals whose allow is not among the records as a decision (each a close): a
    /// reader that counted an aggregate's requests as allowed moves one of them to denied
    /// for each.
    pub fn folded(&self) -> &[&'a Record] {
        &self.folded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, fields: serde_json::Value) -> Record {
        let mut line = serde_json::json!({"created_at": "2026-11-22T10:00:01Z", "request_id": id});
        if let (Some(line), serde_json::Value::Object(more)) = (line.as_object_mut(), fields) {
            line.extend(more);
        }
        Record::parse(&line.to_string()).unwrap()
    }

    #[test]
    fn an_allow_refused_upstream_turns_out_denied_and_a_folded_one_is_kept_apart() {
        let allow = |id| rec(id, serde_json::json!({"event": "decision", "decision": "allow"}));
        let deny = rec("d", serde_json::json!({"event": "decision", "decision": "deny"}));
        let close = |id, outcome| rec(id, serde_json::json!({"event": "close", "outcome": outcome}));
        let records = [
            allow("a"),
            close("a", "ok"),
            allow("b"),
            close("b", "upstream_failure:upstream_denied"),
            deny,
            close("c", "upstream_failure:upstream_denied"),
            close("e", "upstream_failure:dns"),
        ];
        let refusals = UpstreamRefusals::among(&records);
        let verdicts: Vec<_> = records.iter().map(|r| refusals.verdict(r)).collect();
        let (allow, deny) = (Some(Verdict::Allow), Some(Verdict::Deny));
        assert_eq!(verdicts, [allow, None, deny, None, deny, None, None]);
        let folded: Vec<&str> = refusals.folded().iter().map(|r| r.request_id.as_str()).collect();
        assert_eq!(folded, ["c"], "an aggregate folded c's allow");
        assert!(refused_upstream(&records[3]) && !refused_upstream(&records[6]));
    }
}
