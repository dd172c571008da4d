//! Nodes: the node-local proxies a central proxy serves (`spec.nodes`), and which tasks and
//! projects each may attribute traffic to. A node is known by the first name in its
//! client certificate (its first DNS or IP subject alternative name, which its runs are
//! named under); what it claims about a request (the task,
//! project and job, sent as attribution headers) is believed only within its entry.

/// One node a central proxy accepts, and whom it may vouch for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// The name its certificate carries (a DNS or IP subject alternative name).
    pub name: String,
    /// Projects whose tasks it may attribute traffic to (`*`: any; `prefix*`).
    pub projects: Vec<String>,
    /// Tasks it may attribute traffic to without a project (`*`: any; `prefix*`).
    pub tasks: Vec<String>,
}

/// Why a node's claim is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VouchError {
    #[error("node {node} may not attribute traffic to project {project}")]
    Project { node: String, project: String },
    #[error("node {node} may not attribute traffic to task {task}")]
    Task { node: String, task: String },
}

impl NodeSpec {
    /// Whether this node may attribute a request to `task` in `project`: a project it names
    /// must be one of its projects, and a task one of its tasks. Neither widens the other:
    /// a listed task never lets it name another project (a project's scoped entries are that
    /// project's), and a listed project never lets it name any task (task-scoped entries and
    /// exceptions are the task's: with `projects: [team-b]` alone, a node could otherwise
    /// claim another node's run, `node-a:run-...`, with its own project, and use that run's
    /// exceptions; review finding). A request with neither has no task (system entries
    /// only). The job is recorded, never decided on.
    pub fn vouches(&self, task: Option<&str>, project: Option<&str>) -> Result<(), VouchError> {
        if let Some(p) = project
            && !crate::ids::listed(&self.projects, p)
        {
            return Err(VouchError::Project {
                node: self.name.clone(),
                project: p.to_owned(),
            });
        }
        match task {
            Some(t) if !crate::ids::listed(&self.tasks, t) => Err(VouchError::Task {
                node: self.name.clone(),
                task: t.to_owned(),
            }),
            _ => Ok(()),
        }
    }
}

/// The nodes of a policy, looked up by certificate names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nodes(pub Vec<NodeSpec>);

impl Nodes {
    /// The entry of the node whose certificate's first subject alternative name is `name`.
    /// Only the first: it is the name a node's runs are named under (`NAME:run-...`), so the
    /// name a node is listed by is the prefix of its runs, and a load-time check on the
    /// listed names ([`crate::document`]) keeps every node out of the others' runs. (Matched
    /// by any name, a certificate listed by its second name would have runs under a first
    /// name that no check sees: review finding.)
    pub fn find(&self, name: Option<&str>) -> Option<&NodeSpec> {
        let name = name?;
        self.0.iter().find(|n| name.eq_ignore_ascii_case(&n.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(projects: &[&str], tasks: &[&str]) -> NodeSpec {
        NodeSpec {
            name: "node-a".into(),
            projects: projects.iter().map(|s| (*s).to_owned()).collect(),
            tasks: tasks.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Projects listed, tasks listed, task claimed, project claimed, vouched for.
    type Case<'a> = (
        &'a [&'a str],
        &'a [&'a str],
        Option<&'a str>,
        Option<&'a str>,
        bool,
    );

    #[test]
    fn vouching() {
        let cases: &[Case<'_>] = &[
            // nothing claimed: always
            (&[], &[], None, None, true),
            // by project and task
            (&["p1"], &["t1"], Some("t1"), Some("p1"), true),
            (&["p1"], &["t1"], Some("t1"), Some("p2"), false),
            (&["p1"], &[], None, Some("p1"), true),
            // a listed project never lets a node name any task: another node's run, with
            // this node's own project, is refused (review finding)
            (&["p1"], &[], Some("t1"), Some("p1"), false),
            (
                &["team-b"],
                &["node-b:*"],
                Some("node-a:run-4242-1a2b3c4d"),
                Some("team-b"),
                false,
            ),
            // a task without its project is not vouched for by the project
            (&["p1"], &[], Some("t1"), None, false),
            // by task
            (&[], &["t1"], Some("t1"), None, true),
            (&[], &["t1"], Some("t2"), None, false),
            // a listed task never widens the projects: p9's entries are p9's (review finding)
            (&[], &["t1"], Some("t1"), Some("p9"), false),
            (&[], &["*"], Some("other-tenant"), Some("p-secret"), false),
            // an unlisted project with an unlisted task
            (&[], &["t1"], Some("t2"), Some("p9"), false),
            // wildcards
            (&["*"], &["*"], Some("t"), Some("any"), true),
            (&["*"], &[], Some("t"), Some("any"), false),
            (&[], &["*"], Some("t"), None, true),
            // prefixes
            (&[], &["run-node-a-*"], Some("run-node-a-17"), None, true),
            (&[], &["run-node-a-*"], Some("run-node-b-17"), None, false),
            (&["team-*"], &["t"], Some("t"), Some("team-x"), true),
            (&["team-*"], &["t"], Some("t"), Some("other-x"), false),
        ];
        for (projects, tasks, task, project, ok) in cases {
            let n = node(projects, tasks);
            assert_eq!(
                n.vouches(*task, *project).is_ok(),
                *ok,
                "{projects:?} {tasks:?} {task:?} {project:?}"
            );
        }
    }

    #[test]
    fn lookup_by_the_certificates_first_name() {
        let nodes = Nodes(vec![node(&[], &[])]);
        assert!(nodes.find(Some("NODE-A")).is_some());
        assert!(nodes.find(Some("node-b")).is_none());
        assert!(nodes.find(None).is_none());
    }
}
