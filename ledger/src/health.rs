//! What a daemon's `/healthz` and `/metrics` read (a liveness probe and the in-doubt
//! count: each one cheap statement on a pooled read connection), and the upkeep a
//! daemon does between claims (planner statistics).

use crate::conn::args;
use crate::db::Pool;
use crate::error::Error;
use crate::ledger::Ledger;
use crate::rows::IntRow;

impl Ledger {
    /// Refreshes the PostgreSQL planner statistics of the ledger's tables when they
    /// describe far fewer rows than the tables hold (a new database meeting its first
    /// burst), and returns the tables analyzed; nothing to do on SQLite. Cheap when
    /// nothing is stale (one catalog read): a daemon calls it every few seconds.
    pub async fn refresh_planner_statistics(&self) -> Result<Vec<String>, Error> {
        match self.pool() {
            Pool::Postgres(p) => Ok(crate::postgres::refresh_statistics(p).await?),
            Pool::Sqlite(..) => Ok(Vec::new()),
        }
    }

    /// Whether the database answers a trivial statement: health checks need a round
    /// trip, not just a pool that once connected.
    pub async fn ping(&self) -> Result<(), Error> {
        let mut pc = self.pool().acquire().await?;
        pc.conn()
            .optional::<IntRow>("SELECT CAST(1 AS BIGINT) AS n", args![])
            .await?;
        Ok(())
    }

    /// How many tool calls of this scope are `in_doubt` (each waits for a resolution):
    /// the number an operator should watch.
    pub async fn count_calls_in_doubt(&self) -> Result<i64, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let row = pc
            .conn()
            .optional::<IntRow>(
                "SELECT COUNT(*) AS n FROM tool_calls
                 WHERE tenant = $1 AND workspace = $2 AND status = 'in_doubt'",
                args![&s.tenant, &s.workspace],
            )
            .await?;
        Ok(row.map_or(0, |r| r.n))
    }

    /// Event deliveries by consumer and status (pending, delivered, dead): what a
    /// daemon's `/metrics` reports, so a dead letter is seen without running
    /// `flow events --failed`.
    pub async fn count_deliveries(
        &self,
    ) -> Result<Vec<(String, crate::deliveries::DeliveryStatus, i64)>, Error> {
        #[derive(Debug, sqlx::FromRow)]
        struct Row {
            consumer: String,
            status: String,
            n: i64,
        }
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<Row>(
                "SELECT consumer, status, COUNT(*) AS n FROM event_deliveries
                 WHERE tenant = $1 AND workspace = $2 GROUP BY consumer, status
                 ORDER BY consumer, status",
                args![&s.tenant, &s.workspace],
            )
            .await?;
        rows.into_iter()
            .map(|r| {
                Ok((
                    r.consumer,
                    crate::deliveries::DeliveryStatus::parse(&r.status)?,
                    r.n,
                ))
            })
            .collect()
    }
}
