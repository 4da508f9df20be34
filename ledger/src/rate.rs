//! Rate limits and quotas, counted in the database so they hold across processes and
//! hosts (governor-style in-memory limits would not).
//!
//! Fixed windows aligned to UTC: a `Minute` window runs from `hh:mm:00.000` to the next
//! minute, a `Day` window from midnight UTC to the next. A limited request learns when
//! the next window opens. Counters count requests *sent*: the engine acquires one
//! before each request and adds extra ones (e.g. an MCP re-auth) with `rate_add`.

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::Scope;
use crate::model::{RateAcquire, RateDecision, Window};
use crate::rows::IntRow;

impl Ledger {
    /// Counts one request in the current window if the window is under `limit`; one
    /// atomic upsert, so concurrent workers never exceed the limit together.
    pub async fn rate_acquire(
        &self,
        req: RateAcquire,
        now: Timestamp,
    ) -> Result<RateDecision, Error> {
        let start = req.window.start(now);
        let retry_at = Timestamp(start.0 + req.window.millis());
        if req.limit == 0 {
            return Ok(RateDecision::Limited { retry_at });
        }
        let ledger = self.clone();
        self.write_statement(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let row = c
                    .optional::<IntRow>(
                        "INSERT INTO rate_counters (tenant, workspace, key, window_kind, window_start, count)
                         VALUES ($1, $2, $3, $4, $5, 1)
                         ON CONFLICT (tenant, workspace, key, window_kind, window_start)
                         DO UPDATE SET count = rate_counters.count + 1
                         WHERE rate_counters.count < $6
                         RETURNING count AS n",
                        args![
                            &s.tenant,
                            &s.workspace,
                            &req.key,
                            req.window.as_str(),
                            start,
                            i64::from(req.limit),
                        ],
                    )
                    .await?;
                Ok(match row {
                    Some(r) => RateDecision::Granted {
                        count: u32::try_from(r.n).unwrap_or(u32::MAX),
                    },
                    None => RateDecision::Limited { retry_at },
                })
            })
        })
        .await
    }

    /// Counts `n` extra requests that were actually sent, regardless of the limit (they
    /// already happened). Returns the window's count.
    pub async fn rate_add(
        &self,
        key: &str,
        window: Window,
        n: u32,
        now: Timestamp,
    ) -> Result<u32, Error> {
        let ledger = self.clone();
        let key = key.to_owned();
        self.write_statement(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let key = key.as_str();
                let row = c
                    .optional::<IntRow>(
                        "INSERT INTO rate_counters (tenant, workspace, key, window_kind, window_start, count)
                         VALUES ($1, $2, $3, $4, $5, $6)
                         ON CONFLICT (tenant, workspace, key, window_kind, window_start)
                         DO UPDATE SET count = rate_counters.count + $6
                         RETURNING count AS n",
                        args![
                            &s.tenant,
                            &s.workspace,
                            key,
                            window.as_str(),
                            window.start(now),
                            i64::from(n),
                        ],
                    )
                    .await?;
                Ok(row.map_or(0, |r| u32::try_from(r.n).unwrap_or(u32::MAX)))
            })
        })
        .await
    }

    /// A downstream asked every sender of `key` to hold off until `until` (a
    /// `Retry-After`): remembered for every process as a row of kind `hold_off` in the
    /// rate's own table, `window_start` the time it ends (so retention removes it like
    /// any window past). Returns the latest hold-off of `key` now in force.
    pub async fn hold_off(
        &self,
        key: &str,
        until: Timestamp,
        now: Timestamp,
    ) -> Result<Timestamp, Error> {
        let ledger = self.clone();
        let key = key.to_owned();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                c.execute(
                    "INSERT INTO rate_counters (tenant, workspace, key, window_kind, window_start, count)
                     VALUES ($1, $2, $3, 'hold_off', $4, 0)
                     ON CONFLICT (tenant, workspace, key, window_kind, window_start) DO NOTHING",
                    args![&s.tenant, &s.workspace, key.as_str(), until],
                )
                .await?;
                Ok(held_off_in(c, s, &key, now).await?.unwrap_or(until))
            })
        })
        .await
    }

    /// `Some(end)` while a downstream's hold-off of `key` is in force at `now`
    /// ([`Ledger::hold_off`]).
    pub async fn held_off(&self, key: &str, now: Timestamp) -> Result<Option<Timestamp>, Error> {
        let mut pc = self.pool().acquire().await?;
        held_off_in(&mut pc.conn(), self.scope(), key, now).await
    }

    /// The current count of a window (for `flow show`, metrics and tests).
    #[cfg(any(test, feature = "testkit"))]
    pub async fn rate_count(
        &self,
        key: &str,
        window: Window,
        now: Timestamp,
    ) -> Result<u32, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let row = pc
            .conn()
            .optional::<IntRow>(
                "SELECT count AS n FROM rate_counters
                 WHERE tenant = $1 AND workspace = $2 AND key = $3 AND window_kind = $4
                   AND window_start = $5",
                args![
                    &s.tenant,
                    &s.workspace,
                    key,
                    window.as_str(),
                    window.start(now)
                ],
            )
            .await?;
        Ok(row.map_or(0, |r| u32::try_from(r.n).unwrap_or(u32::MAX)))
    }
}

/// The latest hold-off of `key` that ends after `now`, if any.
async fn held_off_in(
    c: &mut Conn<'_>,
    s: &Scope,
    key: &str,
    now: Timestamp,
) -> Result<Option<Timestamp>, Error> {
    let row = c
        .optional::<IntRow>(
            "SELECT MAX(window_start) AS n FROM rate_counters
             WHERE tenant = $1 AND workspace = $2 AND key = $3 AND window_kind = 'hold_off'
               AND window_start > $4
             HAVING MAX(window_start) IS NOT NULL",
            args![&s.tenant, &s.workspace, key, now],
        )
        .await?;
    Ok(row.map(|r| Timestamp(r.n)))
}
