//! The front door: the one call every front end makes for a request that names a
//! destination. A front end parses its wire format into a [`Request`] (who asked, through
//! which node, with which method, for which destination or why none could be read) and
//! calls [`Egress::clear`], which begins the request, refuses an unreadable destination,
//! fails closed on the audit trail, and decides; what comes back is a [`Decided`] allow for
//! the front end to open, dial (a tunnel) or serve on a kept connection, or a [`Refused`]
//! already on record for it to render in its own terms.
//!
//! Credentials are checked by [`Egress::login`], the one place a task's login is verified,
//! whichever front end read it (HTTP/1's `Proxy-Authorization`, SOCKS5's RFC 1929 login).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use sandgate_policy::{Access, AuthError, Target};

use super::{Decided, Egress, Refused};
use crate::config::Identity;
use crate::refusal::Refusal;

/// One request as a front end read it.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    /// The client's address (on a central: the node's).
    pub peer: SocketAddr,
    /// Who asked: the listener's identity, a login's, or what a node vouched for.
    pub identity: Arc<Identity>,
    /// On a central proxy: the node-local proxy that forwarded it.
    pub node: Option<Arc<str>>,
    pub method: Cow<'static, str>,
    /// A plain-HTTP request's origin-form target (`/path?query`): the path is decided and
    /// recorded (without the query, unless [`Egress::record_query`] is on).
    pub path: Option<&'a str>,
    /// Where it asks to go and how, or why the destination could not be read.
    pub dest: Result<(Target, Access), Refusal>,
}

impl Egress {
    /// Begins, records a refusal of, or decides `request` (see the module doc). The
    /// destination is handed back with the allow.
    pub(crate) async fn clear(&self, request: Request<'_>) -> Result<Decided, Refused> {
        let Request {
            peer,
            identity,
            node,
            method,
            path,
            dest,
        } = request;
        let mut pending = self.begin_via(peer, identity, Some(method), node);
        let whole = self.record_query.load(std::sync::atomic::Ordering::Relaxed);
        pending.party.path = path.map(|p| match p.split_once('?') {
            Some((path, _)) if !whole => Arc::from(path),
            _ => Arc::from(p),
        });
        match dest {
            Err(refusal) => Err(self.refuse(pending, None, refusal).await),
            Ok((target, access)) => self.decide(pending, &target, access).await,
        }
    }

    /// What a request to `target` (its method and origin-form target, and its fields)
    /// carries of the credentials' placeholders: nothing, the
    /// headers to set to their secrets (`seen`: an intercepted request, which alone may be
    /// given one), or a placeholder where it does not belong.
    pub(crate) fn carried<'a>(
        &self,
        target: &Target,
        seen: bool,
        (method, origin_form): (&str, &str),
        fields: impl Iterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<sandgate_policy::Carried, sandgate_policy::Leak> {
        self.rules()
            .secrets()
            .check(&target.host, seen, method, origin_form, fields)
    }

    /// The search of a request body to `target` for placeholders bound elsewhere (the
    /// credentials that ask for `inspect_body`); `None` when none does.
    pub(crate) fn body_scan(&self, target: &Target) -> Option<sandgate_policy::BodyScan> {
        self.rules().secrets().body_scan(&target.host)
    }

    /// Verifies a task's login against the credentials in force: the identity it proves
    /// (its task and project, with the listener's job, subject and agent).
    pub(crate) fn login(
        &self,
        task: &str,
        secret: &str,
        listener: &Identity,
    ) -> Result<Arc<Identity>, AuthError> {
        let rules = self.rules();
        let cred = rules.credentials().verify_login(task, secret)?;
        Ok(Arc::new(Identity {
            task: Some(cred.task.clone()),
            project: cred.project.clone(),
            job: listener.job.clone(),
            subject: listener.subject.clone(),
            agent: listener.agent.clone(),
        }))
    }
}
