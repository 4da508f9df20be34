//! Concurrency slots: at most N calls of a tool between the outbound mark and their
//! outcome, counted across every daemon and host (migration 0025).
//!
//! A slot is the call row itself, not a counter kept beside it: a call holds a slot of
//! its limit (`tool_calls.slot`) while its status is `outbound` or `in_doubt`. The mark
//! that takes the slot is the outbound mark, in the same transaction as the count, so a
//! crash and a resume can never exceed the limit, a call in doubt counts as spent until
//! it is resolved (or an operator releases it, [`Ledger::release_slot`]), and a
//! completed, given-back or resolved call frees its slot by its status alone — no write
//! path has to remember to give it back.
//!
//! A call refused a slot stays `claimed` with no holder (as a rate-limited one does),
//! with `slot` and `slot_waiting_since` set: it is a *waiter*. The waiters of a limit are
//! served oldest first: a mark is granted only when the calls in flight plus the live
//! waiters older than this one leave room. A waiter is live while its run is queued or
//! running and it asked within [`WAITER_FRESH`]; a waiter whose node moved on (a
//! deadline, a cancel) stops counting by itself. When a call in a slot completes, the
//! oldest waiter's run, if parked on the queue, is made due at once.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::{EventType, NewEvent, emit};
use crate::fence::call_fence;
use crate::ledger::Ledger;
use crate::model::Scope;
use crate::model::{Actor, CallLease};
use crate::rows::{TextRow, count};
use crate::state::CallTransition;
use serde_json::json;

/// A waiter that has not asked for its slot again within this long no longer holds its
/// place in line (its run was parked and not claimed since, or its node moved on).
pub const WAITER_FRESH: Duration = Duration::from_secs(30);

/// The limit a call counts against: at most `limit` calls named `key` in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// What the calls that share the limit have in common (`<workflow>/<tool>`).
    pub key: String,
    /// How many of them may be between the outbound mark and their outcome at once.
    pub limit: u32,
}

/// What [`Ledger::mark_outbound_in_slot`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotMark {
    /// The call took a slot and is marked outbound: it may be sent.
    Marked,
    /// No slot: the claim was let go (the call waits, `claimed`, with no holder).
    Full {
        /// Calls holding a slot of the limit (outbound or in doubt).
        in_use: u32,
        /// Live waiters ahead of this call.
        ahead: u32,
    },
}

/// One limit's use, for metrics and the status pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotUse {
    /// The limit's key (`<workflow>/<tool>`).
    pub key: String,
    /// Calls in a slot whose outcome is not known yet (`outbound`).
    pub in_flight: u32,
    /// Calls in a slot that are in doubt: they keep it until resolved or released.
    pub in_doubt: u32,
    /// Live waiters.
    pub waiting: u32,
}

/// Whether the `tool_calls` row `w` is a *live* waiter: refused a slot, still claimed,
/// asked again no earlier than the parameter `$fresh`, and its run queued or running.
/// The one definition the line's order, the wake-up and the gauge all read.
macro_rules! live_waiter {
    ($fresh:literal) => {
        concat!(
            " w.status = 'claimed' AND w.slot_waiting_since IS NOT NULL
              AND w.updated_at >= ",
            $fresh,
            " AND EXISTS (SELECT 1 FROM runs r WHERE r.tenant = w.tenant
                  AND r.workspace = w.workspace AND r.id = w.run_id
                  AND r.status IN ('queued', 'running')) "
        )
    };
}

/// The calls in flight and the live waiters ahead of the call (`$4`, `$5`) of limit `$3`.
/// `$6` is now, `$7` the oldest a live waiter's last ask may be.
const COUNT: &str = concat!(
    "WITH me AS (
        SELECT COALESCE(slot_waiting_since, $6) AS since FROM tool_calls
        WHERE tenant = $1 AND workspace = $2 AND run_id = $4 AND tool_call_id = $5)
    SELECT
        (SELECT count(*) FROM tool_calls
         WHERE tenant = $1 AND workspace = $2 AND slot = $3
           AND status IN ('outbound', 'in_doubt')) AS n,
        (SELECT count(*) FROM tool_calls w, me
         WHERE w.tenant = $1 AND w.workspace = $2 AND w.slot = $3 AND",
    live_waiter!("$7"),
    "AND (w.slot_waiting_since < me.since
             OR (w.slot_waiting_since = me.since
               AND (w.run_id < $4 OR (w.run_id = $4 AND w.tool_call_id < $5))))) AS ahead"
);

/// The counts [`COUNT`] returns.
#[derive(sqlx::FromRow)]
struct Counts {
    n: i64,
    ahead: i64,
}

impl Ledger {
    /// [`Ledger::mark_outbound`] for a call whose tool has a concurrency limit: in one
    /// transaction, the calls in flight and the waiters ahead are counted and, when there
    /// is room, the call is marked outbound in `slot`; when there is none, the claim is
    /// let go and the call waits in line (`SlotMark::Full`). On PostgreSQL the limit's
    /// transaction lock makes concurrent marks of the same limit take turns (SQLite has
    /// one writer), so no two see the same free slot.
    pub async fn mark_outbound_in_slot(
        &self,
        lease: &CallLease,
        slot: &Slot,
        now: Timestamp,
    ) -> Result<SlotMark, Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        let slot = slot.clone();
        self.write(move |c| {
            Box::pin(async move {
                let scope = ledger.scope();
                // The limit's marks take turns (PostgreSQL; SQLite has one writer).
                c.take_turns(&format!(
                    "flow-slot:{}:{}:{}",
                    scope.tenant, scope.workspace, slot.key
                ))
                .await?;
                let counts = c
                    .optional::<Counts>(
                        COUNT,
                        args![
                            &scope.tenant,
                            &scope.workspace,
                            &slot.key,
                            &lease.run_id,
                            &lease.tool_call_id,
                            now,
                            now.minus(WAITER_FRESH),
                        ],
                    )
                    .await?
                    .ok_or(Error::LeaseLost)?;
                let (in_use, ahead) = (count(counts.n), count(counts.ahead));
                if in_use.saturating_add(ahead) < slot.limit {
                    ledger.mark_in(c, &lease, Some(&slot.key), now).await?;
                    return Ok(SlotMark::Marked);
                }
                let why = format!(
                    "waiting for a slot of {}: {in_use} of {} in flight or in doubt, \
                     {ahead} waiting ahead",
                    slot.key, slot.limit
                );
                wait_in_line(c, &ledger, &lease, &slot.key, &why, now).await?;
                Ok(SlotMark::Full { in_use, ahead })
            })
        })
        .await
    }

    /// The use of every limit that has calls in a slot or waiting, by key.
    pub async fn slot_use(&self, now: Timestamp) -> Result<Vec<SlotUse>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<SlotRow>(
                concat!(
                    "SELECT w.slot AS key,
                        SUM(CASE WHEN w.status = 'outbound' THEN 1 ELSE 0 END) AS in_flight,
                        SUM(CASE WHEN w.status = 'in_doubt' THEN 1 ELSE 0 END) AS in_doubt,
                        SUM(CASE WHEN",
                    live_waiter!("$3"),
                    "THEN 1 ELSE 0 END) AS waiting
                     FROM tool_calls w
                     WHERE w.tenant = $1 AND w.workspace = $2 AND w.slot IS NOT NULL
                       AND w.status IN ('outbound', 'in_doubt', 'claimed')
                     GROUP BY w.slot ORDER BY w.slot"
                ),
                args![&s.tenant, &s.workspace, now.minus(WAITER_FRESH)],
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| SlotUse {
                key: r.key,
                in_flight: count(r.in_flight),
                in_doubt: count(r.in_doubt),
                waiting: count(r.waiting),
            })
            .filter(|u| u.in_flight + u.in_doubt + u.waiting > 0)
            .collect())
    }

    /// Releases the slot a call in doubt holds (an operator who knows the downstream is
    /// no longer working on it): the call stays in doubt, but no longer counts against
    /// its tool's concurrency limit; `tool_call.slot_released` records who and why, in
    /// the same transaction. `Ok(false)` when the call is not in doubt in a slot.
    pub async fn release_slot(
        &self,
        run_id: &str,
        tool_call_id: &str,
        actor: &Actor,
        now: Timestamp,
    ) -> Result<bool, Error> {
        let ledger = self.clone();
        let (run_id, tool_call_id) = (run_id.to_owned(), tool_call_id.to_owned());
        let actor = actor.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let released = c
                    .optional::<TextRow>(
                        "UPDATE tool_calls SET slot = NULL, updated_at = $5
                         WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                           AND tool_call_id = $4 AND status = 'in_doubt' AND slot IS NOT NULL
                         RETURNING step_id AS t",
                        args![&s.tenant, &s.workspace, &run_id, &tool_call_id, now],
                    )
                    .await?;
                let Some(step) = released else {
                    return Ok(false);
                };
                let event = NewEvent {
                    event_type: EventType::ToolCallSlotReleased,
                    run_id: &run_id,
                    step_id: Some(&step.t),
                    tool_call_id: Some(&tool_call_id),
                    payload: json!({ "by": actor.by, "reason": actor.reason }),
                };
                emit(c, s, now, event).await?;
                Ok(true)
            })
        })
        .await
    }
}

/// One row of [`Ledger::slot_use`].
#[derive(sqlx::FromRow)]
struct SlotRow {
    key: String,
    in_flight: i64,
    in_doubt: i64,
    waiting: i64,
}

/// The holder lets go of a claimed call that found no slot: it waits in line under
/// `key` since its first refusal (`CallTransition::Release`, status unchanged).
async fn wait_in_line(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    lease: &CallLease,
    key: &str,
    why: &str,
    now: Timestamp,
) -> Result<(), Error> {
    let (from, _) = CallTransition::Release.states();
    let mut a = crate::fence::Fence::call(ledger.scope(), lease);
    a.extend(args![now, from.as_str(), key, why]);
    let n = c
        .execute(
            concat!(
                "UPDATE tool_calls SET lease_holder = NULL, lease_expires_at = $8,
                    updated_at = $8, slot = $10, waiting = $11,
                    slot_waiting_since = COALESCE(slot_waiting_since, $8)
                 WHERE",
                call_fence!(),
                "AND status = $9"
            ),
            a,
        )
        .await?;
    if n == 0 {
        return Err(Error::LeaseLost);
    }
    Ok(())
}

/// After a call in `slot` ended: the oldest live waiter's run, if it is parked on the
/// queue, is due now (a slot is free for it). One statement; nothing when nobody waits.
pub(crate) async fn wake_next_waiter(
    c: &mut Conn<'_>,
    s: &Scope,
    slot: &str,
    now: Timestamp,
) -> Result<(), Error> {
    c.execute(
        concat!(
            "UPDATE runs SET not_before = $4
             WHERE tenant = $1 AND workspace = $2 AND status = 'queued' AND not_before > $4
               AND id = (SELECT w.run_id FROM tool_calls w
                   WHERE w.tenant = $1 AND w.workspace = $2 AND w.slot = $3 AND",
            live_waiter!("$5"),
            "ORDER BY w.slot_waiting_since, w.run_id, w.tool_call_id LIMIT 1)"
        ),
        args![&s.tenant, &s.workspace, slot, now, now.minus(WAITER_FRESH)],
    )
    .await?;
    Ok(())
}
