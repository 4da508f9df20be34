//! What a run's finish returns: the row its `RETURNING` reads and the public type.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::Timestamp;
use crate::error::Error;
use crate::rows::{json, ts};
use crate::state::RunStatus;

/// What a run's finish wrote: its final status, output and error. A finish does not
/// read the run's inputs or workflow text back (a large input list would be parsed
/// again at the end of every run only to be dropped); `Ledger::get_run` reads them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishedRun {
    /// The run id.
    pub id: String,
    /// Its final status (a success over the output limit is stored as a failure).
    pub status: RunStatus,
    /// Its output as stored.
    pub output: Option<Value>,
    /// Its error as stored.
    pub error: Option<String>,
    /// When it finished.
    pub finished_at: Option<Timestamp>,
}

/// The columns a [`FinishedRow`] reads: what a finish returns.
macro_rules! finished_cols {
    () => {
        "id, status, output, error, finished_at"
    };
}
pub(crate) use finished_cols;

/// A run's row as its finish returns it (see [`crate::model::FinishedRun`]).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct FinishedRow {
    pub id: String,
    pub status: String,
    pub output: Option<String>,
    pub error: Option<String>,
    pub finished_at: Option<i64>,
}

impl FinishedRow {
    pub(crate) fn into_finished(self) -> Result<FinishedRun, Error> {
        Ok(FinishedRun {
            status: self.status.parse()?,
            output: json("run output", self.output)?,
            id: self.id,
            error: self.error,
            finished_at: ts(self.finished_at),
        })
    }
}
