//! Waits (migration 0011): a node that completes from outside the run. A `wait:` node
//! waits for a published event its `match` accepts; a node with `callback:` sends its
//! call through the gateway as any other and then waits for its callback token.
//!
//! One row per (run, node) moves from `pending` by every hold's one settle
//! (`holds::settle`): an event, a callback, the deadline and a cancel race there and
//! exactly one wins. The row is written before the call is rendered (a callback's token
//! is minted with it), so a callback that comes back before the call's response was
//! recorded is kept, and applied once the call is.

mod publish;
mod rows;
mod settle;

use serde::Serialize;
use serde_json::{Value, json};

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::EventType;
use crate::events::{NodeRef, node_event};
use crate::fence::{Fence, live_run_fence};
use crate::holds::{Outcome, Settle, settle};
use crate::ledger::Ledger;
use crate::model::{RunLease, Scope};
use crate::state::{WaitKind, WaitStatus};
use rows::{read_row, wait_cols};

pub use publish::{MAX_CANDIDATES, Published, PublishedEvent};
pub use settle::CallbackReply;

/// What a node begins to wait for (the gateway, under the run's lease).
#[derive(Debug, Clone)]
pub struct BeginWait {
    /// The node.
    pub node_id: String,
    /// The step that waits.
    pub step_id: String,
    /// An event or a callback.
    pub kind: WaitKind,
    /// The event's name (`wait.event.name`).
    pub event_name: Option<String>,
    /// The `match` expression as written, for views.
    pub matcher: Option<String>,
    /// How far before the wait began a published event still counts.
    pub lookback_ms: i64,
    /// How long it may wait, from when it began.
    pub timeout_ms: i64,
    /// A callback's heartbeat: each heartbeat must come within this long of the last.
    pub heartbeat_ms: Option<i64>,
    /// A callback token's SHA-256 (hex), minted for this render of the call.
    pub token_hash: Option<String>,
}

/// A wait as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Wait {
    /// The run.
    pub run_id: String,
    /// The node.
    pub node_id: String,
    /// The step that waits.
    pub step_id: String,
    /// An event or a callback.
    pub kind: WaitKind,
    /// Where it stands.
    pub status: WaitStatus,
    /// The event's name (event waits).
    pub event_name: Option<String>,
    /// The `match` expression as written.
    pub matcher: Option<String>,
    /// How far before `began_at` an event still counts.
    pub lookback_ms: i64,
    /// When the wait began.
    pub began_at: Timestamp,
    /// When the sweep times it out (the timeout, or a missed heartbeat sooner).
    pub deadline: Timestamp,
    /// When it times out whatever the heartbeats say.
    pub hard_deadline: Timestamp,
    /// A callback's heartbeat interval.
    pub heartbeat_ms: Option<i64>,
    /// The last heartbeat.
    pub last_beat_at: Option<Timestamp>,
    /// Events published under `event_name` since it began (see `seen_signal`).
    #[serde(skip)]
    pub signal: i64,
    /// The count the run's worker last looked at.
    #[serde(skip)]
    pub seen_signal: i64,
    /// The name's last event `seq` when the wait began: later ones are candidates.
    #[serde(skip)]
    pub begin_seq: i64,
    /// How far (by `seq`) the run's worker has read the candidates.
    #[serde(skip)]
    pub seen_seq: i64,
    /// When it was settled.
    pub settled_at: Option<Timestamp>,
    /// Who settled it (`callback`, `event`, the sweep, …).
    pub settled_by: Option<String>,
    /// The event that completed it.
    pub event_id: Option<String>,
    /// The node's output: the event's data, or the callback's `output`.
    pub output: Option<Value>,
    /// The callback's error (`ok: false`).
    pub error: Option<String>,
}

/// Which waits [`Ledger::list_waits`] returns (earliest deadline first).
#[derive(Debug, Clone, Default)]
pub struct WaitFilter {
    /// Only this run's.
    pub run_id: Option<String>,
    /// Only this status (`None`: every status).
    pub status: Option<WaitStatus>,
    /// At most this many (0 = 1000).
    pub limit: u32,
}

impl Ledger {
    /// Begins (or finds) the wait of a node's step, under the run's live lease, in one
    /// transaction: no row, or a row of an earlier step → a `pending` row for this step
    /// (`wait.requested`); this step's row is kept as it stands (a resumed wait keeps its
    /// deadline), and if it is `pending` past its deadline it times out here, by the
    /// compare-and-set the sweep uses. A callback token's hash is recorded with it.
    ///
    /// On PostgreSQL an event wait takes the transaction lock of its event name, as a
    /// publish of that name does: a publish either committed before this wait began
    /// (and the worker's first look finds the event) or signals this wait.
    pub async fn begin_wait(
        &self,
        lease: &RunLease,
        begin: BeginWait,
        now: Timestamp,
    ) -> Result<Wait, Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                // The order every wait writer takes: the name's lock, the run row, the
                // wait row (a publish, the sweep and a callback lock the run first too).
                if let Some(name) = &begin.event_name {
                    publish::lock_name(c, s, name).await?;
                }
                crate::runs::run_for_update(c, s, &lease.run_id).await?;
                let held = c
                    .optional::<(i64,)>(
                        concat!("SELECT lease_token FROM runs WHERE", live_run_fence!()),
                        [Fence::run(s, &lease), args![now]].concat(),
                    )
                    .await?;
                if held.is_none() {
                    return Err(Error::LeaseLost);
                }
                let run_id = lease.run_id.as_str();
                let row = read_row(c, s, run_id, &begin.node_id).await?;
                match row {
                    Some(row) if row.step_id == begin.step_id => {
                        let status: WaitStatus = row.status.parse()?;
                        if status == WaitStatus::Pending && now.0 >= row.deadline {
                            // This worker holds the run: it applies the time-out itself.
                            let timed_out = Settle {
                                hold: row.hold(),
                                outcome: Outcome::wait(WaitStatus::TimedOut, "deadline"),
                                event: Some((
                                    EventType::WaitTimedOut,
                                    json!({ "deadline": row.deadline }),
                                )),
                                wake: None,
                            };
                            settle(c, s, timed_out, now).await?;
                        }
                    }
                    existing => begin_row(c, s, run_id, &begin, existing.is_some(), now).await?,
                }
                if let Some(hash) = &begin.token_hash {
                    c.execute(
                        "INSERT INTO callback_tokens (token_hash, tenant, workspace, run_id,
                            node_id, step_id, created_at)
                         VALUES ($1, $2, $3, $4, $5, $6, $7)",
                        args![
                            hash,
                            &s.tenant,
                            &s.workspace,
                            run_id,
                            &begin.node_id,
                            &begin.step_id,
                            now
                        ],
                    )
                    .await?;
                }
                read_row(c, s, run_id, &begin.node_id)
                    .await?
                    .ok_or(Error::LeaseLost)?
                    .into_wait()
            })
        })
        .await
    }

    /// The wait of (run, node), if the node has begun one.
    pub async fn get_wait(&self, run_id: &str, node_id: &str) -> Result<Option<Wait>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let mut conn = pc.conn();
        read_row(&mut conn, s, run_id, node_id)
            .await?
            .map(rows::WaitRow::into_wait)
            .transpose()
    }

    /// Waits under `filter`, earliest deadline first.
    pub async fn list_waits(&self, filter: WaitFilter) -> Result<Vec<Wait>, Error> {
        let s = self.scope();
        let limit = crate::reads::page_limit(filter.limit, 1000);
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<rows::WaitRow>(
                concat!(
                    "SELECT ",
                    wait_cols!(),
                    " FROM waits WHERE tenant = $1 AND workspace = $2
                       AND ($3 IS NULL OR run_id = $3) AND ($4 IS NULL OR status = $4)
                     ORDER BY deadline, run_id, node_id LIMIT $5"
                ),
                args![
                    &s.tenant,
                    &s.workspace,
                    filter.run_id,
                    filter.status.map(|st| st.as_str()),
                    limit
                ],
            )
            .await?;
        rows.into_iter().map(rows::WaitRow::into_wait).collect()
    }

    /// How many waits are pending (the `flow_waits_pending` gauge).
    pub async fn count_pending_waits(&self) -> Result<u64, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let n = pc
            .conn()
            .optional::<(i64,)>(
                "SELECT COUNT(*) FROM waits WHERE tenant = $1 AND workspace = $2 AND status = $3",
                args![&s.tenant, &s.workspace, WaitStatus::Pending.as_str()],
            )
            .await?
            .map_or(0, |(n,)| n);
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// Writes a `pending` row for `begin`'s step: a new row, or (`replace`) over the row of
/// an earlier step of the node (a retry or a redrive waits anew). Emits `wait.requested`.
async fn begin_row(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
    begin: &BeginWait,
    replace: bool,
    now: Timestamp,
) -> Result<(), Error> {
    let hard = now.0.saturating_add(begin.timeout_ms.max(0));
    let deadline = begin
        .heartbeat_ms
        .map_or(hard, |hb| hard.min(now.0.saturating_add(hb.max(0))));
    if replace {
        c.execute(
            "DELETE FROM waits WHERE tenant = $1 AND workspace = $2 AND run_id = $3
               AND node_id = $4",
            args![&s.tenant, &s.workspace, run_id, &begin.node_id],
        )
        .await?;
    }
    // Every event of the name after `begin_seq` is a candidate; before it, those from
    // `lookback` before now: the first look starts reading at the earliest of them.
    let (begin_seq, start) = match &begin.event_name {
        Some(name) => {
            let last = publish::last_seq(c, s, name).await?;
            let from = now.0.saturating_sub(begin.lookback_ms.max(0));
            let first = publish::first_seq_since(c, s, name, from).await?;
            (last, first.map_or(last, |f| (f - 1).min(last)))
        }
        None => (0, 0),
    };
    c.execute(
        "INSERT INTO waits (tenant, workspace, run_id, node_id, step_id, kind, status,
            event_name, matcher, lookback_ms, began_at, deadline, hard_deadline, heartbeat_ms,
            begin_seq, seen_seq)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
        args![
            &s.tenant,
            &s.workspace,
            run_id,
            &begin.node_id,
            &begin.step_id,
            begin.kind.as_str(),
            WaitStatus::Pending.as_str(),
            begin.event_name.clone(),
            begin.matcher.clone(),
            begin.lookback_ms.max(0),
            now,
            deadline,
            hard,
            begin.heartbeat_ms,
            begin_seq,
            start
        ],
    )
    .await?;
    let payload = json!({
        "kind": begin.kind.as_str(), "event": begin.event_name, "deadline": deadline,
    });
    let ids = NodeRef {
        run_id,
        step_id: begin.step_id.as_str(),
        node_id: begin.node_id.as_str(),
    };
    node_event(c, s, ids, EventType::WaitRequested, payload, now).await
}
