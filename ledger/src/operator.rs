//! What the operator API (`flow serve`) needs beyond the CLI's operations: who did a
//! mutation ([`Actor`], recorded in the event the mutation writes anyway, so the audit
//! trail is the outbox and needs no table of its own), a batch of runs enqueued in one
//! commit, and the calls in doubt across runs.

use crate::clock::Timestamp;
use crate::conn::args;
use crate::enqueue::{EnqueueTx, enqueue_all_in};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::{Actor, Enqueued, NewRun, ToolCall};
use crate::reads::page_limit;
use crate::rows::{CallRow, call_cols};

/// Most runs [`Ledger::enqueue_batch`] takes at once (the API's documented limit).
pub const MAX_BATCH: usize = 1_000;

/// Which in-doubt calls [`Ledger::list_in_doubt`] returns (oldest first).
#[derive(Debug, Clone, Default)]
pub struct InDoubtFilter {
    /// Only calls of this run.
    pub run_id: Option<String>,
    /// Only calls of this node.
    pub node: Option<String>,
    /// Only calls of this tool.
    pub tool: Option<String>,
    /// At most this many (0 = 1000).
    pub limit: u32,
}

/// Batches at least this big check the planner statistics first (PostgreSQL).
const STATISTICS_AFTER: usize = 100;

impl Ledger {
    /// Refreshes stale PostgreSQL planner statistics before a big batch is written (see
    /// [`Ledger::refresh_planner_statistics`]; one catalog read when nothing is stale).
    /// A new database meeting a burst of submissions otherwise plans every foreign-key
    /// check into `runs` as a scan of the tenant's runs: the W3 benchmark's 10,000 runs
    /// through the API spent up to 0.7 s per 1,000-run batch in the `run_inputs` key
    /// checks alone, growing with the table, until a daemon's next look (every 5 s)
    /// analyzed. Best effort: a failed refresh is logged and the batch goes on.
    async fn statistics_before_a_burst(&self) {
        if let Err(e) = self.refresh_planner_statistics().await {
            tracing::warn!(error = %e, "planner statistics not refreshed before a batch");
        }
    }

    /// Enqueues every run of `runs` in ONE transaction (one commit, one fsync on
    /// SQLite): each is idempotent by id as in [`Ledger::enqueue`], and one conflict or
    /// error rolls the whole batch back. Each distinct workflow text is stored once.
    /// Callers bound its size (the API: [`MAX_BATCH`]).
    pub async fn enqueue_batch(
        &self,
        runs: Vec<NewRun>,
        actor: Option<Actor>,
        now: Timestamp,
    ) -> Result<Vec<Enqueued>, Error> {
        if runs.len() >= STATISTICS_AFTER && self.writable().is_ok() {
            self.statistics_before_a_burst().await;
        }
        let ledger = self.clone();
        self.write(move |c| {
            Box::pin(async move {
                let mut tx = EnqueueTx::default();
                let out = enqueue_all_in(c, &ledger, &runs, actor.as_ref(), now, &mut tx).await?;
                tx.finish(c, ledger.scope()).await?;
                Ok(out)
            })
        })
        .await
    }

    /// Every call in doubt across runs (this tenant and workspace), oldest first: what
    /// an operator's inbox lists.
    pub async fn list_in_doubt(&self, filter: InDoubtFilter) -> Result<Vec<ToolCall>, Error> {
        let s = self.scope();
        let limit = page_limit(filter.limit, 1000);
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<CallRow>(
                concat!(
                    "SELECT ",
                    call_cols!(),
                    " FROM tool_calls WHERE tenant = $1 AND workspace = $2
                       AND status = 'in_doubt'
                       AND ($3 IS NULL OR run_id = $3)
                       AND ($4 IS NULL OR tool_call_id = $4)
                       AND ($5 IS NULL OR tool = $5)
                     ORDER BY in_doubt_at, run_id, tool_call_id LIMIT $6"
                ),
                args![
                    &s.tenant,
                    &s.workspace,
                    filter.run_id,
                    filter.node,
                    filter.tool,
                    limit
                ],
            )
            .await?;
        rows.into_iter().map(CallRow::into_call).collect()
    }
}
