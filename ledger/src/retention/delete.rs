//! One run's rows deleted in one statement: what a deletion costs is its round trips
//! (sqlx's SQLite worker thread, PostgreSQL's network), not the deletes themselves —
//! thirteen tables and the run's events were fifteen trips per run (22 ms on
//! PostgreSQL, 2.5 ms on SQLite; `benches/README.md`).
//!
//! - SQLite: the deletes as one text of statements run in order (children before
//!   `runs`, a run's deliveries before its events), each `RETURNING` its table's name
//!   per row, so the counts come back with it.
//! - PostgreSQL: data-modifying CTEs, one per table, and a count of each. They read one
//!   snapshot and run in no set order; the foreign keys to `runs` are `NO ACTION`,
//!   checked at the statement's end, when the children are gone too. The events go with
//!   their delivered deliveries, judged by what the deliveries' CTE deleted
//!   (`RUN_EVENTS_DELIVERED`), not after them.

use std::sync::LazyLock;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::model::Scope;
use crate::rows::IntRow;

use super::sweep::{RUN_EVENT_DELIVERIES, RUN_EVENTS, RUN_EVENTS_DELIVERED, RUN_EVENTS_DRY};
use super::{Deleted, RUN_TABLES, tombstones};

/// The run's own row.
const RUN_ROW: &str = "DELETE FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3";

/// Every delete of one run, in order: `(table, statement)`.
fn deletes(events: &'static str) -> Vec<(&'static str, &'static str)> {
    let mut all: Vec<(&str, &str)> = RUN_TABLES.iter().map(|(t, d, _)| (*t, *d)).collect();
    all.push(("runs", RUN_ROW));
    all.push(("event_deliveries", RUN_EVENT_DELIVERIES));
    all.push(("outbox", events));
    all
}

/// SQLite: one text, each statement returning `t` (its table) per row deleted.
static SQLITE: LazyLock<String> = LazyLock::new(|| {
    deletes(RUN_EVENTS)
        .into_iter()
        .map(|(t, d)| format!("{d} RETURNING '{t}' AS t;\n"))
        .collect()
});

/// PostgreSQL: one statement of CTEs answering `(t, n)` per table.
static POSTGRES: LazyLock<String> = LazyLock::new(|| {
    let all = deletes(RUN_EVENTS_DELIVERED);
    // Named `d_<table>` (a CTE named like a table would hide it from the others);
    // the deliveries' returns what the events' predicate asks about.
    let ctes: Vec<String> = all
        .iter()
        .map(|(t, d)| {
            let returning = if *t == "event_deliveries" {
                "consumer, event_id"
            } else {
                "1"
            };
            format!("d_{t} AS ({d} RETURNING {returning})")
        })
        .collect();
    let counts: Vec<String> = all
        .iter()
        .map(|(t, _)| format!("SELECT '{t}'::text AS t, (SELECT COUNT(*) FROM d_{t}) AS n"))
        .collect();
    format!("WITH {}\n{}", ctes.join(",\n"), counts.join("\nUNION ALL "))
});

/// Deletes the run's rows in one statement and leaves its tombstones (written first:
/// they read the calls).
pub(super) async fn delete_run(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
    used_at: Timestamp,
    now: Timestamp,
) -> Result<(Deleted, u64), Error> {
    let buried = tombstones::bury(c, s, run_id, used_at, now).await?;
    let mut deleted = Deleted::default();
    let a = args![&s.tenant, &s.workspace, run_id];
    if c.is_postgres() {
        for (t, n) in c.all::<(String, i64)>(POSTGRES.as_str(), a).await? {
            deleted.add(&t, u64::try_from(n).unwrap_or(0));
        }
    } else {
        for (t,) in c.all::<(String,)>(SQLITE.as_str(), a).await? {
            deleted.add(&t, 1);
        }
    }
    Ok((deleted, buried))
}

/// What deleting the run would delete (the dry run).
pub(super) async fn count_run(c: &mut Conn<'_>, s: &Scope, run_id: &str) -> Result<Deleted, Error> {
    let mut counted = Deleted::default();
    for (table, _, count) in RUN_TABLES {
        let n = c
            .optional::<IntRow>(count, args![&s.tenant, &s.workspace, run_id])
            .await?
            .map_or(0, |r| r.n);
        counted.add(table, u64::try_from(n).unwrap_or(0));
    }
    counted.add("runs", 1);
    let n = c
        .optional::<IntRow>(RUN_EVENTS_DRY, args![&s.tenant, &s.workspace, run_id])
        .await?
        .map_or(0, |r| r.n);
    counted.add("outbox", u64::try_from(n).unwrap_or(0));
    Ok(counted)
}
