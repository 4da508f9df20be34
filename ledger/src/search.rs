//! Finding runs: the listing newest first and the counts by status beside it, under one
//! [`RunFilter`] (workflow, time, input values, id prefix), and the `run_inputs` rows
//! (migration 0009) that make "runs whose `order_id` is 117" an index walk.
//!
//! A run gets one `run_inputs` row per top-level input with a scalar value, written in
//! its enqueue transaction ([`PendingInputs`]); [`index_rows`] is the rule (the
//! migration's backfill states the same rule in SQL for the runs that were already
//! there). A filtered page walks `run_inputs_by_value` on one `(key, value)` in the
//! listing's order from its cursor and stops after `limit` matches, checking the other
//! pairs of the filter (AND) by primary key. With several pairs the walk is on the one
//! the fewest runs have (`Ledger::narrowest_first`, a capped count of each first).
//!
//! The id prefix is a range, `prefix <= id < successor(prefix)` ([`prefix_upper_bound`]),
//! which is exactly "starts with" under a byte-wise comparison of UTF-8. SQLite compares
//! text byte-wise; PostgreSQL compares under the database's collation, which may not be
//! (`en_US` ignores `_` and `-` at first), so there the comparison is `COLLATE "C"`.
//! A range needs no escaping, so `%` and `_` in a prefix are themselves.

use serde_json::{Value, json};

use crate::clock::Timestamp;
use crate::conn::{Arg, Conn, args};
use crate::error::Error;
use crate::ids::{IdKind, MAX_ID_LEN, check_id};
use crate::ledger::Ledger;
use crate::model::{Run, RunFilter, Scope};
use crate::reads::page_limit;
use crate::rows::{IntRow, RunRow, TextIntRow, run_cols};
use crate::state::RunStatus;

/// Longest input value, in bytes, that gets a `run_inputs` row (and so can be searched
/// for). Order ids, emails and names fit; a pasted document is not a search key, and the
/// bound keeps every index entry far below PostgreSQL's B-tree limit (~2,700 bytes).
pub const MAX_INPUT_VALUE_LEN: usize = 1_024;

/// The `run_inputs` rows of a run's inputs, as `(key, value)`: one per top-level input
/// whose key passes the id grammar and whose value is a string (itself), a number (its
/// JSON text, as serde_json writes it and the run's stored inputs hold it) or a boolean
/// (`true`/`false`), at most [`MAX_INPUT_VALUE_LEN`] bytes and without NUL. Inputs that
/// are not an object give none. Migration 0009 backfills by the same rule.
pub(crate) fn index_rows(inputs: &Value) -> Vec<(String, String)> {
    let Value::Object(map) = inputs else {
        return Vec::new();
    };
    map.iter()
        .filter(|(key, _)| check_id(IdKind::Input, key).is_ok())
        .filter_map(|(key, value)| {
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                Value::Null | Value::Array(_) | Value::Object(_) => return None,
            };
            (text.len() <= MAX_INPUT_VALUE_LEN && !text.contains('\0')).then(|| (key.clone(), text))
        })
        .collect()
}

/// The `run_inputs` rows of the runs an enqueue transaction created, written together
/// by [`PendingInputs::write`] before it commits (`enqueue.rs` adds, its callers write).
///
/// One statement for a batch rather than one per run: on SQLite an `INSERT … SELECT` of
/// several rows opens a statement journal, and inside the writer's per-job `SAVEPOINT`
/// with `temp_store=memory` each one cost more the larger the transaction had grown
/// (`enqueue_batch` of 50,000 runs: 3.5 s without the rows, 22 s with a statement per
/// run; the SQLite shell shows the same, 13.7 s against 2.2 s for a statement per 1,000
/// runs). On PostgreSQL it is one round trip instead of one per run.
#[derive(Debug, Default)]
pub(crate) struct PendingInputs {
    /// `[run_id, key, value, created_at]` per row, as the statement reads them.
    rows: Vec<Value>,
    /// Their keys' and values' bytes, to write before a batch of large inputs grows
    /// without bound.
    bytes: usize,
}

/// Written early once the rows hold this many bytes of keys and values (1,000 runs of
/// ordinary inputs stay far below it).
const PENDING_BYTES: usize = 1 << 20;

impl PendingInputs {
    /// Queues the rows of a run just inserted; writes them (and those queued before) at
    /// once when they have grown past [`PENDING_BYTES`].
    pub(crate) async fn add(
        &mut self,
        c: &mut Conn<'_>,
        scope: &Scope,
        run_id: &str,
        created_at: Timestamp,
        inputs: &Value,
    ) -> Result<(), Error> {
        for (key, value) in index_rows(inputs) {
            self.bytes += key.len() + value.len();
            self.rows.push(json!([run_id, key, value, created_at.0]));
        }
        if self.bytes > PENDING_BYTES {
            self.write(c, scope).await?;
        }
        Ok(())
    }

    /// Writes every queued row in one statement (none queued: no statement).
    pub(crate) async fn write(&mut self, c: &mut Conn<'_>, scope: &Scope) -> Result<(), Error> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let rows = Value::Array(std::mem::take(&mut self.rows)).to_string();
        self.bytes = 0;
        let sql = c.pick(
            "INSERT INTO run_inputs (tenant, workspace, run_id, key, value, created_at)
             SELECT $1, $2, p.value ->> 0, p.value ->> 1, p.value ->> 2,
                CAST(p.value ->> 3 AS BIGINT)
             FROM json_each($3) AS p",
            "INSERT INTO run_inputs (tenant, workspace, run_id, key, value, created_at)
             SELECT $1, $2, p.value ->> 0, p.value ->> 1, p.value ->> 2,
                CAST(p.value ->> 3 AS BIGINT)
             FROM json_array_elements($3::json) AS p",
        );
        c.execute(sql, args![&scope.tenant, &scope.workspace, rows])
            .await?;
        Ok(())
    }
}

/// The smallest text greater than every text that starts with `prefix`, under byte-wise
/// comparison of UTF-8 (= code point order): `prefix` with its last character replaced
/// by the next one (dropping trailing U+10FFFF, which has none). `None` when every
/// character is U+10FFFF: no upper bound is needed then.
pub(crate) fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match u32::from(last) + 1 {
            0xD800 => Some('\u{E000}'),
            n => char::from_u32(n),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

fn invalid(reason: String) -> Error {
    Error::InvalidFilter { reason }
}

/// Refuses a filter no run can match (see [`Error::InvalidFilter`]) before any SQL.
fn check_filter(filter: &RunFilter) -> Result<(), Error> {
    for (key, value) in &filter.inputs {
        check_id(IdKind::Input, key).map_err(|e| invalid(e.to_string()))?;
        if value.len() > MAX_INPUT_VALUE_LEN {
            return Err(invalid(format!(
                "the value for input {key} is {} bytes long, over {MAX_INPUT_VALUE_LEN}: \
                 longer values are not indexed, so no run can match",
                value.len()
            )));
        }
        if value.contains('\0') {
            return Err(invalid(format!(
                "the value for input {key} holds a NUL character, which no stored input can"
            )));
        }
    }
    if let Some(parent) = &filter.parent {
        check_id(IdKind::Run, parent).map_err(|e| invalid(format!("parent: {e}")))?;
    }
    if let Some(prefix) = &filter.id_prefix {
        if prefix.len() > MAX_ID_LEN {
            return Err(invalid(format!(
                "the id prefix is {} bytes long, longer than any run id ({MAX_ID_LEN})",
                prefix.len()
            )));
        }
        if prefix.contains('\0') {
            return Err(invalid("the id prefix holds a NUL character".to_owned()));
        }
    }
    Ok(())
}

/// `$1`–`$7` of every statement here: tenant, workspace, workflow, since, until, the id
/// prefix and its upper bound.
fn common_args(s: &Scope, filter: &RunFilter) -> Vec<Arg> {
    let prefix = filter.id_prefix.as_deref().filter(|p| !p.is_empty());
    args![
        &s.tenant,
        &s.workspace,
        filter.workflow.as_deref(),
        filter.since,
        filter.until,
        prefix,
        prefix.and_then(prefix_upper_bound),
    ]
}

/// How far [`Ledger::narrowest_first`] counts each pair's runs: enough to tell a value a
/// few runs share from one a quarter of them do, at the cost of reading at most this
/// many index entries per pair.
const PROBE_CAP: i64 = 1_000;

/// How many runs have one `key = value`, counted up to `$5` (an index-only walk).
const PROBE: &str = "SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM run_inputs
     WHERE tenant = $1 AND workspace = $2 AND key = $3 AND value = $4 LIMIT $5) AS s";

/// The input filter's three parameters: the first pair (the one the index walk is on)
/// and the others as a JSON array of `[key, value]`, checked per run. `None` without one.
fn input_args(inputs: &[(String, String)]) -> Option<Vec<Arg>> {
    let ((key, value), rest) = inputs.split_first()?;
    let rest: Vec<[&str; 2]> = rest.iter().map(|(k, v)| [k.as_str(), v.as_str()]).collect();
    Some(args![key, value, json!(rest).to_string()])
}

/// The conditions on `runs` alone (no input filter), `$1`–`$7`; `$c` is the collation
/// the id prefix is compared under (`""` on SQLite).
macro_rules! run_conditions {
    ($c:literal, $parent:literal) => {
        concat!(
            " tenant = $1 AND workspace = $2
              AND (",
            $parent,
            " IS NULL OR parent_run_id = ",
            $parent,
            ")
              AND ($3 IS NULL OR workflow_name = $3)
              AND ($4 IS NULL OR created_at >= $4)
              AND ($5 IS NULL OR created_at < $5)
              AND ($6 IS NULL OR id",
            $c,
            " >= $6)
              AND ($7 IS NULL OR id",
            $c,
            " < $7) "
        )
    };
}

/// The conditions of a walk of `run_inputs i` joined to `runs r`: `$1`–`$7` as in
/// `run_conditions` on the index's own columns where it has them (so time and cursor
/// bound the walk), the first pair in `$key`/`$value`, and every pair of the JSON array
/// `$rest` present on the same run (read by `$each`, the dialect's array function).
///
/// Each other pair reads the run's value for its key (primary key: run, key) and
/// compares it, rather than asking whether a row with that key *and value* exists:
/// given the value too, PostgreSQL took `run_inputs_by_value` for the lookup, whose
/// columns put the run id after `created_at`, so each check scanned every run with that
/// value (a quarter of them for `region=us`: 548 ms a page, 7 ms this way).
macro_rules! input_conditions {
    ($c:literal, $key:literal, $value:literal, $rest:literal, $each:literal, $parent:literal) => {
        concat!(
            " (",
            $parent,
            " IS NULL OR r.parent_run_id = ",
            $parent,
            ") AND i.tenant = $1 AND i.workspace = $2 AND i.key = ",
            $key,
            " AND i.value = ",
            $value,
            " AND r.tenant = i.tenant AND r.workspace = i.workspace AND r.id = i.run_id
              AND ($3 IS NULL OR r.workflow_name = $3)
              AND ($4 IS NULL OR i.created_at >= $4)
              AND ($5 IS NULL OR i.created_at < $5)
              AND ($6 IS NULL OR i.run_id",
            $c,
            " >= $6)
              AND ($7 IS NULL OR i.run_id",
            $c,
            " < $7)
              AND NOT EXISTS (SELECT 1 FROM ",
            $each,
            "(",
            $rest,
            ") AS p WHERE (SELECT o.value FROM run_inputs o
                  WHERE o.tenant = i.tenant AND o.workspace = i.workspace
                    AND o.run_id = i.run_id AND o.key = p.value ->> 0)
                  IS DISTINCT FROM p.value ->> 1) "
        )
    };
}

/// A page without an input filter: `$8` status, `$9` limit, `$10`/`$11` the cursor.
/// Walks `runs_by_created` from the cursor.
macro_rules! list_sql {
    ($c:literal) => {
        concat!(
            "SELECT ",
            run_cols!(),
            " FROM runs WHERE",
            run_conditions!($c, "$12"),
            "AND ($8 IS NULL OR status = $8)
             AND ($10 IS NULL OR created_at <= $10)
             AND ($10 IS NULL OR created_at < $10 OR (created_at = $10 AND id < $11))
             ORDER BY created_at DESC, id DESC LIMIT $9"
        )
    };
}

/// A page with an input filter: as `list_sql`, plus `$12`/`$13` the first pair and
/// `$14` the others. The page's ids come from the walk of `run_inputs_by_value`; the
/// outer select reads those runs by primary key, `page` first (`CROSS JOIN` fixes the
/// order on SQLite: asked for `id IN (page)` it walked `runs_by_created` for the
/// `ORDER BY` and tested each of 100,000 runs against the page, 11 ms instead of 1).
/// `run_cols` names `runs`' columns unqualified, which `page`'s `run_id` cannot shadow.
macro_rules! list_by_input_sql {
    ($c:literal, $rest:literal, $each:literal) => {
        concat!(
            "WITH page AS (SELECT i.run_id FROM run_inputs i CROSS JOIN runs r WHERE",
            input_conditions!($c, "$12", "$13", $rest, $each, "$15"),
            "AND ($8 IS NULL OR r.status = $8)
             AND ($10 IS NULL OR i.created_at <= $10)
             AND ($10 IS NULL OR i.created_at < $10 OR (i.created_at = $10 AND i.run_id < $11))
             ORDER BY i.created_at DESC, i.run_id DESC LIMIT $9)
             SELECT ",
            run_cols!(),
            " FROM page CROSS JOIN runs
             WHERE runs.tenant = $1 AND runs.workspace = $2 AND runs.id = page.run_id
             ORDER BY runs.created_at DESC, runs.id DESC"
        )
    };
}

const LIST: (&str, &str) = (list_sql!(""), list_sql!(" COLLATE \"C\""));
const LIST_BY_INPUT: (&str, &str) = (
    list_by_input_sql!("", "$14", "json_each"),
    list_by_input_sql!(" COLLATE \"C\"", "$14::json", "json_array_elements"),
);
const COUNT: (&str, &str) = (
    concat!(
        "SELECT status AS t, COUNT(*) AS n FROM runs WHERE",
        run_conditions!("", "$8"),
        "GROUP BY status"
    ),
    concat!(
        "SELECT status AS t, COUNT(*) AS n FROM runs WHERE",
        run_conditions!(" COLLATE \"C\"", "$8"),
        "GROUP BY status"
    ),
);
const COUNT_BY_INPUT: (&str, &str) = (
    concat!(
        "SELECT r.status AS t, COUNT(*) AS n FROM run_inputs i CROSS JOIN runs r WHERE",
        input_conditions!("", "$8", "$9", "$10", "json_each", "$11"),
        "GROUP BY r.status"
    ),
    concat!(
        "SELECT r.status AS t, COUNT(*) AS n FROM run_inputs i CROSS JOIN runs r WHERE",
        input_conditions!(
            " COLLATE \"C\"",
            "$8",
            "$9",
            "$10::json",
            "json_array_elements",
            "$11"
        ),
        "GROUP BY r.status"
    ),
);

impl Ledger {
    /// The filter's pairs with the one fewest runs have first, the one the page walks
    /// (its `run_inputs_by_value` range), so the walk's length does not depend on the
    /// order the caller named them in: `region=eu AND order_id=117` walked every `eu`
    /// run, a quarter of them, to find one (6.6 ms at 5,000 runs in a debug build, and
    /// growing with the runs); walking the one `117`: 0.5 ms at 100,000.
    /// Each pair is counted up to [`PROBE_CAP`]; one pair: nothing to choose, no probe.
    /// `None` when some pair matches no run at all: so does the filter.
    async fn narrowest_first(
        &self,
        c: &mut Conn<'_>,
        inputs: &[(String, String)],
    ) -> Result<Option<Vec<(String, String)>>, Error> {
        let mut counted = Vec::with_capacity(inputs.len());
        if inputs.len() > 1 {
            let s = self.scope();
            for (key, value) in inputs {
                let a = args![&s.tenant, &s.workspace, key, value, PROBE_CAP];
                let n = c.optional::<IntRow>(PROBE, a).await?.map_or(0, |r| r.n);
                if n == 0 {
                    return Ok(None);
                }
                counted.push(n);
            }
        }
        let mut ordered: Vec<(i64, (String, String))> = counted
            .into_iter()
            .chain(std::iter::repeat(0))
            .zip(inputs.iter().cloned())
            .collect();
        // Stable: equal counts (all at the cap, say) keep the caller's order.
        ordered.sort_by_key(|(n, _)| *n);
        Ok(Some(ordered.into_iter().map(|(_, pair)| pair).collect()))
    }

    /// Runs matching `filter`, newest first (ties by id, descending), at most
    /// `filter.limit` (0 = 100); `filter.after` continues from a previous page, so a
    /// page boundary stays put while new runs arrive. With an input filter the page is
    /// a walk of `run_inputs_by_value`, without one a walk of `runs_by_created`: either
    /// way it reads about one page of rows, not the whole table.
    pub async fn list_runs(&self, filter: RunFilter) -> Result<Vec<Run>, Error> {
        check_filter(&filter)?;
        let s = self.scope();
        let mut a = common_args(s, &filter);
        a.extend(args![
            filter.status.map(|st| st.as_str()),
            page_limit(filter.limit, 100),
            filter.after.as_ref().map(|c| c.created_at),
            filter.after.as_ref().map(|c| c.id.as_str()),
        ]);
        let mut pc = self.pool().acquire().await?;
        let mut c = pc.conn();
        let Some(pairs) = self.narrowest_first(&mut c, &filter.inputs).await? else {
            return Ok(Vec::new());
        };
        let sql = match input_args(&pairs) {
            Some(more) => {
                a.extend(more);
                c.pick(LIST_BY_INPUT.0, LIST_BY_INPUT.1)
            }
            None => c.pick(LIST.0, LIST.1),
        };
        a.extend(args![filter.parent.as_deref()]);
        let rows = c.all::<RunRow>(sql, a).await?;
        rows.into_iter().map(RunRow::into_run).collect()
    }

    /// How many runs match `filter` in each status, every status listed (zeros
    /// included), for the counts a console shows beside a filtered list: the same
    /// workflow, time, input and id-prefix conditions as [`Ledger::list_runs`], while
    /// `status`, `after` and `limit` are ignored (the counts are of the whole match, one
    /// per status).
    pub async fn count_runs(&self, filter: &RunFilter) -> Result<Vec<(RunStatus, i64)>, Error> {
        check_filter(filter)?;
        let mut a = common_args(self.scope(), filter);
        let mut out: Vec<(RunStatus, i64)> = RunStatus::ALL.iter().map(|st| (*st, 0)).collect();
        let mut pc = self.pool().acquire().await?;
        let mut c = pc.conn();
        let Some(pairs) = self.narrowest_first(&mut c, &filter.inputs).await? else {
            return Ok(out);
        };
        let sql = match input_args(&pairs) {
            Some(more) => {
                a.extend(more);
                c.pick(COUNT_BY_INPUT.0, COUNT_BY_INPUT.1)
            }
            None => c.pick(COUNT.0, COUNT.1),
        };
        a.extend(args![filter.parent.as_deref()]);
        let rows = c.all::<TextIntRow>(sql, a).await?;
        for r in rows {
            let st: RunStatus = r.t.parse()?;
            if let Some(slot) = out.iter_mut().find(|(k, _)| *k == st) {
                slot.1 = r.n;
            }
        }
        Ok(out)
    }

    /// How many runs are in each status (every status listed, zeros included): queue
    /// depth and the like for metrics. [`Ledger::count_runs`] with no filter.
    pub async fn count_runs_by_status(&self) -> Result<Vec<(RunStatus, i64)>, Error> {
        self.count_runs(&RunFilter::default()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_are_indexed_by_their_text_and_the_rest_is_not() {
        let inputs = json!({
            "order_id": 117, "sku": "117", "price": 1.5, "big": 1e20, "paid": true,
            "note": null, "items": [1], "meta": {"a": 1}, "bad key": "x",
            "long": "x".repeat(MAX_INPUT_VALUE_LEN + 1), "edge": "y".repeat(MAX_INPUT_VALUE_LEN),
            "nul": "a\0b", "": "empty", "neg": -3, "empty": "",
        });
        let mut rows = index_rows(&inputs);
        rows.sort();
        let keys: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "big", "edge", "empty", "neg", "order_id", "paid", "price", "sku"
            ]
        );
        let get = |k: &str| {
            rows.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("order_id"), Some("117"));
        assert_eq!(get("sku"), Some("117"));
        assert_eq!(get("price"), Some("1.5"));
        let stored = inputs["big"].to_string();
        assert_eq!(
            get("big"),
            Some(stored.as_str()),
            "the text the inputs are stored with"
        );
        assert_eq!(stored, "1e+20");
        assert_eq!(get("paid"), Some("true"));
        assert_eq!(get("neg"), Some("-3"));
        assert_eq!(get("empty"), Some(""));
        assert!(index_rows(&json!([1, 2])).is_empty());
        assert!(index_rows(&json!("x")).is_empty());
    }

    #[test]
    fn the_prefix_bound_is_the_next_text_after_every_extension() {
        assert_eq!(prefix_upper_bound("run_a").as_deref(), Some("run_b"));
        assert_eq!(prefix_upper_bound("a%").as_deref(), Some("a&"));
        assert_eq!(prefix_upper_bound("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(
            prefix_upper_bound("a\u{D7FF}").as_deref(),
            Some("a\u{E000}")
        );
        assert_eq!(prefix_upper_bound("\u{10FFFF}"), None);
        assert_eq!(prefix_upper_bound(""), None);
        for (id, prefix, starts) in [
            ("run_a", "run_a", true),
            ("run_a9", "run_a", true),
            ("run_a\u{10FFFF}x", "run_a", true),
            ("run_b", "run_a", false),
            ("run_", "run_a", false),
            ("a%b", "a%", true),
            ("a&", "a%", false),
        ] {
            let upper = prefix_upper_bound(prefix);
            let inside = id >= prefix && upper.as_deref().is_none_or(|u| id < u);
            assert_eq!(inside, starts, "{id} / {prefix}");
            assert_eq!(id.starts_with(prefix), starts);
        }
    }

    #[test]
    fn filters_no_run_can_match_are_refused() {
        let with = |inputs: Vec<(&str, String)>, prefix: Option<String>| RunFilter {
            inputs: inputs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            id_prefix: prefix,
            ..Default::default()
        };
        let refused = |f: RunFilter| match check_filter(&f) {
            Err(Error::InvalidFilter { reason }) => reason,
            other => panic!("{other:?}"),
        };
        let long_key = "k".repeat(MAX_ID_LEN + 1);
        let msg = refused(with(vec![(long_key.as_str(), "1".into())], None));
        assert!(
            msg.contains("input name") && msg.contains("129 bytes"),
            "{msg}"
        );
        assert!(refused(with(vec![("a b", "1".into())], None)).contains("input name"));
        let long = "v".repeat(MAX_INPUT_VALUE_LEN + 1);
        assert!(refused(with(vec![("k", long)], None)).contains("not indexed"));
        assert!(refused(with(vec![("k", "a\0".into())], None)).contains("NUL"));
        assert!(refused(with(vec![], Some("r".repeat(MAX_ID_LEN + 1)))).contains("prefix"));
        let fine = with(
            vec![("order_id", "v".repeat(MAX_INPUT_VALUE_LEN))],
            Some("run_%_".into()),
        );
        assert!(check_filter(&fine).is_ok());
    }
}
