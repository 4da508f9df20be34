-- Fan-out lists (ledger/src/fanouts.rs): one row per (run, for_each node), holding the
-- node's items once, however many steps they become. Each item is a step of its own
-- (`node[<key>]`, retries `node[<key>]_retry<n>`) whose row holds only its state and
-- result; the item itself is read from here.
--
-- `items` and `keys` (JSON arrays, same order) are the list as last evaluated, followed
-- by items that vanished from a re-evaluated list after their call was sent (they are
-- kept); `vanished` lists the keys that vanished before anything was sent (their steps
-- are recorded skipped).
CREATE TABLE fanouts (
    tenant      TEXT   NOT NULL,
    workspace   TEXT   NOT NULL,
    run_id      TEXT   NOT NULL,
    node_id     TEXT   NOT NULL,
    item_count  BIGINT NOT NULL,
    items       TEXT   NOT NULL,
    keys        TEXT   NOT NULL,
    vanished    TEXT   NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant, workspace, run_id, node_id),
    FOREIGN KEY (tenant, workspace, run_id) REFERENCES runs (tenant, workspace, id)
);
