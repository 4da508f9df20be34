//! What a daemon's `/healthz` and `/metrics` read (a liveness probe and the in-doubt
//! count: each one cheap statement on a pooled read connection), and the upkeep a
//! daemon does beside its claims (planner statistics).

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

    /// [`Ledger::refresh_planner_statistics`] on a connection of its own, so that a
    /// one-shot command's run keeps the pool's connection and opens no second one.
    pub async fn refresh_planner_statistics_aside(&self) -> Result<Vec<String>, Error> {
        match self.pool() {
            Pool::Postgres(p) => Ok(crate::postgres::refresh_statistics_aside(p).await?),
            Pool::Sqlite(..) => Ok(Vec::new()),
        }
    }

    /// Whether this process can *write* the ledger now, for `/healthz`: a read that
    /// answers proves little on SQLite, where the write lock may be held for minutes by
    /// another process, the disk may be full, or the WAL may have been replaced. On
    /// SQLite this is a real write through the writer's group commit — one row of the
    /// migrations table rewritten as it is (`BEGIN IMMEDIATE`, a WAL frame, `COMMIT`) —
    /// so each of those fails it; on PostgreSQL (whose server reports its own
    /// writability) and on a read-only ledger, one round trip.
    pub async fn probe_writable(&self) -> Result<(), Error> {
        if self.is_postgres() || self.writable().is_err() {
            return self.round_trip().await;
        }
        self.write_statement(|c| {
            Box::pin(async move {
                c.execute(
                    "UPDATE _sqlx_migrations SET success = success
                     WHERE version = (SELECT MIN(version) FROM _sqlx_migrations)",
                    args![],
                )
                .await?;
                Ok(())
            })
        })
        .await
    }

    /// What `current_setting(name)` says on one of this ledger's pooled PostgreSQL
    /// connections (`None` on SQLite): what the server applies to flow's own sessions,
    /// which flow sets itself where its guarantees depend on it (`synchronous_commit`,
    /// see `postgres.rs`) — to check that, in tests and by hand.
    #[cfg(any(test, feature = "testkit"))]
    pub async fn postgres_setting(&self, name: &str) -> Result<Option<String>, Error> {
        let Pool::Postgres(p) = self.pool() else {
            return Ok(None);
        };
        let value: String = sqlx::query_scalar("SELECT current_setting($1)")
            .bind(name)
            .fetch_one(p)
            .await?;
        Ok(Some(value))
    }

    /// Whether the database answers a trivial statement (tests; the engine asks
    /// [`Ledger::probe_writable`]).
    #[cfg(any(test, feature = "testkit"))]
    pub async fn ping(&self) -> Result<(), Error> {
        self.round_trip().await
    }

    /// Whether the database answers a trivial statement: health checks need a round
    /// trip, not just a pool that once connected.
    pub(crate) async fn round_trip(&self) -> Result<(), Error> {
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

    /// The calls of this scope in doubt, by tool, with when the oldest of each went into
    /// doubt: a daemon's `flow_tool_calls_in_doubt{tool}` and
    /// `flow_oldest_in_doubt_seconds` (the alert everyone writes: "a call has waited for
    /// a person for an hour"). Tools in alphabetical order.
    pub async fn calls_in_doubt_by_tool(&self) -> Result<Vec<InDoubtTool>, Error> {
        #[derive(Debug, sqlx::FromRow)]
        struct Row {
            tool: String,
            n: i64,
            oldest: Option<i64>,
        }
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<Row>(
                "SELECT tool, COUNT(*) AS n, MIN(in_doubt_at) AS oldest FROM tool_calls
                 WHERE tenant = $1 AND workspace = $2 AND status = $3
                 GROUP BY tool ORDER BY tool",
                args![
                    &s.tenant,
                    &s.workspace,
                    crate::state::CallStatus::InDoubt.as_str()
                ],
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| InDoubtTool {
                tool: r.tool,
                calls: r.n,
                oldest: crate::clock::Timestamp(r.oldest.unwrap_or(0)),
            })
            .collect())
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

/// The calls of one tool in doubt ([`Ledger::calls_in_doubt_by_tool`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InDoubtTool {
    /// The tool's name in its workflow.
    pub tool: String,
    /// How many of its calls are in doubt.
    pub calls: i64,
    /// When the oldest of them went into doubt.
    pub oldest: crate::clock::Timestamp,
}
