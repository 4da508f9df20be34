//! The rows an effect attempt leaves beside its call: one `tool_call_attempts` row per
//! attempt that ended (sent or not), and one `usage` row per request that left. Written
//! in the transaction that records the attempt's outcome (`outbound.rs`, `pure/`, a
//! takeover in `calls.rs`).

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::CallLease;

/// One `tool_call_attempts` row.
pub(crate) struct AttemptRecord<'a> {
    pub run_id: &'a str,
    pub tool_call_id: &'a str,
    pub step_id: &'a str,
    pub attempt: i64,
    pub sent_key: String,
    pub outbound_started_at: Option<i64>,
    pub outcome: crate::model::AttemptOutcome,
    pub error_kind: Option<&'static str>,
    pub error_message: Option<String>,
    pub requests_sent: u32,
}

pub(crate) async fn insert_attempt(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    a: AttemptRecord<'_>,
    now: Timestamp,
) -> Result<(), Error> {
    let s = ledger.scope();
    c.execute(
        "INSERT INTO tool_call_attempts (tenant, workspace, id, run_id, tool_call_id, step_id,
            attempt, sent_key, outbound_started_at, finished_at, outcome, error_kind,
            error_message, requests_sent)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        args![
            &s.tenant,
            &s.workspace,
            format!("att_{}", ulid::Ulid::generate()),
            a.run_id,
            a.tool_call_id,
            a.step_id,
            a.attempt,
            a.sent_key,
            a.outbound_started_at,
            now,
            a.outcome.as_str(),
            a.error_kind,
            a.error_message,
            a.requests_sent,
        ],
    )
    .await?;
    Ok(())
}

/// One `usage` row per request sent: usage counts requests that left, not calls.
pub(crate) async fn insert_usage(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    lease: &CallLease,
    requests: u32,
    now: Timestamp,
) -> Result<(), Error> {
    let s = ledger.scope();
    for _ in 0..requests {
        c.execute(
            "INSERT INTO usage (tenant, workspace, id, run_id, tool_call_id, tool, attempt,
                sent_key, kind, quantity, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $10, 1, $9)",
            args![
                &s.tenant,
                &s.workspace,
                format!("use_{}", ulid::Ulid::generate()),
                &lease.run_id,
                &lease.tool_call_id,
                &lease.tool,
                lease.attempt,
                &lease.key,
                now,
                crate::model::UsageKind::Request.as_str(),
            ],
        )
        .await?;
    }
    Ok(())
}
