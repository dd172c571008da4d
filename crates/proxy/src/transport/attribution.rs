//! Attribution: what a node-local proxy says about each request it forwards (the task,
//! project and job of the listener or credentials it arrived on, the subject that
//! started it and the agent acting for it), as fields of the stream's CONNECT request. A
//! central proxy believes them only on a `role: node` listener and only within the node's
//! `spec.nodes` entry (the subject and agent are recorded as the node's statement and
//! decide nothing); no other front end reads them, and the HTTP/1 forwarder strips them
//! from requests it passes on.

use sandgate_policy::Identity;

pub const TASK: &str = "sandgate-task";
pub const PROJECT: &str = "sandgate-project";
pub const JOB: &str = "sandgate-job";
pub const SUBJECT: &str = "sandgate-subject";
pub const AGENT: &str = "sandgate-agent";

/// The fields for `identity`.
pub fn fields(identity: &Identity) -> impl Iterator<Item = (&'static str, &str)> {
    [
        (TASK, identity.task.as_deref()),
        (PROJECT, identity.project.as_deref()),
        (JOB, identity.job.as_deref()),
        (SUBJECT, identity.subject.as_deref()),
        (AGENT, identity.agent.as_deref()),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k, v?)))
}

/// Why attribution fields were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttributionError {
    #[error("{0} is given more than once")]
    Repeated(&'static str),
    #[error("{0} is not a plain id (1 to 128 letters, digits, and . _ - :)")]
    NotPlain(&'static str),
}

/// Reads the claimed identity from a request's fields.
pub fn read(headers: &hyper::HeaderMap) -> Result<Identity, AttributionError> {
    let one = |name: &'static str| -> Result<Option<String>, AttributionError> {
        let mut values = headers.get_all(name).iter();
        let Some(first) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(AttributionError::Repeated(name));
        }
        match first.to_str() {
            Ok(v) if sandgate_policy::ids::valid(v) => Ok(Some(v.to_owned())),
            _ => Err(AttributionError::NotPlain(name)),
        }
    };
    Ok(Identity {
        task: one(TASK)?,
        project: one(PROJECT)?,
        job: one(JOB)?,
        subject: one(SUBJECT)?,
        agent: one(AGENT)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> hyper::HeaderMap {
        let mut h = hyper::HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn reads_and_refuses() {
        let id = read(&headers(&[
            (TASK, "t1"),
            (PROJECT, "p.1"),
            (JOB, "j"),
            (SUBJECT, "uid-7"),
        ]))
        .unwrap();
        assert_eq!(id.task.as_deref(), Some("t1"));
        assert_eq!(id.project.as_deref(), Some("p.1"));
        assert_eq!(id.subject.as_deref(), Some("uid-7"));
        assert_eq!(read(&headers(&[])).unwrap(), Identity::default());
        assert_eq!(
            read(&headers(&[(TASK, "a"), (TASK, "b")])),
            Err(AttributionError::Repeated(TASK))
        );
        assert_eq!(
            read(&headers(&[(TASK, "a b")])),
            Err(AttributionError::NotPlain(TASK))
        );
        assert_eq!(
            read(&headers(&[(TASK, "")])),
            Err(AttributionError::NotPlain(TASK))
        );
        assert_eq!(
            read(&headers(&[(SUBJECT, "a/b")])),
            Err(AttributionError::NotPlain(SUBJECT))
        );
        let long = "x".repeat(129);
        assert_eq!(
            read(&headers(&[(PROJECT, &long)])),
            Err(AttributionError::NotPlain(PROJECT))
        );
    }

    #[test]
    fn fields_round_trip() {
        let id = Identity {
            task: Some("t".into()),
            project: None,
            job: Some("j".into()),
            subject: Some("alice".into()),
            agent: Some("mcp:client".into()),
        };
        let pairs: Vec<_> = fields(&id).map(|(k, v)| (k, v.to_owned())).collect();
        let h = {
            let mut h = hyper::HeaderMap::new();
            for (k, v) in &pairs {
                h.append(*k, v.parse().unwrap());
            }
            h
        };
        assert_eq!(read(&h).unwrap(), id);
    }
}
