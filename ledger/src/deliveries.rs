//! Per-consumer delivery of outbox events (issue 7): the storage half of the dispatcher.
//!
//! The dispatcher (in the engine) decides backoff and the attempt cap; the ledger keeps
//! the facts so that they hold across processes and crashes:
//! 1. [`Ledger::schedule_deliveries`] copies new events into a consumer's delivery queue
//!    and advances its checkpoint, in (txid, seq) order so that no event committed late
//!    on PostgreSQL is skipped (see migration 0002);
//! 2. [`Ledger::lease_deliveries`] leases due deliveries (`attempts + 1` at lease time, so
//!    a dispatcher killed mid-delivery still counts the attempt and the event comes back
//!    when the lease ends: at least once);
//! 3. [`Ledger::finish_delivery`] (or [`Ledger::finish_deliveries`] for a batch, one
//!    commit) records delivered / retry at T / dead, fenced by the lease holder;
//!    [`Ledger::redeliver`] re-queues one by hand;
//! 4. [`Ledger::expire_dead_delivery_leases`] ends the leases of dispatchers that died
//!    on this host, so a restarted dispatcher re-sends their deliveries at once.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::{Event, EventType};
use crate::ledger::Ledger;
use crate::rows::{EventRow, IntRow};
use crate::worker::WorkerId;

/// Where a new consumer starts reading the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// Every event still in the outbox.
    Beginning,
    /// Only events written after the consumer first schedules.
    Latest,
}

/// A request to fan new outbox events out to one consumer.
#[derive(Debug, Clone)]
pub struct ScheduleDeliveries {
    /// Consumer name (from the config file).
    pub consumer: String,
    /// Only these types (empty = all).
    pub types: Vec<EventType>,
    /// Where a consumer without a checkpoint starts.
    pub start: StartAt,
    /// At most this many events scanned per call (0 = 1000).
    pub limit: u32,
}

/// A request to lease due deliveries.
#[derive(Debug, Clone, Copy)]
pub struct LeaseDeliveries<'a> {
    /// Consumer name.
    pub consumer: &'a str,
    /// The dispatcher process.
    pub worker: &'a WorkerId,
    /// How long the delivery may take before another dispatcher retries it.
    pub lease: Duration,
    /// At most this many.
    pub limit: u32,
}

/// A lease of deliveries as the writer applies it: the consumer's, held by the
/// dispatcher `worker` until `until`, at most `limit`.
struct Leasing {
    consumer: String,
    worker: String,
    until: Timestamp,
    limit: u32,
}

/// What happened to a leased delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// The consumer accepted it.
    Delivered,
    /// It failed; try again at `at`.
    Retry {
        /// Next attempt time (the dispatcher's backoff).
        at: Timestamp,
        /// Why it failed (no secret values).
        error: String,
    },
    /// It failed for the last time (attempt cap): dead-letter it.
    Dead {
        /// Why it failed.
        error: String,
    },
}

/// Recording the outcome of a leased delivery.
#[derive(Debug, Clone)]
pub struct FinishDelivery<'a> {
    /// Consumer name.
    pub consumer: &'a str,
    /// Event id.
    pub event_id: &'a str,
    /// The dispatcher that holds the lease.
    pub worker: &'a WorkerId,
    /// What happened.
    pub outcome: DeliveryOutcome,
}

/// The state of one consumer's delivery of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Waiting for (another) attempt.
    Pending,
    /// Accepted by the consumer.
    Delivered,
    /// Given up on (dead letter); `redeliver` re-queues it.
    Dead,
}

impl DeliveryStatus {
    /// Stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Dead => "dead",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "pending" => Ok(Self::Pending),
            "delivered" => Ok(Self::Delivered),
            "dead" => Ok(Self::Dead),
            other => Err(Error::Corrupt {
                what: format!("unknown delivery status {other:?}"),
            }),
        }
    }
}

/// One consumer's delivery of one event, with the event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// Consumer name.
    pub consumer: String,
    /// The event.
    pub event: Event,
    /// State.
    pub status: DeliveryStatus,
    /// Attempts started (counted when leased).
    pub attempts: u32,
    /// Not before this time.
    pub next_attempt_at: Timestamp,
    /// Last failure.
    pub last_error: Option<String>,
    /// Current lease holder.
    pub leased_by: Option<String>,
    /// Lease end.
    pub leased_until: Option<Timestamp>,
}

/// Which deliveries [`Ledger::list_deliveries`] returns.
#[derive(Debug, Clone, Default)]
pub struct DeliveryFilter {
    /// Only this consumer.
    pub consumer: Option<String>,
    /// Only this status (e.g. `Dead` for `flow events --failed`).
    pub status: Option<DeliveryStatus>,
    /// Only deliveries of this event (`flow events redeliver ID`).
    pub event_id: Option<String>,
    /// Only deliveries of this run's events.
    pub run_id: Option<String>,
    /// At most this many, the newest events' (0 = 100).
    pub limit: u32,
}

#[derive(Debug, sqlx::FromRow)]
struct DeliveryRow {
    consumer: String,
    status: String,
    attempts: i64,
    next_attempt_at: i64,
    last_error: Option<String>,
    leased_by: Option<String>,
    leased_until: Option<i64>,
    seq: i64,
    id: String,
    #[sqlx(rename = "type")]
    event_type: String,
    time: i64,
    run_id: Option<String>,
    step_id: Option<String>,
    tool_call_id: Option<String>,
    payload: String,
}

impl DeliveryRow {
    fn into_delivery(self) -> Result<Delivery, Error> {
        let event = EventRow {
            seq: self.seq,
            id: self.id,
            event_type: self.event_type,
            time: self.time,
            run_id: self.run_id,
            step_id: self.step_id,
            tool_call_id: self.tool_call_id,
            payload: self.payload,
        }
        .into_event()?;
        Ok(Delivery {
            consumer: self.consumer,
            event,
            status: DeliveryStatus::parse(&self.status)?,
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            next_attempt_at: Timestamp(self.next_attempt_at),
            last_error: self.last_error,
            leased_by: self.leased_by,
            leased_until: self.leased_until.map(Timestamp),
        })
    }
}

macro_rules! delivery_select {
    () => {
        "SELECT d.consumer, d.status, d.attempts, d.next_attempt_at, d.last_error, d.leased_by,
            d.leased_until, o.seq, o.id, o.type, o.time, o.run_id, o.step_id, o.tool_call_id,
            o.payload
         FROM event_deliveries d JOIN outbox o
           ON o.tenant = d.tenant AND o.workspace = d.workspace AND o.id = d.event_id"
    };
}

#[derive(Debug, sqlx::FromRow)]
struct Checkpoint {
    last_txid: i64,
    last_seq: i64,
}

#[derive(Debug, sqlx::FromRow)]
struct Scanned {
    txid: i64,
    seq: i64,
    id: String,
    #[sqlx(rename = "type")]
    event_type: String,
}

/// The oldest txid that may still commit, server-wide: events at or past it are not
/// scheduled yet (PostgreSQL).
const PG_HORIZON: &str = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS n";

impl Ledger {
    /// Waits (up to `patience`) until every event committed before this call can be
    /// scheduled; `false` if the patience ran out first. On PostgreSQL an event is
    /// scheduled only once no older transaction anywhere on the server may still commit
    /// (the snapshot's `xmin`; see `schedule_deliveries`), so an unrelated transaction in
    /// flight holds back events that are already committed. A "deliver everything now,
    /// then exit" caller waits here first, or it may leave its last events behind (seen:
    /// `flow daemon --exit-when-idle` exiting without its last run's `run.succeeded`
    /// while other databases on the server were busy). SQLite: at once.
    pub async fn wait_for_committed_events(&self, patience: Duration) -> Result<bool, Error> {
        if !self.is_postgres() {
            return Ok(true);
        }
        let read = |sql: &'static str| async move {
            let mut pc = self.pool().acquire().await?;
            let n = pc
                .conn()
                .optional::<IntRow>(sql, vec![])
                .await?
                .map_or(0, |r| r.n);
            Ok::<i64, Error>(n)
        };
        // Every transaction that committed before now has a txid below this.
        let target =
            read("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS n").await?;
        let started = std::time::Instant::now();
        loop {
            let horizon = read(PG_HORIZON).await?;
            if horizon >= target {
                return Ok(true);
            }
            if started.elapsed() >= patience {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Copies the events after the consumer's checkpoint (matching `types`) into its
    /// delivery queue and advances the checkpoint; returns how many deliveries were
    /// added. Call it in the dispatcher loop before `lease_deliveries`.
    pub async fn schedule_deliveries(
        &self,
        req: ScheduleDeliveries,
        now: Timestamp,
    ) -> Result<u32, Error> {
        let ledger = self.clone();
        self.write(move |c| {
            Box::pin(async move { Ledger::schedule_in(c, &ledger, &req, now).await })
        })
        .await
    }
    /// The body of [`Ledger::schedule_deliveries`], on the writer's connection.
    async fn schedule_in(
        c: &mut Conn<'_>,
        ledger: &Ledger,
        req: &ScheduleDeliveries,
        now: Timestamp,
    ) -> Result<u32, Error> {
        let s = ledger.scope();
        let limit = if req.limit == 0 { 1000 } else { req.limit };
        // Events of transactions that may still commit sort at or after this txid.
        let horizon = if c.is_postgres() {
            c.optional::<IntRow>(PG_HORIZON, vec![])
                .await?
                .map_or(0, |r| r.n)
        } else {
            i64::MAX
        };
        let sql = c.pick(
            "SELECT last_txid, last_seq FROM event_consumers
             WHERE tenant = $1 AND workspace = $2 AND consumer = $3",
            "SELECT last_txid, last_seq FROM event_consumers
             WHERE tenant = $1 AND workspace = $2 AND consumer = $3 FOR UPDATE",
        );
        let cp = c
            .optional::<Checkpoint>(sql, args![&s.tenant, &s.workspace, &req.consumer])
            .await?;
        let cp = match (cp, req.start) {
            (Some(cp), _) => cp,
            (None, StartAt::Beginning) => Checkpoint {
                last_txid: -1,
                last_seq: -1,
            },
            (None, StartAt::Latest) => {
                // Past everything already final; later events sort after it.
                let last = c
                    .optional::<Checkpoint>(
                        "SELECT txid AS last_txid, seq AS last_seq FROM outbox
                         WHERE tenant = $1 AND workspace = $2 AND txid < $3
                         ORDER BY txid DESC, seq DESC LIMIT 1",
                        args![&s.tenant, &s.workspace, horizon],
                    )
                    .await?;
                last.unwrap_or(Checkpoint {
                    last_txid: -1,
                    last_seq: -1,
                })
            }
        };
        let events = c
            .all::<Scanned>(
                "SELECT txid, seq, id, type FROM outbox
                 WHERE tenant = $1 AND workspace = $2
                   AND (txid > $3 OR (txid = $3 AND seq > $4)) AND txid < $5
                 ORDER BY txid, seq LIMIT $6",
                args![
                    &s.tenant,
                    &s.workspace,
                    cp.last_txid,
                    cp.last_seq,
                    horizon,
                    i64::from(limit),
                ],
            )
            .await?;
        let mut added = 0u64;
        for e in &events {
            let wanted = req.types.is_empty()
                || EventType::parse(&e.event_type).is_some_and(|t| req.types.contains(&t));
            if !wanted {
                continue;
            }
            added += c
                .execute(
                    "INSERT INTO event_deliveries (tenant, workspace, consumer, event_id, status,
                        attempts, next_attempt_at, created_at, updated_at)
                     VALUES ($1, $2, $3, $4, 'pending', 0, $5, $5, $5)
                     ON CONFLICT DO NOTHING",
                    args![&s.tenant, &s.workspace, &req.consumer, &e.id, now],
                )
                .await?;
        }
        let (last_txid, last_seq) = events
            .last()
            .map_or((cp.last_txid, cp.last_seq), |e| (e.txid, e.seq));
        c.execute(
            "INSERT INTO event_consumers (tenant, workspace, consumer, last_txid, last_seq, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (tenant, workspace, consumer)
             DO UPDATE SET last_txid = $4, last_seq = $5, updated_at = $6",
            args![
                &s.tenant,
                &s.workspace,
                &req.consumer,
                last_txid,
                last_seq,
                now
            ],
        )
        .await?;
        Ok(u32::try_from(added).unwrap_or(u32::MAX))
    }

    /// Leases up to `limit` pending deliveries that are due and not leased by a live
    /// dispatcher (PostgreSQL: `SKIP LOCKED`), counting the attempt now.
    pub async fn lease_deliveries(
        &self,
        req: LeaseDeliveries<'_>,
        now: Timestamp,
    ) -> Result<Vec<Delivery>, Error> {
        let ledger = self.clone();
        let leasing = Leasing {
            consumer: req.consumer.to_owned(),
            worker: req.worker.as_str().to_owned(),
            until: now.plus(req.lease),
            limit: req.limit,
        };
        self.write(move |c| {
            Box::pin(async move { Ledger::lease_in(c, &ledger, &leasing, now).await })
        })
        .await
    }

    /// The body of [`Ledger::lease_deliveries`].
    async fn lease_in(
        c: &mut Conn<'_>,
        ledger: &Ledger,
        leasing: &Leasing,
        now: Timestamp,
    ) -> Result<Vec<Delivery>, Error> {
        let s = ledger.scope();
        let Leasing {
            consumer,
            worker,
            until,
            limit,
        } = leasing;
        let (until, limit) = (*until, *limit);
        let sql = c.pick(
            "UPDATE event_deliveries SET leased_by = $4, leased_until = $5,
                attempts = attempts + 1, updated_at = $6
             WHERE tenant = $1 AND workspace = $2 AND consumer = $3 AND event_id IN (
                SELECT event_id FROM event_deliveries
                WHERE tenant = $1 AND workspace = $2 AND consumer = $3
                  AND status = 'pending' AND next_attempt_at <= $6
                  AND (leased_until IS NULL OR leased_until <= $6)
                ORDER BY next_attempt_at, event_id LIMIT $7)
             RETURNING event_id",
            "WITH due AS (
                SELECT event_id FROM event_deliveries
                WHERE tenant = $1 AND workspace = $2 AND consumer = $3
                  AND status = 'pending' AND next_attempt_at <= $6
                  AND (leased_until IS NULL OR leased_until <= $6)
                ORDER BY next_attempt_at, event_id LIMIT $7
                FOR UPDATE SKIP LOCKED)
             UPDATE event_deliveries SET leased_by = $4, leased_until = $5,
                attempts = attempts + 1, updated_at = $6
             WHERE tenant = $1 AND workspace = $2 AND consumer = $3
               AND event_id IN (SELECT event_id FROM due)
             RETURNING event_id",
        );
        #[derive(sqlx::FromRow)]
        struct Id {
            event_id: String,
        }
        let ids = c
            .all::<Id>(
                sql,
                args![
                    &s.tenant,
                    &s.workspace,
                    consumer,
                    worker,
                    until,
                    now,
                    i64::from(limit),
                ],
            )
            .await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let row = c
                .optional::<DeliveryRow>(
                    concat!(
                        delivery_select!(),
                        " WHERE d.tenant = $1 AND d.workspace = $2 AND d.consumer = $3
                           AND d.event_id = $4"
                    ),
                    args![&s.tenant, &s.workspace, consumer, &id.event_id],
                )
                .await?;
            if let Some(row) = row {
                out.push(row.into_delivery()?);
            }
        }
        out.sort_by_key(|d| d.event.seq);
        Ok(out)
    }

    /// Records the outcome of a leased delivery. Fenced: only the dispatcher holding the
    /// lease may record it (`LeaseLost` otherwise, e.g. after its lease ran out and
    /// another dispatcher took the delivery).
    #[cfg(any(test, feature = "testkit"))]
    pub async fn finish_delivery(
        &self,
        req: FinishDelivery<'_>,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.writable()?;
        let lost = self
            .finish_deliveries(std::slice::from_ref(&req), now)
            .await?;
        if lost.is_empty() {
            Ok(())
        } else {
            Err(Error::LeaseLost)
        }
    }

    /// Records the outcomes of many leased deliveries in one transaction — one durable
    /// commit for a whole batch, which is what bounds a dispatcher's throughput. Each
    /// is fenced like `Ledger::finish_delivery`; returns the event ids whose lease was
    /// lost (their outcome was not recorded; whoever holds them now will send again).
    pub async fn finish_deliveries(
        &self,
        reqs: &[FinishDelivery<'_>],
        now: Timestamp,
    ) -> Result<Vec<String>, Error> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let ledger = self.clone();
        let reqs: Vec<Finished> = reqs
            .iter()
            .map(|r| Finished {
                consumer: r.consumer.to_owned(),
                event_id: r.event_id.to_owned(),
                worker: r.worker.as_str().to_owned(),
                outcome: r.outcome.clone(),
            })
            .collect();
        self.write(move |c| Box::pin(async move { finish_in(c, &ledger, &reqs, now).await }))
            .await
    }
}

/// An owned [`FinishDelivery`], for the writer.
struct Finished {
    consumer: String,
    event_id: String,
    worker: String,
    outcome: DeliveryOutcome,
}

/// The body of [`Ledger::finish_deliveries`]: the event ids whose lease was lost.
async fn finish_in(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    reqs: &[Finished],
    now: Timestamp,
) -> Result<Vec<String>, Error> {
    let s = ledger.scope();
    let mut lost = Vec::new();
    for req in reqs {
        let (status, next, error) = match &req.outcome {
            DeliveryOutcome::Delivered => ("delivered", now, None),
            DeliveryOutcome::Retry { at, error } => ("pending", *at, Some(error.clone())),
            DeliveryOutcome::Dead { error } => ("dead", now, Some(error.clone())),
        };
        let n = c
            .execute(
                "UPDATE event_deliveries SET status = $6, next_attempt_at = $7,
                        last_error = COALESCE($8, last_error), leased_by = NULL,
                        leased_until = NULL, updated_at = $9
                     WHERE tenant = $1 AND workspace = $2 AND consumer = $3 AND event_id = $4
                       AND leased_by = $5 AND status = 'pending'",
                args![
                    &s.tenant,
                    &s.workspace,
                    &req.consumer,
                    &req.event_id,
                    req.worker.as_str(),
                    status,
                    next,
                    error,
                    now,
                ],
            )
            .await?;
        if n == 0 {
            lost.push(req.event_id.clone());
        }
    }
    Ok(lost)
}

impl Ledger {
    /// Re-queues a delivery by hand (`flow events redeliver`): pending, due now, attempts
    /// reset so the cap applies anew.
    pub async fn redeliver(
        &self,
        consumer: &str,
        event_id: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        let s = self.scope();
        let a = args![&s.tenant, &s.workspace, consumer, event_id, now];
        let n = self
            .write_statement(move |c| {
                Box::pin(async move {
                    c.execute(
                        "UPDATE event_deliveries SET status = 'pending', attempts = 0,
                            next_attempt_at = $5, leased_by = NULL, leased_until = NULL,
                            updated_at = $5
                         WHERE tenant = $1 AND workspace = $2 AND consumer = $3 AND event_id = $4",
                        a,
                    )
                    .await
                })
            })
            .await?;
        if n == 0 {
            return Err(Error::NotFound {
                what: format!("delivery of {event_id} to {consumer}"),
            });
        }
        Ok(())
    }

    /// The newest `limit` deliveries matching `filter`, oldest event first (an operator
    /// looking at dead letters wants the recent ones, read top to bottom).
    pub async fn list_deliveries(&self, filter: DeliveryFilter) -> Result<Vec<Delivery>, Error> {
        let s = self.scope();
        let limit = if filter.limit == 0 { 100 } else { filter.limit };
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<DeliveryRow>(
                concat!(
                    delivery_select!(),
                    " WHERE d.tenant = $1 AND d.workspace = $2
                       AND ($3 IS NULL OR d.consumer = $3) AND ($4 IS NULL OR d.status = $4)
                       AND ($5 IS NULL OR d.event_id = $5) AND ($6 IS NULL OR o.run_id = $6)
                     ORDER BY o.seq DESC, d.consumer DESC LIMIT $7"
                ),
                args![
                    &s.tenant,
                    &s.workspace,
                    filter.consumer,
                    filter.status.map(DeliveryStatus::as_str),
                    filter.event_id,
                    filter.run_id,
                    i64::from(limit),
                ],
            )
            .await?;
        let mut out = rows
            .into_iter()
            .map(DeliveryRow::into_delivery)
            .collect::<Result<Vec<_>, _>>()?;
        out.reverse();
        Ok(out)
    }

    /// Ends the delivery leases held by dispatchers that provably died on this host
    /// (see [`WorkerId::is_provably_dead`]), so that a dispatcher restarted after a
    /// crash re-sends their deliveries at once instead of after the lease. Returns how
    /// many leases ended. Leases of live or remote dispatchers are left to expire.
    pub async fn expire_dead_delivery_leases(&self, now: Timestamp) -> Result<u32, Error> {
        self.writable()?;
        let s = self.scope();
        #[derive(sqlx::FromRow)]
        struct Holder {
            leased_by: String,
        }
        let holders = {
            let mut pc = self.pool().acquire().await?;
            pc.conn()
                .all::<Holder>(
                    "SELECT DISTINCT leased_by FROM event_deliveries
                     WHERE tenant = $1 AND workspace = $2 AND status = 'pending'
                       AND leased_by IS NOT NULL AND leased_until > $3",
                    args![&s.tenant, &s.workspace, now],
                )
                .await?
        };
        let mut ended = 0u64;
        for h in holders {
            if !WorkerId::from_string(h.leased_by.clone()).is_provably_dead() {
                continue;
            }
            let a = args![&s.tenant, &s.workspace, h.leased_by, now];
            ended += self
                .write_statement(move |c| {
                    Box::pin(async move {
                        c.execute(
                            "UPDATE event_deliveries SET leased_until = $4, updated_at = $4
                             WHERE tenant = $1 AND workspace = $2 AND leased_by = $3
                               AND status = 'pending' AND leased_until > $4",
                            a,
                        )
                        .await
                    })
                })
                .await?;
        }
        Ok(u32::try_from(ended).unwrap_or(u32::MAX))
    }

    /// The highest outbox `seq` of this scope (`None` when empty): where `flow events
    /// tail` starts following.
    pub async fn last_event_seq(&self) -> Result<Option<i64>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let row = pc
            .conn()
            .optional::<IntRow>(
                "SELECT MAX(seq) AS n FROM outbox WHERE tenant = $1 AND workspace = $2
                 HAVING MAX(seq) IS NOT NULL",
                args![&s.tenant, &s.workspace],
            )
            .await?;
        Ok(row.map(|r| r.n))
    }
}
