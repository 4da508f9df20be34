//! The reads behind the console's In doubt worklist: the calls in doubt under its
//! filters (a run id prefix, a minimum age), and, for a page of them at once, their
//! runs' workflow names, their last probes and the last event of a type (why each went
//! in doubt), plus calls and runs named by id (what a "resolve selected" dry run
//! checks).
//!
//! Each read is one statement whatever the number of calls: the ids travel as one JSON
//! array parameter (`json_each` on SQLite, `jsonb_array_elements` on PostgreSQL), so a
//! page of a thousand calls costs a handful of statements, not one per call.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::{Value as Json, json};

use crate::clock::Timestamp;
use crate::conn::args;
use crate::error::Error;
use crate::events::{Event, EventType};
use crate::ledger::Ledger;
use crate::model::ToolCall;
use crate::probes::{Probe, ProbeDecision, ProbeObserved};
use crate::reads::page_limit;
use crate::rows::{CallRow, EventRow, call_cols};
use crate::state::{CallStatus, RunStatus};

/// Which calls in doubt [`Ledger::in_doubt_inbox`] lists, oldest first. Every field is
/// optional; set ones must all match.
#[derive(Debug, Clone, Default)]
pub struct InboxFilter {
    /// Only calls of this run.
    pub run_id: Option<String>,
    /// Only calls of runs whose id starts with this (an operator pastes the start of
    /// an id, or a batch's common prefix).
    pub run_prefix: Option<String>,
    /// Only calls of this node.
    pub node: Option<String>,
    /// Only calls of this tool.
    pub tool: Option<String>,
    /// Only calls in doubt since at least this time (in doubt for at least N minutes:
    /// `now - N min`), so the fresh ones a prober may still settle can be left alone.
    pub in_doubt_before: Option<Timestamp>,
    /// At most this many (0 = 1000).
    pub limit: u32,
}

/// A run's name and state, as the worklist shows and checks them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunName {
    /// The run id.
    pub id: String,
    /// Its workflow's `name:`.
    pub workflow: String,
    /// Where it is (a `retry` of a finished run's call is refused).
    pub status: RunStatus,
    /// The run whose sub-workflow node started it, when it is a child run.
    pub parent: Option<String>,
}

/// A call's last probe, with the run it belongs to (a [`Probe`] names only its node).
#[derive(Debug, Clone, PartialEq)]
pub struct LastProbe {
    /// The run.
    pub run_id: String,
    /// The probe with the highest number of that call.
    pub probe: Probe,
}

#[derive(Debug, sqlx::FromRow)]
struct NameRow {
    id: String,
    workflow_name: String,
    status: String,
    parent_run_id: Option<String>,
}

#[derive(Debug, sqlx::FromRow)]
struct LastProbeRow {
    run_id: String,
    tool_call_id: String,
    probe: i64,
    sent_key: String,
    probed_at: i64,
    observed: String,
    decision: String,
    http_status: Option<i64>,
    detail: Option<String>,
    response: Option<String>,
    next_probe_at: Option<i64>,
    by_worker: String,
}

/// A stored name as the enum serde knows it by (the probe enums' own parsers are
/// private to `probes.rs`; their serde names are the stored ones).
fn stored<T: for<'de> Deserialize<'de>>(what: &str, text: String) -> Result<T, Error> {
    serde_json::from_value(Json::String(text.clone())).map_err(|_| Error::Corrupt {
        what: format!("unknown probe {what} `{text}`"),
    })
}

impl LastProbeRow {
    fn into_last(self) -> Result<LastProbe, Error> {
        let response = self
            .response
            .map(|t| serde_json::from_str(&t))
            .transpose()
            .map_err(|e| Error::Corrupt {
                what: format!("probe response is not JSON: {e}"),
            })?;
        Ok(LastProbe {
            run_id: self.run_id,
            probe: Probe {
                tool_call_id: self.tool_call_id,
                probe: u32::try_from(self.probe).unwrap_or(u32::MAX),
                sent_key: self.sent_key,
                probed_at: Timestamp(self.probed_at),
                observed: stored::<ProbeObserved>("observation", self.observed)?,
                decision: stored::<ProbeDecision>("decision", self.decision)?,
                http_status: self.http_status.and_then(|s| u16::try_from(s).ok()),
                detail: self.detail,
                response,
                next_probe_at: self.next_probe_at.map(Timestamp),
                by: self.by_worker,
            },
        })
    }
}

/// `ids` once each, as the JSON array text a statement binds.
fn id_list(ids: &[String]) -> String {
    let unique: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    Json::from(unique.into_iter().collect::<Vec<_>>()).to_string()
}

/// `(run, node)` pairs once each, as a JSON array of two-element arrays.
fn pair_list(calls: &[(String, String)]) -> String {
    let unique: BTreeSet<(&str, &str)> = calls
        .iter()
        .map(|(r, n)| (r.as_str(), n.as_str()))
        .collect();
    let pairs: Vec<Json> = unique.into_iter().map(|(r, n)| json!([r, n])).collect();
    Json::from(pairs).to_string()
}

const NAMES_SQLITE: &str = "SELECT id, workflow_name, status, parent_run_id FROM runs
     WHERE tenant = $1 AND workspace = $2 AND id IN (SELECT value FROM json_each($3))
     ORDER BY id";
const NAMES_POSTGRES: &str = "SELECT id, workflow_name, status, parent_run_id FROM runs
     WHERE tenant = $1 AND workspace = $2
       AND id IN (SELECT jsonb_array_elements_text($3::jsonb))
     ORDER BY id";

/// The probe columns, and the rule that keeps only each call's last probe.
macro_rules! last_probe_sql {
    ($pairs:literal, $join:literal, $run:literal, $node:literal) => {
        concat!(
            "SELECT p.run_id, p.tool_call_id, p.probe, p.sent_key, p.probed_at, p.observed,
                p.decision, p.http_status, p.detail, p.response, p.next_probe_at, p.by_worker
             FROM ",
            $pairs,
            $join,
            " call_probes p ON p.tenant = $1 AND p.workspace = $2
               AND p.run_id = ",
            $run,
            " AND p.tool_call_id = ",
            $node,
            " WHERE p.probe = (SELECT MAX(q.probe) FROM call_probes q
                 WHERE q.tenant = p.tenant AND q.workspace = p.workspace
                   AND q.run_id = p.run_id AND q.tool_call_id = p.tool_call_id)
             ORDER BY p.run_id, p.tool_call_id"
        )
    };
}

/// The call columns of the calls named by `(run, node)` pairs.
macro_rules! calls_sql {
    ($pairs:literal, $join:literal, $run:literal, $node:literal) => {
        concat!(
            "SELECT ",
            call_cols!(),
            " FROM ",
            $pairs,
            $join,
            " tool_calls t ON t.tenant = $1 AND t.workspace = $2 AND t.run_id = ",
            $run,
            " AND t.tool_call_id = ",
            $node,
            " ORDER BY t.run_id, t.tool_call_id"
        )
    };
}

/// Each named call's last event of type `$4`.
macro_rules! last_event_sql {
    ($pairs:literal, $join:literal, $run:literal, $node:literal) => {
        concat!(
            "SELECT o.seq, o.id, o.type, o.time, o.run_id, o.step_id, o.tool_call_id, o.payload
             FROM ",
            $pairs,
            $join,
            " outbox o ON o.tenant = $1 AND o.workspace = $2 AND o.type = $4
               AND o.run_id = ",
            $run,
            " AND o.tool_call_id = ",
            $node,
            " WHERE o.seq = (SELECT MAX(q.seq) FROM outbox q
                 WHERE q.tenant = o.tenant AND q.workspace = o.workspace AND q.run_id = o.run_id
                   AND q.tool_call_id = o.tool_call_id AND q.type = o.type)
             ORDER BY o.run_id, o.tool_call_id"
        )
    };
}

// On SQLite the pairs are joined with CROSS JOIN, which makes them the outer loop: with
// a plain JOIN, SQLite 3.51 walked the workspace's whole outbox (every run's events,
// by `outbox_by_run` on tenant and workspace) and scanned the pairs once per event of
// the type — 35 ms for 200 calls in doubt among 5,000 runs, growing with both; pairs
// first, each call's events are found by run (benches/at_scale.rs). PostgreSQL plans
// the join from its statistics and has no CROSS JOIN … ON.
const LAST_EVENTS_SQLITE: &str = last_event_sql!(
    "json_each($3) AS k",
    " CROSS JOIN",
    "json_extract(k.value, '$[0]')",
    "json_extract(k.value, '$[1]')"
);
const LAST_EVENTS_POSTGRES: &str = last_event_sql!(
    "jsonb_array_elements($3::jsonb) AS k(v)",
    " JOIN",
    "k.v->>0",
    "k.v->>1"
);
const LAST_PROBES_SQLITE: &str = last_probe_sql!(
    "json_each($3) AS k",
    " CROSS JOIN",
    "json_extract(k.value, '$[0]')",
    "json_extract(k.value, '$[1]')"
);
const LAST_PROBES_POSTGRES: &str = last_probe_sql!(
    "jsonb_array_elements($3::jsonb) AS k(v)",
    " JOIN",
    "k.v->>0",
    "k.v->>1"
);
const CALLS_SQLITE: &str = calls_sql!(
    "json_each($3) AS k",
    " CROSS JOIN",
    "json_extract(k.value, '$[0]')",
    "json_extract(k.value, '$[1]')"
);
const CALLS_POSTGRES: &str = calls_sql!(
    "jsonb_array_elements($3::jsonb) AS k(v)",
    " JOIN",
    "k.v->>0",
    "k.v->>1"
);

impl Ledger {
    /// The calls in doubt `filter` matches (this tenant and workspace), oldest first:
    /// what the console's worklist lists. [`Ledger::list_in_doubt`] plus the filters a
    /// worklist of a thousand calls needs (a run id prefix, a minimum age).
    pub async fn in_doubt_inbox(&self, filter: InboxFilter) -> Result<Vec<ToolCall>, Error> {
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
                       AND status = $9
                       AND ($3 IS NULL OR run_id = $3)
                       AND ($4 IS NULL OR substr(run_id, 1, length($4)) = $4)
                       AND ($5 IS NULL OR tool_call_id = $5)
                       AND ($6 IS NULL OR tool = $6)
                       AND ($7 IS NULL OR in_doubt_at <= $7)
                     ORDER BY in_doubt_at, run_id, tool_call_id LIMIT $8"
                ),
                args![
                    &s.tenant,
                    &s.workspace,
                    filter.run_id,
                    filter.run_prefix,
                    filter.node,
                    filter.tool,
                    filter.in_doubt_before,
                    limit,
                    CallStatus::InDoubt.as_str(),
                ],
            )
            .await?;
        rows.into_iter().map(CallRow::into_call).collect()
    }

    /// The workflow name and state of each run of `run_ids` that exists (in id order;
    /// unknown ids are left out). One statement for any number of runs.
    pub async fn run_names(&self, run_ids: &[String]) -> Result<Vec<RunName>, Error> {
        if run_ids.is_empty() {
            return Ok(Vec::new());
        }
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let mut c = pc.conn();
        let sql = c.pick(NAMES_SQLITE, NAMES_POSTGRES);
        let rows = c
            .all::<NameRow>(sql, args![&s.tenant, &s.workspace, id_list(run_ids)])
            .await?;
        rows.into_iter()
            .map(|r| {
                Ok(RunName {
                    status: r.status.parse()?,
                    id: r.id,
                    workflow: r.workflow_name,
                    parent: r.parent_run_id,
                })
            })
            .collect()
    }

    /// The last probe (highest number) of each call of `calls` (`(run, node)` pairs)
    /// that has been probed, by run and node. One statement for any number of calls.
    pub async fn last_probes(&self, calls: &[(String, String)]) -> Result<Vec<LastProbe>, Error> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let mut c = pc.conn();
        let sql = c.pick(LAST_PROBES_SQLITE, LAST_PROBES_POSTGRES);
        let rows = c
            .all::<LastProbeRow>(sql, args![&s.tenant, &s.workspace, pair_list(calls)])
            .await?;
        rows.into_iter().map(LastProbeRow::into_last).collect()
    }

    /// The last event of type `kind` of each call of `calls` (`(run, node)` pairs) that
    /// has one, by run and node: e.g. its last `tool_call.in_doubt`, which says why the
    /// call is in doubt. One statement for any number of calls.
    pub async fn last_events(
        &self,
        calls: &[(String, String)],
        kind: EventType,
    ) -> Result<Vec<Event>, Error> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let mut c = pc.conn();
        let sql = c.pick(LAST_EVENTS_SQLITE, LAST_EVENTS_POSTGRES);
        let rows = c
            .all::<EventRow>(
                sql,
                args![&s.tenant, &s.workspace, pair_list(calls), kind.as_str()],
            )
            .await?;
        rows.into_iter().map(EventRow::into_event).collect()
    }

    /// The calls named by `calls` (`(run, node)` pairs) that exist, whatever their
    /// state, by run and node: what a "resolve selected" dry run checks (a call settled
    /// meanwhile is no longer in doubt). One statement for any number of calls.
    pub async fn calls_by_ids(&self, calls: &[(String, String)]) -> Result<Vec<ToolCall>, Error> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let mut c = pc.conn();
        let sql = c.pick(CALLS_SQLITE, CALLS_POSTGRES);
        let rows = c
            .all::<CallRow>(sql, args![&s.tenant, &s.workspace, pair_list(calls)])
            .await?;
        rows.into_iter().map(CallRow::into_call).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_lists_are_json_without_repeats() {
        let ids = ["b".to_string(), "a".to_string(), "b".to_string()];
        assert_eq!(id_list(&ids), r#"["a","b"]"#);
        let pairs = [
            ("r".to_string(), "x".to_string()),
            ("r".to_string(), "x".to_string()),
            ("q\"".to_string(), "y".to_string()),
        ];
        assert_eq!(pair_list(&pairs), r#"[["q\"","y"],["r","x"]]"#);
    }

    /// The pairs drive each SQLite read of many calls (the outer loop): the plan that
    /// walked the whole outbox first made the in-doubt listing grow with every run.
    #[tokio::test]
    async fn sqlite_reads_of_many_calls_start_from_the_pairs() {
        use sqlx::{Connection, Row};
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("plan.db").display());
        let ledger = Ledger::open(&url, crate::OpenOptions::default())
            .await
            .expect("open");
        ledger.close().await;
        let mut c = sqlx::SqliteConnection::connect(&url)
            .await
            .expect("connect");
        for (sql, typed) in [
            (LAST_EVENTS_SQLITE, true),
            (LAST_PROBES_SQLITE, false),
            (CALLS_SQLITE, false),
        ] {
            let explain = format!("EXPLAIN QUERY PLAN {sql}");
            let mut q = sqlx::query(sqlx::AssertSqlSafe(explain))
                .bind("t")
                .bind("w")
                .bind(r#"[["r","n"]]"#);
            if typed {
                q = q.bind("tool_call.in_doubt");
            }
            let plan = q.fetch_all(&mut c).await.expect("explain");
            let steps: Vec<String> = plan.iter().map(|r| r.get::<String, _>(3)).collect();
            assert!(
                steps.first().is_some_and(|s| s.starts_with("SCAN k")),
                "{steps:?}\n{sql}"
            );
        }
    }

    #[test]
    fn stored_probe_names_parse_through_serde() {
        let found: Result<ProbeObserved, _> = stored("observation", "not_found".into());
        assert!(matches!(found, Ok(ProbeObserved::NotFound)));
        let bad: Result<ProbeDecision, _> = stored("decision", "maybe".into());
        assert!(matches!(bad, Err(Error::Corrupt { what }) if what.contains("`maybe`")));
    }
}
