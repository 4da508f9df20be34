//! Finding runs: the listing newest first and the counts by status beside it, under one
//! [`RunFilter`] (workflow, time, input values, id prefix), and the `run_inputs` rows
//! (migration 0009) that make "runs whose `order_id` is 117" an index walk.
//!
//! A run gets one `run_inputs` row per top-level input with a scalar value, written by
//! [`index_inputs`] in its enqueue transaction; [`index_rows`] is the rule (the
//! migration's backfill states the same rule in SQL for the runs that were already
//! there). A filtered page walks `run_inputs_by_value` on `(key, value)` in the listing's
//! order from its cursor and stops after `limit` matches, checking the other pairs of the
//! filter (AND) by primary key; a page never reads runs that do not match.
//!
//! The id prefix is a range, `prefix <= id < successor(prefix)` ([`prefix_upper_bound`]),
//! which is exactly "starts with" under a byte-wise comparison of UTF-8. SQLite compares
//! text byte-wise; PostgreSQL compares under the database's collation, which may not be
//! (`en_US` ignores `_` and `-` at first), so there the comparison is `COLLATE "C"`.
//! A range needs no escaping, so `%` and `_` in a prefix are themselves.

use serde_json::{Value, json};

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::ids::{IdKind, check_id};
use crate::model::Scope;

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

/// Writes a new run's `run_inputs` rows in the caller's transaction (the enqueue's), in
/// one statement however many inputs it has.
pub(crate) async fn index_inputs(
    c: &mut Conn<'_>,
    scope: &Scope,
    run_id: &str,
    created_at: Timestamp,
    inputs: &Value,
) -> Result<(), Error> {
    let rows = index_rows(inputs);
    if rows.is_empty() {
        return Ok(());
    }
    let pairs: Vec<[&str; 2]> = rows.iter().map(|(k, v)| [k.as_str(), v.as_str()]).collect();
    let sql = c.pick(
        "INSERT INTO run_inputs (tenant, workspace, run_id, key, value, created_at)
         SELECT $1, $2, $3, p.value ->> 0, p.value ->> 1, $4 FROM json_each($5) AS p",
        "INSERT INTO run_inputs (tenant, workspace, run_id, key, value, created_at)
         SELECT $1, $2, $3, p.value ->> 0, p.value ->> 1, $4
         FROM json_array_elements($5::json) AS p",
    );
    let a = args![
        &scope.tenant,
        &scope.workspace,
        run_id,
        created_at,
        json!(pairs).to_string()
    ];
    c.execute(sql, a).await?;
    Ok(())
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
}
