-- Runs found by an input's value ("which run handled order 117?", `RunFilter::inputs`):
-- one row per top-level input of a run whose value is a scalar, written in the run's
-- enqueue transaction (ledger/src/search.rs, `index_rows`, is the rule this mirrors).
--
-- What gets a row: the run's inputs are a JSON object; the key passes the id grammar
-- (ledger/src/ids.rs: 1 to 128 of `A-Za-z0-9_.-`, not `.` or `..`, which every workflow
-- input name does); the value is a string (stored as the string itself), a number (its
-- JSON text exactly as stored: `117`, `-3`, `1.5`, `1e+20`) or a boolean (`true` or
-- `false`), at most 1,024 bytes, without a NUL character. So `order_id=117` finds both
-- 117 and "117". Nulls, arrays and objects get no row.
--
-- `created_at` is the run's (it never changes), so a filtered listing walks
-- `run_inputs_by_value` in the listing's own order (newest first, ties by id) from its
-- cursor and stops after one page, instead of reading every run.
CREATE TABLE run_inputs (
    tenant     TEXT   NOT NULL,
    workspace  TEXT   NOT NULL,
    run_id     TEXT   NOT NULL,
    key        TEXT   NOT NULL,
    value      TEXT   NOT NULL,
    created_at BIGINT NOT NULL,   -- = runs.created_at
    PRIMARY KEY (tenant, workspace, run_id, key),
    FOREIGN KEY (tenant, workspace, run_id) REFERENCES runs (tenant, workspace, id)
        ON DELETE CASCADE
) WITHOUT ROWID;
-- The runs already there. A number's text is taken from the stored JSON (`->`), not from
-- json_each's value, which SQLite has turned into a REAL (1.0e+20 for 1e+20). Runs whose
-- inputs hold the escape \u0000 anywhere are left out (PostgreSQL cannot hold a NUL in a
-- text; left out on both backends alike).
INSERT OR IGNORE INTO run_inputs (tenant, workspace, run_id, key, value, created_at)
SELECT tenant, workspace, run_id, key, value, created_at FROM (
    SELECT r.tenant, r.workspace, r.id AS run_id, j.key AS key, r.created_at,
        CASE j.type
            WHEN 'text' THEN j.value
            WHEN 'true' THEN 'true'
            WHEN 'false' THEN 'false'
            WHEN 'integer' THEN r.inputs -> j.fullkey
            WHEN 'real' THEN r.inputs -> j.fullkey
        END AS value
    FROM runs r, json_each(CASE
        WHEN json_type(r.inputs) = 'object' AND instr(r.inputs, '\u0000') = 0 THEN r.inputs
        ELSE '{}' END) j
)
WHERE value IS NOT NULL
  AND length(key) BETWEEN 1 AND 128
  AND key NOT GLOB '*[^A-Za-z0-9_.-]*'
  AND key NOT IN ('.', '..')
  AND length(CAST(value AS BLOB)) <= 1024
  AND instr(value, char(0)) = 0;

-- After the backfill: one sorted build instead of an insert per row.
-- query: runs with key = value, newest first (list_runs, count_runs with an input filter).
CREATE INDEX run_inputs_by_value
    ON run_inputs (tenant, workspace, key, value, created_at DESC, run_id DESC);
