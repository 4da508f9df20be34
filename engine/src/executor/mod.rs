//! Running a run: [`decide`] says what should happen next from the recorded state; the
//! loop in [`run`] performs it against the ledger and the gateway; [`progress`] reports.

pub mod decide;
pub mod progress;
pub mod run;

pub use run::{Executor, RUN_LEASE, RunOutcome};
