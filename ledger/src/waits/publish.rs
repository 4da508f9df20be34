//! Published events: `POST /api/v1/events:publish` stores one (idempotent on its id)
//! and signals the pending waits of its name; a `wait:` node's worker reads the
//! candidates and matches them (the `match` expression is the engine's).

use serde::Serialize;
use serde_json::Value;

use super::Wait;
use super::rows::{WaitRow, read_row};
use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::Scope;
use crate::runs::run_for_update;
use crate::state::{WaitKind, WaitStatus};

/// Longest event name and event id accepted.
pub const MAX_EVENT_NAME: usize = 200;
/// Most candidates one read of a wait's events returns (in `seq` order); a worker reads
/// page after page from where it stopped (`Wait::seen_seq`).
pub const MAX_CANDIDATES: usize = 1000;

/// An event as published.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PublishedEvent {
    /// Its place among the events of its name (1, 2, …).
    pub seq: i64,
    /// Its id (the publisher's, or `ev_<ULID>`): publishing it again is a no-op.
    pub event_id: String,
    /// Its name (`shipment.delivered`).
    pub name: String,
    /// Its data: what a wait's `match` reads as `event` and the node's output.
    pub data: Value,
    /// When it was stored.
    pub published_at: Timestamp,
    /// Who published it (token name or CLI user).
    pub published_by: Option<String>,
}

/// What a publish came to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Published {
    /// The event's id.
    pub event_id: String,
    /// The id was published before: nothing was stored or signalled again.
    pub duplicate: bool,
    /// Runs whose pending waits of this name were signalled (paused ones re-queued).
    pub signalled: u64,
}

#[derive(Debug, sqlx::FromRow)]
struct EventRow {
    seq: i64,
    event_id: String,
    name: String,
    data: String,
    published_at: i64,
    published_by: Option<String>,
}

impl EventRow {
    fn into_event(self) -> Result<PublishedEvent, Error> {
        Ok(PublishedEvent {
            data: serde_json::from_str(&self.data).map_err(|e| Error::Corrupt {
                what: format!("published event data is not JSON: {e}"),
            })?,
            seq: self.seq,
            event_id: self.event_id,
            name: self.name,
            published_at: Timestamp(self.published_at),
            published_by: self.published_by,
        })
    }
}

/// On PostgreSQL, the transaction lock of an event name: a publish and a wait's begin
/// of the same name take turns, so neither misses the other. SQLite has one writer.
pub(super) async fn lock_name(c: &mut Conn<'_>, s: &Scope, name: &str) -> Result<(), Error> {
    c.take_turns(&format!("flow-event:{}:{}:{name}", s.tenant, s.workspace))
        .await
}

fn check_text(what: &str, v: &str) -> Result<(), Error> {
    if v.trim().is_empty() || v.len() > MAX_EVENT_NAME || v.chars().any(char::is_control) {
        return Err(Error::InvalidEvent {
            reason: format!("the event {what} must be 1 to {MAX_EVENT_NAME} printable characters"),
        });
    }
    Ok(())
}

impl Ledger {
    /// Stores a published event (its id given, or `ev_<ULID>`) unless its id is
    /// already stored (then [`Published::duplicate`]: nothing changes), and in the same
    /// transaction signals every pending event wait of its name and re-queues their
    /// runs that are paused, so a worker looks at it.
    pub async fn publish_event(
        &self,
        name: &str,
        event_id: Option<&str>,
        data: &Value,
        by: Option<&str>,
        now: Timestamp,
    ) -> Result<Published, Error> {
        check_text("name", name)?;
        let event_id = match event_id {
            Some(id) => {
                check_text("id", id)?;
                id.to_owned()
            }
            None => format!("ev_{}", ulid::Ulid::generate()),
        };
        let data = self.checked_json(data)?;
        let (ledger, name, by) = (self.clone(), name.to_owned(), by.map(str::to_owned));
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                lock_name(c, s, &name).await?;
                let seq = last_seq(c, s, &name).await? + 1;
                let n = c
                    .execute(
                        "INSERT INTO published_events (tenant, workspace, event_id, name, seq,
                            data, published_at, published_by)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                         ON CONFLICT (tenant, workspace, event_id) DO NOTHING",
                        args![
                            &s.tenant,
                            &s.workspace,
                            &event_id,
                            &name,
                            seq,
                            &data,
                            now,
                            by
                        ],
                    )
                    .await?;
                if n == 0 {
                    return Ok(Published {
                        event_id,
                        duplicate: true,
                        signalled: 0,
                    });
                }
                let runs = c
                    .all::<(String,)>(
                        "SELECT DISTINCT run_id FROM waits WHERE tenant = $1 AND workspace = $2
                           AND event_name = $3 AND status = $4 AND kind = $5 ORDER BY run_id",
                        args![
                            &s.tenant,
                            &s.workspace,
                            &name,
                            WaitStatus::Pending.as_str(),
                            WaitKind::Event.as_str()
                        ],
                    )
                    .await?;
                // Each run is locked before its waits are written, in run id order: the
                // order a sweep or a pause takes them in.
                for (run_id,) in &runs {
                    let run = run_for_update(c, s, run_id).await?;
                    c.execute(
                        "UPDATE waits SET signal = signal + 1 WHERE tenant = $1 AND workspace = $2
                           AND run_id = $3 AND event_name = $4 AND status = $5 AND kind = $6",
                        args![
                            &s.tenant,
                            &s.workspace,
                            run_id,
                            &name,
                            WaitStatus::Pending.as_str(),
                            WaitKind::Event.as_str()
                        ],
                    )
                    .await?;
                    crate::run_states::requeue_paused(c, s, &run, None, now).await?;
                }
                Ok(Published {
                    event_id,
                    duplicate: false,
                    signalled: runs.len() as u64,
                })
            })
        })
        .await
    }

    /// A wait with the events that may complete it, in `seq` order from `after` (else
    /// from where its worker stopped, `seen_seq`): its name's published after the wait
    /// began (by `seq`, whatever the clocks say) or from `lookback` before, at most
    /// [`MAX_CANDIDATES`]. The wait is read first, so its `signal` counts at least every
    /// event the list misses.
    pub async fn wait_candidates(
        &self,
        run_id: &str,
        node_id: &str,
        after: Option<i64>,
    ) -> Result<Option<(Wait, Vec<PublishedEvent>)>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let mut conn = pc.conn();
        let c = &mut conn;
        let Some(row) = read_row(c, s, run_id, node_id).await? else {
            return Ok(None);
        };
        let events = candidates(c, s, &row, after.unwrap_or(row.seen_seq)).await?;
        Ok(Some((row.into_wait()?, events)))
    }

    /// Records that the run's worker looked at the wait's events up to `signal` (and
    /// read them up to `seen_seq`) and none matched, so a pause is not refused for them
    /// again and the next look reads on from there. Fenced by the run lease
    /// (as a pause is): a worker that lost the run is [`Error::LeaseLost`], so its count
    /// (maybe of an earlier step's wait) cannot hide an event from the new holder.
    pub async fn saw_signal(
        &self,
        lease: &crate::model::RunLease,
        node_id: &str,
        signal: i64,
        seen_seq: i64,
    ) -> Result<(), Error> {
        let (ledger, lease, node_id) = (self.clone(), lease.clone(), node_id.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                crate::ledger::check_run_lease(c, s, &lease, None).await?;
                c.execute(
                    "UPDATE waits SET seen_signal = CASE WHEN seen_signal < $5 THEN $5 ELSE seen_signal END,
                        seen_seq = CASE WHEN seen_seq < $6 THEN $6 ELSE seen_seq END
                     WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND node_id = $4",
                    args![&s.tenant, &s.workspace, &lease.run_id, &node_id, signal, seen_seq],
                )
                .await?;
                Ok(())
            })
        })
        .await
    }

    /// The events published under `name`, newest first (at most `limit`, 0 = 100).
    #[cfg(any(test, feature = "testkit"))]
    pub async fn list_published_events(
        &self,
        name: Option<&str>,
        limit: u32,
    ) -> Result<Vec<PublishedEvent>, Error> {
        let s = self.scope();
        let limit = crate::reads::page_limit(limit, 100);
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<EventRow>(
                "SELECT seq, event_id, name, data, published_at, published_by FROM published_events
                 WHERE tenant = $1 AND workspace = $2 AND ($3 IS NULL OR name = $3)
                 ORDER BY published_at DESC, event_id DESC LIMIT $4",
                args![&s.tenant, &s.workspace, name, limit],
            )
            .await?;
        rows.into_iter().map(EventRow::into_event).collect()
    }
}

async fn candidates(
    c: &mut Conn<'_>,
    s: &Scope,
    row: &WaitRow,
    after: i64,
) -> Result<Vec<PublishedEvent>, Error> {
    let Some(name) = &row.event_name else {
        return Ok(Vec::new());
    };
    let from = row.began_at.saturating_sub(row.lookback_ms.max(0));
    let rows = c
        .all::<EventRow>(
            "SELECT seq, event_id, name, data, published_at, published_by FROM published_events
             WHERE tenant = $1 AND workspace = $2 AND name = $3 AND seq > $4
               AND (seq > $5 OR published_at >= $6)
             ORDER BY seq LIMIT $7",
            args![
                &s.tenant,
                &s.workspace,
                name,
                after,
                row.begin_seq,
                from,
                MAX_CANDIDATES as i64
            ],
        )
        .await?;
    rows.into_iter().map(EventRow::into_event).collect()
}

/// The lowest `seq` of the events of `name` published at or after `from`, if any.
pub(super) async fn first_seq_since(
    c: &mut Conn<'_>,
    s: &Scope,
    name: &str,
    from: i64,
) -> Result<Option<i64>, Error> {
    let row = c
        .optional::<(Option<i64>,)>(
            "SELECT MIN(seq) FROM published_events
             WHERE tenant = $1 AND workspace = $2 AND name = $3 AND published_at >= $4",
            args![&s.tenant, &s.workspace, name, from],
        )
        .await?;
    Ok(row.and_then(|(n,)| n))
}

/// The last `seq` of the events of `name` (0 for none); under the name's lock.
pub(super) async fn last_seq(c: &mut Conn<'_>, s: &Scope, name: &str) -> Result<i64, Error> {
    let row = c
        .optional::<(i64,)>(
            "SELECT COALESCE(MAX(seq), CAST(0 AS BIGINT)) FROM published_events
             WHERE tenant = $1 AND workspace = $2 AND name = $3",
            args![&s.tenant, &s.workspace, name],
        )
        .await?;
    Ok(row.map_or(0, |(n,)| n))
}
