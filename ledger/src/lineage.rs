//! Where a child run came from: the types a sub-workflow's run carries (`Run::parent`),
//! apart from `model.rs` so that `children.rs` and the model can both name them.

use serde::{Deserialize, Serialize};

/// Where a child run (a sub-workflow's run) came from: the parent run and the parent's
/// step that started it. The ledger uses it to wake the parent when the child ends and
/// to carry a parent's cancel down; views use it to link the two.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentLink {
    /// The parent run.
    pub run_id: String,
    /// The parent's step (`node`, `node_retry1`, `node[key]`) whose result the child is.
    pub step_id: String,
    /// What a cancel of the parent does to this child.
    pub on_cancel: OnParentCancel,
}

/// What a cancel of the parent run does to a child run still going.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnParentCancel {
    /// The child is cancelled too (its own children after it).
    #[default]
    Cancel,
    /// The child goes on as a run of its own; nobody waits for it.
    Abandon,
}

impl OnParentCancel {
    /// The stored spelling (`runs.on_parent_cancel`, the workflow file's).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Abandon => "abandon",
        }
    }
}
