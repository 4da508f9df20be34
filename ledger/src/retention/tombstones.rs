//! Idempotency-key tombstones (migration 0015): what a deleted run's keys promised.
//!
//! A run deleted by retention leaves one row per call whose request may have left: the
//! key's SHA-256, the run and node, the request digest and how the call ended. A claim of a key that no
//! call holds looks here before it inserts: a tombstoned key is refused
//! ([`Error::KeyRetired`]), never sent again as if new and never replayed from data that
//! is gone. Tombstones are written in the transaction that deletes the run, so a crash
//! leaves either the run or its tombstones.

use serde::Serialize;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::Scope;
use crate::state::CallStatus;

/// The stored form of an idempotency key: its SHA-256, lowercase hex. Keys are often
/// made of order numbers or e-mail addresses; the tombstone outlives the run that held
/// them, so it keeps only what a lookup needs.
pub fn key_hash(key: &str) -> String {
    crate::canonical::sha256_hex(key)
}

/// A deleted run's key, as its tombstone records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tombstone {
    /// The run that used the key (deleted).
    pub run_id: String,
    /// Its node.
    pub node_id: String,
    /// The canonical digest of the request it sent.
    pub request_hash: String,
    /// How the call ended: `succeeded` or `failed`.
    pub outcome: CallStatus,
    /// When that run finished.
    pub used_at: Timestamp,
    /// When retention deleted the run: the tombstone expires `keys` after it.
    pub deleted_at: Timestamp,
}

#[derive(sqlx::FromRow)]
struct TombstoneRow {
    run_id: String,
    node_id: String,
    request_hash: String,
    outcome: String,
    used_at: i64,
    deleted_at: i64,
}

impl TombstoneRow {
    fn into_tombstone(self) -> Result<Tombstone, Error> {
        Ok(Tombstone {
            run_id: self.run_id,
            node_id: self.node_id,
            request_hash: self.request_hash,
            outcome: self.outcome.parse()?,
            used_at: Timestamp(self.used_at),
            deleted_at: Timestamp(self.deleted_at),
        })
    }
}

/// The tombstone of `key`, if a deleted run used it.
pub(crate) async fn find(
    c: &mut Conn<'_>,
    s: &Scope,
    key: &str,
) -> Result<Option<Tombstone>, Error> {
    c.optional::<TombstoneRow>(
        "SELECT run_id, node_id, request_hash, outcome, used_at, deleted_at
             FROM key_tombstones WHERE tenant = $1 AND workspace = $2 AND key_hash = $3",
        args![&s.tenant, &s.workspace, key_hash(key)],
    )
    .await?
    .map(TombstoneRow::into_tombstone)
    .transpose()
}

/// `Err(KeyRetired)` when a deleted run used `key`: the check a brand-new claim makes
/// before it inserts.
pub(crate) async fn refuse_retired(c: &mut Conn<'_>, s: &Scope, key: &str) -> Result<(), Error> {
    match find(c, s, key).await? {
        None => Ok(()),
        Some(t) => Err(Error::KeyRetired {
            run_id: t.run_id,
            node_id: t.node_id,
            outcome: t.outcome,
            deleted_at: t.deleted_at,
        }),
    }
}

/// Why run id `run_id` could not be inserted though no run holds it: a deleted run of
/// that id sent calls whose keys are retired (`KeyRetired`, naming one of them). Asked
/// only after the insert skipped the id, so a tombstone is expected; without one the
/// run vanished under the caller (`NotFound`).
pub(crate) async fn retired_run(c: &mut Conn<'_>, s: &Scope, run_id: &str) -> Error {
    let found = c
        .optional::<TombstoneRow>(
            "SELECT run_id, node_id, request_hash, outcome, used_at, deleted_at
                 FROM key_tombstones WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                 ORDER BY used_at LIMIT 1",
            args![&s.tenant, &s.workspace, run_id],
        )
        .await;
    match found {
        Ok(Some(row)) => match row.into_tombstone() {
            Ok(t) => Error::KeyRetired {
                run_id: t.run_id,
                node_id: t.node_id,
                outcome: t.outcome,
                deleted_at: t.deleted_at,
            },
            Err(e) => e,
        },
        Ok(None) => Error::NotFound {
            what: format!("run {run_id}"),
        },
        Err(e) => e,
    }
}

/// The calls of a run whose request may have left: what leaves a tombstone.
macro_rules! sent_calls {
    ($select:literal) => {
        concat!(
            "SELECT ",
            $select,
            " FROM tool_calls
             WHERE tenant = $1 AND workspace = $2 AND run_id = $3
               AND (outbound_started_at IS NOT NULL OR outbound_requests > 0
                    OR uncounted_sends > 0)"
        )
    };
}

/// How many tombstones deleting `run_id` would write (a dry run).
pub(crate) async fn count(c: &mut Conn<'_>, s: &Scope, run_id: &str) -> Result<u64, Error> {
    let n = c
        .optional::<crate::rows::IntRow>(
            sent_calls!("COUNT(*) AS n"),
            args![&s.tenant, &s.workspace, run_id],
        )
        .await?
        .map_or(0, |r| r.n);
    Ok(u64::try_from(n).unwrap_or(0))
}

/// A call of a run about to be deleted: what its tombstone keeps.
#[derive(sqlx::FromRow)]
pub(crate) struct KeyedCall {
    tool_call_id: String,
    idempotency_key: String,
    request_hash: String,
    status: String,
}

/// Writes a tombstone for every call of `run_id` whose request may have left (its
/// outbound mark was written), in the deleting transaction. A call that never sent
/// (a pure function, a failure before the send) leaves none: sending its key later is
/// a first send, and a pure result is computed again. The run's calls are all
/// terminal (the caller checked), so `status` is the outcome.
pub(crate) async fn bury(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
    used_at: Timestamp,
    now: Timestamp,
) -> Result<u64, Error> {
    let calls = c
        .all::<KeyedCall>(
            sent_calls!("tool_call_id, idempotency_key, request_hash, status"),
            args![&s.tenant, &s.workspace, run_id],
        )
        .await?;
    let mut n = 0;
    for call in calls {
        n += c
            .execute(
                "INSERT INTO key_tombstones (tenant, workspace, key_hash, run_id, node_id,
                    request_hash, outcome, used_at, deleted_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
                args![
                    &s.tenant,
                    &s.workspace,
                    key_hash(&call.idempotency_key),
                    run_id,
                    call.tool_call_id,
                    call.request_hash,
                    call.status,
                    used_at,
                    now
                ],
            )
            .await?;
    }
    Ok(n)
}

impl Ledger {
    /// The tombstone of `key`, if a run deleted by retention used it: what an operator
    /// asks when a run was refused a key.
    #[cfg(any(test, feature = "testkit"))]
    pub async fn key_tombstone(&self, key: &str) -> Result<Option<Tombstone>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        find(&mut pc.conn(), s, key).await
    }
}
