//! A brand-new pure call in ONE statement: the common case of a node's first attempt,
//! with no step and no call yet. On SQLite a script of chained inserts run in one command
//! on the connection's thread (each insert happens only if the one before it did, through
//! `changes()`), on PostgreSQL one statement of data-modifying CTEs (atomic without
//! `BEGIN`/`COMMIT`). Anything else writes nothing here and goes the general way
//! (`general.rs`).

use serde_json::json;

use crate::clock::Timestamp;
use crate::conn::{Arg, Conn, args};
use crate::error::Error;
use crate::fence::{Fence, live_run_fence};
use crate::ledger::Ledger;
use crate::model::RunLease;
use crate::rows::IntRow;
use crate::state::{StepStatus, attempt_key};

/// The outbox columns written here mirror `events::emit`: same table, same meaning.
const SQLITE_FRESH: &str = concat!(
    "
INSERT INTO steps (tenant, workspace, run_id, step_id, node_id, retry, status, created_at,
    updated_at, started_at, finished_at, output, error_kind, error_message, tool_call_id)
SELECT $1, $2, $3, $7, $8, $9, $15, $21, $22, $21, $22, $16, $17, $18, $10
WHERE EXISTS (SELECT 1 FROM runs WHERE",
    live_run_fence!(),
    ")
    AND NOT EXISTS (SELECT 1 FROM tool_calls WHERE tenant = $1 AND workspace = $2
        AND run_id = $3 AND tool_call_id = $10)
    AND NOT EXISTS (SELECT 1 FROM tool_calls WHERE tenant = $1 AND workspace = $2
        AND idempotency_key = $12)
ON CONFLICT DO NOTHING;
INSERT INTO tool_calls (tenant, workspace, run_id, tool_call_id, step_id, tool,
    idempotency_key, request, request_hash, status, attempt_count, outbound_requests, output,
    error_kind, error_message, lease_token, run_token, created_at, updated_at, finished_at)
SELECT $1, $2, $3, $10, $7, $11, $12, $13, $14, $15, 1, 0, $16, $17, $18, 1, $5, $21, $22, $22
WHERE changes() = 1;
INSERT INTO tool_call_attempts (tenant, workspace, id, run_id, tool_call_id, step_id, attempt,
    sent_key, outbound_started_at, finished_at, outcome, error_kind, error_message,
    requests_sent)
SELECT $1, $2, $19, $3, $10, $7, 1, $20, NULL, $22, $15, $17, $18, 0
WHERE changes() = 1;
INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id, payload)
SELECT $1, $2, $23, 'step.started', $21, $3, $7, NULL, $24
WHERE changes() = 1;
INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id, payload)
SELECT $1, $2, $25, $26, $22, $3, $7, $10, $27
WHERE changes() = 1
RETURNING 1 AS n;
"
);

/// The same on PostgreSQL. `FOR SHARE` keeps the run lease fenced for the statement (a
/// concurrent claim that bumps the token waits), as `check_run_lease` does; a racing
/// writer of the same step or call makes it fail with a unique violation, and then the
/// general way decides.
const POSTGRES_FRESH: &str = concat!(
    "
WITH ok AS (
    SELECT 1 AS one FROM runs
    WHERE",
    live_run_fence!(),
    "AND NOT EXISTS (SELECT 1 FROM tool_calls WHERE tenant = $1 AND workspace = $2
          AND run_id = $3 AND tool_call_id = $10)
      AND NOT EXISTS (SELECT 1 FROM tool_calls WHERE tenant = $1 AND workspace = $2
          AND idempotency_key = $12)
      AND NOT EXISTS (SELECT 1 FROM steps WHERE tenant = $1 AND workspace = $2
          AND run_id = $3 AND step_id = $7)
    FOR SHARE),
s AS (
    INSERT INTO steps (tenant, workspace, run_id, step_id, node_id, retry, status, created_at,
        updated_at, started_at, finished_at, output, error_kind, error_message, tool_call_id)
    SELECT $1, $2, $3, $7, $8, $9, $15, $21, $22, $21, $22, $16, $17, $18, $10 FROM ok),
c AS (
    INSERT INTO tool_calls (tenant, workspace, run_id, tool_call_id, step_id, tool,
        idempotency_key, request, request_hash, status, attempt_count, outbound_requests,
        output, error_kind, error_message, lease_token, run_token, created_at, updated_at,
        finished_at)
    SELECT $1, $2, $3, $10, $7, $11, $12, $13, $14, $15, 1, 0, $16, $17, $18, 1, $5, $21, $22,
        $22 FROM ok),
a AS (
    INSERT INTO tool_call_attempts (tenant, workspace, id, run_id, tool_call_id, step_id,
        attempt, sent_key, outbound_started_at, finished_at, outcome, error_kind,
        error_message, requests_sent)
    SELECT $1, $2, $19, $3, $10, $7, 1, $20, NULL, $22, $15, $17, $18, 0 FROM ok),
e AS (
    INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id,
        payload, txid)
    SELECT $1, $2, v.id, v.type, v.time, $3, $7, v.call, v.payload,
        pg_current_xact_id()::text::bigint
    FROM ok, (VALUES ($23, 'step.started', $21, NULL::text, $24, 1),
                     ($25, $26, $22, $10, $27, 2)) AS v(id, type, time, call, payload, k)
    ORDER BY v.k)
SELECT COUNT(*) AS n FROM ok
"
);

/// One brand-new pure call, ready to bind.
pub(super) struct Fresh {
    pub(super) step_id: String,
    pub(super) node_id: String,
    pub(super) retry: u32,
    pub(super) tool_call_id: String,
    pub(super) tool: String,
    pub(super) key: String,
    pub(super) request: String,
    pub(super) request_hash: String,
    pub(super) status: StepStatus,
    pub(super) output: Option<String>,
    pub(super) error: Option<crate::model::StepError>,
    pub(super) started_at: Timestamp,
    pub(super) finished_at: Timestamp,
}

impl Fresh {
    pub(super) fn args(&self, ledger: &Ledger, run: &RunLease, now: Timestamp) -> Vec<Arg> {
        let s = ledger.scope();
        let error_kind = self.error.as_ref().map(|e| e.kind.as_str());
        let error = self.error.as_ref().map(|e| e.message.clone());
        let event = match self.status {
            StepStatus::Succeeded => "step.succeeded",
            _ => "step.failed",
        };
        let (started, done) = self.payloads();
        let own = args![
            now,
            &self.step_id,
            &self.node_id,
            self.retry,
            &self.tool_call_id,
            &self.tool,
            &self.key,
            &self.request,
            &self.request_hash,
            self.status.as_str(),
            self.output.clone(),
            error_kind,
            error,
            format!("att_{}", ulid::Ulid::generate()),
            attempt_key(&self.key, 1),
            self.started_at,
            self.finished_at,
            crate::events::new_event_id(),
            started,
            crate::events::new_event_id(),
            event,
            done,
        ];
        [Fence::run(s, run), own].concat()
    }

    /// The payloads `create_step_in` (`step.started`) and `finish_step_in` would write.
    fn payloads(&self) -> (String, String) {
        let started = json!({
            "node_id": self.node_id,
            "retry": self.retry,
            "not_before": Option::<Timestamp>::None,
        });
        let done = json!({
            "node_id": self.node_id,
            "retry": self.retry,
            "error_kind": self.error.as_ref().map(|e| e.kind.as_str()),
            "error": self.error.as_ref().map(|e| e.message.clone()),
        });
        (started.to_string(), done.to_string())
    }

    /// This call as an element of the batch statements' array (a succeeded first
    /// attempt: `SQLITE_BATCH` / `POSTGRES_BATCH` write exactly what `*_FRESH` would).
    /// A struct serialized straight into the array (SQLite's JSONB, or JSON text on
    /// PostgreSQL: `conn::rows_arg`), not a `serde_json::Value` map: the map cost sixteen
    /// key and value allocations per node and a second walk to print it (callgrind,
    /// benches/README.md "W2").
    pub(super) fn batch_item(&self) -> BatchItem<'_> {
        let (p0, p1) = self.payloads();
        BatchItem {
            step: &self.step_id,
            node: &self.node_id,
            call: &self.tool_call_id,
            tool: &self.tool,
            key: &self.key,
            req: &self.request,
            hash: &self.request_hash,
            out: self.output.as_deref(),
            att: format!("att_{}", ulid::Ulid::generate()),
            sk: attempt_key(&self.key, 1),
            t0: self.started_at.0,
            t1: self.finished_at.0,
            e0: crate::events::new_event_id(),
            p0,
            e1: crate::events::new_event_id(),
            p1,
        }
    }
}

/// One element of the batch statements' array; the field names are what the
/// statements read (`->> 'step'`, …). Strings, integers and `Option`s only (see
/// `conn::rows_arg`).
#[derive(serde::Serialize)]
pub(super) struct BatchItem<'a> {
    step: &'a str,
    node: &'a str,
    call: &'a str,
    tool: &'a str,
    key: &'a str,
    req: &'a str,
    hash: &'a str,
    out: Option<&'a str>,
    att: String,
    sk: String,
    t0: i64,
    t1: i64,
    e0: String,
    p0: String,
    e1: String,
    p1: String,
}

/// Writes one brand-new pure call in one statement; `false` (nothing written) when the
/// step or call exists, the key is taken or the run lease does not hold.
pub(super) async fn write_fresh(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run: &RunLease,
    fresh: &Fresh,
    now: Timestamp,
) -> Result<bool, Error> {
    let sql = c.pick(SQLITE_FRESH, POSTGRES_FRESH);
    let rows = c.all::<IntRow>(sql, fresh.args(ledger, run, now)).await?;
    Ok(rows.first().is_some_and(|r| r.n == 1))
}
