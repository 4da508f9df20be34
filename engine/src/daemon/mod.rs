//! `flow daemon`: workers that drain the shared run queue (ARCHITECTURE.md: The daemon).
//!
//! Shaped like mini-redis's server: a [`Service`] owns the claim loop and the runs it
//! executes; a [`Handle`] is how the outside (signals, tests) asks it to stop; and
//! [`shutdown::on_signals`] feeds SIGTERM/SIGINT into the handle — the first signal stops
//! claiming and lets the calls in flight finish within the grace period, a second one
//! stops at once.
//!
//! - `service.rs`: the claim loop — batch claims up to the free slots, LISTEN/NOTIFY
//!   wake-ups with polling as the guarantee, reclaiming dead local workers' runs,
//!   backoff while the database is unreachable, the idle exit, the graceful drain.
//! - `run_task.rs`: one claimed run: read it, parse its snapshot (cached), execute it,
//!   give it back to the queue when this process cannot go on.
//! - [`metrics`]: Prometheus text at `/metrics` and `/healthz`, and the step observer
//!   that counts tool calls and logs them.
//! - [`shutdown`]: [`Handle`] and the signal listener.
//!
//! Invariant: the daemon adds no path around the gateway; every tool call still goes
//! through the ledger's claim and fenced `outbound` mark, so a daemon that lost the
//! database or its lease can never send a request twice.

pub mod metrics;
mod outage;
mod run_task;
mod service;
pub mod shutdown;

use std::time::Duration;

use flow_ledger::WorkerId;

pub use service::{Service, Stopped};
pub use shutdown::Handle;

/// How a daemon runs (its command-line settings; `flow.toml` is `config::Config`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Most runs executed at once by this process.
    pub concurrency: usize,
    /// How often to look at the queue when no notification arrives (and the most a
    /// submit waits for a polling-only daemon).
    pub poll_interval: Duration,
    /// Exit (as `Stopped::Idle`) once nothing is queued and nothing is in flight.
    pub exit_when_idle: bool,
    /// After a stop request, how long the calls in flight may take before their runs are
    /// abandoned (their calls then go in doubt, as after a crash).
    pub grace: Duration,
    /// Use PostgreSQL `LISTEN/NOTIFY` to claim at once on submit (off: poll only, e.g.
    /// behind a transaction-pooling PgBouncer, which cannot LISTEN).
    pub listen: bool,
    /// This process's worker id (lease holder).
    pub worker: WorkerId,
    /// `flow` with the global options that differ from their defaults (`--db`,
    /// `--tenant`, …), for the commands the daemon's log lines suggest, so a pasted one
    /// reaches this daemon's ledger.
    pub flow: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            concurrency: 8,
            poll_interval: Duration::from_secs(1),
            exit_when_idle: false,
            grace: Duration::from_secs(30),
            listen: true,
            worker: WorkerId::current(),
            flow: "flow".into(),
        }
    }
}
