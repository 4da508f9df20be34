//! The [`Executor`] itself: what it holds (the gateway, where progress goes, the backoff
//! RNG). Its methods that execute a run are the loop's (`run.rs`); it stands apart so
//! that what the loop passes around (`scope.rs`) and a sub-workflow's step
//! (`child.rs`), which executes a child run with it, need not import the loop.

use std::sync::Arc;

use super::progress::Progress;
use crate::gateway::Gateway;

/// Runs runs: shared by `flow run`, `flow resume` and the daemon.
#[derive(Clone)]
pub struct Executor {
    pub(super) gateway: Gateway,
    pub(super) progress: Arc<dyn Progress>,
    pub(super) rng: Arc<std::sync::Mutex<rand::rngs::StdRng>>,
    /// Whether a run with nothing in flight that must wait (a retry's backoff, a rate
    /// limit, a concurrency slot) goes back to the queue until then instead of keeping
    /// its worker ([`Executor::parking`]): true for the daemon, whose claim loop picks it
    /// up again; false for `flow run`, which has nobody else to.
    pub(super) parks: bool,
}

impl Executor {
    /// An executor over `gateway`, reporting to `progress`, drawing backoff jitter from
    /// `rng` (seeded in tests).
    pub fn new(gateway: Gateway, progress: Arc<dyn Progress>, rng: rand::rngs::StdRng) -> Self {
        Self {
            gateway,
            progress,
            rng: Arc::new(std::sync::Mutex::new(rng)),
            parks: false,
        }
    }

    /// This executor, parking runs that must wait on the queue (`not_before`) instead
    /// of holding a worker while they wait: a call waiting for a slot or a rate limit
    /// takes no worker from other runs. For the daemon.
    pub fn parking(mut self) -> Self {
        self.parks = true;
        self
    }

    /// The gateway (ledger, tools, secrets).
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// This executor reporting under the parent's node `prefix`: what a sub-workflow's
    /// child run is executed with in-process.
    pub(super) fn nested(&self, prefix: &str) -> Executor {
        Executor {
            gateway: self.gateway.clone(),
            progress: Arc::new(super::progress::Nested::new(self.progress.clone(), prefix)),
            rng: self.rng.clone(),
            // A child run executed in-process belongs to its parent's step.
            parks: false,
        }
    }
}
