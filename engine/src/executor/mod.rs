//! Running a run: [`decide`] says what should happen next from the recorded state; the
//! loop in [`run`] performs it against the ledger and the gateway; [`progress`] reports.

pub mod decide;
mod heartbeat;
pub mod progress;
pub mod run;

pub use heartbeat::RUN_LEASE;
pub use run::{Executor, RunOutcome};
