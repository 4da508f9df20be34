//! How a wait ends: an event the worker matched, a callback to its token (or a
//! heartbeat that extends it), a wait's rule in the daemons' sweep of holds.

use serde_json::{Value, json};

use super::PublishedEvent;
use super::Wait;
use super::rows::{WaitRow, read_row, wait_cols};
use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::EventType;
use crate::fence::{Fence, live_run_fence};
use crate::holds::{Due, Outcome, Settle, settle};
use crate::ledger::Ledger;
use crate::model::{RunLease, Scope};
use crate::runs::run_for_update;
use crate::state::WaitStatus;

/// What a callback says (`POST /api/v1/callbacks/{token}`).
#[derive(Debug, Clone)]
pub struct CallbackReply {
    /// `true`: the node succeeds with `output`; `false`: it fails with `error`.
    pub ok: bool,
    /// The node's output.
    pub output: Option<Value>,
    /// Why the work failed.
    pub error: Option<String>,
}

fn not_found() -> Error {
    // One answer for an unknown, used, expired or foreign token: a caller learns
    // nothing by probing.
    Error::NotFound {
        what: "callback".into(),
    }
}

impl Ledger {
    /// Completes a pending event wait of the lease's run with the event the worker
    /// matched (`wait.completed`); the row as it stands after (someone else may have
    /// won: the deadline, a cancel).
    pub async fn complete_event_wait(
        &self,
        lease: &RunLease,
        node_id: &str,
        event: &PublishedEvent,
        now: Timestamp,
    ) -> Result<Wait, Error> {
        let (ledger, lease, node_id) = (self.clone(), lease.clone(), node_id.to_owned());
        let output = self.checked_json(&event.data)?;
        let (event_id, name) = (event.event_id.clone(), event.name.clone());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let held = c
                    .optional::<(i64,)>(
                        concat!("SELECT lease_token FROM runs WHERE", live_run_fence!()),
                        [Fence::run(s, &lease), args![now]].concat(),
                    )
                    .await?;
                if held.is_none() {
                    return Err(Error::LeaseLost);
                }
                let row = read_row(c, s, &lease.run_id, &node_id)
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        what: format!("wait of run {} node {node_id}", lease.run_id),
                    })?;
                let completed = Settle {
                    hold: row.hold(),
                    outcome: Outcome::Wait {
                        to: WaitStatus::Completed,
                        by: "event",
                        event_id: Some(event_id.clone()),
                        output: Some(output),
                        error: None,
                    },
                    event: Some((
                        EventType::WaitCompleted,
                        json!({ "kind": "event", "event_id": event_id, "event": name }),
                    )),
                    // This worker holds the run: it applies the event itself.
                    wake: None,
                };
                settle(c, s, completed, now).await?;
                read_row(c, s, &lease.run_id, &node_id)
                    .await?
                    .ok_or(Error::LeaseLost)?
                    .into_wait()
            })
        })
        .await
    }

    /// A callback to the token whose SHA-256 is `token_hash`: its pending wait becomes
    /// `completed` (`ok`) or `failed`, in one transaction with the run locked first
    /// (`wait.completed`; a paused run goes back on the queue). A wait whose call is
    /// still in flight is completed all the same: the worker applies it once the call
    /// is recorded. Unknown, used, expired and finished-run tokens are all
    /// [`Error::NotFound`].
    pub async fn callback(
        &self,
        token_hash: &str,
        reply: CallbackReply,
        now: Timestamp,
    ) -> Result<Wait, Error> {
        let output = reply
            .output
            .as_ref()
            .map(|v| self.checked_json(v))
            .transpose()?;
        self.known_token(token_hash).await?;
        let (ledger, token_hash) = (self.clone(), token_hash.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let (run, row) = live_token(c, s, &token_hash, now).await?;
                let to = if reply.ok {
                    WaitStatus::Completed
                } else {
                    WaitStatus::Failed
                };
                let payload = json!({ "kind": "callback", "ok": reply.ok, "error": reply.error });
                let answered = Settle {
                    hold: row.hold(),
                    outcome: Outcome::Wait {
                        to,
                        by: "callback",
                        event_id: None,
                        output: if reply.ok { output } else { None },
                        error: if reply.ok { None } else { reply.error.clone() },
                    },
                    event: Some((EventType::WaitCompleted, payload)),
                    wake: Some((&run, None)),
                };
                if !settle(c, s, answered, now).await? {
                    return Err(not_found());
                }
                read_row(c, s, &row.run_id, &row.node_id)
                    .await?
                    .ok_or_else(not_found)?
                    .into_wait()
            })
        })
        .await
    }

    /// A callback's heartbeat: the work is alive, so the wait's deadline moves to one
    /// heartbeat interval from now (never past its timeout). Answers as
    /// [`Ledger::callback`] does for a token that cannot be used.
    pub async fn callback_heartbeat(
        &self,
        token_hash: &str,
        now: Timestamp,
    ) -> Result<Wait, Error> {
        self.known_token(token_hash).await?;
        let (ledger, token_hash) = (self.clone(), token_hash.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let (_, row) = live_token(c, s, &token_hash, now).await?;
                let deadline = row.heartbeat_ms.map_or(row.deadline, |hb| {
                    row.hard_deadline.min(now.0.saturating_add(hb.max(0)))
                });
                c.execute(
                    "UPDATE waits SET deadline = $5, last_beat_at = $6
                     WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND node_id = $4
                       AND status = $7 AND step_id = $8",
                    args![
                        &s.tenant,
                        &s.workspace,
                        &row.run_id,
                        &row.node_id,
                        deadline,
                        now,
                        WaitStatus::Pending.as_str(),
                        &row.step_id
                    ],
                )
                .await?;
                read_row(c, s, &row.run_id, &row.node_id)
                    .await?
                    .ok_or_else(not_found)?
                    .into_wait()
            })
        })
        .await
    }

    /// [`Error::NotFound`] for a token never minted, read without a write transaction:
    /// a flood of made-up tokens does not queue behind (or in front of) the engine's
    /// writes.
    async fn known_token(&self, token_hash: &str) -> Result<(), Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let found = pc
            .conn()
            .optional::<(i64,)>(
                "SELECT CAST(1 AS BIGINT) FROM callback_tokens
                 WHERE token_hash = $1 AND tenant = $2 AND workspace = $3",
                args![token_hash, &s.tenant, &s.workspace],
            )
            .await?;
        found.map(|_| ()).ok_or_else(not_found)
    }

    /// A wait's rule (event or callback) when its hold's timer fires
    /// (`Ledger::fire_due_timers`): a wait past its deadline (or a missed heartbeat's)
    /// times out (`wait.timed_out`, its paused run back on the queue); a wait of a
    /// finished run, or of a step that ended without it (a failed call), is cancelled so
    /// its token answers 404. `false` when it was no longer pending or not yet due.
    pub(crate) async fn wait_due(
        &self,
        run_id: &str,
        node_id: &str,
        due: Due,
        now: Timestamp,
    ) -> Result<bool, Error> {
        let to = match due {
            Due::TimedOut => WaitStatus::TimedOut,
            Due::Cancelled => WaitStatus::Cancelled,
            Due::Remind => return Ok(false),
        };
        let ledger = self.clone();
        let (run_id, node_id) = (run_id.to_owned(), node_id.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let run = run_for_update(c, s, &run_id).await?;
                let Some(row) = read_row(c, s, &run_id, &node_id).await? else {
                    return Ok(false);
                };
                let due = to == WaitStatus::Cancelled || row.deadline <= now.0;
                if row.status != WaitStatus::Pending.as_str() || !due {
                    return Ok(false);
                }
                let event = (to == WaitStatus::TimedOut).then(|| {
                    let payload = json!({ "deadline": row.deadline, "kind": row.kind });
                    (EventType::WaitTimedOut, payload)
                });
                let due = Settle {
                    hold: row.hold(),
                    outcome: Outcome::wait(to, "sweep"),
                    wake: event.as_ref().map(|_| (&run, None)),
                    event,
                };
                if !settle(c, s, due, now).await? {
                    return Ok(false);
                }
                Ok(true)
            })
        })
        .await
    }
}

/// The run (locked) and the pending wait a token may still settle: the token is known,
/// its run is not finished, its wait is pending for the token's step and not past its
/// deadline. Anything else is [`Error::NotFound`].
async fn live_token(
    c: &mut Conn<'_>,
    s: &Scope,
    token_hash: &str,
    now: Timestamp,
) -> Result<(crate::rows::RunRow, WaitRow), Error> {
    let Some((run_id, node_id, step_id)) = c
        .optional::<(String, String, String)>(
            "SELECT run_id, node_id, step_id FROM callback_tokens
             WHERE token_hash = $1 AND tenant = $2 AND workspace = $3",
            args![token_hash, &s.tenant, &s.workspace],
        )
        .await?
    else {
        return Err(not_found());
    };
    let run = run_for_update(c, s, &run_id)
        .await
        .map_err(|_| not_found())?;
    if run.status()?.is_terminal() {
        return Err(not_found());
    }
    // The token's step must still be live: a step that failed (its retry waits anew,
    // under a new token) or was skipped takes no callback.
    let row = c
        .optional::<WaitRow>(
            concat!(
                "SELECT ",
                wait_cols!(),
                " FROM waits WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                   AND node_id = $4 AND step_id = $5 AND status = $6 AND deadline > $7
                   AND EXISTS (SELECT 1 FROM steps st WHERE st.tenant = $1
                     AND st.workspace = $2 AND st.run_id = $3 AND st.step_id = $5
                     AND st.status IN ('running', 'paused'))"
            ),
            args![
                &s.tenant,
                &s.workspace,
                &run_id,
                &node_id,
                &step_id,
                WaitStatus::Pending.as_str(),
                now
            ],
        )
        .await?
        .ok_or_else(not_found)?;
    Ok((run, row))
}
