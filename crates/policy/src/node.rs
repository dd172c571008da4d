//! Nodes: the node-local proxies a central proxy serves (`spec.nodes`), and which tasks and
//! projects each may attribute traffic to. A node is known by a name in its client
//! certificate (a subject alternative name); what it claims about a request (the task,
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
    /// Whether this node may attribute a request to `task` in `project`. A project it names
    /// must always be one of its projects (a task it may vouch for never widens that: a
    /// project's scoped entries are that project's). A task must be one of its tasks, or
    /// come with one of its projects. A request with neither has no task (system entries
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
            Some(t) if project.is_none() && !crate::ids::listed(&self.tasks, t) => Err(VouchError::Task {
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
    /// The first entry named by any of `names` (a certificate's subject alternative names).
    pub fn find<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Option<&NodeSpec> {
        let names: Vec<&str> = names.into_iter().collect();
        self.0
            .iter()
            .find(|n| names.iter().any(|m| m.eq_ignore_ascii_case(&n.name)))
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
            // by project
            (&["p1"], &[], Some("t1"), Some("p1"), true),
            (&["p1"], &[], Some("t1"), Some("p2"), false),
            (&["p1"], &[], None, Some("p1"), true),
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
            (&["*"], &[], Some("t"), Some("any"), true),
            (&[], &["*"], Some("t"), None, true),
            // prefixes
            (&[], &["run-node-a-*"], Some("run-node-a-17"), None, true),
            (&[], &["run-node-a-*"], Some("run-node-b-17"), None, false),
            (&["team-*"], &[], Some("t"), Some("team-x"), true),
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
    fn lookup_by_any_certificate_name() {
        let nodes = Nodes(vec![node(&[], &[])]);
        assert!(nodes.find(["other", "NODE-A"]).is_some());
        assert!(nodes.find(["node-b"]).is_none());
        assert!(nodes.find([]).is_none());
    }
}
