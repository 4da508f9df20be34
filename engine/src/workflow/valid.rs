//! A workflow that passed every check, together with what the checks computed.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::ops::Deref;
use std::sync::Arc;

use super::children::Child;

use super::model::Workflow;
use crate::plan::Plan;

/// A workflow that passed validation, with its plan (the DAG, its topological order) and
/// the index of its node ids. Only validation makes one ([`super::parse_with`] and the
/// loaders), so whoever holds one may rely on an acyclic plan: the executor no longer
/// builds the plan again, nor needs an error for the cycle that cannot be there, and the
/// node index is built once instead of by each reader.
#[derive(Debug, Clone)]
pub struct ValidWorkflow {
    workflow: Workflow,
    plan: Plan,
    index: HashMap<String, usize>,
    /// Each `workflow:` node's child, by node id.
    children: HashMap<String, Arc<Child>>,
}

impl ValidWorkflow {
    /// Wraps a workflow validation found no problem in, with the plan it built.
    pub(super) fn new(workflow: Workflow, plan: Plan) -> Self {
        let index = workflow
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.clone(), i))
            .collect();
        Self {
            workflow,
            plan,
            index,
            children: HashMap::new(),
        }
    }

    /// Sets the children validation read (`children::resolve`).
    pub(super) fn set_children(&mut self, children: HashMap<String, Arc<Child>>) {
        self.children = children;
    }

    /// The child workflow of the `workflow:` node `id`.
    pub fn child(&self, id: &str) -> Option<&Arc<Child>> {
        self.children.get(id)
    }

    /// The text a run of this workflow stores, given the text it was read from: that
    /// text, with its sub-workflows appended under `included:` when it has some and
    /// does not carry them already.
    pub fn stored_text<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if self.children.is_empty() || !self.workflow.included.is_empty() {
            return Cow::Borrowed(text);
        }
        let files: BTreeMap<&str, &str> = self
            .children
            .values()
            .map(|c| (c.path.as_str(), c.text.as_str()))
            .collect();
        Cow::Owned(super::children::bundle(text, files.into_iter()))
    }

    /// The workflow's DAG.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Node id → position in [`Workflow::nodes`].
    pub fn index(&self) -> &HashMap<String, usize> {
        &self.index
    }

    /// The position of the node `id`, if the workflow has one.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// The workflow itself, to change it (tests build variants this way).
    pub fn into_inner(self) -> Workflow {
        self.workflow
    }
}

impl Deref for ValidWorkflow {
    type Target = Workflow;

    fn deref(&self) -> &Workflow {
        &self.workflow
    }
}
