//! The waits table's row and the statements every wait operation shares: read a row,
//! and the row as the hold a settle moves (the compare-and-set itself is every kind's:
//! `holds::settle`).

use serde_json::Value;

use super::Wait;
use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::holds::HoldRef;
use crate::model::Scope;

#[derive(Debug, sqlx::FromRow)]
pub(super) struct WaitRow {
    pub(super) run_id: String,
    pub(super) node_id: String,
    pub(super) step_id: String,
    pub(super) kind: String,
    pub(super) status: String,
    pub(super) event_name: Option<String>,
    pub(super) matcher: Option<String>,
    pub(super) lookback_ms: i64,
    pub(super) began_at: i64,
    pub(super) deadline: i64,
    pub(super) hard_deadline: i64,
    pub(super) heartbeat_ms: Option<i64>,
    pub(super) last_beat_at: Option<i64>,
    pub(super) signal: i64,
    pub(super) seen_signal: i64,
    pub(super) begin_seq: i64,
    pub(super) seen_seq: i64,
    pub(super) settled_at: Option<i64>,
    pub(super) settled_by: Option<String>,
    pub(super) event_id: Option<String>,
    pub(super) output: Option<String>,
    pub(super) error: Option<String>,
}

macro_rules! wait_cols {
    () => {
        " run_id, node_id, step_id, kind, status, event_name, matcher, lookback_ms, began_at,
          deadline, hard_deadline, heartbeat_ms, last_beat_at, signal, seen_signal,
          begin_seq, seen_seq, settled_at, settled_by, event_id, output, error "
    };
}
pub(super) use wait_cols;

impl WaitRow {
    /// This wait as the hold a settle moves (`holds::settle`).
    pub(super) fn hold(&self) -> HoldRef<'_> {
        HoldRef {
            run_id: &self.run_id,
            step_id: &self.step_id,
            node_id: &self.node_id,
        }
    }

    pub(super) fn into_wait(self) -> Result<Wait, Error> {
        let output = match self.output.as_deref() {
            None => None,
            Some(s) => Some(
                serde_json::from_str::<Value>(s).map_err(|e| Error::Corrupt {
                    what: format!("wait output is not JSON: {e}"),
                })?,
            ),
        };
        Ok(Wait {
            kind: self.kind.parse()?,
            status: self.status.parse()?,
            run_id: self.run_id,
            node_id: self.node_id,
            step_id: self.step_id,
            event_name: self.event_name,
            matcher: self.matcher,
            lookback_ms: self.lookback_ms,
            began_at: Timestamp(self.began_at),
            deadline: Timestamp(self.deadline),
            hard_deadline: Timestamp(self.hard_deadline),
            heartbeat_ms: self.heartbeat_ms,
            last_beat_at: self.last_beat_at.map(Timestamp),
            signal: self.signal,
            seen_signal: self.seen_signal,
            begin_seq: self.begin_seq,
            seen_seq: self.seen_seq,
            settled_at: self.settled_at.map(Timestamp),
            settled_by: self.settled_by,
            event_id: self.event_id,
            output,
            error: self.error,
        })
    }
}

/// The wait row of (run, node) in the caller's transaction.
pub(super) async fn read_row(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
    node_id: &str,
) -> Result<Option<WaitRow>, Error> {
    c.optional::<WaitRow>(
        concat!(
            "SELECT ",
            wait_cols!(),
            " FROM waits WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND node_id = $4"
        ),
        args![&s.tenant, &s.workspace, run_id, node_id],
    )
    .await
}
