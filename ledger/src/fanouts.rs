//! A `for_each` node's list, stored once per (run, node): the items its steps are
//! rendered from, their keys in list order, and the keys that vanished from a
//! re-evaluated list before anything was sent. Written under the run's live lease by the
//! process that evaluated the list; read by a later execution (to tell a vanished key
//! from a new one) and by views.

use serde_json::Value;

use crate::clock::Timestamp;
use crate::conn::args;
use crate::error::Error;
use crate::fence::{Fence, live_run_fence};
use crate::ledger::Ledger;
use crate::model::RunLease;

/// A `for_each` node's stored list.
#[derive(Debug, Clone, PartialEq)]
pub struct Fanout {
    /// The node.
    pub node_id: String,
    /// The items (a JSON array), in list order, then the kept vanished ones.
    pub items: Value,
    /// Each item's key, same order as `items`.
    pub keys: Vec<String>,
    /// Keys that vanished from a re-evaluated list before their call was sent.
    pub vanished: Vec<String>,
    /// When the list was first stored.
    pub created_at: Timestamp,
    /// When it was last stored.
    pub updated_at: Timestamp,
}

#[derive(sqlx::FromRow)]
struct FanoutRow {
    node_id: String,
    items: String,
    keys: String,
    vanished: String,
    created_at: i64,
    updated_at: i64,
}

impl FanoutRow {
    fn into_fanout(self) -> Result<Fanout, Error> {
        let corrupt = |what: &str| Error::Corrupt {
            what: format!("fanout {what} of node `{}`", self.node_id),
        };
        let items = serde_json::from_str(&self.items).map_err(|_| corrupt("items"))?;
        let keys = serde_json::from_str(&self.keys).map_err(|_| corrupt("keys"))?;
        let vanished = serde_json::from_str(&self.vanished).map_err(|_| corrupt("vanished"))?;
        Ok(Fanout {
            items,
            keys,
            vanished,
            created_at: Timestamp(self.created_at),
            updated_at: Timestamp(self.updated_at),
            node_id: self.node_id,
        })
    }
}

impl Ledger {
    /// Stores (or replaces) a `for_each` node's list under the run's live lease: the list
    /// is what the node's item steps are rendered from, so it is written before any of
    /// them starts. A lost lease writes nothing ([`Error::LeaseLost`]).
    pub async fn record_fanout(
        &self,
        lease: &RunLease,
        fanout: &Fanout,
        now: Timestamp,
    ) -> Result<(), Error> {
        let s = self.scope().clone();
        let own = args![
            now,
            &fanout.node_id,
            i64::try_from(fanout.keys.len()).unwrap_or(i64::MAX),
            fanout.items.to_string(),
            Value::from(fanout.keys.clone()).to_string(),
            Value::from(fanout.vanished.clone()).to_string()
        ];
        let a = [Fence::run(&s, lease), own].concat();
        let written = self
            .write_statement(move |c| {
                Box::pin(async move {
                    c.optional::<(i64,)>(
                        concat!(
                            "INSERT INTO fanouts (tenant, workspace, run_id, node_id, item_count,
                                items, keys, vanished, created_at, updated_at)
                             SELECT $1, $2, $3, $7, $8, $9, $10, $11, $6, $6
                             WHERE EXISTS (SELECT 1 FROM runs WHERE",
                            live_run_fence!(),
                            ")
                             ON CONFLICT (tenant, workspace, run_id, node_id) DO UPDATE SET
                                item_count = excluded.item_count, items = excluded.items,
                                keys = excluded.keys, vanished = excluded.vanished,
                                updated_at = excluded.updated_at
                             RETURNING item_count"
                        ),
                        a,
                    )
                    .await
                })
            })
            .await?;
        written.map(|_| ()).ok_or(Error::LeaseLost)
    }

    /// The stored list of a run's `for_each` node, if it was evaluated.
    pub async fn get_fanout(&self, run_id: &str, node_id: &str) -> Result<Option<Fanout>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let row = pc
            .conn()
            .optional::<FanoutRow>(
                "SELECT node_id, items, keys, vanished, created_at, updated_at FROM fanouts
                 WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND node_id = $4",
                args![&s.tenant, &s.workspace, run_id, node_id],
            )
            .await?;
        row.map(FanoutRow::into_fanout).transpose()
    }
}
