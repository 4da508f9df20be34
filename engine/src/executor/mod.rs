//! Running a run: [`decide`] says what should happen next from the recorded state; the
//! loop in [`run`] performs it against the ledger and the gateway; [`progress`] reports.
//! Beside the loop: `state` (node states loaded from the ledger's steps), `scope` (what
//! one execution passes around, and the writes that settle a node without a call) and
//! `start` (a node's `if`, deadline, timeout, next retry and expression context) and
//! `reconcile` (probing in-doubt calls before the run pauses), `ends` (how an execution
//! ends here: finished, released, parked on the queue); the nodes that call no
//! tool run here, not in the gateway: `wait` (a `wait:` node) and `child` (a
//! sub-workflow node).

mod child;
pub mod decide;
mod ends;
mod expand;
mod handle;
mod heartbeat;
pub mod node;
pub mod progress;
mod reconcile;
pub mod run;
mod scope;
mod start;
mod state;
mod wait;

pub use child::child_run_id;
pub use handle::Executor;
pub use run::RunOutcome;
