//! Retention of what is not a run: deleted by age, in batches of at most `limit` rows
//! per table and statement, each guarded by what still needs the row.
//!
//! Each part is one predicate written once: the delete walks it (`rowid` on SQLite,
//! `ctid` on PostgreSQL, so a table with a composite key needs no key list) and a dry
//! run counts it.

use serde::Serialize;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::rows::IntRow;

use super::Deleted;

/// The horizons of one sweep: rows older than each are deleted (`None`: kept).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Sweep {
    /// Outbox events (delivered to every consumer) and published events (no pending
    /// wait still to read them) before this.
    pub events_before: Option<Timestamp>,
    /// Schedule history recorded before this (the runs horizon).
    pub history_before: Option<Timestamp>,
    /// Key tombstones written (their run deleted) before this (the `keys` horizon).
    pub keys_before: Option<Timestamp>,
    /// Rate-limit windows that started before this (long closed).
    pub windows_before: Option<Timestamp>,
    /// Workflow texts no run references any more.
    pub texts: bool,
    /// At most this many rows per table and call.
    pub limit: u32,
}

/// One part of a sweep: a table, and its delete and count on one predicate (`o` is
/// the table's alias; `$1` tenant, `$2` workspace, `$3` the horizon, `$4` the limit).
struct Part {
    table: &'static str,
    sqlite: &'static str,
    postgres: &'static str,
    count: &'static str,
}

macro_rules! part {
    ($table:literal, $pred:expr) => {
        Part {
            table: $table,
            sqlite: concat!(
                "DELETE FROM ",
                $table,
                " WHERE rowid IN (SELECT o.rowid FROM ",
                $table,
                " o WHERE o.tenant = $1 AND o.workspace = $2 AND ",
                $pred,
                " LIMIT $4)"
            ),
            postgres: concat!(
                "DELETE FROM ",
                $table,
                " WHERE ctid IN (SELECT o.ctid FROM ",
                $table,
                " o WHERE o.tenant = $1 AND o.workspace = $2 AND ",
                $pred,
                " LIMIT $4)"
            ),
            count: concat!(
                "SELECT COUNT(*) AS n FROM (SELECT 1 FROM ",
                $table,
                " o WHERE o.tenant = $1 AND o.workspace = $2 AND ",
                $pred,
                " LIMIT $4) x"
            ),
        }
    };
}

/// Every consumer has scheduled event `$e` (its checkpoint, inclusive, is at or past
/// the event in (txid, seq) order).
macro_rules! consumers_have {
    ($e:literal) => {
        concat!(
            "NOT EXISTS (SELECT 1 FROM event_consumers ec WHERE ec.tenant = ",
            $e,
            ".tenant AND ec.workspace = ",
            $e,
            ".workspace AND (ec.last_txid < ",
            $e,
            ".txid OR (ec.last_txid = ",
            $e,
            ".txid AND ec.last_seq < ",
            $e,
            ".seq)))"
        )
    };
}

/// No delivery of event `$e` is pending or dead.
macro_rules! all_delivered {
    ($e:literal) => {
        concat!(
            "NOT EXISTS (SELECT 1 FROM event_deliveries d WHERE d.tenant = ",
            $e,
            ".tenant AND d.workspace = ",
            $e,
            ".workspace AND d.event_id = ",
            $e,
            ".id AND d.status <> 'delivered')"
        )
    };
}

/// An outbox event `$e` of no run, or of a run that is gone: a run's events stay as
/// long as the run (its audit trail, who submitted it, why a call is in doubt) and go
/// with it ([`RUN_EVENTS`]).
macro_rules! runless {
    ($e:literal) => {
        concat!(
            "(",
            $e,
            ".run_id IS NULL OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.tenant = ",
            $e,
            ".tenant AND r.workspace = ",
            $e,
            ".workspace AND r.id = ",
            $e,
            ".run_id))"
        )
    };
}

/// The deliveries of events about to go: only delivered ones (an event with any other
/// delivery is not deletable, `OUTBOX`), of events every consumer has scheduled.
const DELIVERIES: Part = part!(
    "event_deliveries",
    concat!(
        "o.status = 'delivered' AND o.event_id IN (SELECT e.id FROM outbox e
        WHERE e.tenant = $1 AND e.workspace = $2 AND e.time < $3 AND ",
        consumers_have!("e"),
        " AND ",
        all_delivered!("e"),
        " AND ",
        runless!("e"),
        ")"
    )
);

/// Outbox events before the horizon, of no run (or a deleted one), that every consumer
/// has scheduled and whose deliveries are gone (deleted just before, as delivered):
/// nothing pending or dead (an operator may still redeliver a dead one) is lost.
const OUTBOX: Part = part!(
    "outbox",
    concat!(
        "o.time < $3 AND ",
        consumers_have!("o"),
        " AND ",
        runless!("o"),
        " AND NOT EXISTS (SELECT 1 FROM event_deliveries d
           WHERE d.tenant = o.tenant AND d.workspace = o.workspace AND d.event_id = o.id)
         ORDER BY o.seq"
    )
);

/// What a dry run counts for the outbox: the events [`OUTBOX`] deletes once their
/// delivered deliveries are gone.
const OUTBOX_DRY: Part = part!(
    "outbox",
    concat!(
        "o.time < $3 AND ",
        consumers_have!("o"),
        " AND ",
        all_delivered!("o"),
        " AND ",
        runless!("o"),
        " ORDER BY o.seq"
    )
);

/// A deleted run's events that every consumer has, with their delivered deliveries
/// (`$3` the run): deleted in the run's transaction. Its other events (a consumer has
/// not had them) stay until they are delivered and past `events` ([`OUTBOX`]).
pub(super) const RUN_EVENT_DELIVERIES: &str = concat!(
    "DELETE FROM event_deliveries WHERE tenant = $1 AND workspace = $2 AND status = 'delivered'
       AND event_id IN (SELECT e.id FROM outbox e
         WHERE e.tenant = $1 AND e.workspace = $2 AND e.run_id = $3 AND ",
    consumers_have!("e"),
    " AND ",
    all_delivered!("e"),
    ")"
);

/// See [`RUN_EVENT_DELIVERIES`]: the events themselves, once no delivery of them is left.
pub(super) const RUN_EVENTS: &str = concat!(
    "DELETE FROM outbox WHERE tenant = $1 AND workspace = $2 AND run_id = $3
       AND id IN (SELECT e.id FROM outbox e
         WHERE e.tenant = $1 AND e.workspace = $2 AND e.run_id = $3 AND ",
    consumers_have!("e"),
    " AND NOT EXISTS (SELECT 1 FROM event_deliveries d
           WHERE d.tenant = e.tenant AND d.workspace = e.workspace AND d.event_id = e.id))"
);

/// PostgreSQL's one-statement deletion (`delete.rs`): the run's events of which no
/// delivery is left once `d_event_deliveries` (its sibling CTE, [`RUN_EVENT_DELIVERIES`]
/// returning `consumer, event_id`) has deleted the delivered ones. Both read one
/// snapshot, so "no delivery left" must be asked of what that CTE really deleted: a
/// delivery a redeliver set back to pending after the snapshot is skipped by it, and
/// keeps its event here too.
pub(super) const RUN_EVENTS_DELIVERED: &str = concat!(
    "DELETE FROM outbox WHERE tenant = $1 AND workspace = $2 AND run_id = $3
       AND id IN (SELECT e.id FROM outbox e
         WHERE e.tenant = $1 AND e.workspace = $2 AND e.run_id = $3 AND ",
    consumers_have!("e"),
    " AND NOT EXISTS (SELECT 1 FROM event_deliveries d
           WHERE d.tenant = e.tenant AND d.workspace = e.workspace AND d.event_id = e.id
             AND NOT EXISTS (SELECT 1 FROM d_event_deliveries x
               WHERE x.consumer = d.consumer AND x.event_id = d.event_id)))"
);

/// What a dry run counts of a run's events.
pub(super) const RUN_EVENTS_DRY: &str = concat!(
    "SELECT COUNT(*) AS n FROM outbox e
     WHERE e.tenant = $1 AND e.workspace = $2 AND e.run_id = $3 AND ",
    consumers_have!("e"),
    " AND ",
    all_delivered!("e")
);

/// Published events before the horizon that no pending wait of their name has yet to
/// read (a wait reads its name's events in `seq` order from `seen_seq`). The newest
/// event of each name stays: a name's next `seq` is its largest plus one, and a wait
/// reads the events after the `seq` it began at.
const PUBLISHED: Part = part!(
    "published_events",
    "o.published_at < $3
       AND NOT EXISTS (SELECT 1 FROM waits w
           WHERE w.tenant = o.tenant AND w.workspace = o.workspace
             AND w.event_name = o.name AND w.status = 'pending' AND w.seen_seq < o.seq)
       AND o.seq < (SELECT MAX(p.seq) FROM published_events p
           WHERE p.tenant = o.tenant AND p.workspace = o.workspace AND p.name = o.name)"
);

/// Tombstones written before the `keys` horizon.
const TOMBSTONES: Part = part!("key_tombstones", "o.deleted_at < $3");

/// Schedule history recorded before the runs horizon.
const HISTORY: Part = part!("schedule_history", "o.recorded_at < $3");

/// Rate-limit windows long closed (a day window ends a day after it starts).
const WINDOWS: Part = part!("rate_counters", "o.window_start < $3");

/// Workflow texts no run references (`$3` unused: a text goes with its last run).
const TEXTS: Part = part!(
    "workflow_texts",
    "o.created_at < $3 AND NOT EXISTS (SELECT 1 FROM runs r
        WHERE r.tenant = o.tenant AND r.workspace = o.workspace AND r.workflow_hash = o.hash)"
);

/// Runs one part: deletes (or counts) at most `limit` rows before `before`.
async fn run_part(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    part: &Part,
    before: Timestamp,
    limit: u32,
    dry_run: bool,
) -> Result<u64, Error> {
    let s = ledger.scope();
    let a = args![&s.tenant, &s.workspace, before, i64::from(limit)];
    if dry_run {
        let n = c
            .optional::<IntRow>(part.count, a)
            .await?
            .map_or(0, |r| r.n);
        return Ok(u64::try_from(n).unwrap_or(0));
    }
    let sql = c.pick(part.sqlite, part.postgres);
    c.execute(sql, a).await
}

impl Ledger {
    /// One sweep: every part whose horizon is set, each its own transaction of at most
    /// `sweep.limit` rows (outbox events with their deliveries in one). With `dry_run`
    /// nothing is written and the counts are what would go (each at most `limit`).
    pub async fn gc_sweep(
        &self,
        sweep: &Sweep,
        now: Timestamp,
        dry_run: bool,
    ) -> Result<Deleted, Error> {
        let mut deleted = Deleted::default();
        let limit = sweep.limit.max(1);
        let mut jobs: Vec<(Vec<&'static Part>, Timestamp)> = Vec::new();
        if let Some(at) = sweep.events_before {
            let outbox = if dry_run { &OUTBOX_DRY } else { &OUTBOX };
            jobs.push((vec![&DELIVERIES, outbox], at));
            jobs.push((vec![&PUBLISHED], at));
        }
        if let Some(at) = sweep.keys_before {
            jobs.push((vec![&TOMBSTONES], at));
        }
        if let Some(at) = sweep.history_before {
            jobs.push((vec![&HISTORY], at));
        }
        if let Some(at) = sweep.windows_before {
            jobs.push((vec![&WINDOWS], at));
        }
        if sweep.texts {
            // A text stored this minute may belong to a run whose enqueue has not
            // committed yet (PostgreSQL also locks the table, below).
            jobs.push((vec![&TEXTS], now.minus(std::time::Duration::from_secs(60))));
        }
        for (parts, before) in jobs {
            let counts = self.sweep_parts(parts, before, limit, dry_run).await?;
            for (table, n) in counts {
                deleted.add(table, n);
            }
        }
        Ok(deleted)
    }

    /// Runs `parts` in one transaction (or, on a dry run, one read connection).
    async fn sweep_parts(
        &self,
        parts: Vec<&'static Part>,
        before: Timestamp,
        limit: u32,
        dry_run: bool,
    ) -> Result<Vec<(&'static str, u64)>, Error> {
        if dry_run {
            let mut pc = self.pool().acquire().await?;
            let mut c = pc.conn();
            let mut out = Vec::new();
            for part in parts {
                out.push((
                    part.table,
                    run_part(&mut c, self, part, before, limit, true).await?,
                ));
            }
            return Ok(out);
        }
        let ledger = self.clone();
        self.write(move |c| {
            Box::pin(async move {
                let mut out = Vec::new();
                for part in parts {
                    if part.table == "workflow_texts" && c.is_postgres() {
                        // The lock stalls enqueues: taken only when a text may go.
                        let dry = run_part(c, &ledger, part, before, 1, true).await?;
                        if dry == 0 {
                            out.push((part.table, 0));
                            continue;
                        }
                        // An enqueue inserts its text (or finds it) before it commits; the
                        // lock waits for such enqueues, so the delete below sees their runs.
                        c.execute(
                            "LOCK TABLE workflow_texts IN SHARE ROW EXCLUSIVE MODE",
                            args![],
                        )
                        .await?;
                    }
                    out.push((
                        part.table,
                        run_part(c, &ledger, part, before, limit, false).await?,
                    ));
                }
                Ok(out)
            })
        })
        .await
    }
}
