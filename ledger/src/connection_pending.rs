//! Sign-ins waiting for their browser (migration 0018): begun by one server (the console's
//! or the API's *Connect*), finished by whichever server the browser comes back to.
//!
//! The ledger holds the record sealed (the engine's key) under the hash of the sign-in's
//! `state`; [`Ledger::take_pending_sign_in`] deletes the row as it reads it, so one
//! redirect finishes a sign-in once even when two servers get it at the same moment.

use crate::clock::Timestamp;
use crate::conn::args;
use crate::error::Error;
use crate::ledger::Ledger;

/// A sign-in begun and not yet finished. Its secrets are in `sealed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSignIn {
    /// The connection signed in to.
    pub name: String,
    /// What finishing needs, sealed by the engine (base64).
    pub sealed: String,
    /// The key it is sealed under.
    pub key_id: String,
    /// Who began it (recorded as `connected_by`).
    pub begun_by: String,
    /// After this the redirect is refused.
    pub expires_at: Timestamp,
}

#[derive(sqlx::FromRow)]
struct Row {
    name: String,
    sealed: String,
    key_id: String,
    begun_by: String,
    expires_at: i64,
}

impl Ledger {
    /// Records sign-in `pending` under `state_hash`, begun at `now`; sweeps the rows that
    /// expired before `now` (a browser that never came back leaves one behind).
    pub async fn put_pending_sign_in(
        &self,
        state_hash: &str,
        pending: PendingSignIn,
        now: Timestamp,
    ) -> Result<(), Error> {
        let ledger = self.clone();
        let state_hash = state_hash.to_owned();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                c.execute(
                    "DELETE FROM connection_pending
                     WHERE tenant = $1 AND workspace = $2 AND expires_at <= $3",
                    args![&s.tenant, &s.workspace, now],
                )
                .await?;
                c.execute(
                    "INSERT INTO connection_pending (tenant, workspace, state_hash, name,
                        sealed, key_id, begun_by, begun_at, expires_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    args![
                        &s.tenant,
                        &s.workspace,
                        &state_hash,
                        pending.name,
                        pending.sealed,
                        pending.key_id,
                        pending.begun_by,
                        now,
                        pending.expires_at
                    ],
                )
                .await?;
                Ok(())
            })
        })
        .await
    }

    /// Takes (deletes and returns) the sign-in recorded under `state_hash` if it has not
    /// expired at `now`. `None` for an unknown, spent or expired state: of two servers
    /// given the same redirect, one gets the row and the other `None`.
    pub async fn take_pending_sign_in(
        &self,
        state_hash: &str,
        now: Timestamp,
    ) -> Result<Option<PendingSignIn>, Error> {
        let ledger = self.clone();
        let state_hash = state_hash.to_owned();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let taken = c
                    .optional::<Row>(
                        "DELETE FROM connection_pending
                         WHERE tenant = $1 AND workspace = $2 AND state_hash = $3
                         RETURNING name, sealed, key_id, begun_by, expires_at",
                        args![&s.tenant, &s.workspace, &state_hash],
                    )
                    .await?;
                Ok(taken
                    .map(|r| PendingSignIn {
                        name: r.name,
                        sealed: r.sealed,
                        key_id: r.key_id,
                        begun_by: r.begun_by,
                        expires_at: Timestamp(r.expires_at),
                    })
                    .filter(|p| p.expires_at > now))
            })
        })
        .await
    }
}
