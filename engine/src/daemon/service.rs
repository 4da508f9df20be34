//! The claim loop: keep up to `concurrency` runs executing, claim in batches, wake on
//! notifications or the poll interval, reclaim dead local workers' runs, ride out
//! database outages, and on a stop request drain within the grace period.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use flow_ledger::notify::{QueueListener, Wake};
use flow_ledger::{ClaimRuns, Claimed, Ledger, RunLease, RunStatus};
use tokio::task::JoinSet;

use super::metrics::Metrics;
use super::run_task::{self, Ended, Shared};
use super::{Handle, Settings};
use crate::executor::Executor;

/// How often leases of provably dead workers on this host are expired, so their runs
/// are reclaimed at once instead of after the lease length.
const EXPIRE_EVERY: Duration = Duration::from_secs(2);

/// How often the daemon checks whether the ledger's planner statistics went stale
/// (`Ledger::refresh_planner_statistics`; the first check is at start, and more come
/// sooner while its work is young: [`StatsDue`]).
const STATS_EVERY: Duration = Duration::from_secs(5);

/// Keeps plans from being made on statistics of an empty database. A failure is only
/// logged: the claim loop finds out whether the database is down.
async fn refresh_statistics(ledger: Ledger) {
    let started = Instant::now();
    match ledger.refresh_planner_statistics().await {
        Ok(tables) if tables.is_empty() => {}
        Ok(tables) => tracing::info!(
            tables = tables.join(","),
            ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "refreshed the planner statistics of tables that outgrew them"
        ),
        Err(e) => tracing::debug!(error = %e, "cannot check the planner statistics"),
    }
}

/// Runs claimed before the first check driven by work rather than time.
const STATS_AFTER_CLAIMS: u64 = 64;

/// When the planner statistics are next checked: every [`STATS_EVERY`], and also each
/// time the runs this daemon claimed have doubled since the last check (64, 128,
/// 256, …). A new database meets its first burst with no statistics, and until they
/// exist PostgreSQL plans each run's fenced checks and foreign-key checks as scans of
/// every call and run of the tenant (a cost that grows with each run): a daemon that
/// drains 500 runs in half a second finished them all before its 5-second look
/// (benches/README.md, "statistics of a new database"). The check itself is one
/// catalog read; it analyzes only tables that outgrew their statistics.
/// The check runs beside the claim loop (an `ANALYZE` of a few tables takes tens of
/// milliseconds that claims should not wait for), one at a time.
#[derive(Debug, Default)]
struct StatsDue {
    last: Option<Instant>,
    claimed: u64,
    claimed_at_last: u64,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl StatsDue {
    fn due(&self) -> bool {
        self.running.as_ref().is_none_or(|h| h.is_finished())
            && (self.last.is_none_or(|t| t.elapsed() >= STATS_EVERY)
                || (self.claimed >= STATS_AFTER_CLAIMS
                    && self.claimed >= self.claimed_at_last.saturating_mul(2)))
    }

    /// Starts the check (see `due`).
    fn check(&mut self, ledger: &Ledger) {
        self.last = Some(Instant::now());
        self.claimed_at_last = self.claimed;
        self.running = Some(tokio::spawn(refresh_statistics(ledger.clone())));
    }

    fn claimed(&mut self, n: usize) {
        self.claimed = self
            .claimed
            .saturating_add(u64::try_from(n).unwrap_or(u64::MAX));
    }
}

/// How long to wait before trying to listen again after the listener failed.
const RELISTEN_AFTER: Duration = Duration::from_secs(5);

/// With a backlog, the longest a free slot waits for others to free up so that they are
/// claimed together: a claim orders the queue, so it is one of the dearest statements,
/// and claiming per finished run would pay it once per run.
const CLAIM_GAP: Duration = Duration::from_millis(5);

/// Why [`Service::run`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// `exit_when_idle`: nothing queued, nothing in flight.
    Idle,
    /// A graceful stop: the runs in flight finished, were released, or (when the
    /// database did not answer) were left to their leases; the counts say which.
    Graceful {
        /// Runs whose calls were still in flight at the end of the grace period.
        abandoned: usize,
        /// Of those, the runs released to the queue.
        released: usize,
        /// Runs that could not be released during the stop (abandoned ones whose release
        /// failed, and runs whose own release gave up): their leases expire instead.
        not_released: usize,
    },
    /// An immediate stop: runs in flight were left to their leases.
    Immediate,
    /// The ledger cannot be written by this process any more (its SQLite WAL was
    /// deleted or replaced): stopped at once, runs left to their leases; the reason.
    Unusable(String),
}

/// A daemon: the claim loop and the runs it executes.
pub struct Service {
    config: Settings,
    shared: Arc<Shared>,
    handle: Handle,
}

/// The claim loop's backoff while the database does not answer (`None` while it does).
/// Whether it answers is [`super::outage::Outage`], shared with the run tasks.
type Backoff = Option<ExponentialBackoff>;

fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build()
}

impl Service {
    /// A daemon executing runs with `executor` (whose step observer should be a
    /// [`super::metrics::Observer`] over the same `metrics`).
    pub fn new(executor: Executor, config: Settings, metrics: Arc<Metrics>) -> Self {
        let handle = Handle::new();
        let shared = Shared::new(
            executor,
            metrics,
            handle.graceful().clone(),
            config.flow.clone(),
        );
        Self {
            config,
            shared,
            handle,
        }
    }

    /// The handle that stops this service.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    fn ledger(&self) -> &Ledger {
        &self.shared.ledger
    }

    fn now(&self) -> flow_ledger::Timestamp {
        self.shared.executor.gateway().now()
    }

    /// A claim-loop call started at `started` failed: report it, and return how long to
    /// wait before the next try.
    fn db_failed(
        &self,
        delays: &mut Backoff,
        started: Instant,
        e: &flow_ledger::Error,
    ) -> Duration {
        self.shared.outage.failed(started, "claim loop", e);
        delays
            .get_or_insert_with(backoff)
            .next()
            .unwrap_or(Duration::from_secs(5))
    }

    /// A claim-loop call started at `started` succeeded.
    fn db_ok(&self, delays: &mut Backoff, started: Instant) {
        self.shared.outage.ok(started);
        *delays = None;
    }

    /// Runs until idle (with `exit_when_idle`) or stopped through the handle.
    pub async fn run(self) -> Stopped {
        let mut listener = None;
        let stopped = self.serve(&mut listener).await;
        if let Some(l) = listener.take() {
            // End the listening session cleanly (the server logs a dropped one as
            // "connection reset by peer"); bounded, the database may be gone.
            let _ = tokio::time::timeout(Duration::from_secs(1), l.close()).await;
        }
        stopped
    }

    async fn serve(&self, listener: &mut Option<QueueListener>) -> Stopped {
        let mut tasks: JoinSet<Ended> = JoinSet::new();
        let mut leases: HashMap<String, RunLease> = HashMap::new();
        let mut delays: Backoff = None;
        let mut relisten_at: Option<Instant> = None;
        *listener = match self.listen().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for queue notifications; polling until it works");
                relisten_at = Some(Instant::now() + RELISTEN_AFTER);
                None
            }
        };
        let mut last_expire: Option<Instant> = None;
        let mut stats = StatsDue::default();
        let mut last_claim: Option<Instant> = None;
        // The last claim got every run it asked for: more are probably queued.
        let mut backlog = false;
        let batch = (self.config.concurrency / 4).max(1);
        let graceful = self.handle.graceful().clone();
        let immediate = self.handle.immediate().clone();
        loop {
            while let Some(joined) = tasks.try_join_next() {
                self.reap(joined, &mut leases);
            }
            self.shared.metrics.set_in_flight(tasks.len());
            if let Some(reason) = self.shared.outage.unusable() {
                return Stopped::Unusable(reason);
            }
            if graceful.is_cancelled() {
                break;
            }
            if relisten_at.is_some_and(|t| Instant::now() >= t) {
                match self.listen().await {
                    Ok(l) => {
                        tracing::info!("listening for queue notifications again");
                        relisten_at = None;
                        *listener = l;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "still cannot listen for queue notifications");
                        relisten_at = Some(Instant::now() + RELISTEN_AFTER);
                    }
                }
            }
            let mut wait = self.config.poll_interval;
            let free = self.config.concurrency.saturating_sub(tasks.len());
            let since_claim = last_claim.map_or(CLAIM_GAP, |t| t.elapsed());
            let due = !backlog || free >= batch || since_claim >= CLAIM_GAP;
            if free > 0 && !due {
                wait = CLAIM_GAP.saturating_sub(since_claim);
            } else if free > 0 {
                if stats.due() {
                    stats.check(self.ledger());
                }
                if last_expire.is_none_or(|t| t.elapsed() >= EXPIRE_EVERY) {
                    let started = Instant::now();
                    last_expire = Some(started);
                    if let Err(e) = self.due_timers().await {
                        wait = self.db_failed(&mut delays, started, &e);
                        self.pause(wait, &mut tasks, &mut leases).await;
                        continue;
                    }
                }
                let started = Instant::now();
                last_claim = Some(started);
                match self.claim(free).await {
                    Ok(claimed) => {
                        self.db_ok(&mut delays, started);
                        let got = claimed.len();
                        stats.claimed(got);
                        backlog = got == free;
                        for claimed in claimed {
                            leases.insert(claimed.lease.run_id.clone(), claimed.lease.clone());
                            tasks.spawn(run_task::execute(self.shared.clone(), claimed));
                        }
                        self.shared.metrics.set_in_flight(tasks.len());
                        if backlog {
                            // The queue may hold more: claim again once a batch of slots
                            // is free, or the gap has passed.
                            wait = CLAIM_GAP;
                        } else if got == 0 && tasks.is_empty() && self.config.exit_when_idle {
                            match self.idle().await {
                                Ok(true) => return Stopped::Idle,
                                Ok(false) => {}
                                Err(e) => wait = self.db_failed(&mut delays, started, &e),
                            }
                        }
                    }
                    Err(e) => wait = self.db_failed(&mut delays, started, &e),
                }
            }
            let can_claim =
                !backlog && tasks.len() < self.config.concurrency && !self.shared.outage.is_down();
            tokio::select! {
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                    self.reap(joined, &mut leases);
                }
                woke = wait_for(listener), if can_claim && listener.is_some() => {
                    if let Err(e) = woke {
                        tracing::warn!(error = %e, "lost the queue notification channel; polling until it is back");
                        *listener = None;
                        relisten_at = Some(Instant::now() + RELISTEN_AFTER);
                    }
                }
                () = tokio::time::sleep(wait) => {}
                () = graceful.cancelled() => {}
            }
        }
        if immediate.is_cancelled() {
            return Stopped::Immediate;
        }
        self.drain(tasks, leases).await
    }

    /// Waits `wait` (database down), still reaping runs that end meanwhile.
    async fn pause(
        &self,
        wait: Duration,
        tasks: &mut JoinSet<Ended>,
        leases: &mut HashMap<String, RunLease>,
    ) {
        let sleep = tokio::time::sleep(wait);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => self.reap(joined, leases),
                () = &mut sleep => return,
                () = self.handle.graceful().cancelled() => return,
            }
        }
    }

    /// The queue listener: `Ok(None)` when there is none to have (SQLite, `--no-listen`).
    async fn listen(&self) -> Result<Option<QueueListener>, flow_ledger::Error> {
        if !self.config.listen {
            return Ok(None);
        }
        self.ledger().listen_queue().await
    }

    async fn claim(&self, free: usize) -> Result<Vec<Claimed>, flow_ledger::Error> {
        let started = Instant::now();
        let req = ClaimRuns {
            worker: &self.config.worker,
            lease: crate::lease::length(),
            limit: u32::try_from(free).unwrap_or(u32::MAX),
        };
        let claimed = self.ledger().claim_next_runs(req, self.now()).await?;
        self.shared
            .metrics
            .claimed(claimed.len(), started.elapsed());
        Ok(claimed)
    }

    /// The durable timers this loop keeps, every [`EXPIRE_EVERY`]: the ledger's one
    /// timer watcher (holds' deadlines and reminders, holds of ended runs, due probes of
    /// calls in doubt: `Ledger::fire_due_timers`), then the runs of provably dead local
    /// workers (reclaimed at once). Only the last is an error: the watcher logs its own,
    /// and the claim that follows finds out whether the database is down.
    async fn due_timers(&self) -> Result<(), flow_ledger::Error> {
        self.fire_due_timers().await;
        self.ledger()
            .expire_dead_local_workers(self.now())
            .await
            .map(|_| ())
    }

    /// Fires the due timers of every kind, whichever daemon comes first: each kind's
    /// one compare-and-set decides, so a racing decision, event, callback, operator or
    /// daemon changes nothing twice. A hold past its deadline times out and its paused
    /// run goes back on the queue (whose next holder applies `on_timeout`); a hold of a
    /// finished run or ended step is cancelled (a callback token then answers 404); an
    /// approval's reminder comes due; a paused run whose call in doubt is due a probe
    /// goes back on the queue, so the worker that claims it (one per run, by its lease)
    /// probes before it would pause again.
    async fn fire_due_timers(&self) {
        let rules = flow_ledger::TimerRules {
            next_remind: crate::approval::next_remind,
            probe_by: crate::reconcile::RESOLVED_BY,
        };
        match self.ledger().fire_due_timers(self.now(), 100, rules).await {
            Ok(fired) => {
                for h in &fired.holds.timed_out {
                    tracing::info!(run = %h.run_id, node = %h.subject, kind = %h.kind, "hold timed out");
                }
                for run in &fired.probed {
                    tracing::info!(run = %run, "re-queued for a due probe of its call in doubt");
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot fire due timers"),
        }
    }

    /// Nothing claimable now: idle unless runs are still queued (e.g. not due yet) or
    /// held by provably dead local workers (expired here, so claimable next turn).
    async fn idle(&self) -> Result<bool, flow_ledger::Error> {
        if self.ledger().expire_dead_local_workers(self.now()).await? > 0 {
            return Ok(false);
        }
        let counts = self.ledger().count_runs_by_status().await?;
        Ok(counts
            .iter()
            .all(|(status, n)| *status != RunStatus::Queued || *n == 0))
    }

    fn reap(
        &self,
        joined: Result<Ended, tokio::task::JoinError>,
        leases: &mut HashMap<String, RunLease>,
    ) {
        match joined {
            Ok(ended) => {
                leases.remove(&ended.run_id);
            }
            Err(e) => {
                // A panic inside an execution: its run stays leased to this process until
                // the lease expires (or this process exits), then another worker resumes it.
                tracing::error!(error = %e, "a run's task failed");
            }
        }
    }

    /// The graceful end: wait for the runs in flight (they start nothing new and release
    /// themselves) up to the grace period, then abandon the rest and release their runs.
    async fn drain(
        &self,
        mut tasks: JoinSet<Ended>,
        mut leases: HashMap<String, RunLease>,
    ) -> Stopped {
        let in_flight = tasks.len();
        if in_flight > 0 {
            tracing::warn!(
                runs = in_flight,
                grace_ms = u64::try_from(self.config.grace.as_millis()).unwrap_or(u64::MAX),
                "waiting for the calls in flight"
            );
        }
        let deadline = tokio::time::sleep(self.config.grace);
        tokio::pin!(deadline);
        let immediate = self.handle.immediate().clone();
        let mut not_released = 0;
        while !tasks.is_empty() {
            tokio::select! {
                Some(joined) = tasks.join_next() => {
                    if matches!(&joined, Ok(ended) if ended.status == "lost") {
                        not_released += 1;
                    }
                    self.reap(joined, &mut leases);
                }
                () = &mut deadline => break,
                () = immediate.cancelled() => return Stopped::Immediate,
            }
        }
        let abandoned = tasks.len();
        if abandoned > 0 {
            tracing::warn!(
                runs = abandoned,
                "grace period over: abandoning the calls still in flight (they will be found in doubt) and releasing their runs"
            );
            tasks.abort_all();
            while let Some(joined) = tasks.join_next().await {
                if let Ok(ended) = joined {
                    leases.remove(&ended.run_id);
                }
            }
        }
        let mut released = 0;
        for lease in leases.values() {
            match self.ledger().release_run(lease, self.now()).await {
                Ok(()) => released += 1,
                Err(e) => {
                    not_released += 1;
                    tracing::warn!(run = %lease.run_id, error = %e, "could not release the run; its lease will expire");
                }
            }
        }
        self.shared.metrics.set_in_flight(0);
        Stopped::Graceful {
            abandoned,
            released,
            not_released,
        }
    }
}

async fn wait_for(listener: &mut Option<QueueListener>) -> Result<Wake, flow_ledger::Error> {
    match listener {
        Some(l) => l.wait().await,
        None => std::future::pending().await,
    }
}
