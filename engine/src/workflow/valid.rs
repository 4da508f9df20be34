//! A workflow that passed every check, together with what the checks computed.

use std::collections::HashMap;
use std::ops::Deref;

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
        }
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
