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
}

impl Executor {
    /// An executor over `gateway`, reporting to `progress`, drawing backoff jitter from
    /// `rng` (seeded in tests).
    pub fn new(gateway: Gateway, progress: Arc<dyn Progress>, rng: rand::rngs::StdRng) -> Self {
        Self {
            gateway,
            progress,
            rng: Arc::new(std::sync::Mutex::new(rng)),
        }
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
        }
    }
}
