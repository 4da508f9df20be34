-- Runs found by an input's value ("which run handled order 117?", `RunFilter::inputs`):
-- one row per top-level input of a run whose value is a scalar, written in the run's
-- enqueue transaction (ledger/src/search.rs, `index_rows`, is the rule this mirrors).
--
-- What gets a row: the run's inputs are a JSON object; the key passes the id grammar
-- (ledger/src/ids.rs: 1 to 128 of `A-Za-z0-9_.-`, not `.` or `..`, which every workflow
-- input name does); the value is a string (stored as the string itself), a number (its
-- JSON text exactly as stored: `117`, `-3`, `1.5`, `1e+20`) or a boolean (`true` or
-- `false`), at most 1,024 bytes, without a NUL character. So `order_id=117` finds both
-- 117 and "117". Nulls, arrays and objects get no row. (The byte bound also keeps every
-- index entry far below PostgreSQL's B-tree limit of about 2,700 bytes.)
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
    PRIMARY KEY (tenant, workspace, run_id, key)
);

-- The runs already there. `inputs` is TEXT holding JSON: read as `json`, not `jsonb`,
-- because `json` keeps a number's text as written (jsonb would turn 1e+20 into
-- 100000000000000000000, which no longer matches what a new run stores). Runs whose
-- inputs hold the escape \u0000 anywhere are left out (a text cannot hold a NUL, and
-- reading the string would fail the migration).
INSERT INTO run_inputs (tenant, workspace, run_id, key, value, created_at)
SELECT tenant, workspace, run_id, key, value, created_at FROM (
    SELECT r.tenant, r.workspace, r.id AS run_id, j.key, r.created_at,
        CASE json_typeof(j.value)
            WHEN 'string' THEN j.value #>> '{}'
            WHEN 'number' THEN j.value::text
            WHEN 'boolean' THEN j.value::text
        END AS value
    FROM runs r CROSS JOIN LATERAL json_each(CASE
        WHEN strpos(r.inputs, '\u0000') = 0 AND json_typeof(r.inputs::json) = 'object'
        THEN r.inputs::json ELSE '{}'::json END) AS j
) s
WHERE value IS NOT NULL
  AND key ~ '^[A-Za-z0-9_.-]{1,128}$'
  AND key NOT IN ('.', '..')
  AND octet_length(value) <= 1024
ON CONFLICT DO NOTHING;

-- The foreign key and the index come after the backfill. Checked row by row, the key costs
-- a lookup of runs per row, and on a ledger whose statistics still describe an empty runs
-- table (never analyzed: autovacuum off or not yet there) each lookup scanned the
-- tenant's runs: the 400,000 rows of 100,000 runs were still being written after 15
-- minutes. Added afterwards, the key is validated by one join (0.1 s for those rows).
ALTER TABLE run_inputs ADD CONSTRAINT run_inputs_run_fkey
    FOREIGN KEY (tenant, workspace, run_id) REFERENCES runs (tenant, workspace, id)
    ON DELETE CASCADE;
-- query: runs with key = value, newest first (list_runs, count_runs with an input filter).
CREATE INDEX run_inputs_by_value
    ON run_inputs (tenant, workspace, key, value, created_at DESC, run_id DESC);
-- Statistics now, so the first searches are planned for the table as it is (a daemon
-- refreshes them from here on: `refresh_planner_statistics`).
ANALYZE run_inputs;
