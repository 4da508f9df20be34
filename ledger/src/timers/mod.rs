//! Timers: every durable deadline the daemons keep, one row shape read by one watcher.
//!
//! A timer is a row of the `timers` view (migration 0023): its kind, the run and the
//! subject it acts on, when it is due. The view reads each deadline from the row that
//! owns it — a hold's deadline or reminder, a paused run's due probe of a call in
//! doubt — so no write keeps a second copy in step. [`Ledger::fire_due_timers`] is the
//! watcher: one query takes the due timers of every kind, soonest first, and one
//! `match` on [`TimerKind`] hands each to its kind's rule, which acts by its own
//! compare-and-set (any number of daemons may fire at once; the loser of a race changes
//! nothing).
//!
//! Adding a kind of timer: a [`TimerKind`] variant, a branch of the view (both
//! backends' migration; its `subject` names what acts, so rows that act on the same
//! thing group into one timer), its arm in the one `match` below, and a conformance
//! case (the probes' is `probes::a_run_with_many_due_probes_is_one_timer_beside_a_hold`).
//! Deadlines still kept apart (issue 50, item 3): event deliveries' `next_attempt_at`
//! (the dispatcher's loop), schedule ticks (the scheduler's), retry `not_before` (the
//! claim), connection refreshes and retention passes.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::Timestamp;
use crate::conn::args;
use crate::error::{Error, ErrorClass};
use crate::holds::{DueHold, SweptHolds};
use crate::ledger::Ledger;
use crate::model::Actor;

crate::state::text_enum! {
    /// What fires when a timer is due.
    TimerKind {
        /// A pending hold (approval, event wait, callback): its deadline, an approval's
        /// next reminder, or at once when its run or step ended without it.
        Hold => "hold",
        /// A paused run's calls in doubt, due at the soonest next probe among them. The run
        /// goes back on the queue and its next holder probes before it pauses again.
        Probe => "probe",
    }
}

/// The engine's rules for timers whose effect the ledger cannot decide alone.
#[derive(Debug, Clone, Copy)]
pub struct TimerRules {
    /// An approval's next reminder after `sent` ones, from its rule's `remind` list and
    /// when it was asked (`None`: no more reminders).
    pub next_remind: fn(&Value, u32, Timestamp) -> Option<Timestamp>,
    /// Who re-queues a run for a due probe (the `by` of its `run.queued` event).
    pub probe_by: &'static str,
}

/// What one [`Ledger::fire_due_timers`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FiredTimers {
    /// The holds' timers: timed out, cancelled, reminded.
    pub holds: SweptHolds,
    /// Paused runs re-queued for a due probe of a call in doubt.
    pub probed: Vec<String>,
}

/// One row of the `timers` view, as the watcher reads it.
type TimerRow = (String, Option<String>, String, String, Option<i64>, i64);

impl Ledger {
    /// The daemons' one timer watcher: fires at most `limit` timers due at `now`, of
    /// every kind, soonest due first (a hold of an ended run or step is due at once),
    /// each by its kind's rule in its own transaction. A race lost to a decision, an
    /// operator or another daemon is not an error: that timer is simply not counted.
    pub async fn fire_due_timers(
        &self,
        now: Timestamp,
        limit: u32,
        rules: TimerRules,
    ) -> Result<FiredTimers, Error> {
        let s = self.scope();
        let due = {
            let mut pc = self.pool().acquire().await?;
            pc.conn()
                .all::<TimerRow>(
                    // Grouped after the filter: a run's due probes are one timer, and
                    // `due_at <= $3` still reaches each branch's index.
                    "SELECT kind, hold_kind, run_id, subject, MIN(deadline), MAX(ended)
                       FROM timers
                      WHERE tenant = $1 AND workspace = $2 AND due_at <= $3
                      GROUP BY kind, hold_kind, run_id, subject
                      ORDER BY MIN(due_at), run_id, subject LIMIT $4",
                    args![&s.tenant, &s.workspace, now, limit],
                )
                .await?
        };
        let mut fired = FiredTimers::default();
        for (kind, hold_kind, run_id, subject, deadline, ended) in due {
            match kind.parse::<TimerKind>()? {
                TimerKind::Hold => {
                    let Some(hold_kind) = hold_kind else {
                        return Err(Error::Corrupt {
                            what: format!("hold timer of run {run_id} without its kind"),
                        });
                    };
                    let hold = DueHold {
                        kind: hold_kind.parse()?,
                        run_id,
                        subject,
                        deadline: deadline.map(Timestamp),
                        ended: ended != 0,
                    };
                    self.fire_hold(hold, now, rules.next_remind, &mut fired.holds)
                        .await?;
                }
                TimerKind::Probe => {
                    let actor = Actor {
                        by: rules.probe_by.into(),
                        reason: Some("a probe of a call in doubt is due".into()),
                    };
                    match self.requeue_run_as(&run_id, Some(actor), now).await {
                        Ok(_) => fired.probed.push(run_id),
                        // Claimed, resumed or finished meanwhile: its holder probes.
                        Err(e)
                            if matches!(e.class(), ErrorClass::Conflict | ErrorClass::NotFound) => {
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(fired)
    }
}
