//! The dispatcher loop: schedule → lease → send → finish, per consumer.

use std::sync::Arc;
use std::time::Duration;

use flow_ledger::{
    Clock, Delivery, DeliveryOutcome, FinishDelivery, LeaseDeliveries, Ledger, ScheduleDeliveries,
    WorkerId,
};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{Consumer, Error, backoff};

/// How long `dispatch_once` waits for older transactions on the server to end.
const COMMITTED_PATIENCE: Duration = Duration::from_secs(5);

/// Schedule rounds of one `dispatch_once` per consumer, at most.
const MAX_DRAIN_ROUNDS: usize = 100;

/// Tuning knobs; the defaults suit a daemon.
#[derive(Debug, Clone)]
pub struct Options {
    /// Deliveries leased (and finished in one commit) at a time, per consumer.
    pub batch: u32,
    /// Webhook requests in flight at once, per consumer.
    pub concurrency: usize,
    /// How long an idle consumer waits before looking for work again. Retries are due
    /// on whole seconds, so well under a second keeps the backoff schedule honest.
    pub poll_interval: Duration,
    /// Added to a consumer's timeout to make the delivery lease: room for recording the
    /// outcome before another dispatcher may take the delivery over.
    pub lease_margin: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            batch: 64,
            concurrency: 16,
            poll_interval: Duration::from_millis(250),
            lease_margin: Duration::from_secs(30),
        }
    }
}

/// What one or more rounds did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Deliveries added to consumers' queues (new events that passed a filter).
    pub scheduled: u64,
    /// Accepted by their consumer.
    pub delivered: u64,
    /// Failed, to be tried again later.
    pub retried: u64,
    /// Failed for the last time: now dead letters.
    pub dead: u64,
    /// Sent, but the lease was lost before the outcome was recorded (another
    /// dispatcher took over; it will send again).
    pub lost: u64,
}

impl Summary {
    fn add(&mut self, o: Summary) {
        self.scheduled += o.scheduled;
        self.delivered += o.delivered;
        self.retried += o.retried;
        self.dead += o.dead;
        self.lost += o.lost;
    }

    /// Deliveries attempted.
    pub fn attempts(&self) -> u64 {
        self.delivered + self.retried + self.dead + self.lost
    }

    fn idle(&self) -> bool {
        self.scheduled == 0 && self.attempts() == 0
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} scheduled, {} delivered, {} to retry, {} dead, {} lost leases",
            self.scheduled, self.delivered, self.retried, self.dead, self.lost
        )
    }
}

/// A dispatcher: the consumers of one ledger scope, and who it is.
#[derive(Clone)]
pub struct Dispatcher {
    ledger: Ledger,
    consumers: Arc<[Consumer]>,
    clock: Arc<dyn Clock>,
    worker: WorkerId,
    options: Options,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("consumers", &self.consumers)
            .field("worker", &self.worker)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher for `consumers` acting as this process.
    pub fn new(ledger: Ledger, consumers: Vec<Consumer>, clock: Arc<dyn Clock>) -> Self {
        Self {
            ledger,
            consumers: consumers.into(),
            clock,
            worker: WorkerId::current(),
            options: Options::default(),
        }
    }

    /// Other tuning.
    pub fn with_options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// Another identity (tests model several dispatchers in one process).
    pub fn with_worker(mut self, worker: WorkerId) -> Self {
        self.worker = worker;
        self
    }

    /// Delivers everything due now to every consumer (consumers in parallel), then
    /// returns. Failed deliveries are scheduled for later, not waited for. "Now"
    /// includes every event committed before the call: on PostgreSQL it first waits (up
    /// to 5 s) for transactions still in flight elsewhere on the server, which would
    /// otherwise hold those events back (`Ledger::wait_for_committed_events`).
    pub async fn dispatch_once(&self) -> Result<Summary, Error> {
        if !self
            .ledger
            .wait_for_committed_events(COMMITTED_PATIENCE)
            .await?
        {
            tracing::warn!(
                "a transaction on the database server has been open for over 5 s; events \
                 committed after it started are delivered later, not now"
            );
        }
        self.expire_dead_leases().await;
        let rounds =
            futures::future::join_all(self.consumers.iter().map(|c| self.drain_all(c))).await;
        let mut total = Summary::default();
        for r in rounds {
            total.add(r?);
        }
        Ok(total)
    }

    /// Dispatches until `shutdown` fires, each consumer on its own so that a slow one
    /// does not hold the others up. Ledger errors are logged and retried after a pause:
    /// the dispatcher outlives a database restart. Returns once the batches in flight
    /// are recorded (bounded by the consumers' timeouts).
    pub async fn run(&self, shutdown: CancellationToken) -> Summary {
        self.expire_dead_leases().await;
        let loops = self
            .consumers
            .iter()
            .map(|c| self.consumer_loop(c, &shutdown));
        let mut total = Summary::default();
        for s in futures::future::join_all(loops).await {
            total.add(s);
        }
        total
    }

    async fn consumer_loop(&self, c: &Consumer, shutdown: &CancellationToken) -> Summary {
        let mut total = Summary::default();
        let mut failing = 0u32;
        while !shutdown.is_cancelled() {
            let pause = match self.drain(c, shutdown).await {
                Ok(s) => {
                    failing = 0;
                    total.add(s);
                    if s.idle() {
                        self.options.poll_interval
                    } else {
                        Duration::ZERO
                    }
                }
                Err(e) => {
                    failing += 1;
                    tracing::warn!(consumer = %c.name, error = %e, "event dispatch failed; retrying");
                    backoff::delay(failing).max(self.options.poll_interval)
                }
            };
            if !pause.is_zero() {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
        total
    }

    /// Drains `c` until a round schedules nothing new: one schedule call scans at most
    /// a page of the outbox, and `dispatch_once` promises everything due now.
    async fn drain_all(&self, c: &Consumer) -> Result<Summary, Error> {
        let never = CancellationToken::new();
        let mut total = Summary::default();
        // Bounded, so that a steady stream of new events cannot keep it from returning.
        for _ in 0..MAX_DRAIN_ROUNDS {
            let s = self.drain(c, &never).await?;
            total.add(s);
            if s.scheduled == 0 {
                break;
            }
        }
        Ok(total)
    }

    /// Schedules new events for `c`, then leases and delivers batches until nothing is
    /// due (or `stop` fires between batches).
    async fn drain(&self, c: &Consumer, stop: &CancellationToken) -> Result<Summary, Error> {
        let mut sum = Summary::default();
        let req = ScheduleDeliveries {
            consumer: c.name.clone(),
            types: c.types.clone(),
            start: c.start,
            limit: 0,
        };
        sum.scheduled += u64::from(
            self.ledger
                .schedule_deliveries(req, self.clock.now())
                .await?,
        );
        let batch = self.options.batch.max(1);
        while !stop.is_cancelled() {
            let leased = self
                .ledger
                .lease_deliveries(
                    LeaseDeliveries {
                        consumer: &c.name,
                        worker: &self.worker,
                        lease: c.sink.timeout() + self.options.lease_margin,
                        limit: batch,
                    },
                    self.clock.now(),
                )
                .await?;
            if leased.is_empty() {
                break;
            }
            sum.add(self.deliver(c, &leased).await?);
            if leased.len() < batch as usize {
                break;
            }
        }
        Ok(sum)
    }

    /// Sends one leased batch and records every outcome in one commit.
    async fn deliver(&self, c: &Consumer, leased: &[Delivery]) -> Result<Summary, Error> {
        let results = c
            .sink
            .deliver(leased, self.ledger.scope(), self.options.concurrency)
            .await;
        let now = self.clock.now();
        let mut sum = Summary::default();
        let finishes: Vec<FinishDelivery> = leased
            .iter()
            .zip(results)
            .map(|(d, result)| {
                let outcome = match result {
                    Ok(()) => {
                        tracing::debug!(consumer = %c.name, event = %d.event.id, attempt = d.attempts, "delivered");
                        DeliveryOutcome::Delivered
                    }
                    Err(f) => backoff::after_failure(
                        d.attempts,
                        c.max_attempts,
                        f.retry_after,
                        now,
                        f.message,
                    ),
                };
                match &outcome {
                    DeliveryOutcome::Delivered => sum.delivered += 1,
                    DeliveryOutcome::Retry { at, error } => {
                        sum.retried += 1;
                        tracing::info!(consumer = %c.name, event = %d.event.id, attempt = d.attempts, retry_at = %at, %error, "delivery failed; will retry");
                    }
                    DeliveryOutcome::Dead { error } => {
                        sum.dead += 1;
                        tracing::warn!(consumer = %c.name, event = %d.event.id, attempt = d.attempts, %error, "delivery is a dead letter (`flow events --failed`)");
                    }
                }
                FinishDelivery {
                    consumer: &c.name,
                    event_id: &d.event.id,
                    worker: &self.worker,
                    outcome,
                }
            })
            .collect();
        let lost = self.ledger.finish_deliveries(&finishes, now).await?;
        for id in &lost {
            tracing::warn!(consumer = %c.name, event = %id, "delivery lease lost before its outcome was recorded; it will be sent again");
        }
        // Lost ones were counted by outcome above; move them to `lost`.
        for f in finishes
            .iter()
            .filter(|f| lost.iter().any(|l| l == f.event_id))
        {
            match f.outcome {
                DeliveryOutcome::Delivered => sum.delivered -= 1,
                DeliveryOutcome::Retry { .. } => sum.retried -= 1,
                DeliveryOutcome::Dead { .. } => sum.dead -= 1,
            }
            sum.lost += 1;
        }
        Ok(sum)
    }

    async fn expire_dead_leases(&self) {
        match self
            .ledger
            .expire_dead_delivery_leases(self.clock.now())
            .await
        {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(
                    leases = n,
                    "took over deliveries of a dispatcher that died on this host"
                )
            }
            Err(e) => tracing::warn!(error = %e, "could not check for dead dispatchers"),
        }
    }
}

/// Runs a dispatcher for `consumers` until `shutdown` fires — what `flow daemon` and
/// `flow events dispatch` call. Returns what it did.
pub async fn run(
    ledger: Ledger,
    consumers: Vec<Consumer>,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) -> Summary {
    Dispatcher::new(ledger, consumers, clock)
        .run(shutdown)
        .await
}

/// Delivers everything due now once (`flow events dispatch --once`, tests).
pub async fn dispatch_once(
    ledger: &Ledger,
    consumers: Vec<Consumer>,
    clock: Arc<dyn Clock>,
) -> Result<Summary, Error> {
    Dispatcher::new(ledger.clone(), consumers, clock)
        .dispatch_once()
        .await
}
