//! One clock for every process of a PostgreSQL ledger: the server's.
//!
//! The only SQL in the ledger that reads the database clock, and it decides nothing: it
//! *anchors* [`crate::SystemClock`] (see there), after which every `now` this process
//! binds is the server's time plus monotonic time since. Decisions keep taking `now` as
//! an argument (tests drive time; SQLite and PostgreSQL compare alike).

use std::time::{Duration, Instant};

use crate::db::Pool;
use crate::error::Error;
use crate::ledger::Ledger;

/// The server's clock, epoch milliseconds.
const LEDGER_TIME: &str =
    "SELECT CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)";

/// How often a process re-anchors (bounds the monotonic clock's drift from the server's).
pub(crate) const REANCHOR_EVERY: Duration = Duration::from_secs(30);

/// Round trips per anchoring: the one with the shortest round trip is kept.
const SAMPLES: usize = 3;

impl Ledger {
    /// [`Ledger::measure_skew`] for tests: anchors the clock and returns the skew.
    #[cfg(any(test, feature = "testkit"))]
    pub async fn anchor_clock(&self) -> Result<Option<i64>, Error> {
        self.measure_skew().await
    }

    /// Reads the server's clock and anchors this process's [`crate::SystemClock`] to it
    /// (PostgreSQL; `Ok(None)` on SQLite, which has no clock of its own). Returns the
    /// wall clock's skew from the server's in milliseconds (positive: ahead), read at
    /// the midpoint of the shortest of a few round trips.
    pub(crate) async fn measure_skew(&self) -> Result<Option<i64>, Error> {
        let Pool::Postgres(pool) = self.pool() else {
            return Ok(None);
        };
        let mut best: Option<(Duration, i64, Instant)> = None;
        for _ in 0..SAMPLES {
            let sent = Instant::now();
            let server: i64 = sqlx::query_scalar(LEDGER_TIME).fetch_one(pool).await?;
            let rtt = sent.elapsed();
            if best.is_none_or(|(b, _, _)| rtt < b) {
                best = Some((rtt, server, sent + rtt / 2));
            }
        }
        Ok(best.map(|(_, server, at)| crate::clock::anchor(server, at)))
    }

    /// On PostgreSQL: anchors now (a failure is left to the statements that follow,
    /// which meet the same unreachable server) and again every [`REANCHOR_EVERY`] while
    /// any clone of this ledger is alive. A skew over [`SKEW_WARNING`] is logged once per
    /// change of more than a second, so an operator learns that the host's clock is off
    /// (flow itself goes by the server's).
    pub(crate) async fn keep_clock_anchored(&self) {
        if !matches!(self.pool(), Pool::Postgres(_)) {
            return;
        }
        let mut said = None;
        report(self.measure_skew().await, &mut said);
        let weak = std::sync::Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REANCHOR_EVERY).await;
                let Some(inner) = weak.upgrade() else { return };
                let ledger = Ledger { inner };
                report(ledger.measure_skew().await, &mut said);
            }
        });
    }
}

/// A skew of the wall clock from the server's that is worth a line in the log.
pub(crate) const SKEW_WARNING: Duration = Duration::from_secs(2);

fn report(anchored: Result<Option<i64>, Error>, said: &mut Option<i64>) {
    match anchored {
        Ok(Some(skew)) => {
            let warn = u128::from(skew.unsigned_abs()) > SKEW_WARNING.as_millis();
            let changed = said.is_none_or(|s: i64| (s - skew).abs() > 1_000);
            if warn && changed {
                tracing::warn!(
                    skew_ms = skew,
                    "this host's clock is {:.1} s {} the database server's; flow judges leases, deadlines and schedule ticks by the server's clock",
                    skew.unsigned_abs() as f64 / 1000.0,
                    if skew > 0 { "ahead of" } else { "behind" }
                );
                *said = Some(skew);
            } else if !warn {
                *said = None;
            }
        }
        Ok(None) => {}
        Err(e) => tracing::debug!(error = %e, "cannot read the database server's clock yet"),
    }
}
